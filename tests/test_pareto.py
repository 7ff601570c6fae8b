"""``qwenperf compare --pareto``: the points (per-user against per-device output tok/s), the
device count of GPU and CPU runs, the frontier and the chart."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.gate.compare import CompareError, compare, load_runs
from pytest_qwenperf.gate.compare_output import pareto_figure
from pytest_qwenperf.gate.pareto import Devices, ParetoPoint, devices_of, frontier, points_of
from tests.test_baseline import make_run
from tests.test_compare import compare as compare_cli
from tests.test_compare import session_file
from tests.test_compare_sources import serve, write

PNG = b"\x89PNG\r\n\x1a\n"


def cpu_run(
    config: str = "base",
    workload: str = "isl128-osl128",
    *,
    version: str = "0.32.0",
    output: float = 5_000.0,
    tpot: float = 20.0,
    cores: Sequence[int] = (0,),
    samples: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """A CPU suite run's JSON with its mean TPOT and the cores its server ran on."""
    run = make_run(config, workload, version=version, output=output, samples=samples)
    run["metrics"]["mean_tpot_ms"] = tpot
    run["telemetry"]["cpu"] = {"server_cores": {"cores": list(cores)}}
    return run


def gpu_run(argv: Sequence[str], replicas: int | None = 1, **figures: Any) -> dict[str, Any]:
    """A run on H100s with this vLLM argv and replica count."""
    run = cpu_run(**figures)
    run["identity"]["argv"] = list(argv)
    run["context"]["machine"] |= {"kind": "h100", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 8}
    run["context"]["replicas"] = replicas
    run["telemetry"]["cpu"] = None
    return run


def devices(run: dict[str, Any]) -> Devices:
    return devices_of(decode_run(run), "f.json: run")


@pytest.mark.parametrize(
    ("argv", "replicas", "count"),
    [
        ([], 1, 1),
        (["--tensor-parallel-size", "8", "--max-model-len", "4096"], 1, 8),
        (["--tensor-parallel-size", "1", "--data-parallel-size", "8"], 1, 8),
        (["-tp", "2", "-pp", "2", "--data-parallel-size=2"], 2, 16),
        (["--tensor_parallel_size=4"], 3, 12),
        (["--max-num-seqs", "256"], 4, 4),
    ],
)
def test_a_gpu_runs_devices_are_tp_pp_dp_times_replicas(argv: list[str], replicas: int, count: int) -> None:
    assert devices(gpu_run(argv, replicas)) == Devices(count, "GPU")


def test_a_cpu_runs_devices_are_its_servers_cores() -> None:
    assert devices(cpu_run(cores=(0, 1, 2, 3))) == Devices(4, "core")


def test_the_engines_device_decides_over_the_hardware_kind() -> None:
    """A GPU host without NVML in the client's environment records its hardware as ``cpu``; the
    engine config it recorded says ``cuda``."""
    run = cpu_run()
    run["identity"]["argv"] = ["-tp", "2"]
    run["context"]["environment"] = {"engine": {"device_config.device": '"cuda"'}}
    assert devices(run) == Devices(2, "GPU")
    run["context"]["environment"]["engine"]["device_config.device"] = '"cpu"'
    assert devices(run) == Devices(1, "core")


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda run: run["telemetry"].update(cpu=None), r"f\.json: run: telemetry\.cpu\.server_cores\.cores: expected the server's cores"),
        (lambda run: run["telemetry"]["cpu"].update(server_cores={"cores": []}), r"server_cores\.cores: .*got \[\]"),
        (lambda run: run["context"].update(machine=None), r"context\.machine\.kind: expected 'cpu' or a GPU kind"),
    ],
)
def test_a_cpu_run_without_a_device_count_is_an_error_naming_the_field(mangle: Any, message: str) -> None:
    run = cpu_run()
    mangle(run)
    with pytest.raises(CompareError, match=message):
        devices(run)


