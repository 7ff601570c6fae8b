"""Nothing overwritten or lost: the files qwenperf writes, driven as a user drives them.

The command line runs as a subprocess (``qwenperf tiny-model``, ``qwenperf bench``) and the
plugin in inner pytest sessions. These tests run as root here and in CI, where permission
bits stop nothing, so an unwritable place is one that no user can write: a path under a
regular file, a path that is a folder, or /sys (sysfs takes no new files, even from root).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_qwenperf.core import files
from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.gate.baseline import load_baseline
from pytest_qwenperf.measure.report import ServersSpent, SessionReport
from pytest_qwenperf.suite.tiny_model import MARKER, TinyModelSpec

REPO = Path(__file__).resolve().parents[2]
QWENPERF = str(Path(sys.executable).parent / "qwenperf")
STANDIN = f"{sys.executable} {REPO / 'tests' / 'standins' / 'openai_standin.py'}"
PUBLISHED = REPO / "baselines" / "b200" / "Qwen--Qwen3.5-27B-FP8" / "dp8" / "isl1024-osl512.json"
UNWRITABLE = ["parent-is-a-file", "is-a-folder", "under-sys"]


def cli(*args: str, umask: int = -1) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QWENPERF, *args], capture_output=True, text=True, timeout=300, umask=umask, check=False)


def inner(pytester: pytest.Pytester, *args: str, umask: int = -1) -> subprocess.CompletedProcess[str]:
    """An inner pytest session in ``pytester.path``, as a user starts it (with a umask of its own when given)."""
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'basetemp'}", *args]
    return subprocess.run(argv, cwd=pytester.path, capture_output=True, text=True, timeout=300, umask=umask, check=False)


def unwritable_path(tmp_path: Path, kind: str) -> Path:
    if kind == "parent-is-a-file":
        (tmp_path / "plain-file").write_text("a user's file\n")
        return tmp_path / "plain-file" / "out.json"
    if kind == "is-a-folder":
        (tmp_path / "out.json").mkdir()
        return tmp_path / "out.json"
    assert kind == "under-sys"
    return Path("/sys/qwenperf-test/out.json")


def modes(folder: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------- tiny-model DIR


def test_tiny_model_refuses_a_dir_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.write_text("a user's notes\n")
    done = cli("tiny-model", str(target))
    assert done.returncode == 2, done.stderr
    expected = f"qwenperf tiny-model: {target}: is a file, not a folder; give a new or empty folder for the model"
    assert done.stderr.strip() == expected
    assert target.read_text() == "a user's notes\n"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_tiny_model_refuses_a_folder_holding_a_users_files_and_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text('{"mine": true}\n')  # a name the model also writes
    (target / "notes.txt").write_text("keep me\n")
    before = snapshot(target)
    done = cli("tiny-model", str(target))
    assert done.returncode == 2, done.stderr
    assert f"{target}: not written, the folder holds files that are not the tiny model's: " in done.stderr
    assert "config.json (not written by qwenperf tiny-model)" in done.stderr
    assert "notes.txt (not written by qwenperf tiny-model)" in done.stderr
    assert snapshot(target) == before
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "notes.txt"]  # no marker, no temp file


def test_tiny_model_reuses_its_own_folder_rewrites_it_for_another_seed_and_refuses_it_once_touched(tmp_path: Path) -> None:
    target, fresh = tmp_path / "model", tmp_path / "fresh-seed-1"
    assert cli("tiny-model", str(target)).returncode == 0
    written = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}
    assert MARKER in written and len(written) == 8

    again = cli("tiny-model", str(target))  # same seed: reused as it is
    assert (again.returncode, again.stdout.strip()) == (0, str(target))
    assert {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == written

    other = cli("tiny-model", str(target), "--seed", "1")  # every file is ours: rewritten for the new seed
    assert other.returncode == 0, other.stderr
    assert cli("tiny-model", str(fresh), "--seed", "1").returncode == 0
    assert snapshot(target) == snapshot(fresh)
    assert json.loads((target / MARKER).read_text())["fingerprint"] == TinyModelSpec(seed=1).fingerprint()

    with (target / "config.json").open("a") as edit:  # a user tuned the config by hand
        edit.write(" ")
    (target / "README.md").write_text("my notes\n")
    before = snapshot(target)
    refused = cli("tiny-model", str(target))
    assert refused.returncode == 2
    assert "README.md (not written by qwenperf tiny-model)" in refused.stderr
    assert "config.json (changed since qwenperf tiny-model wrote it)" in refused.stderr
    assert snapshot(target) == before


# ----------------------------------------------------------------- kept copies of the session JSON

RECORD = """
import pytest
from pytest_qwenperf.suite.config import ServingConfig
VERSION = ServingConfig(id="{version}", model="m")
@pytest.mark.parametrize("serving_config", [VERSION], ids=[VERSION.id])
def test_boot(vllm_server): pass
"""


def test_session_json_versions_written_in_the_same_second_all_survive(pytester: pytest.Pytester) -> None:
    """Three sessions write results.json; before each, the file's mtime is set to the same second
    (what three quick sessions do), so kept copies named by the second would overwrite each other."""
    same_second = 1_780_000_000.0
    for version in ("v1", "v2", "v3"):
        pytester.makepyfile(test_record=RECORD.format(version=version))
        done = inner(pytester, f"--qwenperf-launcher={STANDIN}", "--qwenperf-json=results.json")
        assert done.returncode == 0, done.stdout + done.stderr
        os.utime(pytester.path / "results.json", (same_second, same_second))
    assert "previous file kept as " in done.stdout
    versions = {p.name: list(json.loads(p.read_text())["boots"]) for p in pytester.path.glob("results*.json")}
    assert versions["results.json"] == ["v3"]
    assert sorted(versions.values()) == [["v1"], ["v2"], ["v3"]], versions
    assert len(versions) == 3


def _write_versions(path: Path, count: int) -> None:
    for n in range(count):
        SessionReport().write_json(path, ServersSpent(boots={f"v{n}": 1}))
        os.utime(path, (1_780_000_000.0, 1_780_000_000.0))


def test_kept_copies_never_collide_where_the_filesystem_has_no_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")  # what vfat and some network filesystems answer

    monkeypatch.setattr(files.os, "link", no_links)
    _write_versions(tmp_path / "results.json", 3)
    kept = {p.name: list(json.loads(p.read_text())["boots"]) for p in tmp_path.iterdir()}
    assert sorted(kept.values()) == [["v0"], ["v1"], ["v2"]] and kept["results.json"] == ["v2"]


CONCURRENT = """
import sys, time
from pathlib import Path
from pytest_qwenperf.measure.report import ServersSpent, SessionReport
go, n = Path(sys.argv[1]), sys.argv[2]
while not go.exists():
    time.sleep(0.001)
