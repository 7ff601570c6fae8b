"""Load generation: workloads → requests → streamed HTTP calls → :class:`~pytest_qwenperf.core.records.RequestRecord`."""
