"""Operator profiles: the trace summarizer on a hand-written Chrome trace, how a vLLM's profiler is turned
on per release, the capture between /start_profile and /stop_profile against a stand-in server, the
profile repeat after the measured ones, and the profiles in ``qwenperf compare``."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from pytest_qwenperf.cli.main import main
from pytest_qwenperf.core.profile import OperatorProfile, OperatorShare, OperatorTable, TraceError, share_changes, summarize
from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.measure import run as run_module
from pytest_qwenperf.measure import sequential
from pytest_qwenperf.measure.method import Method, repeats
from pytest_qwenperf.measure.profile import ProfilerLeftOn, ProfileSetting, ProfilingFailed, capture
from pytest_qwenperf.serving.server import ManagedServer, ServerSpec
from pytest_qwenperf.suite import vllm_args
from pytest_qwenperf.suite.vllm_args import launcher_python, profiler_launch, profiler_switch
from tests.test_baseline import make_run, suite
from tests.test_compare import session_file
from tests.test_measure_sequential import repeat_at

TRACE = Path(__file__).parent / "data" / "profile-two-threads.pt.trace.json"
"""Thread 10: an annotated step holding aten::linear (50 µs: aten::mm 30 and aten::add 5 inside) and another
aten::mm (20); thread 11, at the same times: aten::mm (40, aten::copy_ 10 inside); two GPU streams."""


# ------------------------------------------------------------------ the summarizer


def test_self_time_is_the_duration_less_the_events_nested_on_the_same_thread() -> None:
    cpu, gpu = summarize([TRACE])
    found = {op.name: (op.self_us, op.count) for op in cpu.operators}
    # mm: 30 + 20 on thread 10, 40 - 10 on thread 11 (not nested in thread 10's linear, which overlaps it in time);
    # the step's annotation keeps what its operators leave (100 - 50 - 20), under its name with the numbers folded;
    # the Python function and the profiler's own span are no rows, and nest nothing.
    step = "execute_context_N(N)_generation_N(N)"
    assert found == {"aten::mm": (80.0, 3), step: (30.0, 1), "aten::linear": (15.0, 1), "aten::copy_": (10.0, 1), "aten::add": (5.0, 1)}
    assert [op.name for op in cpu.operators] == ["aten::mm", step, "aten::linear", "aten::copy_", "aten::add"]
    assert cpu.total_us == 140.0 and cpu.operators[0].share == pytest.approx(80 / 140)
    assert sum(op.share for op in cpu.operators) == pytest.approx(1.0)
    assert gpu is not None and gpu.total_us == 12.0
    assert [(op.name, op.self_us, op.count) for op in gpu.operators] == [("gemm_kernel", 10.0, 2), ("Memcpy HtoD (Pageable -> Device)", 2.0, 1)]


def test_gzipped_traces_read_alike_and_the_traces_of_a_point_add_up(tmp_path: Path) -> None:
    packed = tmp_path / "rank0.1.pt.trace.json.gz"
    packed.write_bytes(gzip.compress(TRACE.read_bytes()))
    assert summarize([packed]) == summarize([TRACE])
    cpu, _ = summarize([TRACE, packed])  # two ranks of one point
    assert cpu.total_us == 280.0 and cpu.operators[0] == OperatorShare(name="aten::mm", self_us=160.0, share=160 / 280, count=6)
    top = summarize([TRACE], top=2)[0]
    assert [op.name for op in top.operators] == ["aten::mm", "execute_context_N(N)_generation_N(N)"] and top.total_us == 140.0


def test_a_host_only_trace_has_no_device_table_and_a_child_that_outlasts_its_parent_takes_only_its_overlap(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 5.0, "dur": 10.0},
    ]
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(events))  # a bare list of events is a Chrome trace too
    cpu, gpu = summarize([path])
    assert gpu is None and {op.name: op.self_us for op in cpu.operators} == {"outer": 5.0, "inner": 10.0}


@pytest.mark.parametrize(("content", "why"), [(b"{not json", "cannot read the trace"), (b'{"traceEvents": 3}', "no traceEvents list")])
def test_an_unreadable_trace_names_the_file(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "bad.pt.trace.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=rf"{path}: {why}"):
        summarize([path])


def test_share_changes_rank_the_largest_moves_and_count_an_unlisted_share_as_zero() -> None:
    def table(**shares: float) -> OperatorTable:
        return OperatorTable(total_us=100.0, operators=tuple(OperatorShare(name=n, self_us=s * 100, share=s, count=1) for n, s in shares.items()))

    before, after = table(mm=0.5, add=0.3, copy=0.2), table(mm=0.7, add=0.25, attn=0.05)
    moved = share_changes(before, after)
    assert [(c.name, round(c.change, 3)) for c in moved] == [("mm", 0.2), ("copy", -0.2), ("add", -0.05), ("attn", 0.05)]
    assert (moved[1].reference, moved[1].now) == (0.2, None)
    assert share_changes(before, before) == ()


# ------------------------------------------------------------------ turning the profiler on, per release


def fake_vllm(root: Path, version: str, *, profiler_flag: bool) -> Path:
    """A ``vllm`` package with only what building the serve parser needs, as a release of ``version`` has it."""
    package = root / "vllm"
    for sub in ("platforms", "utils", "entrypoints", "entrypoints/openai"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (package / "platforms" / "__init__.py").write_text("class CpuPlatform:\n    pass\n\ncurrent_platform = CpuPlatform()\n")
    (package / "utils" / "__init__.py").write_text("from argparse import ArgumentParser as FlexibleArgumentParser\n")
    flag = "    parser.add_argument('--profiler-config', type=__import__('json').loads)\n" if profiler_flag else ""
    (package / "entrypoints" / "openai" / "cli_args.py").write_text(
        "def make_arg_parser(parser):\n    for name in ('--model', '--host', '--port'):\n        parser.add_argument(name)\n" + flag + "    return parser\n"
    )
    return root


@pytest.mark.parametrize(
    ("version", "has_flag", "expected"), [("0.32.0", True, "--profiler-config"), ("0.10.1", False, "VLLM_TORCH_PROFILER_DIR")]
)
def test_the_switch_is_the_installed_parsers_flag_else_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, has_flag: bool, expected: str
) -> None:
    """The real parser child, on a stand-in vLLM (ahead of the installed one on the path) with or without the flag."""
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm(tmp_path, version, profiler_flag=has_flag)))
    assert profiler_switch(sys.executable) == expected


def test_a_parser_that_rejects_the_profiler_config_itself_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_args, "_ask", lambda python, argvs: {"version": "0.40.0", "errors": {"profiler": "argument --profiler-config: bad"}})
    with pytest.raises(vllm_args.ParserUnavailable, match="rejects the profiler config"):
        profiler_switch("python")


def test_the_flag_and_the_variable_each_write_operators_only_into_the_folder() -> None:
    flags, env = profiler_launch("--profiler-config", "/runs/tiny.profiles")
    assert flags[0] == "--profiler-config" and env == {}
    assert json.loads(flags[1]) == {
        "profiler": "torch",
        "torch_profiler_dir": "/runs/tiny.profiles",
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
    }
    assert profiler_launch("VLLM_TORCH_PROFILER_DIR", "/runs/tiny.profiles") == (
        (),
        {"VLLM_TORCH_PROFILER_DIR": "/runs/tiny.profiles", "VLLM_TORCH_PROFILER_WITH_STACK": "0"},
    )


@pytest.mark.parametrize(
    ("launcher", "python"),
    [
        (("/opt/vllm-a/bin/python", "-m", "vllm.entrypoints.openai.api_server"), "/opt/vllm-a/bin/python"),
        (("env", "A=1", "/venv/bin/python3", "-m", "benchmarks.quota_launcher", "--", "/v/python", "-m", "vllm.entrypoints.openai.api_server"), "/v/python"),
        (("/usr/bin/python3.11", "serve.py"), "/usr/bin/python3.11"),
        (("vllm", "serve"), sys.executable),
    ],
)
def test_the_launchers_python_is_the_one_that_runs_vllm(launcher: tuple[str, ...], python: str) -> None:
    assert launcher_python(launcher) == python


@pytest.mark.parametrize("switch", ["--profiler-config", "VLLM_TORCH_PROFILER_DIR"])
def test_a_profiled_server_starts_with_its_traces_folder_beside_its_log(tmp_path: Path, switch: vllm_args.ProfilerSwitch) -> None:
    server = ManagedServer(ServerSpec(model="m", args=("--dtype", "bfloat16"), name="tiny", profiler=switch), tmp_path)
    launch = server._launch(8000)
    flags, env = profiler_launch(switch, str(tmp_path / "tiny.profiles"))
    assert launch.argv[len(launch.argv) - len(flags) :] == flags and {"--dtype", "bfloat16"} <= set(launch.argv)
    assert {k: launch.env[k] for k in env} == env
    plain = ManagedServer(ServerSpec(model="m", name="plain"), tmp_path)._launch(8001)
    assert "--profiler-config" not in plain.argv and "VLLM_TORCH_PROFILER_DIR" not in plain.env


# ------------------------------------------------------------------ the capture, against a stand-in server


class StandIn:
    """A server that profiles as vLLM does: ``/server_info`` names its folder, ``/stop_profile`` writes the
    trace there (and its key-averages table) and answers only then, after ``write_s``."""

    def __init__(self, folder: Path, *, stop_status: int = 200, start_status: int = 200, write_s: float = 0.2) -> None:
        self.folder, self.stop_status, self.start_status, self.write_s = folder, stop_status, start_status, write_s
        self.events: list[str] = []
        self.profiling = False
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps({"vllm_config": {"profiler_config": {"profiler": "torch", "torch_profiler_dir": str(folder)}}})
                self._answer(200, body.encode())

            def do_POST(self) -> None:
                stand_in.events.append(self.path)
                if self.path == "/start_profile":
                    stand_in.profiling = stand_in.start_status == 200
                    self._answer(stand_in.start_status)
                elif self.path == "/stop_profile" and stand_in.stop_status == 200:
                    time.sleep(stand_in.write_s)
                    folder.mkdir(exist_ok=True)
                    shutil.copy(TRACE, folder / f"dp0_rank0.{time.time_ns()}.pt.trace.json")
                    (folder / "dp0_rank0.profiler_out.txt").write_text("key averages\n")
                    stand_in.profiling = False
                    self._answer(200)
                else:
                    self._answer(stand_in.stop_status)

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self) -> StandIn:
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    (tmp_path / "server.profiles").mkdir()
    (tmp_path / "server.profiles" / "earlier.pt.trace.json").write_text("[]")  # another profile's: not this one's
    with StandIn(tmp_path / "server.profiles") as server:
        yield server


def test_capture_drives_between_start_and_stop_and_returns_once_the_traces_are_written(tmp_path: Path, stand_in: StandIn) -> None:
    def drive() -> None:
        assert stand_in.profiling, "the load must run while the profiler is on"
        stand_in.events.append("load")

    folder = tmp_path / "results.profiles" / "cpu" / "base" / "isl128-osl128"
    profile = capture([stand_in.url], drive, folder, relative_to=tmp_path)
    assert stand_in.events == ["/start_profile", "load", "/stop_profile"] and not stand_in.profiling
    assert profile.stop_s is not None and profile.stop_s >= 0.2
    (trace,) = profile.traces
    assert trace.startswith("results.profiles/cpu/base/isl128-osl128/dp0_rank0.") and (tmp_path / trace).is_file()
    assert (folder / "dp0_rank0.profiler_out.txt").is_file() and sorted(p.name for p in stand_in.folder.iterdir()) == ["earlier.pt.trace.json"]
    assert profile.cpu == summarize([TRACE])[0] and profile.gpu == summarize([TRACE])[1]


def test_without_a_folder_the_traces_stay_where_the_server_wrote_them(stand_in: StandIn) -> None:
    profile = capture([stand_in.url], lambda: None, None)
    (trace,) = profile.traces
    assert Path(trace).parent == stand_in.folder.resolve() and Path(trace).is_file()


def test_a_failed_load_still_turns_the_profiler_off(tmp_path: Path, stand_in: StandIn) -> None:
    def drive() -> None:
        raise RuntimeError("the server stopped")

    with pytest.raises(RuntimeError, match="the server stopped"):
        capture([stand_in.url], drive, tmp_path / "p")
    assert stand_in.events == ["/start_profile", "/stop_profile"] and not stand_in.profiling


def test_a_server_without_a_profiler_is_named_and_nothing_is_driven(tmp_path: Path) -> None:
    with StandIn(tmp_path / "dir", start_status=404) as server:
        with pytest.raises(ProfilingFailed, match=rf"POST {server.url}/start_profile answered 404: the server runs without a profiler"):
            capture([server.url], lambda: pytest.fail("nothing may be driven"), tmp_path / "p")
        assert server.events == ["/start_profile"]


def test_a_stop_that_fails_leaves_the_profiler_possibly_on(tmp_path: Path) -> None:
    with StandIn(tmp_path / "dir", stop_status=500) as server, pytest.raises(ProfilerLeftOn, match="/stop_profile answered 500"):
        capture([server.url], lambda: None, tmp_path / "p")


# ------------------------------------------------------------------ the profile repeat of a point


def test_the_profile_repeat_comes_after_the_measured_ones_and_is_not_among_their_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    measured = iter([repeat_at(f) for f in (1.0, 1.02, 0.98, 1.0)])

    def repeat(*args: object, **kwargs: object) -> object:
        events.append("measured repeat")
        return next(measured)

    def once(*args: object, **kwargs: object) -> object:
        events.append("profiled load run")
        return repeat_at(0.5)[1]  # far slower: were it among the samples, they would show it

    def fake_capture(urls: list[str], drive: Any, folder: Path, **kwargs: Any) -> OperatorProfile:
        events.append(f"start {urls} into {folder.relative_to(tmp_path)}")
        drive()
        events.append("stopped")
        return OperatorProfile(traces=("t.pt.trace.json",), cpu=OperatorTable(total_us=1.0))

    monkeypatch.setattr(sequential, "measure_repeat", repeat)
    monkeypatch.setattr(run_module.Driver, "_observed", once)
    monkeypatch.setattr(run_module, "reset_prefix_caches", lambda urls: True)
    monkeypatch.setattr(run_module, "capture", fake_capture)
    server = SimpleNamespace(base_urls=("http://s:1",), load_urls=("http://s:1",), check_alive=lambda: None)
    cpu = suite("cpu")
    method = Method(plan=repeats(3), profile=ProfileSetting(tmp_path / "r.profiles"))
    decided = sequential.measure_point(cast(Any, server), cpu.config("base"), cpu.workloads[0], method, lambda run: None)
    assert events == [*["measured repeat"] * 3, "start ('http://s:1',) into r.profiles/cpu/base/isl128-osl128", "profiled load run", "stopped"]
    assert decided.run.profile is not None and decided.run.samples is not None
    assert sorted(decided.run.samples["output_throughput"]) == [4_900.0, 5_000.0, 5_100.0]
    unprofiled = sequential.measure_point(cast(Any, server), cpu.config("base"), cpu.workloads[0], Method(plan=repeats(1)), lambda run: None)
    assert unprofiled.run.profile is None and events.count("profiled load run") == 1


def test_a_pairs_sides_keep_their_profiles_apart(tmp_path: Path) -> None:
    setting = ProfileSetting(tmp_path / "r.profiles", relative_to=tmp_path)
    assert setting.under("candidate").point("cpu/base", "w") == tmp_path / "r.profiles" / "candidate" / "cpu" / "base" / "w"
    assert setting.under("candidate").relative_to == tmp_path


# ------------------------------------------------------------------ qwenperf compare


def profiled_run(version: str, **shares: float) -> dict[str, Any]:
    operators = tuple(OperatorShare(name=n, self_us=s * 1000, share=s, count=10) for n, s in shares.items())
    profile = OperatorProfile(traces=(f"{version}.profiles/t.pt.trace.json.gz",), cpu=OperatorTable(total_us=1000.0, operators=operators))
    return make_run(version=version) | {"profile": msgspec.to_builtins(profile)}


def test_compare_shows_each_sides_top_operators_and_the_largest_share_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [profiled_run("0.32.0", **{"aten::mm": 0.5, "aten::add": 0.3, "_C::rms_norm": 0.2})])
    new = session_file(tmp_path / "new.json", [profiled_run("0.33.0", **{"aten::mm": 0.7, "aten::add": 0.25, "aten::copy_": 0.05})])
    assert decode_run(json.loads(old.read_text())["runs"][0]).profile is not None
    assert main(["compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = lines.index("host operators by self time in the profiled repeat (one extra, not measured), as shares of all host self time")
    assert lines[start + 1].split() == ["#", "0.32.0", "share", "0.33.0", "share"]
    assert lines[start + 3].split() == ["1", "aten::mm", "50.0%", "aten::mm", "70.0%"]
    assert lines[start + 5].split() == ["3", "_C::rms_norm", "20.0%", "aten::copy_", "5.0%"]
    assert (
        "largest share changes in 0.33.0 against 0.32.0: aten::mm +20.0 pt (50.0% → 70.0%); _C::rms_norm -20.0 pt (20.0% → —); "
        "aten::add -5.0 pt (30.0% → 25.0%); aten::copy_ +5.0 pt (— → 5.0%)"
    ) in out
    assert "device kernels" not in out

    assert main(["compare", str(old), str(new), "--json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)["groups"]
    assert [p["file"] for p in group["profiles"]] == ["0.32.0", "0.33.0"]
    assert group["profiles"][1]["cpu"]["operators"][0] == {"name": "aten::mm", "self_us": 700.0, "share": 0.7, "count": 10}
    (changes,) = group["profile_changes"]
    assert changes[0] == {"name": "aten::mm", "reference": 0.5, "now": 0.7, "change": pytest.approx(0.2)}


def test_compare_without_profiles_shows_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = session_file(tmp_path / "old.json", [make_run(version="0.32.0")])
    new = session_file(tmp_path / "new.json", [profiled_run("0.33.0", **{"aten::mm": 1.0})])
    assert main(["compare", str(old), str(old)]) == 0
    assert "operators" not in capsys.readouterr().out
    assert main(["compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "aten::mm" in out and "largest share changes" not in out  # the reference has no profile to compare with
    assert main(["compare", str(old), str(old), "--json"]) == 0
    assert "profiles" not in json.loads(capsys.readouterr().out)["groups"][0]
