"""Why a point changed: the evidence its reference run and its run already record, ranked.

:func:`diagnose` takes the reference run and the run of one point (config × workload), the
point's verdicts and, where there is one, its config's canary judgement, and returns a
:class:`Diagnosis`: lines (:class:`Cause`), each stating the evidence and its size with the
figures it rests on. It guesses nothing beyond them: a figure either run lacks gives no line,
and a cause is named only by a rule stated here on the figures in its line.

The evidence, ranked in this order (:data:`RANKING`):

1. **engine-config**: each key of the resolved engine config (``context.environment.engine``)
   that differs, by key. Under the same vLLM argv (runs judged against each other have it), such
   a key is the same flags resolved to another value: a default that drifted between releases,
   the classic cause.
2. **environment**: each other field of the environment that differs (vLLM version and commit,
   torch, CUDA, the driver, NCCL, FlashInfer, the GPUs), in
   :data:`~pytest_qwenperf.core.environment.VERSIONS` order; where either run recorded no
   environment, the vLLM versions of the runs' context.
3. **canary**: the config's answer to the correctness canary changed (``changed-output``): its
   match rate against the floor, the log-prob drift and the first differing prompt.
4. **telemetry**: what the server and devices did that moved beyond its own noise (the table
   :data:`_TELEMETRY`: KV-cache usage, preemptions, requests running and waiting, speculative
   acceptance, prefix-cache hits, server CPU, GPU utilization, power and clocks, work per
   CPU-second and per joule), the largest move first (its ``size``, below).
5. **latency-shape**: whether mean TTFT (prefill, queueing included) or mean TPOT (decode)
   moved, with both ratios: it says where the time went, not why, so it comes last.

Differences of setup come first because a regression needs a cause and they are the candidates;
a changed canary output says the computation itself changed; the telemetry shows what the server
did differently, effects that point at a cause.

When a quantity moved, and its size:

* Where either side has several repeats (``samples``) and none is zero, the verdict rule
  decides (:func:`~pytest_qwenperf.core.verdict.judge`, with the reference's sessions and the
  runner's noise as a verdict takes them): a move is a change beyond :data:`REPEATS_MOVE` (a
  ratio below 0.95 or above 1/0.95, the bounds of a verdict at that tolerance) whose interval
  lies wholly on one side of no change. Its size is the log ratio over the interval's
  half-width (how many times its noise). Repeats without any spread (a gauge whose every repeat
  read the same whole number of requests) give no noise to measure against: their size is the
  log ratio over :data:`REPEATS_MOVE`'s bound, the least a move had to be, so that a move whose
  noise is unknown does not outrank one measured at several times its noise.
* With one value per side (most telemetry: the run's single load run, not every repeat's), a
  move is a ratio at or beyond the bounds of :data:`SINGLE_MOVE` (0.90 or 1/0.90), and the line
  says that it rests on one value per side. Its size is the log ratio over that bound's.
* A move must also be at least the quantity's floor, where a level near zero makes any ratio
  large (one percentage point of a fraction, one request, one preemption).
* A quantity from or to zero has no ratio: its size is infinite, first among the telemetry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from pytest_qwenperf.core.canary import CanaryJudgement
from pytest_qwenperf.core.environment import Environment
from pytest_qwenperf.core.metrics import metric
from pytest_qwenperf.core.run import Run, session_counts
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.verdict import Hearing, Judgement, SessionSpread, Side, format_value, judge

Kind = Literal["engine-config", "environment", "canary", "telemetry", "latency-shape", "plugin"]
"""``plugin``: a cause a plugin's ``pytest_qwenperf_causes`` hook added, after the ranked ones."""

RANKING = "engine-config and environment differences, the canary, telemetry by its move over its noise, then the latency shape"
"""The order of a diagnosis's causes, as a heading states it (the module docstring says why)."""
REPEATS_MOVE = 0.05
"""The least change that counts as a move where repeats give a spread: the throughput tolerance."""
SINGLE_MOVE = 0.10
"""The least change that counts as a move with one value per side: beyond the ±3 % of pinned
repeats on the 2-core machine, at the ±14 % of unpinned ones (DESIGN.md, "Noise")."""

NONE_FOUND = (
    "none found in what both runs record: no engine-config, environment or canary difference, no telemetry beyond its noise, "
    "no mean TTFT and TPOT on both sides"
)


