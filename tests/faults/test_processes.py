"""Nothing left running: a session that dies takes its servers with it, leftovers of an
earlier death are stopped at the next start, and a GPU already in use fails the session
before any boot.

Real processes and signals throughout; the two cancellation cases run a real CPU vLLM.
A dead session's tree is reaped by its guard (:mod:`pytest_qwenperf.serving.guard`), so the
checks poll psutil up to generous deadlines: the verdict is "gone", never "gone within
a tight time".
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pytest_qwenperf.serving import gpu_memory, hardware, proctree
from tests import fake_pynvml
from tests.processes import alive, end_inner_session, interruptible, wait_for_tree

GONE_WITHIN_S = 60.0  # generous: a loaded 2-core machine, and vLLM's engine core exiting
SLEEPER = "import time; time.sleep(600)"


def _wait_all_gone(procs: list[psutil.Process], timeout: float = GONE_WITHIN_S) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in procs if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _describe(procs: list[psutil.Process]) -> list[str]:
    described = []
    for proc in procs:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.Error:
            described.append(f"{proc.pid} (gone)")
    return described


# --------------------------------------------------------------- the guard, without vLLM


def _guarded_tree(tmp_path: Path, script: str, size: int) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """A process that starts a tree of ``size`` processes (guard included) through
    :func:`proctree.spawn_tree`, with the folder ``tmp_path / "scratch"`` as its own, and then
    waits: the tree's starter, which the tests kill."""
    ready = tmp_path / "ready"
    (tmp_path / "scratch").mkdir()
    start = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from pytest_qwenperf.serving import proctree\n"
        f"proctree.spawn_tree([sys.executable, '-c', {script!r}], log_path=Path({str(tmp_path / 'log')!r}),"
        f" env={{}}, tag=proctree.new_tag(), scratch=Path({str(tmp_path / 'scratch')!r}))\n"
        f"Path({str(ready)!r}).write_text('up')\n"
        "time.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", start], cwd=Path(__file__).parents[2])
    deadline = time.monotonic() + GONE_WITHIN_S
    while not ready.exists() or len(tree := proctree.tagged_processes(f"{starter.pid}-")) < size:
        assert starter.poll() is None and time.monotonic() < deadline, "the starter never started its tree"
        time.sleep(0.05)
    return starter, tree


_CHILD_AND_GRANDCHILD = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "time.sleep(600)\n"
)


_IGNORES_SIGTERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"


@pytest.mark.parametrize(
    ("script", "size"),
    [(_CHILD_AND_GRANDCHILD, 3), (_IGNORES_SIGTERM, 2)],  # sizes count the guard
    ids=["child-and-grandchild", "ignores-sigterm"],
)
def test_sigkill_of_the_starter_takes_the_tree_down(tmp_path: Path, script: str, size: int) -> None:
    """Also a server deaf to SIGTERM: the guard's grace ends in SIGKILL. The tree's own folder goes with it."""
    starter, tree = _guarded_tree(tmp_path, script, size)
    try:
        starter.kill()
        starter.wait()
        assert _describe(_wait_all_gone(tree)) == []
        assert not (tmp_path / "scratch").exists()
    finally:
        for proc in tree:
            if alive(proc):
                proc.kill()


