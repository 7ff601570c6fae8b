"""Shared by every layer: request records, the metric registry, statistics and the verdict rule,
run identity, file I/O and option parsers. Standard library and numpy at most; nothing here
imports another layer."""