class Figure(msgspec.Struct, frozen=True):
    """One figure a cause rests on: what it is, its value (a number, or a setting's JSON text) and unit."""

    name: str
    value: float | str | None
    unit: str = ""


class Cause(msgspec.Struct, frozen=True, kw_only=True):
    """One line of evidence: its kind, what it is about, the line, and the figures it rests on."""

    kind: Kind
    subject: str  # an engine key (engine.<key>), an environment field, a telemetry quantity, "canary", "latency"
    text: str
    figures: tuple[Figure, ...]
    size: float | None = None  # telemetry: its move over the least it had to be (>= 1; inf from or to zero); None: not a move


class Diagnosis(msgspec.Struct, frozen=True, kw_only=True):
    """Why a point changed between its reference run and its run: the causes in the order of :data:`RANKING`."""

    changed: tuple[str, ...]  # what the verdicts found changed: each metric judged a regression, "canary" for a changed output
    causes: tuple[Cause, ...]

    def lines(self) -> tuple[str, ...]:
        """The causes numbered (``1. telemetry: ...``), or one line saying none was found."""
        if not self.causes:
            return (NONE_FOUND,)
        return tuple(f"{i}. {cause.kind}: {cause.text}" for i, cause in enumerate(self.causes, 1))


Values = dict[str, tuple[float | None, ...]]
"""Quantity name -> its value per repeat (one value: the run's single one); None: a value lost."""


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """What a diagnosis reads of one side: of a run (:meth:`of`), or what a stored baseline kept of
    the run it was recorded from (``gate.baseline.evidence``: its context and its ``evidence`` block)."""

    vllm_version: str | None
    environment: Environment | None
    argv: str  # a fingerprint of the vLLM argv: equal on both sides, a differing engine key is the same flags resolved anew
    values: Values  # every quantity of :data:`EVIDENCE` the side has
    sessions: dict[str, tuple[int, ...]] = msgspec.field(default_factory=dict)  # name -> values per pooled session
    runner_noise: dict[str, SessionSpread] = msgspec.field(default_factory=dict)

    @classmethod
    def of(cls, run: Run) -> Evidence:
        values = evidence_values(run)
        return cls(
            vllm_version=run.context.vllm_version,
            environment=run.context.environment,
            argv=run.identity.baseline().argv_sha256,
            values=values,
            sessions={name: run.sessions_of(name, len(found)) for name, found in values.items()},
            runner_noise={name: spread for name, spread in run.runner_noise.items() if name in values},
        )

    def sessions_of(self, name: str, count: int) -> tuple[int, ...]:
        return session_counts(self.sessions.get(name), count)


def evidence_values(run: Run) -> Values:
    """The values of every quantity a diagnosis weighs that ``run`` has: its repeats' (``samples``),
    else its single value; what a baseline keeps of the run it is recorded from."""
    found: Values = {}
    for quantity in EVIDENCE:
        repeats = (run.samples or {}).get(quantity.name)
        values = tuple(repeats) if repeats else (quantity.read(run),)
        if any(v is not None for v in values):
            found[quantity.name] = tuple(_finite(v) for v in values)
    return found


def diagnose(
    reference: Run | Evidence, run: Run | Evidence, judgements: Sequence[Judgement], canary: CanaryJudgement | None = None
) -> Diagnosis:
    """The evidence of why ``run`` differs from ``reference`` (sides of one point: runs, or what a
    stored baseline kept), ranked (see the module docstring). ``judgements``: the point's
    verdicts; ``canary``: its config's canary judgement."""
    reference = reference if isinstance(reference, Evidence) else Evidence.of(reference)
    run = run if isinstance(run, Evidence) else Evidence.of(run)
    changed = tuple(j.metric for j in judgements if j.verdict == "regression")
    if canary is not None and canary.verdict == "changed-output":
        changed += ("canary",)
    causes = (
        *_environment(reference, run),
        *_canary(canary),
        *sorted(_telemetry(reference, run), key=lambda cause: -(cause.size or 0.0)),
        *_latency_shape(reference, run),
    )
    return Diagnosis(changed=changed, causes=causes)


# ------------------------------------------------------------------ setup


