"""``python -m pytest_qwenperf.pinned CPUS -- COMMAND...``: exec COMMAND on the given CPUs.

The affinity is set before the exec, so the server and every process it forks inherit
it from the first instruction on (setting it from outside after the start would race
with the server's own forks).
"""

from __future__ import annotations

import os
import sys

from pytest_qwenperf.options import cpu_list


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m pytest_qwenperf.pinned CPUS -- COMMAND [ARGS...]")
    os.sched_setaffinity(0, cpu_list(argv[0]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