SessionReport().write_json(Path(sys.argv[3]), ServersSpent(boots={"writer-" + n: 1}))
"""


def test_writers_finishing_at_the_same_moment_all_keep_their_results(tmp_path: Path) -> None:
    go, path = tmp_path / "go", tmp_path / "out" / "results.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", CONCURRENT, str(go)]
    writers = [subprocess.Popen([*argv, str(n), str(path)], env=env, stderr=subprocess.PIPE, text=True) for n in range(4)]
    go.touch()
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0, 0], errors
    found = sorted(name for p in path.parent.iterdir() for name in json.loads(p.read_text())["boots"])
    assert found == [f"writer-{n}" for n in range(4)]


# ----------------------------------------------------------------- baselines: hand-set tolerances, published figures

RUNS = """
from pathlib import Path
from pytest_qwenperf.suite.config import load_suite
from pytest_qwenperf.serving.hardware import Hardware
from pytest_qwenperf.core.summary import RunSummary, TokenCrossCheck
from pytest_qwenperf.loadgen.arrivals import ClosedLoop
from pytest_qwenperf.loadgen.client import LoadResult
from pytest_qwenperf.loadgen.assignment import LoadOptions
from pytest_qwenperf.plugin.settings import REPORT_KEY
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.observe import ClientSetup, Observation
from pytest_qwenperf.measure.run import build_run
from pytest_qwenperf.serving.server import ServerInfo
from pytest_qwenperf.telemetry import TelemetrySummary

SUITES = Path({suites!r})
CPU = Hardware(kind="cpu", cpu_model="Test CPU", cpu_ids=frozenset({{0, 1}}))
B200 = Hardware(kind="b200", gpu_name="NVIDIA B200", gpu_count=8)


def measured(pytestconfig, suite_name, config_id, workload_id, hardware, total):
    \"\"\"Adds to the session's report the run a load test would have measured.\"\"\"
    suite = load_suite(SUITES / f"{{suite_name}}.toml")
    summary = RunSummary.from_values(
        {{
            "duration": 10.0, "completed": 256, "failed": 0, "total_input_tokens": 32768, "total_output_tokens": 32768,
            "request_throughput": total / 256, "output_throughput": total / 2, "total_token_throughput": total,
            "p99_ttft_ms": 200.0, "p99_tpot_ms": 20.0, "achieved_request_rate": float("inf"),
        }}
    )
    pytestconfig.stash[REPORT_KEY].add(
        build_run(
            suite.config(config_id), next(w for w in suite.workloads if w.id == workload_id), Observation(
                load=LoadResult((), 0.0, 10.0, ClosedLoop(1), LoadOptions(), ((1,),)), summary=summary, steady=None,
                server_deltas={{}}, requests_per_server={{}}, tokens=TokenCrossCheck(1, 1, 1.0, 1.0, 0, True),
                client_bound=None, client_cpu_busy=0.4, started="2026-04-01T02:00:00+00:00",
                telemetry=TelemetrySummary(window=None, gpu=None, cpu=None, server=None),
            ),
            Method.of(suite, repeats(1), ClientSetup()), (ServerInfo("http://127.0.0.1:8000", "m", "0.32.0", 2048),), hardware,
        )
    )
