"""Load generation: workloads → requests → streamed HTTP calls → :class:`~pytest_qwenperf.records.RequestRecord`."""
