"""What to run, as data: suite files, serving configs, workloads, the embedded tiny model and
the check of a config's flags against vLLM's own parser. Nothing here starts a process."""