"""

CPU_RUN = """
from runs import CPU, measured
def test_measure(pytestconfig): measured(pytestconfig, "cpu", "base", "isl128-osl128", CPU, {total})
"""

B200_RUN = """
from runs import B200, measured
def test_measure(pytestconfig): measured(pytestconfig, "b200", "dp8", "isl1024-osl512", B200, 80_000.0)
"""


@pytest.fixture
def runs(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(runs=RUNS.format(suites=str(REPO / "perf_tests" / "suites")))
    return pytester


def test_update_baselines_keeps_a_tolerance_set_by_hand(runs: pytest.Pytester) -> None:
    runs.makepyfile(test_measure=CPU_RUN.format(total=10_000.0))
    first = inner(runs, "--qwenperf-update-baselines")
    assert first.returncode == 0 and "qwenperf: baseline written: " in first.stdout, first.stdout + first.stderr
    path = runs.path / "baselines" / "cpu-test-cpu-2c" / "embedded-tiny" / "base" / "isl128-osl128.json"
    data = json.loads(path.read_text())
    assert data["metrics"]["total_token_throughput"]["tolerance"] == 0.10  # the cpu suite's
    data["metrics"]["total_token_throughput"]["tolerance"] = 0.4  # loosened by hand, as the docs invite
    path.write_text(json.dumps(data, indent=2))

    runs.makepyfile(test_measure=CPU_RUN.format(total=12_000.0))
    second = inner(runs, "--qwenperf-update-baselines")
    assert second.returncode == 0 and "qwenperf: baseline written: " in second.stdout, second.stdout + second.stderr
    stored = load_baseline(path)
    assert stored.metrics["total_token_throughput"].value == 12_000.0
    assert stored.metrics["total_token_throughput"].tolerance == 0.4
    assert stored.metrics["output_throughput"].tolerance == 0.10
    assert stored.history[0].metrics["total_token_throughput"].tolerance == 0.4


@pytest.fixture
def published(runs: pytest.Pytester) -> Path:
    path = runs.path / "baselines" / PUBLISHED.relative_to(REPO / "baselines")
    path.parent.mkdir(parents=True)
    shutil.copyfile(PUBLISHED, path)
    runs.makepyfile(test_measure=B200_RUN)
    return path


def test_update_baselines_keeps_a_published_baseline_and_names_the_flag(runs: pytest.Pytester, published: Path) -> None:
    before = published.read_bytes()
    done = inner(runs, "--qwenperf-update-baselines")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"qwenperf: {published}: not updated: it holds published figures" in done.stdout, done.stdout
    assert "--qwenperf-replace-published b200/dp8 or --qwenperf-replace-published " in done.stdout
    assert published.read_bytes() == before


@pytest.mark.parametrize("named", ["config-key", "file"])
def test_update_baselines_replaces_a_published_baseline_when_a_flag_names_it(
    runs: pytest.Pytester, published: Path, named: str
) -> None:
    name = "b200/dp8" if named == "config-key" else str(published.relative_to(runs.path))
    done = inner(runs, "--qwenperf-update-baselines", f"--qwenperf-replace-published={name}")
    assert done.returncode == 0 and "qwenperf: baseline written: " in done.stdout, done.stdout + done.stderr
    stored = load_baseline(published)
    assert stored.provenance.kind == "measured" and stored.metrics["total_token_throughput"].value == 80_000.0
    assert [h.provenance.kind for h in stored.history] == ["published"]


def test_replace_published_without_update_baselines_is_a_usage_error(runs: pytest.Pytester, published: Path) -> None:
    done = inner(runs, "--qwenperf-replace-published=b200/dp8")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--qwenperf-replace-published: only takes effect with --qwenperf-update-baselines" in done.stderr


# ----------------------------------------------------------------- writability, checked before anything runs

BOOTS = """
import pytest
from pytest_qwenperf.suite.config import ServingConfig
A = ServingConfig(id="cfg-a", model="m")
@pytest.mark.parametrize("serving_config", [A], ids=[A.id])
def test_boot(vllm_server):
    open("booted", "w").close()
