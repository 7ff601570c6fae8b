"""Project-wide test settings for the plugin's own tests and the perf suite."""

import os

from hypothesis import settings

pytest_plugins = ["pytester"]  # the plugin's own tests run inner pytest sessions

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