def test_the_guard_removes_the_trees_folder_once_its_command_has_exited(tmp_path: Path) -> None:
    """What vLLM leaves there: a Unix socket (its ZMQ IPC endpoints), never removed by vLLM itself."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = f"import socket; socket.socket(socket.AF_UNIX).bind({str(scratch / 'ipc')!r})"
    popen = proctree.spawn_tree([sys.executable, "-c", script], log_path=tmp_path / "log", env={}, tag=proctree.new_tag(), scratch=scratch)
    assert popen.wait(timeout=GONE_WITHIN_S) == 0, (tmp_path / "log").read_text()
    assert not scratch.exists()


def test_the_guard_reports_the_servers_exit_status(tmp_path: Path) -> None:
    for script, expected in (("raise SystemExit(3)", 3), ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM)):
        popen = proctree.spawn_tree([sys.executable, "-c", script], log_path=tmp_path / "log", env={}, tag=proctree.new_tag())
        assert popen.wait(timeout=GONE_WITHIN_S) == expected


# ------------------------------------------------------- leftovers of an earlier session


@pytest.fixture
def dead_owner() -> str:
    """A tag prefix naming a process that has ended: what a session killed by SIGKILL leaves."""
    owner = subprocess.Popen([sys.executable, "-c", SLEEPER])
    prefix = proctree.owner_prefix(owner.pid)
    owner.kill()
    owner.wait()
    return prefix


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for popen in started:
        for proc in proctree.tree_of(popen.pid, "", group=True) if alive(popen.pid) else ():
            proc.kill()
        if popen.poll() is None:
            popen.kill()
        popen.wait()


def _start(processes: list[subprocess.Popen[bytes]], script: str | None, tag: str | None, **kwargs: object) -> subprocess.Popen[bytes]:
    """``python -c script`` (None: ``sleep 600``) in a session of its own, tagged as given."""
    env = {**os.environ}
    env.pop(proctree.TAG_ENV, None)
    if tag is not None:
        env[proctree.TAG_ENV] = tag
    argv = [sys.executable, "-c", script] if script is not None else ["sleep", "600"]
    popen = subprocess.Popen(argv, env=env, start_new_session=True, **kwargs)  # type: ignore[call-overload]
    processes.append(popen)
    return popen


def test_leftovers_of_a_dead_session_are_named_and_stopped_and_nothing_else(
    pytester: pytest.Pytester, dead_owner: str, processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    child_pid_file = tmp_path / "child"
    leftover = _start(
        processes,
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(child_pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n",
        f"{dead_owner}leftover",
    )
    live_session = _start(processes, SLEEPER, proctree.new_tag())  # this test process is alive: not a leftover
    untagged = _start(processes, SLEEPER, None)
    other_user = _start(processes, None, f"{dead_owner}nobody", user=65534)  # another user's process
    deadline = time.monotonic() + GONE_WITHIN_S
    while not child_pid_file.exists() or not child_pid_file.read_text():
        assert time.monotonic() < deadline, "the leftover never started its child"
        time.sleep(0.05)
    child = int(child_pid_file.read_text())

    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*qwenperf: stopped * process(es) left running by a session that died:*",
            f"*pid {leftover.pid} (started by pid {dead_owner.split('-')[0]}, gone)*",
            f"*pid {child} *",
        ]
    )
    assert not alive(leftover.pid) and not alive(child)
    assert [alive(p.pid) for p in (live_session, untagged, other_user)] == [True, True, True]


# --------------------------------------------------------------------- GPU memory held


B200_SUITE = Path(__file__).parents[2] / "perf_tests" / "suites" / "b200.toml"


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[fake_pynvml.FakeGpu]]:
    """Eight B200s through the NVML fake; the tests script the processes on them."""
    gpus = [fake_pynvml.FakeGpu(uuid=f"GPU-{i:08d}", name="NVIDIA B200") for i in range(8)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.module(gpus))
    monkeypatch.setattr(gpu_memory, "DRAIN_TIMEOUT_S", 1.0)
    hardware.detect.cache_clear()
    yield gpus
    hardware.detect.cache_clear()


def _b200_session(pytester: pytest.Pytester, marker: Path) -> pytest.RunResult:
    """An inner session of the b200 suite whose launcher only leaves a mark: a boot shows as the file."""
    launcher = f"{sys.executable} -c \"open({str(marker)!r}, 'a').write('booted')\""
    pytester.makepyfile(
        test_one="""
