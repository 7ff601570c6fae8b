"""The process sweeps: leftovers of a session that died are stopped at the next start, and
whatever of this process's own trees outlived teardown is killed; each named with its key masked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_qwenperf.serving import proctree
from tests.processes import alive

SLEEPER = "import time; time.sleep(600)"


def test_leftovers_of_a_dead_owner_are_stopped_and_named() -> None:
    owner = subprocess.Popen([sys.executable, "-c", SLEEPER])
    prefix = proctree.owner_prefix(owner.pid)
    owner.kill()
    owner.wait()
    env = {**os.environ, proctree.TAG_ENV: f"{prefix}leftover"}
    leftover = subprocess.Popen([sys.executable, "-c", SLEEPER, "--api-key", "sekrit"], env=env, start_new_session=True)
    try:
        sweep = proctree.stop_orphaned_trees()
        mine = [line for line in sweep.stopped if line.startswith(f"pid {leftover.pid} ")]
        assert mine == [f"pid {leftover.pid} (started by pid {owner.pid}, gone): {sys.executable} -c {SLEEPER} --api-key ***"]
        assert not alive(leftover.pid) and sweep.survivors == ()
    finally:
        leftover.kill()
        leftover.wait()


def test_a_live_owners_trees_are_no_leftovers() -> None:
    env = {**os.environ, proctree.TAG_ENV: proctree.new_tag()}  # this test process is alive
    live = subprocess.Popen([sys.executable, "-c", SLEEPER], env=env, start_new_session=True)
    try:
        assert not any(line.startswith(f"pid {live.pid} ") for line in proctree.stop_orphaned_trees().stopped)
        assert alive(live.pid)
    finally:
        live.kill()
        live.wait()


def test_own_trees_that_outlived_teardown_are_killed_and_named(tmp_path: Path) -> None:
    """In a process of its own: the sweep takes every tree its caller started."""
    script = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from pytest_qwenperf.serving import proctree\n"
        f"argv = [sys.executable, '-c', {SLEEPER!r}, '--api-key', 'sekrit']\n"
        f"proctree.spawn_tree(argv, log_path=Path({str(tmp_path / 'log')!r}), env={{}}, tag=proctree.new_tag())\n"
        "while len(tree := proctree.tagged_processes(proctree.owner_prefix())) < 2: time.sleep(0.05)\n"
        "print(json.dumps({'tree': sorted(p.pid for p in tree), 'killed': proctree.kill_own_trees()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout)
    killed = seen["killed"]
    assert sorted(int(line.split(" ", 1)[0]) for line in killed) == seen["tree"]
    assert sorted(line.split(" ", 1)[1] for line in killed) == sorted(
        [f"guard: {sys.executable} -c {SLEEPER} --api-key ***", f"{sys.executable} -c {SLEEPER} --api-key ***"]
    )
    assert [pid for pid in seen["tree"] if alive(pid)] == []
