"""pytest-qwenperf: performance gates for vLLM upgrades and serving-config changes."""

__version__ = "0.1.0"