def test_one(qwenperf_run): pass
"""
    )
    return pytester.runpytest_inprocess(
        f"--qwenperf-suite={B200_SUITE}", f"--qwenperf-launcher={launcher}", "--qwenperf-boot-timeout=5", "-p", "no:cacheprovider", "-x"
    )


def test_gpu_memory_in_use_fails_the_session_before_any_boot(
    pytester: pytest.Pytester, fake_gpus: list[fake_pynvml.FakeGpu], processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    holder = _start(processes, SLEEPER, None)
    fake_gpus[3].processes = [(holder.pid, 70 * 2**30)]
    fake_gpus[5].processes = [(holder.pid + 1_000_000, None)]  # another PID namespace: no command, no figure
    marker = tmp_path / "booted"

    result = _b200_session(pytester, marker)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*GPU memory is in use by other processes on GPUs this session needs*",
            f"*GPU 3: pid {holder.pid} (*-c {SLEEPER}*) holds 70.0 GiB*",
            f"*GPU 5: pid {holder.pid + 1_000_000} (?) holds an unknown amount of memory*",
        ]
    )
    assert not marker.exists(), "a server was booted although the GPUs were busy"


def test_free_gpus_let_the_session_boot(pytester: pytest.Pytester, fake_gpus: list[fake_pynvml.FakeGpu], tmp_path: Path) -> None:
    marker = tmp_path / "booted"
    result = _b200_session(pytester, marker)
    assert result.ret != pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    assert marker.exists(), "with free GPUs the session should have tried to boot"


# ------------------------------------------------------------- real CPU vLLM, killed


HOLD = """
import time, pytest
from pytest_qwenperf.suite.config import tiny_cpu_config
TINY = tiny_cpu_config("{name}", ("--enforce-eager",))  # eager: no compile warm-up (tests/e2e/tiny.py EAGER)

@pytest.fixture
def slow_teardown():
    yield
    time.sleep(300)  # a teardown the runner's SIGKILL cuts short

@pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])
def test_hold(vllm_server, slow_teardown):
    open({ready!r}, "w").write("up")
    time.sleep(600)
"""


@pytest.fixture
def inner_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The inner sessions' temporary folder (``TMPDIR``): a new one, at a short path, as a Unix
    socket's path is at most 107 bytes long; removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="tmpdir-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _inner_session_with_vllm(pytester: pytest.Pytester, tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    ready = tmp_path / "ready"
    pytester.makepyfile(test_hold=HOLD.format(name=name, ready=str(ready)))
    with open(tmp_path / "inner.out", "w") as out:
        inner = pytester.popen(interruptible([sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]), stdout=out, stderr=out)
    tree = wait_for_tree(inner, ready, timeout=600)
    assert any("EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM") for p in tree), _describe(tree)
    return inner, tree


def _left_in(tmp: Path) -> list[str]:
    """What a server tree left in the temporary folder: vLLM's IPC sockets (it makes them there
    unless told otherwise, and removes none), its torch.distributed rendezvous file (``vllm_dist_<uuid>``,
    one a boot) and the tree's own folder for them (serving.process.scratch_folder)."""
    return sorted(
        str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_socket() or p.name.startswith(("qwenperf-", "vllm_dist_"))
    )


@pytest.mark.e2e
def test_sigkill_of_a_session_leaves_no_vllm_process(pytester: pytest.Pytester, tmp_path: Path, inner_tmpdir: Path) -> None:
    inner, tree = _inner_session_with_vllm(pytester, tmp_path, "sigkilled")
    try:
        assert _left_in(inner_tmpdir), "the server's sockets are where the check looks"
        inner.kill()
        inner.wait()
        assert _describe(_wait_all_gone(tree)) == []
        assert proctree.tagged_processes(f"{inner.pid}-") == []
        assert _left_in(inner_tmpdir) == []
    finally:
        end_inner_session(inner)


@pytest.mark.e2e
def test_github_actions_cancel_sequence_leaves_no_vllm_process(pytester: pytest.Pytester, tmp_path: Path, inner_tmpdir: Path) -> None:
    """What a cancelled Actions job does: SIGINT, SIGTERM 7.5 s later, SIGKILL 2.5 s after
    that. The inner session's teardown is slow (a fixture sleeps), so SIGKILL lands while
    its server is still up, as it does on a runner whose teardown takes too long."""
    inner, tree = _inner_session_with_vllm(pytester, tmp_path, "cancelled")
    try:
        for sig, wait in ((signal.SIGINT, 7.5), (signal.SIGTERM, 2.5), (signal.SIGKILL, 0.0)):
            if inner.poll() is None:
                inner.send_signal(sig)
            time.sleep(wait)
        inner.wait()
        assert _describe(_wait_all_gone(tree)) == []
        assert proctree.tagged_processes(f"{inner.pid}-") == []
        assert _left_in(inner_tmpdir) == []
    finally:
        end_inner_session(inner)
