"""Servers and everything around them: one managed-process lifecycle for vLLM and nginx,
replicas, routing, placement, the server pool, hardware detection, process trees and
Kubernetes rendering."""
