"""GuideLLM's and AIPerf's result files in ``qwenperf compare``: read from files the real tools wrote
against the CPU vLLM server (``tests/data/tools/README.md`` says how), judged, and refused when
they are of the wrong kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_qwenperf.gate.setups import GREEDY
from pytest_qwenperf.gate.sources import read_results
from tests.test_compare import _rows
from tests.test_compare import compare as compare_cli

TOOLS = Path(__file__).resolve().parent / "data" / "tools"
GUIDELLM = TOOLS / "guidellm-0.8.1"
AIPERF = TOOLS / "aiperf-0.13.0"


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_a_guidellm_report_is_read_with_its_own_figures_under_our_names() -> None:
    (result,) = read_results(GUIDELLM / "a.json")
    written = _json(GUIDELLM / "a.json")["benchmarks"][0]
    m, metrics = written["metrics"], result.run.metrics
    assert metrics["output_throughput"] == m["output_tokens_per_second"]["successful"]["mean"]
    assert metrics["total_token_throughput"] == m["tokens_per_second"]["successful"]["mean"]
    assert metrics["p99_ttft_ms"] == m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"]
    assert metrics["mean_tpot_ms"] == m["inter_token_latency_ms"]["successful"]["mean"]  # its ITL is vLLM's TPOT
    assert metrics["mean_e2el_ms"] == pytest.approx(1000 * m["request_latency"]["successful"]["mean"])  # seconds there
    assert "mean_itl_ms" not in metrics  # it reports no gaps between chunks
    assert (metrics["completed"], metrics["failed"]) == (m["request_totals"]["successful"], 0)
    setup = result.setup
    assert setup is not None and setup.client == "guidellm 0.8.1" and setup.sampling == GREEDY
    assert setup.model == "qwenperf-tiny" and setup.load == "concurrent (streams=32, max_concurrency=32)"
    assert setup.output_len == 128.0


def test_an_aiperf_export_is_read_with_its_units_obeyed() -> None:
    (result,) = read_results(AIPERF / "a.json")
    written, metrics = _json(AIPERF / "a.json"), result.run.metrics
    assert metrics["output_throughput"] == written["output_token_throughput"]["avg"]
    assert metrics["p99_ttft_ms"] == written["time_to_first_token"]["p99"]
    assert metrics["mean_tpot_ms"] == written["inter_token_latency"]["avg"]
    assert metrics["mean_e2el_ms"] == written["request_latency"]["avg"]
    assert (metrics["completed"], metrics["failed"]) == (256, 0)
    setup = result.setup
    assert setup is not None and setup.client == "aiperf 0.13.0" and setup.sampling is None  # no temperature sent
    assert setup.load == "type=concurrency, concurrency=32" and setup.output_len == 128.0


def test_an_aiperf_latency_in_seconds_is_converted_and_an_unknown_unit_named(tmp_path: Path) -> None:
    written = _json(AIPERF / "a.json")
    written["request_latency"] = {k: v / 1000 if k != "unit" else "s" for k, v in written["request_latency"].items() if k in ("unit", "avg", "p99")}
    (tmp_path / "s.json").write_text(json.dumps(written))
    (result,) = read_results(tmp_path / "s.json")
    assert result.run.metrics["p99_e2el_ms"] == pytest.approx(_json(AIPERF / "a.json")["request_latency"]["p99"])
    written["request_latency"]["unit"] = "furlongs"
    (tmp_path / "f.json").write_text(json.dumps(written))
    with pytest.raises(ValueError, match=r"f\.json: request_latency\.unit: expected a time unit \(ms, s, sec, us, ns\), got 'furlongs'"):
        read_results(tmp_path / "f.json")


@pytest.mark.parametrize("tool", [GUIDELLM, AIPERF], ids=["guidellm", "aiperf"])
def test_compare_gives_a_verdict_on_a_pair_each_tool_wrote(tool: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = compare_cli(capsys, tool / "a.json", tool / "b.json", "--fail-on", "regression")
    assert status in (0, 1), err
    rows = _rows(out)
    verdict = rows["output_throughput"][-1]
    assert verdict in {"pass", "regression", "improvement", "noisy", "underpowered"}, out
    assert "not-comparable" not in out and "invalid" not in out
    assert f"({tool.name.replace('-', ' ')})" in out  # the title names the tool and its version


def test_results_of_two_tools_are_not_comparable(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = compare_cli(capsys, GUIDELLM / "a.json", AIPERF / "a.json")
    assert "not-comparable" in out and "client: 'guidellm 0.8.1' vs 'aiperf 0.13.0'" in out


def test_requests_aiperf_counted_as_errors_make_its_run_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    """Greedy on the tiny model, 37 of 256 answers stream no text: AIPerf counts them as errors,
    so a verdict on its figures would rest on the other 219 alone."""
    status, out, _ = compare_cli(capsys, AIPERF / "a.json", AIPERF / "greedy-empty-text.json", "--fail-on", "regression")
    assert status == 1 and "invalid" in out and "37 request(s) of the run failed" in out


@pytest.mark.parametrize(
    ("tool", "edit", "message"),
    [
        (GUIDELLM, lambda d: d["benchmarks"][0]["metrics"].pop("output_tokens_per_second"),
         "benchmarks[0].metrics.output_tokens_per_second: expected"),
        (GUIDELLM, lambda d: d.update(benchmarks=[]), "benchmarks: expected a non-empty list of benchmarks, got []"),
        (AIPERF, lambda d: d.pop("output_token_throughput"), "output_token_throughput: expected an AIPerf metric"),
        (AIPERF, lambda d: d["request_count"].update(avg="many"), "request_count.avg: expected a number, got 'many'"),
    ],
    ids=["guidellm-no-throughput", "guidellm-no-benchmark", "aiperf-no-throughput", "aiperf-count-text"],
)  # fmt: skip
def test_a_wrong_field_is_one_line_naming_file_and_field_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tool: Path, edit: Any, message: str
) -> None:
    written = _json(tool / "a.json")
    edit(written)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(written))
    status, _, err = compare_cli(capsys, tool / "a.json", bad)
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and f"{bad}: {message}" in err, err


def test_a_file_of_no_known_kind_names_the_kinds_it_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "other.json").write_text(json.dumps({"results": {"throughput": 1}}))
    status, _, err = compare_cli(capsys, GUIDELLM / "a.json", tmp_path / "other.json")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "a GuideLLM benchmark report" in err and "an AIPerf profile export" in err