@pytest.mark.parametrize(
    ("argv", "replicas", "message"),
    [
        (["-tp", "8"], None, r"context\.replicas: expected the number of servers .*got nothing"),
        (["--tensor-parallel-size", "eight"], 1, r"identity\.argv: --tensor-parallel-size: expected a whole number of 1 or more, got 'eight'"),
        (["--max-model-len", "4096", "-pp"], 1, r"identity\.argv: -pp: expected .*got nothing"),
        (["--data-parallel-size=0"], 1, r"--data-parallel-size: expected .*got '0'"),
    ],
)
def test_a_gpu_run_without_a_device_count_is_an_error_naming_the_field(argv: list[str], replicas: int | None, message: str) -> None:
    with pytest.raises(CompareError, match=message):
        devices(gpu_run(argv, replicas))


def point(per_user: float, per_device: float, source: str = "") -> ParetoPoint:
    return ParetoPoint("0.32.0", ("cpu", "base"), "chat", per_user, per_device, "core", source)


def test_the_frontier_keeps_what_nothing_beats_sorted_by_per_user_tok_s() -> None:
    fast, middle, dense = point(100.0, 500.0), point(50.0, 2_000.0), point(10.0, 4_000.0)
    beaten = point(40.0, 1_000.0)  # middle is faster per user and per device
    same_speed_less_dense = point(50.0, 1_500.0)  # a tie on x, lower y
    same_density_slower = point(5.0, 4_000.0)  # a tie on y, lower x
    twin = point(50.0, 2_000.0, "another file")  # equal on both axes: neither beats the other
    found = frontier([beaten, fast, same_speed_less_dense, dense, twin, middle, same_density_slower])
    assert found == (dense, twin, middle, fast)  # equal points in the order they came
    assert frontier([beaten]) == (beaten,) and frontier([]) == ()


def test_every_repeat_is_a_point_divided_by_the_devices(tmp_path: Path) -> None:
    samples = {"mean_tpot_ms": [20.0, 25.0], "output_throughput": [5_000.0, 4_000.0]}
    repeated = gpu_run(["-tp", "4"], 2, samples=samples)
    single = cpu_run("ctx-short", tpot=10.0, output=3_000.0, cores=(0, 1))
    run_set = load_runs(session_file(tmp_path / "s.json", [repeated, single]))
    found = points_of([run_set], ["0.32.0"])
    assert [(p.rung, p.per_user, p.per_device, p.device, p.source) for p in found] == [
        (("cpu", "base"), 50.0, 625.0, "GPU", "s.json, repeat 1 of 2"),
        (("cpu", "base"), 40.0, 500.0, "GPU", "s.json, repeat 2 of 2"),
        (("cpu", "ctx-short"), 100.0, 1_500.0, "core", "s.json"),
    ]


def search_of(*probes: tuple[float, float, float, str | None]) -> dict[str, Any]:
    """A concurrency search (SLO p99 TPOT 40 ms, capacity 24) as a run's JSON holds it, with a probe
    per (load, output tok/s, mean TPOT ms, why it was stopped or None)."""
    return {
        "search": "concurrency", "slo": {"p99_tpot_ms": 40.0}, "load": 24.0, "interval": [16.0, 32.0],
        "output_throughput": 900.0, "binding": "p99_tpot_ms", "cliff": False, "bound": "found",
        "probes": [
            {"latencies": {"p99_tpot_ms": 30.0}, "load": load, "output_throughput": output, "mean_tpot_ms": tpot, "stopped": stopped}
            for load, output, tpot, stopped in probes
        ],
    }  # fmt: skip


def test_a_search_workloads_points_are_its_probes_that_delivered(tmp_path: Path) -> None:
    """Every probe of every search is a point, the ones past the capacity (stopped) left out."""
    run = cpu_run("ctx-short", cores=(0, 1))
    run["capacity"] = [search_of((16.0, 800.0, 10.0, None), (32.0, 1_000.0, 20.0, "3 request(s) failed"), (24.0, 900.0, 12.5, None))]
    found = points_of([load_runs(session_file(tmp_path / "s.json", [run]))], ["0.32.0"])
    assert [(p.per_user, p.per_device, p.source) for p in found] == [
        (100.0, 400.0, "s.json, search 1 of 1, probe at 16"),
        (80.0, 450.0, "s.json, search 1 of 1, probe at 24"),
    ]


