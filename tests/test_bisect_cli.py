"""``qwenperf bisect`` as a user runs it, over "releases" that are launchers of known speed.

Each release is the paced stand-in (tests/standins/paced_vllm.py) at 5 ms a token, or at 15 ms
from the first slowed one on: a slowdown of known place and size. The whole command runs (real
processes, real sockets, real repeats): the first slowed release is found within the search's
bound of steps, none is found when nothing slowed, an interrupted bisection leaves no server
running and resumes from its state file, and a state file of another bisection is refused.
"""

from __future__ import annotations

import json
import math
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.processes import interruptible
from tests.test_candidate import PACED, paced
from tests.test_max_repeats import write_suite


def releases(slow_from: int | None, n: int) -> list[str]:
    """``n`` launchers, the ones from ``slow_from`` on three times slower a token (``--release`` tells them
    apart; the stand-in ignores it, as it ignores the config's vLLM flags)."""
    return [paced(15 if slow_from is not None and i >= slow_from else 5) + f" --release r{i}" for i in range(n)]


def command(tmp_path: Path, versions: list[str], *extra: str) -> list[str]:
    write_suite(tmp_path)
    return [
        sys.executable, "-m", "pytest_qwenperf.cli.main", "bisect",
        "--good", versions[0], "--bad", versions[-1], "--between", *versions[1:-1],
        "--config", "base", "--workload", "w", "--suite", str(tmp_path / "suite.toml"),
        "--state", str(tmp_path / "state.json"), "--log-dir", str(tmp_path / "logs"), "--boot-timeout", "60", *extra,
    ]  # fmt: skip


def bisect(tmp_path: Path, versions: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(tmp_path, versions, *extra), capture_output=True, text=True, check=False, timeout=600)


def state(tmp_path: Path) -> dict[str, dict[str, object]]:
    return {step["version"]: step for step in json.loads((tmp_path / "state.json").read_text())["steps"]}


def stand_ins(*, servers: bool = False) -> list[psutil.Process]:
    """Every process of a stand-in's tree (the guard that started it included); ``servers``: the stand-ins alone."""
    found = [p for p in psutil.process_iter(["cmdline"]) if str(PACED) in " ".join(p.info["cmdline"] or [])]
    return [p for p in found if p.info["cmdline"][1:2] == [str(PACED)]] if servers else found


@pytest.mark.parametrize(("n", "slow_from"), [(5, 3), (6, 1)])
def test_the_first_slowed_release_is_found_within_log2_n_plus_one_steps(tmp_path: Path, n: int, slow_from: int) -> None:
    versions = releases(slow_from, n)
    done = bisect(tmp_path, versions, "--plot", str(tmp_path / "bisect.png"))
    assert done.returncode == 0, done.stderr
    assert f"first bad: {versions[slow_from]} (last good: {versions[slow_from - 1]})" in done.stdout
    steps = state(tmp_path)
    assert len(steps) <= math.ceil(math.log2(n)) + 1
    assert all(step["regressed"] == (versions.index(version) >= slow_from) for version, step in steps.items())
    assert all(step["ratio"] < 0.8 for step in steps.values() if step["regressed"])  # 5 ms -> 15 ms a token
    assert (tmp_path / "bisect.png").read_bytes().startswith(b"\x89PNG")
    assert not stand_ins()


def test_without_a_slowdown_it_reports_none_after_measuring_the_bad_end(tmp_path: Path) -> None:
    versions = releases(None, 4)
    done = bisect(tmp_path, versions, "--markdown")
    assert done.returncode == 0, done.stderr
    assert f"no regression: {versions[-1]} did not regress against {versions[0]}" in done.stdout
    assert list(state(tmp_path)) == [versions[-1]]
    assert "| step |" in done.stdout


def test_one_server_at_a_time_finds_it_too(tmp_path: Path) -> None:
    versions = releases(2, 3)
    done = bisect(tmp_path, versions, "--sequential")
    assert done.returncode == 0, done.stderr
    assert f"first bad: {versions[2]}" in done.stdout
    assert "one at a time" in done.stderr
    # each step's boots and repeats are told on stderr as they finish, named by the release
    lines = done.stderr.splitlines()
    assert any(line.startswith(f"qwenperf booted {versions[0]} standin/base in ") for line in lines), done.stderr
    assert any(line.startswith(f"qwenperf {versions[2]}: standin/base / w: repeat 1 of ") and " done, " in line for line in lines), done.stderr


def test_an_interrupted_bisection_stops_every_server_and_resumes_from_its_state(tmp_path: Path) -> None:
    versions = releases(3, 5)
    process = subprocess.Popen(interruptible(command(tmp_path, versions)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "state.json").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT, err
    assert not stand_ins()
    first = state(tmp_path)
    assert list(first) == [versions[-1]]  # the bad end is the first step

    resumed = bisect(tmp_path, versions)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 step(s) from" in resumed.stderr
    assert f"first bad: {versions[3]}" in resumed.stdout
    assert state(tmp_path)[versions[-1]] == first[versions[-1]]  # kept, not measured again
    assert f"  {versions[-1]}:" not in resumed.stderr  # steps measured now are listed as they end


def test_a_state_file_of_another_bisection_is_refused(tmp_path: Path) -> None:
    versions = releases(None, 2)
    assert bisect(tmp_path, versions).returncode == 0
    other = bisect(tmp_path, versions, "--repeats", "3")
    assert other.returncode == 2
    assert "holds the steps of another bisection (it differs in repeats" in other.stderr
    assert "--state" in other.stderr


def test_a_version_that_does_not_boot_ends_the_bisection_with_exit_1_and_keeps_the_steps_before(tmp_path: Path) -> None:
    broken = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)' --release broken"
    fast, _, *slow = releases(2, 4)
    versions = [fast, broken, *slow]  # the bad end first, then the middle one: the broken one
    done = bisect(tmp_path, versions)
    assert done.returncode == 1, done.stderr
    assert f"a step could not be measured: {broken}:" in done.stderr
    assert list(state(tmp_path)) == [versions[-1]]
    assert not stand_ins()


def test_a_sigkilled_bisection_leaves_no_server_behind(tmp_path: Path) -> None:
    process = subprocess.Popen(command(tmp_path, releases(3, 5)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(stand_ins(servers=True)) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(stand_ins(servers=True)) == 2  # the good release's server and the version's, side by side
    process.kill()
    process.wait(timeout=30)
    deadline = time.monotonic() + 60  # the servers' guards see their starter gone, then stop them
    while stand_ins() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not stand_ins()


def test_a_release_that_cannot_be_installed_is_a_step_that_could_not_be_measured(tmp_path: Path) -> None:
    wheel = tmp_path / "wheels" / "vllm-9.9.9-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"not a zip archive")
    versions = [releases(None, 1)[0], str(wheel)]
    done = bisect(tmp_path, versions, "--envs", str(tmp_path / "envs"), "--install-arg=--no-index")
    assert done.returncode == 1, done.stderr
    assert f"a step could not be measured: {wheel}: installing {wheel} failed" in done.stderr
    (log,) = (tmp_path / "logs").glob("01-*vllm-9.9.9-py3-none-any.whl/install.log")
    assert f"$ {Path(sys.executable).parent / 'uv'} pip install" in log.read_text()
    assert not stand_ins()