def _environment(reference: Evidence, run: Evidence) -> list[Cause]:
    """Engine-config keys, then the other environment fields, that differ; the context's vLLM
    versions where either run recorded no environment."""
    mine, theirs = reference.environment, run.environment
    if mine is None or theirs is None:
        before, after = reference.vllm_version, run.vllm_version
        if not before or not after or before == after:
            return []
        text = f"vllm_version: {before!r} vs {after!r} (reference vs run; an environment is not recorded on both sides)"
        return [Cause(kind="environment", subject="vllm_version", text=text, figures=_sides(before, after))]
    same_argv = reference.argv == run.argv
    resolved = ", under the same vLLM argv: the same flags resolved to another value" if same_argv else ""
    engine, versions = [], []
    for field, text in mine.differences(theirs).items():
        key = field.removeprefix("engine.")
        if key != field:
            figures = _sides(mine.engine.get(key), theirs.engine.get(key))
            line = f"{text} (reference vs run){resolved}"
            engine.append(Cause(kind="engine-config", subject=field, text=line, figures=figures))
        else:
            figures = _sides(getattr(mine, field), getattr(theirs, field))
            versions.append(Cause(kind="environment", subject=field, text=f"{text} (reference vs run)", figures=figures))
    return engine + versions


def _sides(reference: float | str | None, run: float | str | None, unit: str = "") -> tuple[Figure, ...]:
    return (Figure("reference", reference, unit), Figure("run", run, unit))


def _canary(answer: CanaryJudgement | None) -> list[Cause]:
    """The canary's changed output, with the figures its verdict rests on."""
    if answer is None or answer.verdict != "changed-output" or answer.found is None:
        return []
    found = answer.found
    drift = "unknown (no log-probabilities)" if found.logprob_drift is None else f"{found.logprob_drift:.4g}"
    first = "" if found.first_mismatch is None else f"; the first differing prompt is #{found.first_mismatch}"
    text = (
        f"the config's output changed: {found.matched} of {found.prompts} canary prompts give the reference's tokens "
        f"(match rate {found.match_rate:.3f}, floor {answer.floor.match_rate:g}), mean log-prob drift {drift}{first}"
    )
    figures = (
        Figure("match rate", found.match_rate, "fraction"),
        Figure("floor", answer.floor.match_rate, "fraction"),
        Figure("prompts", found.prompts, "count"),
        Figure("logprob drift", found.logprob_drift),
        Figure("first differing prompt", found.first_mismatch),
    )
    return [Cause(kind="canary", subject="canary", text=text, figures=figures)]


# ------------------------------------------------------------------ moves

Reader = Callable[[Run], object]


@dataclass(frozen=True)
class _Quantity:
    """A figure a run records, as its diagnosis reads it."""

    name: str  # the registry's name where it has one; its per-repeat values are ``samples.<name>``
    words: str
    unit: str
    read: Reader  # its single value
    floor: float = 0.0  # the least absolute change that counts


def _registered(name: str, words: str, floor: float = 0.0) -> _Quantity:
    """A metric of the registry, read at its path (:meth:`Run.value`)."""
    return _Quantity(name, words, metric(name).unit, lambda run: run.value(name), floor)


def _gauge(name: str) -> Reader:
    """The mean of a scheduler gauge over the run's window (``telemetry.server_gauges``)."""
    return lambda run: _at(run.telemetry, "server_gauges", name, "mean")


def _per_gpu(name: str) -> Reader:
    """The mean over GPUs of each one's mean ``name``; None unless every GPU has one (a part would mislead)."""

    def read(run: Run) -> float | None:
        devices = _at(run.telemetry, "gpu", "devices")
        means = [_finite(_at(device, name, "mean")) for device in devices] if isinstance(devices, list) else []
        return None if not means or None in means else math.fsum(m for m in means if m is not None) / len(means)

    return read