def test_a_run_without_a_mean_tpot_is_an_error_naming_file_run_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = cpu_run()
    del run["metrics"]["mean_tpot_ms"]
    old = session_file(tmp_path / "old.json", [run])
    status, out, err = compare_cli(capsys, old, old, "--pareto", tmp_path / "pareto.png")
    assert status == 2 and out == ""
    assert "old.json: run of cpu/base on isl128-osl128: metrics.mean_tpot_ms: expected a positive number" in err
    assert not (tmp_path / "pareto.png").exists()


def test_a_bench_result_is_refused_naming_what_it_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = write(tmp_path / "serve.json", serve())
    status, _, err = compare_cli(capsys, result, result, "--pareto", tmp_path / "pareto.png")
    assert status == 2
    assert "serve.json: a bench result (vllm bench serve) records no vLLM argv, replicas or server cores" in err


def two_versions(tmp_path: Path) -> tuple[Path, Path]:
    """Two sessions, 0.32.0 and 0.33.0, of three rungs (``cpu/ctx-short`` with two workloads); 0.33.0 lacks ``cpu/seqs-32``."""
    old = session_file(
        tmp_path / "old.json",
        [cpu_run("base"), cpu_run("ctx-short"), cpu_run("ctx-short", "shared-prefix-pl1536", tpot=40.0, output=6_000.0), cpu_run("seqs-32")],
    )
    new = session_file(tmp_path / "new.json", [cpu_run("base", version="0.33.0", tpot=15.0), cpu_run("ctx-short", version="0.33.0")])
    return old, new


def test_the_chart_has_one_axes_per_rung_with_both_versions_on_it(tmp_path: Path) -> None:
    sets = [load_runs(path) for path in two_versions(tmp_path)]
    figure = pareto_figure(points_of(sets, compare(sets).labels))
    assert [ax.get_title() for ax in figure.axes] == ["cpu/base", "cpu/ctx-short", "cpu/seqs-32"]
    base = figure.axes[0]
    assert base.get_legend_handles_labels()[1] == ["0.32.0", "0.33.0"]
    assert base.get_ylabel() == "output tok/s per core"
    # The same colour for a version on every chart.
    assert [c.get_facecolor().tolist() for c in base.collections] == [c.get_facecolor().tolist() for c in figure.axes[1].collections]


def test_compare_writes_the_pareto_png_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = two_versions(tmp_path)
    status, out, _ = compare_cli(capsys, old, new, "--pareto", tmp_path / "pareto.png", "--json")
    assert status == 0
    image = (tmp_path / "pareto.png").read_bytes()
    assert image[:8] == PNG
    width, height = int.from_bytes(image[16:20], "big"), int.from_bytes(image[20:24], "big")
    assert (width, height) == (int(16.5 * 110), int(4.0 * 110))  # three charts in a row
    points = json.loads(out)["pareto"]
    short = [(p["file"], p["workload"], p["per_user"], p["frontier"]) for p in points if p["config"] == "ctx-short"]
    assert short == [("0.32.0", "isl128-osl128", 50.0, True), ("0.32.0", "shared-prefix-pl1536", 25.0, True), ("0.33.0", "isl128-osl128", 50.0, True)]
    assert points[0] == {
        "file": "0.32.0", "suite": "cpu", "config": "base", "workload": "isl128-osl128", "per_user": 50.0, "per_device": 5_000.0,
        "device": "core", "source": "old.json", "frontier": True,
    }  # fmt: skip
    status, out, _ = compare_cli(capsys, old, new, "--json")
    assert status == 0 and "pareto" not in json.loads(out)


def test_without_matplotlib_the_error_names_the_extra(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    old, new = two_versions(tmp_path)
    status, _, err = compare_cli(capsys, old, new, "--pareto", tmp_path / "pareto.png")
    assert status == 2
    assert "--pareto needs matplotlib: pip install 'pytest-qwenperf[plot]'" in err
