"""The docs site (mkdocs.yml, docs/): it builds with --strict, every page is in its navigation, a built
page loads nothing from the network, and every ``qwenperf`` command a page shows parses with the
command's own parser and runs, offline, with the exit status and output the page implies, where the
page does not mark it as needing a GPU, a cluster or a network (``# needs: …`` on the block's first line).

A page's commands run in the order it shows them, in one temporary folder per page, which holds the
files the page names (:data:`FILES`: the repository's own result files where the page shows those,
else sessions made by the tests' builders) and the repository's ``perf_tests``."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from pytest_qwenperf.cli.main import build_parser, main
from pytest_qwenperf.core.formats import json_safe
from pytest_qwenperf.core.summary import RunSummary
from pytest_qwenperf.gate.history_store import HistoryStore
from pytest_qwenperf.measure.method import Method
from pytest_qwenperf.measure.report import SessionReport
from pytest_qwenperf.measure.run import build_run
from pytest_qwenperf.serving.hardware import Hardware
from pytest_qwenperf.serving.server import ServerInfo
from pytest_qwenperf.suite import vllm_args
from pytest_qwenperf.suite.config import load_suite
from tests.test_baseline import observation, run_of, suite
from tests.test_compare import benchmark_file
from tests.test_pareto import cpu_run

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.DOTALL)
EXTERNAL = re.compile(r"<(?:script|img|iframe)[^>]+src=\"(?:https?:)?//|<link[^>]+rel=\"(?:stylesheet|preload|icon)\"[^>]+href=\"(?:https?:)?//|@import url\(\"?(?:https?:)?//")


def test_the_site_builds_strict_and_loads_nothing_from_the_network(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        check=False, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    built = [path for path in site.rglob("*") if path.suffix in (".html", ".css")]
    assert len([path for path in built if path.suffix == ".html"]) >= len(list((ROOT / "docs").rglob("*.md")))
    loading = {str(path.relative_to(site)): EXTERNAL.findall(path.read_text()) for path in built}
    assert {path: found for path, found in loading.items() if found} == {}


def test_the_external_asset_check_sees_a_cdn_script() -> None:
    assert EXTERNAL.findall('<script src="https://unpkg.com/iframe-worker/shim"></script>')
    assert not EXTERNAL.findall('<a href="https://squidfunk.github.io/mkdocs-material/">Material</a>')


def _nav_pages(nav: list[object]) -> set[str]:
    found: set[str] = set()
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            found |= _nav_pages(value) if isinstance(value, list) else {str(value)}
    return found


def test_every_page_is_in_the_navigation() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    assert pages == _nav_pages(nav)


@dataclass(frozen=True)
class Command:
    """A ``qwenperf`` command line a page shows."""

    words: tuple[str, ...]  # after ``qwenperf``, split as a shell splits them, unexpanded
    variables: tuple[tuple[str, str], ...] = ()  # the block's assignments before it (OUT=...)
    says_exit: int | None = None  # the status its line's comment gives (``# exit 1``), if it gives one

    @property
    def key(self) -> str:
        return " ".join(self.words)

    def argv(self, folder: Path) -> list[str]:
        """The words as a shell in ``folder`` passes them: variables expanded, globs matched (sorted)."""
        found: list[str] = []
        for word in self.words:
            expanded = string.Template(word).safe_substitute(dict(self.variables))
            matched = sorted(glob.glob(expanded, root_dir=folder)) if any(c in expanded for c in "*?[") else []
            found += matched or [expanded]  # a glob that matches nothing stays as it is, as in bash
        return found


ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)=(.*)", re.DOTALL)
SAYS_EXIT = re.compile(r"#\s*exit (\d+)\s*$")


def shown(text: str) -> list[Command]:
    """The ``qwenperf`` command lines of the blocks of ``text`` not marked ``# needs: …``, split as a
    shell would (continuations joined; a redirect, a pipe or a comment ends one)."""
    found = []
    for block in BLOCK.findall(text):
        if block.lstrip().startswith("# needs:"):
            continue
        variables: dict[str, str] = {}
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if len(words) == 1 and (assigned := ASSIGNMENT.fullmatch(words[0])):
                variables[assigned[1]] = assigned[2]
            for i, word in enumerate(words):
                if Path(word).name == "qwenperf":
                    argv = words[i + 1 :]
                    ends = [j for j, w in enumerate(argv) if w in ("|", ">", ">>", "&&", ";", "2>&1")]
                    says = SAYS_EXIT.search(line)
                    own = tuple(argv[: ends[0]] if ends else argv)
                    found.append(Command(own, tuple(variables.items()), int(says[1]) if says else None))
                    break
    return found


def commands(text: str) -> list[list[str]]:
    """The words of :func:`shown`'s commands, a glob standing for two files."""
    return [[expanded for w in command.words for expanded in ([w, w] if "*" in w else [w])] for command in shown(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_command_a_page_shows_parses(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in commands(page.read_text()):
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.relative_to(ROOT)}: qwenperf {shlex.join(argv)}: {capsys.readouterr().err.strip()}")


def test_a_command_with_a_removed_flag_is_found() -> None:
    text = "```bash\nqwenperf compare a.json b.json --fail-on regresion   # a typo\n```\n"
    text += "```bash\n# needs: GPU\nqwenperf doctor --nope\n```"
    (argv,) = commands(text)
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)


# The files the pages' commands name. -----------------------------------------------------------


def _copy(source: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, folder / source.name)


def _repeats(output: float) -> dict[str, list[float]]:
    return {"output_throughput": [output * f for f in (0.99, 1.0, 1.01)]}


def _cpu_run(version: str, day: int, output: float, config: str = "base") -> dict[str, Any]:
    """A run of the cpu suite (with a mean TPOT, as ``--pareto`` needs) started on November ``day``,
    its output throughput's three repeats around ``output``."""
    run = cpu_run(config, version=version, output=output, samples=_repeats(output))
    run["context"]["started"] = f"2026-11-{day:02d}T02:00:00+00:00"
    return run


def _b200_run(day: int, output: float) -> dict[str, Any]:
    """A run of the b200 suite's ``dp8`` rung on 8 B200s, as :func:`make_run` makes one of the cpu suite."""
    b200 = suite("b200")
    config = b200.config("dp8")
    workload = next(w for w in b200.workloads if w.runs_on(config.id))
    summary = RunSummary.from_values(
        {
            "duration": 60.0,
            "completed": 4096,
            "failed": 0,
            "total_input_tokens": 4096 * 1024,
            "total_output_tokens": 4096 * 512,
            "request_throughput": output / 512,
            "output_throughput": output,
            "total_token_throughput": output * 3,
            "p99_ttft_ms": 900.0,
            "p99_tpot_ms": 30.0,
            "achieved_request_rate": float("inf"),
        }
    )
    server = ServerInfo("http://127.0.0.1:8000", b200.model, "0.18.0", 4096)
    machine = Hardware(kind="b200", gpu_name="NVIDIA B200", gpu_count=8, driver="580.95.05", cuda="13.0", cpu_model="Test CPU")
    made = build_run(config, workload, observation(summary), Method(suite=b200.name), (server,), machine)
    run = json.loads(json.dumps(json_safe(msgspec.to_builtins(made))))
    run["samples"] = _repeats(output)
    run["context"]["started"] = f"2026-11-{day:02d}T02:00:00+00:00"
    return run


def _session(path: Path, runs: list[dict[str, Any]]) -> None:
    """A session's JSON as the plugin writes it (``--qwenperf-json``)."""
    report = SessionReport()
    for run in runs:
        report.add(run_of(run))
    report.write_json(path)


def _two_versions(folder: Path) -> None:
    """``results/0.18.json`` and ``results/0.19.json``: a session of two rungs of the cpu suite under
    each version, alike within 1 %; ``results/0.18/`` and ``results/0.19/``: three such sessions each;
    ``.qwenperf/history.sqlite``: eight nights of the base rung under 0.18.0, flat."""
    results = folder / "results"

    def session(path: Path, version: str, day: int, base: float, short: float) -> None:
        _session(path, [_cpu_run(version, day, base), _cpu_run(version, day, short, "ctx-short")])

    session(results / "0.18.json", "0.18.0", 20, 5_000.0, 5_200.0)
    session(results / "0.19.json", "0.19.0", 21, 5_050.0, 5_150.0)
    for i in range(3):
        session(results / "0.18" / f"{i}.json", "0.18.0", 10 + i, 5_000.0 + 40 * i, 5_200.0)
        session(results / "0.19" / f"{i}.json", "0.19.0", 13 + i, 5_080.0 - 30 * i, 5_250.0)
    (folder / ".qwenperf").mkdir()
    nights = [run_of(_cpu_run("0.18.0", day, 5_000.0 * (1 + 0.01 * (day % 3 - 1)))) for day in range(1, 9)]
    with HistoryStore.open(str(folder / ".qwenperf" / "history.sqlite")) as store:
        store.append(nights, source="tests")


def _nights_and_benchmarks(folder: Path) -> None:
    """``results/``: 14 nightly sessions of the cpu suite's base rung, 5,000 tok/s under 0.31.0, then
    4,200 under 0.32.0 (a step for the worse at night 9); ``.benchmarks/``: pytest-benchmark's storage of
    7 nights of the b200 suite's ``dp8`` rung (``--benchmark-autosave``), flat."""
    for day, level in enumerate([5_000.0] * 8 + [4_200.0] * 6, start=1):
        _session(folder / "results" / f"night-{day:02d}.json", [_cpu_run("0.31.0" if level > 4_600 else "0.32.0", day, level)])
    storage = folder / ".benchmarks" / "Linux-CPython-3.11-64bit"
    storage.mkdir(parents=True)
    for day in range(1, 8):
        benchmark_file(storage / f"{day:04d}_nightly.json", [_b200_run(day, 60_000.0 + 500 * (day % 3))])


def _upgrade_gate(folder: Path) -> None:
    """The session files the page was measured with (docs/upgrade-gate/)."""
    for path in (ROOT / "docs" / "upgrade-gate").glob("*.json"):
        _copy(path, folder)


def _real_nights(folder: Path) -> None:
    """The page's 18 nights and the store they were recorded in (benchmarks/results/history-2026-11-24/,
    the page's $OUT); ``flat.sqlite`` is left for the page's import to make."""
    nights = Path("benchmarks") / "results" / "history-2026-11-24"
    for path in [*(ROOT / nights).glob("night-*.json"), ROOT / nights / "nights.sqlite"]:
        _copy(path, folder / nights)


def _tool_results(folder: Path) -> None:
    """GuideLLM reports and AIPerf exports the real tools wrote (tests/data/tools/): two runs of each."""
    tools = ROOT / "tests" / "data" / "tools"
    _copy(tools / "guidellm-0.8.1" / "a.json", folder / "guidellm-before")
    _copy(tools / "guidellm-0.8.1" / "b.json", folder / "guidellm-after")
    shutil.copy(tools / "aiperf-0.13.0" / "a.json", folder / "aiperf-0.32.json")
    shutil.copy(tools / "aiperf-0.13.0" / "b.json", folder / "aiperf-0.33.json")


def _traces(folder: Path) -> None:
    """The slice of Mooncake's conversation trace the tests replay (tests/data/traces/)."""
    _copy(ROOT / "tests" / "data" / "traces" / "mooncake-conversation-180s.jsonl", folder / "tests" / "data" / "traces")


FILES: dict[str, Callable[[Path], None]] = {
    "docs/capacity-and-traces.md": _traces,
    "docs/history-and-bisect.md": _nights_and_benchmarks,
    "docs/history.md": _real_nights,
    "docs/interchange.md": _tool_results,
    "docs/report.md": _two_versions,
    "docs/upgrade-gate.md": _upgrade_gate,
    "docs/verdicts.md": _two_versions,
}
"""Page → what puts the files its commands name in its folder (every folder also has ``perf_tests``)."""


# What each command should do. ------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    status: int  # 1 where a --fail-on gate should trip on the page's files
    output: tuple[str, ...] = ()  # parts of lines its stdout or stderr holds
    files: tuple[str, ...] = ()  # files it writes


NIGHTS = "18 runs, latest 1,174: ▇▇██▇█▅▅▇███|▁▁▄▁▂▃"  # the page's output of `qwenperf history`
CHANGE_AT_13 = (  # the change point the page shows
    "#13        2026-11-24T08:50  0.32.0 → 0.32.0      1,428 tok/s  1,104 tok/s  -22.7%      100.0%             6  worse"
)
K8S_RUNG = "render-k8s perf_tests/suites/b200.toml --config dp8-ctx4k-fp8kv-mtp1 --replicas 12"
BENCH_ARGS = "--input-len 1024 --output-len 512 --num-prompts 500000 --warmup 6144 --max-concurrency 49152"
RAY_JOB = "entrypoint: qwenperf bench --ray auto --workers 16 --endpoint http://qwenperf-b200-dp8-ctx4k-fp8kv-mtp1:8000"
B200 = "perf_tests/suites/b200.toml"

EXPECTED: dict[str, dict[str, Expect]] = {
    "docs/history-and-bisect.md": {
        "history import history.sqlite results/ .benchmarks/": Expect(0, ("21 run(s) recorded in history.sqlite",)),
        "history history.sqlite --config b200/dp8 --metric output_throughput --markdown": Expect(
            0, ("### b200/dp8 / isl1024-osl512 / output_throughput (tok/s, higher is better) on b200",)
        ),
        "history history.sqlite --fail-on change --plot history.png": Expect(
            1, ("failing on a confirmed change for the worse: cpu/base / isl128-osl128 / output_throughput",), ("history.png",)
        ),
    },
    "docs/history.md": {
        "history import $OUT/flat.sqlite $OUT/night-0[1-9].json $OUT/night-1[0-2].json": Expect(0, ("12 run(s) recorded",)),
        "history $OUT/flat.sqlite --fail-on change": Expect(0, ("12 runs, latest",)),
        "history $OUT/nights.sqlite --fail-on change": Expect(1, (NIGHTS, CHANGE_AT_13)),
    },
    "docs/interchange.md": {
        "compare guidellm-before/ guidellm-after/ --fail-on regression": Expect(0, ("(guidellm 0.8.1)",)),
        "compare aiperf-0.32.json aiperf-0.33.json": Expect(0, ("(aiperf 0.13.0)",)),
    },
    "docs/report.md": {
        "report results/0.18.json results/0.19.json -o report.html --history .qwenperf/history.sqlite": Expect(
            0, ("qwenperf: wrote report.html",), ("report.html",)
        ),
    },
    "docs/scaling.md": {
        K8S_RUNG: Expect(0, ("kind: Deployment", "  replicas: 12")),
        f"{K8S_RUNG} --clients 16 --client-image registry.example/qwenperf-ray:2.52.0 --bench-args {BENCH_ARGS}": Expect(
            0, ("kind: RayJob", RAY_JOB)
        ),
    },
    "docs/suite.md": {
        "lint perf_tests/suites/*.toml": Expect(0, (f"ok   {B200}: dp8-ctx4k-fp8kv-mtp1 (vLLM",)),
        f"show {B200} --json": Expect(0, ('"suite": "b200"',)),
        f"plan --suite {B200}": Expect(0, (f"b200 ({B200}): 16 point(s) on 5 config(s)",)),
        "plan --suite perf_tests/suites/cpu.toml --config base --json": Expect(0, ('"schema": "qwenperf-plan/1"',)),
        f"plan --suite {B200} --tier nightly --fail-over 110": Expect(0, ("is within --fail-over 110 min",)),
        f"plan --suite {B200} --tier nightly --candidate": Expect(0, ("with a candidate: each repeat on both sides",)),
    },
    "docs/capacity-and-traces.md": {
        "trace --read tests/data/traces/mooncake-conversation-180s.jsonl --start 120 --span 30 --fit scale --context 2048 --kv-block 128": Expect(
            0, ("fitted (lengths scaled by 1/64, blocks of 8 tokens, to fit 2,048 tokens):", "in whole 128-token blocks)")
        ),
    },
    "docs/upgrade-gate.md": {  # the counts "Later rule changes" gives
        "compare first.json second.json --fail-on regression": Expect(0, ("(first.json): 25 pass, 1 underpowered",)),
        "compare reset-first.json reset-second.json --fail-on regression": Expect(
            1, ("1 improvement, 1 noisy, 19 pass, 1 regression, 9 underpowered",)
        ),
        "compare first.json slowed.json --fail-on regression": Expect(1, ("9 missing, 1 pass, 16 regression",)),
        "compare vllm-0.31.0.json first.json --fail-on regression --plot cpu-0.31.0-vs-0.32.0.png": Expect(
            0, ("verdicts against 0.31.0: 24 pass, 2 underpowered",), ("cpu-0.31.0-vs-0.32.0.png",)
        ),
    },
    "docs/verdicts.md": {
        "baseline promote .qwenperf/history.sqlite --config cpu/base": Expect(
            0, ("to baselines/cpu-test-cpu-2c/embedded-tiny/base/isl128-osl128.json: history: 8 runs",)
        ),
        "baseline list": Expect(0, ("measured: qwenperf baseline promote",)),
        "compare results/0.19.json --baselines baselines --history .qwenperf/history.sqlite --fail-on regression": Expect(
            0, ("vs stored baseline (stale: recorded with vLLM 0.18, this run has 0.19)", "no reference for this run")
        ),
        "compare results/0.18.json results/0.19.json --fail-on regression --markdown": Expect(
            0, ("| metric | 0.18.0 | 0.19.0 | Δ | verdict |",)
        ),
        "compare results/*.json --plot throughput.png": Expect(0, ("verdicts against 0.18.0: 8 pass",), ("throughput.png",)),
        "compare results/0.18 results/0.19 --pareto pareto.png": Expect(0, ("verdicts against 0.18.0: 8 pass",), ("pareto.png",)),
    },
}
"""Page → command as the page shows it → what it should do on the page's files; every command a page
shows without ``# needs: …`` has one, and a ``# exit N`` on its line must agree with it."""


def run_command(argv: list[str], folder: Path) -> tuple[int, str]:
    """``qwenperf ARGV`` run in ``folder`` in this process: its exit status, its stdout and stderr."""
    output = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return status, output.getvalue()


def run_page(page: str, text: str, folder: Path, expected: Mapping[str, Expect]) -> list[str]:
    """Run the commands of ``text`` in ``folder`` in their order; what went otherwise than ``expected``."""
    problems = []
    for command in shown(text):
        named = f"{page}: qwenperf {command.key}"
        expect = expected.get(command.key)
        if expect is None:
            problems.append(f"{named}: not in EXPECTED, and its block is not marked `# needs: …`")
            continue
        if command.says_exit is not None and command.says_exit != expect.status:
            problems.append(f"{named}: the page says exit {command.says_exit}, EXPECTED {expect.status}")
        status, output = run_command(command.argv(folder), folder)
        if status != expect.status:
            problems.append(f"{named}: exit status {status}, expected {expect.status}; it said:\n{output[-3000:]}")
            continue
        lacks = [line for line in expect.output if line not in output]
        problems += [f"{named}: its output lacks {line!r}; it said:\n{output[-3000:]}" for line in lacks]
        problems += [f"{named}: wrote no {name}" for name in expect.files if not (folder / name).is_file()]
    return problems


@pytest.fixture
def one_vllm_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``qwenperf lint`` or ``doctor`` command a page shows asks a child Python with vLLM about its
    suites' configs, about 10 s of CPU a child; here the first child is asked about every suite's
    configs at once, and each later question whose argvs it answered, on any page, from that reply."""
    ask = vllm_args._ask
    replies: dict[tuple[str, ...], str | None] = {}
    rest: dict[str, Any] = {}

    def asked_once(python: str, argvs: dict[str, list[str]]) -> dict[str, Any]:
        if not replies:
            every = {
                f"{path.name}:{config.id}": list(vllm_args._server_args(config))
                for path in sorted((ROOT / "perf_tests" / "suites").glob("*.toml"))
                for config in load_suite(path).configs
            }
            reply = ask(python, every)
            replies.update({tuple(argv): reply["errors"].get(key) for key, argv in every.items()})
            rest.update({name: value for name, value in reply.items() if name != "errors"})
        if any(tuple(argv) not in replies for argv in argvs.values()):
            return ask(python, argvs)
        errors = {config: replies[tuple(argv)] for config, argv in argvs.items() if replies[tuple(argv)] is not None}
        return {**rest, "errors": errors}

    monkeypatch.setattr(vllm_args, "_ask", asked_once)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", [page for page in PAGES if shown(page.read_text())], ids=_name)
@pytest.mark.usefixtures("one_vllm_parser")
def test_every_command_a_page_shows_runs_as_the_page_says(page: Path, tmp_path: Path) -> None:
    (tmp_path / "perf_tests").symlink_to(ROOT / "perf_tests")
    FILES.get(_name(page), lambda folder: None)(tmp_path)
    assert run_page(_name(page), page.read_text(), tmp_path, EXPECTED.get(_name(page), {})) == []


def test_every_expectation_is_of_a_command_a_page_shows() -> None:
    expected = {(page, command) for page, commands in EXPECTED.items() for command in commands}
    assert expected - {(_name(page), command.key) for page in PAGES for command in shown(page.read_text())} == set()


def test_a_missing_file_a_tripped_gate_a_contradiction_and_an_unknown_command_are_reported(tmp_path: Path) -> None:
    _upgrade_gate(tmp_path)
    text = (
        "```bash\nqwenperf compare first.json secnd.json --fail-on regression   # exit 0\n"
        "qwenperf compare first.json slowed.json --fail-on regression\n"
        "qwenperf compare first.json second.json   # exit 1\n"
        "qwenperf compare second.json first.json\n```\n"
    )
    expected = {
        "compare first.json secnd.json --fail-on regression": Expect(0),
        "compare first.json slowed.json --fail-on regression": Expect(0),
        "compare first.json second.json": Expect(0, ("no such line",), ("diff.png",)),
    }
    problems = run_page("p.md", text, tmp_path, expected)
    assert [problem.splitlines()[0] for problem in problems] == [
        "p.md: qwenperf compare first.json secnd.json --fail-on regression: exit status 2, expected 0; it said:",
        "p.md: qwenperf compare first.json slowed.json --fail-on regression: exit status 1, expected 0; it said:",
        "p.md: qwenperf compare first.json second.json: the page says exit 1, EXPECTED 0",
        "p.md: qwenperf compare first.json second.json: its output lacks 'no such line'; it said:",
        "p.md: qwenperf compare first.json second.json: wrote no diff.png",
        "p.md: qwenperf compare second.json first.json: not in EXPECTED, and its block is not marked `# needs: …`",
    ]
    assert "secnd.json" in problems[0] and "failing on 9 missing, 16 regression" in problems[1]


def test_a_blocks_variables_and_globs_are_expanded_in_the_pages_folder(tmp_path: Path) -> None:
    for name in ("night-01.json", "night-02.json", "night-10.json"):
        (tmp_path / "out" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "out" / name).write_text("{}")
    block = 'OUT=out\nV=".venv/bin/python -m x"\nqwenperf history import $OUT/h.sqlite $OUT/night-0[1-9].json ${OUT}/*.none'
    (command,) = shown(f"```bash\n{block}\n```")
    assert command.variables == (("OUT", "out"), ("V", ".venv/bin/python -m x"))
    assert command.argv(tmp_path) == ["history", "import", "out/h.sqlite", "out/night-01.json", "out/night-02.json", "out/*.none"]
