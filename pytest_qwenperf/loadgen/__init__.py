"""Load generation: requests → arrival schedule → streamed HTTP calls → :class:`~pytest_qwenperf.core.records.RequestRecord`."""
