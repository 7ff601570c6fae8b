"""The steps of ``scripts/gpu-check OUTDIR`` (run through that script, which finds the GPU and the wheels).

Each step runs whole commands as a user would (``qwenperf doctor``, ``pytest perf_tests``,
``qwenperf compare``) and then checks what they wrote. A check that does not hold is a line
in ``summary.txt`` starting ``FAIL``; the exit status is 1 when there is any.

1. ``qwenperf doctor --suite hopper``: no check of the GPU, the PID visibility, the load or the
   CPU side fails (vLLM is not installed here, so the software checks may).
2. The one-GPU suite's ``ctx-short`` and ``fp8kv`` rungs on the chat workload, served by the
   stand-in (which honours neither knob: the two are two boots, not a comparison): one boot per config; NVML samples with utilization, power and energy; tokens
   per joule; the sampled GPU is the one the suite asks for (``CUDA_VISIBLE_DEVICES=0``) and
   the server's process held memory there and nowhere else; the utilization floor met.
3. A process holding memory on GPU 0 before the session: the session fails before any boot,
   naming that process.
4. The same process starting once the server holds its GPU: the run is ``invalid: gpu-shared``
   naming it, and ``qwenperf compare`` gives no verdict on it but ``invalid``.

Every session records into one history store in OUTDIR (not the checkout's default store), so the
GPU runs' environment goes through the store and back: step 2's runs are recorded, and step 4's
run is judged against step 2's (``vs history: 1 run``) and recorded as invalid.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pytest_qwenperf.serving.gpu_memory import holders
from pytest_qwenperf.serving.hardware import detect

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "perf_tests" / "suites" / "hopper.toml"
STANDIN = ROOT / "tests" / "standins" / "model_vllm.py"
# The chat workload: on a real H200 the throughput workload (isl512-osl256, 896 requests at 128 in
# flight) took the stand-in 137 s a config, which left no room for the rest in 8 minutes.
MAIN_SELECTION = "hopper-ctx-short/chat or hopper-fp8kv/chat"
MAIN_BOOTS = {"hopper/ctx-short": 1, "hopper/fp8kv": 1}
SHARED_SELECTION = "hopper-ctx-short/chat"
HISTORY = "history.sqlite"  # in OUTDIR
HOLDER = """
import sys, time, torch
if sys.argv[1:] == ["--wait"]:  # torch is imported: the GPU is held a moment after "go"
    sys.stdin.readline()
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("HOLDING", flush=True)
time.sleep(3600)
"""


@dataclass
class Summary:
    """What was checked, in order: (passed, line)."""

    out: Path
    lines: list[tuple[bool, str]] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)

    def check(self, holds: bool, what: str) -> bool:
        self.lines.append((holds, what))
        print(("ok    " if holds else "FAIL  ") + what, flush=True)
        return holds

    def write(self) -> int:
        failed = [line for holds, line in self.lines if not holds]
        text = "\n".join(("ok    " if holds else "FAIL  ") + line for holds, line in self.lines)
        verdict = f"gpu-check: {len(self.lines) - len(failed)} of {len(self.lines)} checks held"
        (self.out / "summary.txt").write_text(f"{text}\n{verdict}\n")
        document = {"checks": [{"ok": holds, "check": line} for holds, line in self.lines], "figures": self.figures}
        (self.out / "summary.json").write_text(json.dumps(document, indent=2, default=str))
        print(verdict)
        return 1 if failed else 0


def main() -> int:
    out = Path(sys.argv[1])
    summary = Summary(out)
    summary.figures["gpu"] = _gpu_description()
    started = time.monotonic()
    try:
        doctor(summary)
        model(summary)
        session(summary)
        held_before_boot(summary)
        held_during_run(summary)
        turns(summary)
    finally:
        summary.figures["wall_s"] = round(time.monotonic() - started, 1)
    return summary.write()


# --- the steps -------------------------------------------------------------------------


def doctor(summary: Summary) -> None:
    result = _run(
        [*_qwenperf(), "doctor", "--suite", str(SUITE), "--json"], summary.out / "doctor.log", stdout=summary.out / "doctor.json"
    )
    try:
        report = json.loads((summary.out / "doctor.json").read_text())
    except ValueError as exc:
        summary.check(False, f"doctor: its JSON did not parse ({exc}); exit {result}, see doctor.log")
        return
    _run([*_qwenperf(), "doctor", "--suite", str(SUITE), "--load-seconds", "10"], summary.out / "doctor.txt")
    checks = report["checks"]
    summary.figures["doctor"] = {f"{c['group']}/{c['name']}": f"{c['status']}: {c['figure']}" for c in checks}
    failed = [f"{c['group']}/{c['name']}: {c['figure']}" for c in checks if c["status"] == "fail" and c["group"] != "software"]
    summary.check(not failed, "doctor: no GPU, PID, load or CPU check fails" + (f" ({'; '.join(failed)})" if failed else ""))
    groups = {c["group"] for c in checks}
    summary.check({"gpu", "pid", "load", "cpu", "software"} <= groups, f"doctor: every group reported ({sorted(groups)})")


def model(summary: Summary) -> None:
    began = time.monotonic()
    result = _run([*_qwenperf(), "tiny-model", "--model", "embedded:gpu"], summary.out / "model.log")
    summary.figures["model_generation_s"] = round(time.monotonic() - began, 1)
    summary.check(result == 0, f"the embedded:gpu model was generated (exit {result}, {summary.figures['model_generation_s']} s)")


def session(summary: Summary) -> None:
    with _gpu_processes() as seen:
        result = _pytest(summary.out, "session", MAIN_SELECTION, repeats=1)
    summary.check(
        result == 0, f"perf session of the one-GPU suite against the stand-in passed (pytest exit {result}, session.log)"
    )
    report = _session_json(summary.out / "session.json")
    if report is None:
        summary.check(False, "session.json was written")
        return
    boots = report["boots"]
    summary.check(boots == MAIN_BOOTS, f"one boot per config: {boots}")
    for run in report["runs"]:
        _run_checks(summary, run)
    on_gpus = {index: sorted(names) for index, names in seen.items()}
    summary.figures["gpu_processes_during_session"] = on_gpus
    standin_on = [index for index, names in seen.items() if any(STANDIN.name in n for n in names)]
    summary.check(standin_on == [0], f"the stand-in held memory on GPU 0 and no other (seen on {standin_on})")
    recorded = _recorded(summary.out)
    log = (summary.out / "session.log").read_text(errors="replace")
    summary.check(
        recorded == (len(report["runs"]), 0) and "now their reference on this machine" in log,
        f"the history recorded the session's runs and said they are now the reference ((valid, invalid) {recorded})",
    )


def _run_checks(summary: Summary, run: dict) -> None:
    key = f"{run['identity']['config']}/{run['identity']['workload']}"
    gpu = (run.get("telemetry") or {}).get("gpu") or {}
    devices = gpu.get("devices") or []
    summary.check(
        [d["index"] for d in devices] == [0],
        f"{key}: the sampled GPUs are the config's CUDA_VISIBLE_DEVICES=0 ({[d['index'] for d in devices]})",
    )
    if not devices:
        return
    device = devices[0]
    util, power = device.get("utilization") or {}, device.get("power_w") or {}
    figures = {
        "samples": device["samples"],
        "utilization_mean": util.get("mean"),
        "sm_activity_mean": (device.get("sm_activity") or {}).get("mean"),
        "tensor_activity_mean": (device.get("tensor_activity") or {}).get("mean"),
        "power_w_mean": power.get("mean"),
        "power_limit_w": device.get("power_limit_w"),
        "sm_clock_mhz_mean": (device.get("sm_clock_mhz") or {}).get("mean"),
        "clock_events": device.get("clock_events"),
        "energy_j": device.get("energy_j"),
        "tokens_per_joule": gpu.get("tokens_per_joule"),
        "output_throughput": run["metrics"].get("output_throughput"),
        "field_errors": device.get("field_errors"),
        "conditions": run.get("conditions"),
    }
    summary.figures[key] = figures
    summary.check(
        device["samples"] > 0
        and (util.get("max") or 0) > 0
        and (power.get("mean") or 0) > 0
        and (device.get("energy_j") or 0) > 0,
        f"{key}: NVML samples with non-zero utilization, power and energy ({device['samples']} samples, "
        f"utilization {util.get('mean')}, {power.get('mean')} W, {device.get('energy_j')} J)",
    )
    summary.check((gpu.get("tokens_per_joule") or 0) > 0, f"{key}: tokens per joule {gpu.get('tokens_per_joule')}")
    summary.check(not run.get("conditions"), f"{key}: valid (conditions {run.get('conditions')})")


def held_before_boot(summary: Summary) -> None:
    with _holder(summary.out / "holder-before.log") as pid:
        assert pid is not None
        result = _pytest(summary.out, "held-before-boot", SHARED_SELECTION, repeats=1)
    log = (summary.out / "held-before-boot.log").read_text(errors="replace")
    summary.check(
        result not in (0, 1), f"a process holding GPU 0 before the session stops it as a usage error (pytest exit {result})"
    )
    summary.check(
        f"pid {pid}" in log and "nothing was booted" in log, f"the session names the holder (pid {pid}) and booted nothing"
    )
    report = _session_json(summary.out / "held-before-boot.json")
    summary.check(not (report or {}).get("runs") and not (report or {}).get("boots"), "no server booted, no run measured")


def held_during_run(summary: Summary) -> None:
    holder: dict[str, int] = {}
    over = threading.Event()
    watcher = threading.Thread(target=_hold_while_the_server_holds, args=(summary.out / "holder-during.log", holder, over))
    watcher.start()
    try:
        result = _pytest(summary.out, "held-during-run", SHARED_SELECTION, repeats=1)
    finally:
        over.set()
        watcher.join()
    pid = holder.get("pid")
    summary.check(pid is not None, f"a holder started once the stand-in held GPU 0 (pid {pid})")
    report = _session_json(summary.out / "held-during-run.json")
    runs = report["runs"] if report else []
    conditions = [c for run in runs for c in run.get("conditions") or []]
    shared = [c["detail"] for c in conditions if c["reason"] == "gpu-shared"]
    summary.figures["held_during_run"] = conditions
    summary.check(result == 1 and bool(runs), f"the session measured and failed (pytest exit {result}, {len(runs)} run)")
    summary.check(bool(shared) and f"pid {pid}" in shared[0], f"the run is invalid: gpu-shared naming pid {pid} ({shared})")
    if not runs:
        return
    references = [run.get("reference") for run in runs]
    recorded = _recorded(summary.out)
    summary.check(
        all((r or "").startswith("history: 1 run") for r in references) and recorded[1] == len(runs),
        f"it was judged against the first session's run in the history and recorded as invalid "
        f"(references {references}, (valid, invalid) {recorded})",
    )
    compare = summary.out / "compare-held-during-run.json"
    argv = [*_qwenperf(), "compare", str(summary.out / "session.json"), str(summary.out / "held-during-run.json"), "--json"]
    code = _run(argv, summary.out / "compare.log", stdout=compare)
    document = _session_json(compare) or {}
    verdicts = [
        j["verdict"]
        for group in document.get("groups", [])
        if group.get("config") == "ctx-short"
        for row in group["rows"]
        for j in row["judgements"]
        if j is not None
    ]
    summary.check(
        code == 0 and bool(verdicts) and all(v.startswith("invalid") for v in verdicts),
        f"qwenperf compare gives it no verdict but invalid (exit {code}, verdicts {sorted(set(verdicts))})",
    )


# --- helpers ---------------------------------------------------------------------------


def turns(summary: Summary) -> None:
    """A/A candidate sessions on the model stand-in on this GPU: taking turns through sleep mode (the
    weights leave the GPU while a side sleeps) against both awake side by side
    (benchmarks/sleep_turns.py); neither may lose a request or judge A/A a regression."""
    began = time.monotonic()
    result = _run(
        [sys.executable, "-m", "benchmarks.sleep_turns", "--sessions", "2", "--standin", "model", "--device", "cuda",
         "--real-nvml", "--out", str(summary.out / "sleep_turns.json")],
        summary.out / "sleep_turns.log",
    )  # fmt: skip
    summary.figures["sleep_turns_s"] = round(time.monotonic() - began, 1)
    try:
        found = json.loads((summary.out / "sleep_turns.json").read_text())
    except (OSError, ValueError) as exc:
        summary.check(False, f"sleep turns: no results ({exc}); exit {result}, see sleep_turns.log")
        return
    sessions = found["sessions"]
    summary.figures["sleep_turns"] = found.get("summary")
    done = [s for s in sessions if "candidate" in s]
    summary.check(len(done) == len(sessions) == 4, f"sleep turns: 4 A/A sessions gave results ({len(done)} of {len(sessions)})")
    summary.check(all(sum(s["failed"]) == 0 for s in done), "sleep turns: no request failed (a sleeping stand-in answers 503)")
    took = [s["turns"] for s in done if s["arm"] == "turns"]
    summary.check(bool(took) and all(t and t["wakes"] > 0 for t in took), f"sleep turns: the turns arm took turns ({took})")
    summary.check(all(s["verdict"] != "regression" for s in done), f"sleep turns: no A/A session judged a regression ({[s['verdict'] for s in done]})")


def _qwenperf() -> list[str]:
    return [sys.executable, "-m", "pytest_qwenperf.cli.main"]


def _pytest(out: Path, name: str, selection: str, repeats: int) -> int:
    """A perf session of the one-GPU suite against the stand-in; its output in ``<name>.log``, its runs in ``<name>.json``."""
    plugin = [] if _installed() else ["-p", "pytest_qwenperf.plugin.hooks"]
    argv = [
        sys.executable, "-m", "pytest", *plugin, "perf_tests/test_throughput.py", "perf_tests/test_utilization.py",
        "-m", "hopper", "-k", selection, "-p", "no:cacheprovider", "-o", "addopts=", "-rA",
        "--qwenperf-suite", str(SUITE),
        "--qwenperf-launcher", shlex.join([sys.executable, str(STANDIN)]),
        "--qwenperf-repeats", str(repeats),
        "--qwenperf-baselines", str(out / "no-baselines"),
        "--qwenperf-json", str(out / f"{name}.json"),
        "--qwenperf-log-dir", str(out / "logs" / name),
        "--qwenperf-history", str(out / HISTORY),
    ]  # fmt: skip
    return _run(argv, out / f"{name}.log")


def _recorded(out: Path) -> tuple[int, int]:
    """How many (valid, invalid) runs the check's history store holds; (-1, -1) when it does not exist."""
    path = out / HISTORY
    if not path.exists():
        return (-1, -1)
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT invalid = '', COUNT(*) FROM runs GROUP BY invalid = ''").fetchall()
    counts = {bool(valid): n for valid, n in rows}
    return (counts.get(True, 0), counts.get(False, 0))


