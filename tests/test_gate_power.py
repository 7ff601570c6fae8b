"""benchmarks/gate_power.py's pure parts: arms, their order, quotas, the cgroup files, and the analysis."""

from __future__ import annotations

import io
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gate_power
from benchmarks.gate_power import (
    COMPANION,
    METRICS,
    Arm,
    analyse,
    arm_order,
    busy_cores,
    parse_arms,
    print_analysis,
    quota_us,
    williams_rows,
)

# ------------------------------------------------------------------ arms


def test_parse_arms_reads_targets_from_names() -> None:
    assert parse_arms("A,A2,B5,B10,B20") == (
        Arm("A", 0.0),
        Arm("A2", 0.0),
        Arm("B5", 0.05),
        Arm("B10", 0.10),
        Arm("B20", 0.20),
    )
    assert parse_arms(" A , B12.5") == (Arm("A", 0.0), Arm("B12.5", 0.125))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A2,B10", "A, the reference"),
        ("A,A", "each at most once"),
        ("A,C5", "expected A, A<n>"),
        ("A,B0", "between 0 and 100"),
        ("A,B100", "between 0 and 100"),
    ],
)
def test_parse_arms_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_arms(text)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_williams_rows_balance_positions_and_carry_over(n: int) -> None:
    rows = williams_rows(n)
    assert len(rows) == (2 * n if n % 2 else n)
    for row in rows:
        assert sorted(row) == list(range(n))
    per_row = len(rows) // n
    for position in range(n):
        assert Counter(row[position] for row in rows) == dict.fromkeys(range(n), per_row)
    followers = Counter((row[i], row[i + 1]) for row in rows for i in range(n - 1))
    assert set(followers.values()) <= {len(rows) // n}
    assert set(followers) == {(a, b) for a, b in itertools.permutations(range(n), 2)}


def test_arm_order_cycles_through_the_design_across_blocks() -> None:
    arms = parse_arms("A,A2,B5,B10,B20")
    cycle = len(williams_rows(len(arms)))
    assert cycle == 10
    orders = [tuple(arm.name for arm in arm_order(arms, i)) for i in range(2 * cycle)]
    assert orders[:cycle] == orders[cycle:]
    assert len(set(orders[:cycle])) == cycle
    first = Counter(order[0] for order in orders[:cycle])
    assert first == dict.fromkeys((arm.name for arm in arms), 2)


# ------------------------------------------------------------------ quotas


def test_quota_is_the_target_share_of_the_cores_the_server_used() -> None:
    assert quota_us(0.10, 0.95, 100_000) == 85_500
    assert quota_us(0.20, 1.0, 100_000) == 80_000
    assert quota_us(0.05, 1.9, 50_000) == 90_250  # more than one core: a quota above the period
    assert quota_us(0.0, 0.95, 100_000) is None


@pytest.mark.parametrize(
    ("slowdown", "busy", "period", "message"),
    [(1.0, 1.0, 100_000, "fraction"), (-0.1, 1.0, 100_000, "fraction"), (0.1, 0.0, 100_000, "positive"), (0.5, 0.01, 100_000, "minimum")],
)
def test_quota_refuses(slowdown: float, busy: float, period: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quota_us(slowdown, busy, period)


def test_busy_cores_takes_the_least_disturbed_steady_window_figure() -> None:
    def repeat(busy: float | None, cpu_s: float, wall_s: float) -> dict[str, Any]:
        return {"metrics": {"server_cpu_busy": busy}, "server_cpu_s": cpu_s, "wall_s": wall_s}

    assert busy_cores([repeat(0.5, 10, 20), repeat(0.97, 10, 20)]) == pytest.approx(0.97)
    assert busy_cores([repeat(None, 10, 20), repeat(None, 12, 20)]) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="no repeat"):
        busy_cores([repeat(None, 10, 0)])


# ------------------------------------------------------------------ analysis


def _repeat(arm: str, throughput: float, *, invalid: tuple[str, ...] = ()) -> dict[str, Any]:
    metrics: dict[str, float | None] = dict.fromkeys(METRICS, None)
    metrics |= {
        "output_throughput": throughput,
        "total_token_throughput": 2 * throughput,
        "p99_tpot_ms": 1e5 / throughput,  # lower is better: slower runs have larger values
        COMPANION: 1000.0,
    }
    return {"arm": arm, "metrics": metrics, "invalid": list(invalid), "wall_s": 20.0}


def _results(blocks: list[list[dict[str, float]]], arms: tuple[str, ...] = ("A", "A2", "B10")) -> dict[str, Any]:
    """Blocks of rounds, each round ``{arm: output throughput}``."""
    return {
        "schema": gate_power.SCHEMA,
        "command": "python -m benchmarks.gate_power --blocks 3 --rounds 3",
        "arms": [{"name": arm, "slowdown": 0.1 if arm == "B10" else 0.0} for arm in arms],
        "rounds": 3,
        "blocks": [
            {"index": b, "rounds": [{"index": r, "repeats": {arm: _repeat(arm, value) for arm, value in round_.items()}} for r, round_ in enumerate(rounds)]}
            for b, rounds in enumerate(blocks)
        ],
    }


A_VALUES = (1000.0, 1010.0, 990.0)


def _block(a_shift: float = 1.0, b_factor: float = 0.9) -> list[dict[str, float]]:
    return [{"A": a * a_shift, "A2": A_VALUES[(i + 1) % 3] * a_shift, "B10": a * a_shift * b_factor} for i, a in enumerate(A_VALUES)]


def test_analysis_detects_a_clear_slowdown_and_no_a_a_regression() -> None:
    results = _results([_block(1.0), _block(1.1), _block(0.95)])
    analysis = analyse(results, tolerance=0.05)
    throughput = analysis["metrics"]["output_throughput"]
    assert analysis["blocks"] == 3 and analysis["repeats_per_side"] == 3
    assert throughput["arms"]["B10"]["pooled_ratio"] == pytest.approx(0.9)
    assert throughput["arms"]["B10"]["regressions"] == 3 and throughput["arms"]["B10"]["pairs"] == 3
    assert throughput["arms"]["A2"]["regressions"] == 0
    assert throughput["arms"]["A2"]["pooled_ratio"] == pytest.approx(1.0)
    # lower is better for TPOT: the slower arm is a regression there too
    assert analysis["metrics"]["p99_tpot_ms"]["arms"]["B10"]["regressions"] == 3
    # a figure the slowdown leaves alone is never a regression
    assert analysis["metrics"][COMPANION]["arms"]["B10"]["verdicts"] == {"pass": 3}
    # no value recorded: no pairs
    assert analysis["metrics"]["p99_ttft_ms"]["arms"]["B10"]["pairs"] == 0
    # spreads of A: within a block the same three values; between blocks the shifts
    within = throughput["a_within_block_cv"]
    assert within["n"] == 3 and within["median"] == pytest.approx(0.01, rel=1e-9)
    means = [1000.0, 1100.0, 950.0]
    mean = sum(means) / 3
    sd = (sum((m - mean) ** 2 for m in means) / 2) ** 0.5
    assert throughput["a_between_block_cv"] == pytest.approx(sd / mean)


def test_analysis_takes_the_first_k_rounds_and_skips_short_blocks() -> None:
    short = _block()[:1]
    results = _results([_block(), _block(), short])
    analysis = analyse(results, tolerance=0.05)
    assert analysis["blocks"] == 2 and analysis["blocks_in_file"] == 3
    one = analyse(results, tolerance=0.05, repeats=1)
    assert one["blocks"] == 3 and one["repeats_per_side"] == 1
    b10 = one["metrics"]["output_throughput"]["arms"]["B10"]
    assert b10["pairs"] == 3 and b10["regressions"] == 3  # one sample each side: the tolerance alone decides
    assert one["metrics"]["output_throughput"]["a_within_block_cv"] is None


def test_analysis_leaves_invalid_repeats_out() -> None:
    results = _results([_block(), _block()])
    results["blocks"][0]["rounds"][0]["repeats"]["B10"] = _repeat("B10", 1.0, invalid=("failed-requests",))
    analysis = analyse(results, tolerance=0.05)
    assert analysis["invalid_repeats_left_out"] == 1
    assert analysis["metrics"]["output_throughput"]["arms"]["B10"]["pooled_ratio"] == pytest.approx(0.9, rel=1e-3)


def test_analysis_reports_the_mde_where_judgements_carry_one(monkeypatch: pytest.MonkeyPatch) -> None:
    results = _results([_block(), _block(1.1)])
    real_judge = gate_power.judge
    mdes = iter([0.02, 0.04] * 100)

    class WithMde:
        def __init__(self, judgement: Any) -> None:
            self.verdict = judgement.verdict
            self.mde = next(mdes)

    monkeypatch.setattr(gate_power, "judge", lambda *a, **k: WithMde(real_judge(*a, **k)))
    mde = analyse(results, tolerance=0.05)["metrics"]["output_throughput"]["arms"]["B10"]["mde"]
    assert mde["n"] == 2 and mde["median"] == pytest.approx(0.03)
    assert mde["p10"] == pytest.approx(0.022) and mde["p90"] == pytest.approx(0.038)


def test_print_analysis_and_json_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results([_block(), _block(1.1)])))
    assert gate_power.main(["--analyse", str(path), "--tolerance", "0.05"]) == 0
    text = capsys.readouterr().out
    assert "achieved slowdown of output_throughput (pooled, against the interleaved A): A2 0.0% (target 0%), B10 10.0% (target 10%)" in text
    assert "| output_throughput (tok/s) | B10 | 10% | -10.0% | 2 of 2 (100%) | regression 2 | " in text  # then the MDE, where judged
    assert "| output_throughput (tok/s) | A2 | 0% | +0.0% | 0 of 2 (0%) | pass 2 | " in text
    assert "| output_throughput | 1.0% (1.0%–1.0%) | 6.7% |" in text
    assert gate_power.main(["--analyse", str(path), "--json", "--repeats", "2"]) == 0
    analysis = json.loads(capsys.readouterr().out)
    assert analysis["repeats_per_side"] == 2
    out = io.StringIO()
    print_analysis(analysis, out)
    assert "2 repeat(s) per side" in out.getvalue()