def _at(node: object, *keys: str) -> object:
    """The value at ``keys`` through JSON objects; None where a step is missing."""
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _finite(value: object) -> float | None:
    """A finite, non-negative number as a float; None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


_TELEMETRY = (
    _Quantity("kv_cache_usage", "KV-cache usage", "fraction", _gauge("kv_cache_usage"), floor=0.01),
    _Quantity("num_preemptions", "preemptions", "count", lambda run: run.server.deltas.get("num_preemptions"), floor=1),
    _Quantity("num_requests_running", "requests running, the mean batch", "requests", _gauge("num_requests_running"), floor=1),
    _Quantity("num_requests_waiting", "requests waiting", "requests", _gauge("num_requests_waiting"), floor=1),
    _registered("spec_decode_acceptance_rate", "speculative acceptance", floor=0.01),
    _registered("spec_decode_mean_acceptance_length", "speculative acceptance length"),
    _registered("prefix_cache_hit_rate", "prefix-cache hit rate", floor=0.01),
    _registered("server_cpu_busy", "server CPU busy"),
    _registered("tokens_per_server_cpu_s", "tokens per server CPU-second"),
    _registered("gpu_utilization", "GPU utilization", floor=0.01),
    _registered("gpu_sm_activity", "SM activity", floor=0.01),
    _registered("gpu_tensor_activity", "tensor activity", floor=0.01),
    _Quantity("gpu_power_w", "GPU power (mean over GPUs)", "W", _per_gpu("power_w")),
    _Quantity("gpu_sm_clock_mhz", "SM clock (mean over GPUs)", "MHz", _per_gpu("sm_clock_mhz")),
    _registered("tokens_per_joule", "tokens per joule"),
)
_TTFT = _registered("mean_ttft_ms", "mean TTFT")
_TPOT = _registered("mean_tpot_ms", "mean TPOT")
EVIDENCE = (*_TELEMETRY, _TTFT, _TPOT)
"""Every quantity a diagnosis weighs: what :class:`Evidence` holds of a side."""


@dataclass(frozen=True)
class _Move:
    """A quantity on both sides, and whether it moved by the rule of the module docstring."""

    quantity: _Quantity
    reference: float  # the centre of its values
    run: float
    moved: bool
    size: float  # the log ratio over the least a move had to be; inf from or to zero
    basis: str  # what decided it, in words
    figures: tuple[Figure, ...]

    @property
    def ratio(self) -> float | None:
        return self.run / self.reference if self.reference else None

    def text(self) -> str:
        """``KV-cache usage (fraction): 0.62 → 0.97 (×1.565): 12.4 times its noise (95% interval ...)``."""
        ratio = self.ratio
        change = "" if ratio is None else f" (×{ratio:.3f})"
        values = f"{format_value(self.reference)} → {format_value(self.run)}{change}"
        return f"{self.quantity.words} ({self.quantity.unit}): {values}: {self.basis}"


def _move(quantity: _Quantity, reference: Evidence, run: Evidence) -> _Move | None:
    """``quantity`` on both runs and whether it moved; None where either lacks it."""
    before, after = _values(reference, quantity), _values(run, quantity)
    if before is None or after is None:
        return None
    base, now = centre(before), centre(after)
    counts = (Figure("values (reference)", len(before), "count"), Figure("values (run)", len(after), "count"))
    big_enough = abs(now - base) >= quantity.floor and now != base
    if base == 0 or now == 0:
        basis = f"{'from' if base == 0 else 'to'} none ({_single(before, after)})"
        figures = (*_sides(base, now, quantity.unit), *counts)
        return _Move(quantity, base, now, big_enough, math.inf if big_enough else 0.0, basis, figures)
    if (len(before) > 1 or len(after) > 1) and min(*before, *after) > 0:
        return _judged(quantity, reference, run, before, after, big_enough, counts)
    ratio = now / base
    size = abs(math.log(ratio)) / -math.log1p(-SINGLE_MOVE)
    moved = big_enough and size >= 1
    least = f"the least move of {SINGLE_MOVE:.0%}"
    shown = _outcome(quantity, size >= 1, big_enough, f"{size:.1f} times {least}", f"within {least}")
    figures = (*_sides(base, now, quantity.unit), Figure("ratio", ratio), Figure("least move", SINGLE_MOVE, "fraction"), *counts)
    return _Move(quantity, base, now, moved, size, f"{shown} ({_single(before, after)})", figures)


def _single(before: Sequence[float], after: Sequence[float]) -> str:
    """What a move decided without a spread rests on."""
    if len(before) == len(after) == 1:
        return "one value per side"
    return f"the centres of {len(before)} vs {len(after)} values alone: a value of zero has no log-scale spread"


def _judged(
    quantity: _Quantity,
    reference: Evidence,
    run: Evidence,
    before: tuple[float, ...],
    after: tuple[float, ...],
    big_enough: bool,
    counts: tuple[Figure, ...],
) -> _Move:
    """A move decided by the verdict rule on the repeats' spread (either direction is a move)."""
    hearing = Hearing(
        quantity.name,
        Side(before, reference.sessions_of(quantity.name, len(before))),
        Side(after),
        direction="higher",
        tolerance=REPEATS_MOVE,
        unit=quantity.unit,
        runner=_runner(reference, run, quantity.name),
    )
    j = judge(hearing)
    # Both centres are positive and there is a spread, so the verdict has a ratio and an MDE.
    assert j.baseline is not None and j.now is not None and j.ratio is not None and j.mde is not None
    half = -math.log1p(-j.mde) if j.mde < 1 else math.inf  # the interval's half-width, log scale
    log_ratio = abs(math.log(j.ratio))
    size = log_ratio / half if half > 0 else log_ratio / -math.log1p(-REPEATS_MOVE)
    beyond = j.verdict in ("regression", "improvement")
    low, high = j.ratio * math.exp(-half), j.ratio * math.exp(half)
    sessions = "" if j.between is None else f", sessions differing by SD {j.between:.1%}"
    interval = f"{j.confidence:.0%} interval ×{low:.3f}–×{high:.3f} over {len(before)} vs {len(after)} repeats{sessions}"
    noise = f"{size:.1f} times its noise" if half > 0 else f"{size:.1f} times the least move of {REPEATS_MOVE:.0%} (repeats without spread)"
    shown = _outcome(quantity, beyond, big_enough, noise, f"within its noise or {REPEATS_MOVE:.0%}")
    figures = (*_sides(j.baseline, j.now, quantity.unit), Figure("ratio", j.ratio), Figure("mde", j.mde, "fraction"), *counts)
    return _Move(quantity, j.baseline, j.now, beyond and big_enough, size, f"{shown} ({interval})", figures)


