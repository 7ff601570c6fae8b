"""One measured point: a workload driven against running servers with telemetry sampled,
repeated and summarized into a run; the session's runs and their JSON."""