def test_analysis_pools_consecutive_blocks_per_side_and_pairs_a_with_the_next_groups_a2() -> None:
    results = _results([_block(1.0), _block(1.0), _block(1.2), _block(1.2), _block(0.9)])
    pooled = analyse(results, tolerance=0.05, pool=2)
    assert (pooled["blocks"], pooled["repeats_per_side"], pooled["pool"]) == (4, 6, 2)  # the fifth block has no partner
    throughput = pooled["metrics"]["output_throughput"]["arms"]
    assert throughput["B10"]["pairs"] == 2 and throughput["B10"]["regressions"] == 2
    # A of the first group against A2 of the second: 20 % apart, so not the interleaved A/A's ratio of 1
    apart = throughput[gate_power.APART]
    assert apart["pairs"] == 1 and apart["pooled_ratio"] == pytest.approx(1.2)
    assert apart["verdicts"] == {"improvement": 1}
    single = analyse(results, tolerance=0.05)["metrics"]["output_throughput"]["arms"][gate_power.APART]
    assert single["pairs"] == 4
    assert gate_power.APART not in analyse(_results([_block(), _block()], arms=("A", "B10")), tolerance=0.05)["targets"]


def test_files_of_the_same_arms_merge_their_blocks_in_order_and_others_are_refused() -> None:
    first, second = _results([_block(), _block(1.1)]), _results([_block(0.9)])
    both = gate_power.merged([first, second], ["one.json", "two.json"])
    assert [b["rounds"][0]["repeats"]["A"]["metrics"] for b in both["blocks"]] == [
        b["rounds"][0]["repeats"]["A"]["metrics"] for b in (*first["blocks"], *second["blocks"])
    ]
    assert both["command"] == [first["command"], second["command"]]
    assert analyse(both)["blocks"] == 3
    assert gate_power.merged([first], ["one.json"]) is first
    with pytest.raises(ValueError, match=r"two.json: expected the arms of one.json \(A, A2, B10\), got A, B10"):
        gate_power.merged([first, _results([], arms=("A", "B10"))], ["one.json", "two.json"])
    with pytest.raises(ValueError, match=r"two.json: expected 3 rounds a block as in one.json, got 2"):
        gate_power.merged([first, {**second, "rounds": 2}], ["one.json", "two.json"])