def _outcome(quantity: _Quantity, beyond: bool, big_enough: bool, moved: str, within: str) -> str:
    """How a move was decided, in words: ``moved`` or ``within`` by its rule, or under its floor."""
    if not beyond:
        return within
    return moved if big_enough else f"under the least change of {quantity.floor:g} {quantity.unit}"


def telemetry_figures(run: Run) -> dict[str, float]:
    """The single value of each telemetry figure a diagnosis weighs that ``run`` has: what a repeat
    adds to a point's ``samples`` (``measure.run``), so that a later diagnosis judges the figure on
    its repeats' spread rather than on one value per side."""
    return {quantity.name: value for quantity in _TELEMETRY if (value := _finite(quantity.read(run))) is not None}


def _values(side: Evidence, quantity: _Quantity) -> tuple[float, ...] | None:
    """Its value per repeat, else its single value; None where the side lacks it or lost one of its
    repeats' values."""
    found = side.values.get(quantity.name)
    return None if not found or None in found else tuple(v for v in found if v is not None)


def _runner(reference: Evidence, run: Evidence, name: str) -> SessionSpread | None:
    """The wider of the two runs' runner noise, as :func:`~pytest_qwenperf.gate.judge.judge_against_run` takes it."""
    known = [spread for spread in (reference.runner_noise.get(name), run.runner_noise.get(name)) if spread is not None]
    return max(known, key=lambda spread: spread.log_sd, default=None)


def _telemetry(reference: Evidence, run: Evidence) -> list[Cause]:
    """Every telemetry quantity both runs have that moved."""
    moves = [move for quantity in _TELEMETRY if (move := _move(quantity, reference, run)) is not None and move.moved]
    return [Cause(kind="telemetry", subject=m.quantity.name, text=m.text(), figures=m.figures, size=m.size) for m in moves]


_PHASES = {
    (True, True): "prefill and decode both moved",
    (True, False): "prefill moved (TTFT, queueing included), decode (TPOT) did not",
    (False, True): "decode moved (TPOT), prefill (TTFT) did not",
    (False, False): "neither TTFT nor TPOT moved",
}


def _latency_shape(reference: Evidence, run: Evidence) -> list[Cause]:
    """Which of mean TTFT and mean TPOT moved, with both; nothing unless both runs have both."""
    ttft, tpot = _move(_TTFT, reference, run), _move(_TPOT, reference, run)
    if ttft is None or tpot is None:
        return []
    text = f"{_PHASES[ttft.moved, tpot.moved]}: {ttft.text()}; {tpot.text()}"
    figures = tuple(
        Figure(f"{move.quantity.name} {figure.name}", figure.value, figure.unit) for move in (ttft, tpot) for figure in move.figures
    )
    return [Cause(kind="latency-shape", subject="latency", text=text, figures=figures)]
