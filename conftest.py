"""Project-wide pytest settings for the plugin's own tests and the perf suite."""

pytest_plugins = ["pytester"]  # the plugin's own tests run inner pytest sessions