def _installed() -> bool:
    try:
        importlib.metadata.distribution("pytest-qwenperf")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _run(argv: list[str], log: Path, stdout: Path | None = None) -> int:
    with open(log, "a") as err, open(stdout or log, "a") as to:
        err.write(f"$ {shlex.join(argv)}\n")
        err.flush()
        return subprocess.run(argv, stdout=to, stderr=err, cwd=ROOT, check=False).returncode


def _session_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _holder(log: Path, when: Callable[[], bool] | None = None) -> Iterator[int | None]:
    """A process holding 1 GiB on GPU 0 for as long as the block runs, from the moment ``when()`` is
    true (polled; None: at once); the block gets its pid, or None when ``when()`` never was."""
    with open(log, "w") as to:
        argv = [sys.executable, "-c", HOLDER, *(["--wait"] if when else [])]
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=to, text=True)
        try:
            assert process.stdin is not None and process.stdout is not None
            if when is not None:
                if not when():
                    yield None
                    return
                process.stdin.write("go\n")
                process.stdin.flush()
            if process.stdout.readline().strip() != "HOLDING":
                raise RuntimeError(f"the GPU-memory holder did not start: {log}")
            yield process.pid
        finally:
            process.kill()
            process.wait()


def _hold_while_the_server_holds(log: Path, holder: dict[str, int], over: threading.Event) -> None:
    """Once the stand-in holds memory on GPU 0, hold some too, until it no longer does or the session is over."""

    def standin_holds() -> bool:
        return any(STANDIN.name in holder.command for holder in holders(["0"]))

    def server_booted() -> bool:
        while not over.is_set():
            if standin_holds():
                return True
            time.sleep(0.2)
        return False

    with _holder(log, when=server_booted) as pid:
        if pid is not None:
            holder["pid"] = pid
            while not over.wait(0.5) and standin_holds():
                pass


@contextlib.contextmanager
def _gpu_processes() -> Iterator[dict[int, set[str]]]:
    """Command lines seen holding memory on each GPU while the block runs (read each second)."""
    seen: dict[int, set[str]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            for holder in holders([None]):
                seen.setdefault(holder.gpu, set()).add(holder.command)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def _gpu_description() -> dict[str, object]:
    hardware = detect()
    return {
        "name": hardware.gpu_name,
        "count": hardware.gpu_count,
        "driver": hardware.driver,
        "nvidia_ml_py": importlib.metadata.version("nvidia-ml-py"),
        "date": time.strftime("%Y-%m-%d"),
        "python": sys.version.split()[0],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


if __name__ == "__main__":
    sys.exit(main())