"""


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_an_unwritable_session_json_fails_before_any_server_boots(pytester: pytest.Pytester, tmp_path: Path, kind: str) -> None:
    target = unwritable_path(tmp_path, kind)
    pytester.makepyfile(test_boot=BOOTS)
    done = inner(pytester, f"--qwenperf-launcher={STANDIN}", f"--qwenperf-json={target}", "--qwenperf-log-dir=logs")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert f"--qwenperf-json {target}: cannot write the results there: " in done.stderr
    assert not (pytester.path / "booted").exists() and not (pytester.path / "logs").exists()


@pytest.mark.parametrize("kind", ["parent-is-a-file", "is-a-file", "under-sys"])
def test_an_unwritable_baseline_folder_fails_before_any_server_boots(
    pytester: pytest.Pytester, tmp_path: Path, kind: str
) -> None:
    (tmp_path / "plain-file").write_text("a user's file\n")
    target = {"parent-is-a-file": tmp_path / "plain-file" / "b", "is-a-file": tmp_path / "plain-file"}.get(
        kind, Path("/sys/qwenperf-test")
    )
    pytester.makepyfile(test_boot=BOOTS)
    done = inner(pytester, f"--qwenperf-launcher={STANDIN}", "--qwenperf-update-baselines", f"--qwenperf-baselines={target}")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert f"--qwenperf-update-baselines: cannot write baselines into the folder {target} " in done.stderr
    assert not (pytester.path / "booted").exists()
    assert (tmp_path / "plain-file").read_text() == "a user's file\n"


@pytest.fixture
def listening() -> Iterator[tuple[str, list[object]]]:
    """A port that records every connection made to it (and closes it at once)."""
    server = socket.create_server(("127.0.0.1", 0))
    connections: list[object] = []

    def accept() -> None:
        while True:
            try:
                conn, peer = server.accept()
            except OSError:
                return
            connections.append(peer)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", connections
    server.close()


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_bench_refuses_an_unwritable_json_before_probing_the_endpoints(
    tmp_path: Path, listening: tuple[str, list[object]], kind: str
) -> None:
    url, connections = listening
    target = unwritable_path(tmp_path, kind)
    done = cli("bench", "--endpoint", url, "--num-prompts", "4", "--json", str(target), "--progress", "off")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"qwenperf: --json {target}: cannot write the result there: "), done.stderr
    assert connections == [], "the endpoint was probed before the output path was checked"


# ----------------------------------------------------------------- modes and durability


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664)])
def test_files_get_the_users_umask(runs: pytest.Pytester, umask: int, mode: int) -> None:
    model = runs.path / "model"
    assert cli("tiny-model", str(model), umask=umask).returncode == 0
    assert set(modes(model).values()) == {mode}, modes(model)

    runs.makepyfile(test_measure=CPU_RUN.format(total=10_000.0))
    done = inner(runs, "--qwenperf-json=results.json", "--qwenperf-update-baselines", umask=umask)
    assert done.returncode == 0, done.stdout + done.stderr
    baseline = runs.path / "baselines" / "cpu-test-cpu-2c" / "embedded-tiny" / "base" / "isl128-osl128.json"
    assert stat.S_IMODE((runs.path / "results.json").stat().st_mode) == mode
    assert stat.S_IMODE(baseline.stat().st_mode) == mode


def test_a_replaced_file_keeps_its_mode(runs: pytest.Pytester) -> None:
    """A team made its baseline group-writable and its results private: updates keep that."""
    runs.makepyfile(test_measure=CPU_RUN.format(total=10_000.0))
    assert inner(runs, "--qwenperf-json=results.json", "--qwenperf-update-baselines").returncode == 0
    baseline = runs.path / "baselines" / "cpu-test-cpu-2c" / "embedded-tiny" / "base" / "isl128-osl128.json"
    baseline.chmod(0o664)
    (runs.path / "results.json").chmod(0o600)
    done = inner(runs, "--qwenperf-json=results.json", "--qwenperf-update-baselines", umask=0o022)
    assert done.returncode == 0 and "previous file kept as" in done.stdout, done.stdout + done.stderr
    assert stat.S_IMODE(baseline.stat().st_mode) == 0o664
    assert stat.S_IMODE((runs.path / "results.json").stat().st_mode) == 0o600
    assert len(load_baseline(baseline).history) == 1


def test_the_folder_is_fsynced_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real os.fsync and os.replace, observed: which kind of file each fsync was on, and in what order."""
    calls: list[tuple[str, tuple[int, int]]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        calls.append(("fsync folder" if stat.S_ISDIR(info.st_mode) else "fsync file", (info.st_dev, info.st_ino)))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        info = os.stat(dst)
        calls.append(("rename", (info.st_dev, info.st_ino)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "baseline.json"
    write_atomically(path, "{}")
    written, folder = os.stat(path), os.stat(tmp_path)
    assert calls == [
        ("fsync file", (written.st_dev, written.st_ino)),
        ("rename", (written.st_dev, written.st_ino)),
        ("fsync folder", (folder.st_dev, folder.st_ino)),
    ]
