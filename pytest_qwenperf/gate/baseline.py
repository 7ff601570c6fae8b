"""Baselines: what one (hardware, model, config, workload) measured before, as versioned JSON.

A baseline lives at ``baselines/<hardware>/<model-slug>/<config>/<workload>.json`` and
holds five blocks:

* ``identity``: what was measured (hardware kind, model, suite, config id, sha256 of the
  rendered vLLM argv, workload id and fingerprint). A run is compared with a baseline
  only when its identity is equal; anything else is "not comparable", never a regression.
* ``context``: where and with what it was measured (vLLM version, GPU, driver, CUDA, CPU,
  date, this project's commit). Context is allowed to differ: it is what a comparison
  across vLLM upgrades is about.
* ``metrics``: the gated metrics (:data:`~pytest_qwenperf.core.metrics.GATED` and the
  :data:`~pytest_qwenperf.core.metrics.SCALING` family), each with its unit, better
  direction, tolerance and the samples it was measured as.
  ``value`` is the :func:`centre` of the samples; verdicts use the samples. The stored
  tolerance and direction are authoritative, so a team can loosen one in the file.
* ``provenance``: ``measured`` (by this tool) or ``published`` (a figure from elsewhere,
  with its source).
* ``history``: earlier ``{context, metrics, provenance}`` entries, newest last.

Writes are atomic and refuse runs that must not become a baseline: failed requests,
client and server token counts that disagree, a client-bound run, or a run whose
identity differs from the stored file's. A file that cannot be parsed is never
overwritten: it is reported, naming the file, the field and what was expected.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.core.identity import Context, Identity, argv_digest
from pytest_qwenperf.core.metrics import GATED, Direction, find, gate_order
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.textfiles import read_text

SCHEMA = "qwenperf-baseline/1"

ProvenanceKind = Literal["measured", "published"]

# ------------------------------------------------------------------ errors and reading


class BaselineError(ValueError):
    """A baseline file is unreadable or malformed; the message names file, field and expectation."""


class RunJsonError(ValueError):
    """A run's JSON lacks a field this module needs; the message names where, the field and expectation."""


class BaselineRefused(ValueError):
    """A run that must not become the baseline (failed, client-bound, or not comparable)."""


class PublishedBaselineKept(BaselineRefused):
    """The stored baseline holds published figures, and replacing them was not asked for."""


def _show(value: object) -> str:
    if value is _MISSING:
        return "nothing (the field is missing)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_MISSING = object()


class _Reader:
    """Typed access to parsed JSON whose errors say where, which field and what was expected."""

    def __init__(self, where: str, error: type[ValueError]) -> None:
        self.where = where
        self.error = error

    def fail(self, field: str, expected: str, got: object) -> ValueError:
        return self.error(f"{self.where}: {field}: expected {expected}, got {_show(got)}")

    def table(self, data: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
        value = data.get(key, _MISSING)
        if not isinstance(value, dict):
            raise self.fail(field, "a JSON object", value)
        return value

    def text(self, data: Mapping[str, Any], key: str, field: str) -> str:
        value = data.get(key, _MISSING)
        if not isinstance(value, str) or not value:
            raise self.fail(field, "a non-empty string", value)
        return value

    def optional_text(self, data: Mapping[str, Any], key: str, field: str) -> str | None:
        """A string or null; an empty string (an unknown CPU model, say) reads as null."""
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise self.fail(field, "a string or null", value)
        return value or None

    def integer(self, data: Mapping[str, Any], key: str, field: str) -> int | None:
        value = data.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise self.fail(field, "a non-negative integer or null", value)
        return value

    def number(self, value: object, field: str) -> float:
        """A finite, non-negative number: every metric and tolerance is one."""
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value >= 0):
            raise self.fail(field, "a finite, non-negative number", value)
        return float(value)

    def numbers(self, value: object, field: str) -> tuple[float, ...]:
        if not isinstance(value, list) or not value:
            raise self.fail(field, "a non-empty list of finite, non-negative numbers", value)
        return tuple(self.number(v, f"{field}[{i}]") for i, v in enumerate(value))

    def choice(self, data: Mapping[str, Any], key: str, field: str, choices: tuple[str, ...]) -> str:
        value = data.get(key, _MISSING)
        if value not in choices:
            raise self.fail(field, "one of " + ", ".join(repr(c) for c in choices), value)
        return value  # type: ignore[return-value]


# ------------------------------------------------------------------ identity, context


# ------------------------------------------------------------------ context


_CONTEXT_INTS = ("gpu_count", "cpu_count")


def _context(reader: _Reader, data: Mapping[str, Any], field: str) -> Context:
    values: dict[str, object] = {}
    for f in fields(Context):
        if f.name in _CONTEXT_INTS:
            values[f.name] = reader.integer(data, f.name, f"{field}.{f.name}")
        else:
            values[f.name] = reader.optional_text(data, f.name, f"{field}.{f.name}")
    return Context(**values)


@dataclass(frozen=True)
class Provenance:
    kind: ProvenanceKind
    source: str  # a URL for published figures; what produced it for measured ones

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source}


# ------------------------------------------------------------------ metrics and baselines


@dataclass(frozen=True)
class StoredMetric:
    value: float  # centre(samples)
    unit: str
    direction: Direction
    tolerance: float  # fraction of the baseline a run may be worse by
    samples: tuple[float, ...]

    @classmethod
    def of(cls, name: str, samples: Sequence[float], tolerance: float | None = None) -> StoredMetric:
        """``tolerance`` overrides the metric's default (a suite's ``tolerances`` table)."""
        info = find(name)
        if info is None or info.tolerance is None:
            raise ValueError(f"{name!r} is not a gated metric")
        tolerance = info.tolerance if tolerance is None else tolerance
        return cls(centre(samples), info.unit, info.direction, tolerance, tuple(float(s) for s in samples))

    def as_json(self) -> dict[str, object]:
        return {
            "value": self.value,
            "unit": self.unit,
            "direction": self.direction,
            "tolerance": self.tolerance,
            "samples": list(self.samples),
        }


@dataclass(frozen=True)
class HistoryEntry:
    context: Context
    metrics: Mapping[str, StoredMetric]
    provenance: Provenance

    def as_json(self) -> dict[str, object]:
        return {
            "context": self.context.as_json(),
            "metrics": _metrics_json(self.metrics),
            "provenance": self.provenance.as_json(),
        }


@dataclass(frozen=True)
class Baseline:
    identity: Identity
    context: Context
    metrics: Mapping[str, StoredMetric]
    provenance: Provenance
    history: tuple[HistoryEntry, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "identity": self.identity.as_json(),
            "context": self.context.as_json(),
            "metrics": _metrics_json(self.metrics),
            "provenance": self.provenance.as_json(),
            "history": [entry.as_json() for entry in self.history],
        }


def _metrics_json(metrics: Mapping[str, StoredMetric]) -> dict[str, object]:
    return {name: metrics[name].as_json() for name in gate_order(metrics)}


def _metrics(reader: _Reader, data: Mapping[str, Any], field: str) -> Mapping[str, StoredMetric]:
    table = reader.table(data, "metrics", field)
    if not table:
        raise reader.fail(field, "at least one metric", table)
    metrics = {}
    for name, entry in table.items():
        where = f"{field}.{name}"
        if not isinstance(entry, dict):
            raise reader.fail(where, "a JSON object with value, unit, direction, tolerance, samples", entry)
        samples = reader.numbers(entry.get("samples", _MISSING), f"{where}.samples")
        value = reader.number(entry.get("value", _MISSING), f"{where}.value")
        expected = centre(samples)
        if not math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise reader.fail(f"{where}.value", f"the centre of its samples ({expected!r})", value)
        tolerance = reader.number(entry.get("tolerance", _MISSING), f"{where}.tolerance")
        if not 0 <= tolerance < 1:
            raise reader.fail(f"{where}.tolerance", "a fraction in [0, 1)", tolerance)
        metrics[name] = StoredMetric(
            value=expected,
            unit=reader.text(entry, "unit", f"{where}.unit"),
            direction=reader.choice(entry, "direction", f"{where}.direction", get_args(Direction)),
            tolerance=tolerance,
            samples=samples,
        )
    return MappingProxyType(metrics)


def _provenance(reader: _Reader, data: Mapping[str, Any], field: str) -> Provenance:
    table = reader.table(data, "provenance", field)
    kind = reader.choice(table, "kind", f"{field}.kind", get_args(ProvenanceKind))
    return Provenance(kind, reader.text(table, "source", f"{field}.source"))


def _entry(reader: _Reader, data: Mapping[str, Any], prefix: str) -> HistoryEntry:
    """The {context, metrics, provenance} blocks of ``data``; field names start with ``prefix``."""
    return HistoryEntry(
        context=_context(reader, reader.table(data, "context", f"{prefix}context"), f"{prefix}context"),
        metrics=_metrics(reader, data, f"{prefix}metrics"),
        provenance=_provenance(reader, data, f"{prefix}provenance"),
    )


def parse_baseline(data: object, where: str) -> Baseline:
    """Check and convert a parsed baseline document; errors name ``where``, the field and the expectation."""
    reader = _Reader(where, BaselineError)
    if not isinstance(data, dict):
        raise reader.fail("(top level)", f"a JSON object with schema {SCHEMA!r}", data)
    if data.get("schema", _MISSING) != SCHEMA:
        raise reader.fail("schema", repr(SCHEMA), data.get("schema", _MISSING))
    identity_table = reader.table(data, "identity", "identity")
    identity = Identity(
        **{f.name: reader.text(identity_table, f.name, f"identity.{f.name}") for f in fields(Identity)}
    )
    history = data.get("history", _MISSING)
    if not isinstance(history, list):
        raise reader.fail("history", "a list of earlier {context, metrics, provenance} entries", history)
    entries = []
    for i, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise reader.fail(f"history[{i}]", "a JSON object with context, metrics, provenance", entry)
        entries.append(_entry(reader, entry, f"history[{i}]."))
    current = _entry(reader, data, "")
    return Baseline(identity, current.context, current.metrics, current.provenance, tuple(entries))


def load_baseline(path: Path) -> Baseline:
    """Read and check a baseline file; :class:`BaselineError` names the file, the field and what was expected."""
    text = read_text(Path(path), "baseline file", f"a {SCHEMA} JSON document", BaselineError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{path}: (document): expected a complete {SCHEMA} JSON document, but it is not valid JSON at line "
            f"{exc.lineno} column {exc.colno} ({exc.msg}); the file may be truncated or half-written"
        ) from None
    return parse_baseline(data, str(path))


def find_baseline(root: Path, identity: Identity) -> Baseline | None:
    """The stored baseline for ``identity`` under ``root``; None when there is none yet."""
    path = identity.path(root)
    return load_baseline(path) if path.exists() else None


def save_baseline(root: Path, baseline: Baseline) -> Path:
    """Write ``baseline`` atomically at its identity's path under ``root``; returns the path."""
    path = baseline.identity.path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(baseline.as_json(), indent=2))
    return path


# ------------------------------------------------------------------ runs


@dataclass(frozen=True)
class MeasuredRun:
    """The parts of a run's JSON (``RunResult.as_json()``) that baselines and verdicts use."""

    identity: Identity
    context: Context
    samples: Mapping[str, tuple[float, ...]]  # gated metric -> one value per repeat
    failed: int  # failed requests over every repeat
    tokens_match: bool | None
    token_detail: str
    client_bound: str | None
    tolerances: Mapping[str, float]  # gated metric -> fraction, where the run's suite overrides the default
    lost: Mapping[str, str]  # gated metric the run names without a number -> where (a null, a NaN)


def parse_run(run: Mapping[str, Any], where: str = "run") -> MeasuredRun:
    """Check and read a run's JSON; :class:`RunJsonError` names ``where``, the field and the expectation.

    A gated metric's samples are ``samples.<name>`` when the run carries them (one value
    per repeat), else its single value at the registry's
    :attr:`~pytest_qwenperf.core.metrics.MetricInfo.path` (``metrics.<name>`` for client
    metrics). A metric the run does not name was not measured; one it names with a null
    or non-finite value (a sample among ``samples.<name>``, or the single value) is data
    the run lost: it goes to ``lost`` with where it was, not to ``samples``, and the
    verdicts decide what that means.
    """
    reader = _Reader(where, RunJsonError)
    if not isinstance(run, Mapping):
        raise reader.fail("(top level)", "a run's JSON object", run)
    identity = reader.table(run, "identity", "identity")
    argv = identity.get("argv", _MISSING)
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise reader.fail("identity.argv", "a list of strings (the rendered vLLM argv)", argv)
    context = reader.table(run, "context", "context")
    hardware = context.get("hardware") or {}
    if not isinstance(hardware, dict):
        raise reader.fail("context.hardware", "a JSON object or null", hardware)
    metrics = reader.table(run, "metrics", "metrics")
    client = reader.table(run, "client", "client")
    tokens = reader.table(run, "token_check", "token_check")
    matches = tokens.get("matches", _MISSING)
    if matches not in (True, False, None):
        raise reader.fail("token_check.matches", "true, false or null", matches)
    failed = reader.number(metrics.get("failed", _MISSING), "metrics.failed")
    repeats = run.get("samples")
    if isinstance(repeats, dict) and repeats.get("failed") is not None:  # ``metrics`` is one repeat (the median's)
        failed = max(failed, math.fsum(reader.numbers(repeats["failed"], "samples.failed")))
    samples, lost = _run_samples(reader, run, metrics)
    return MeasuredRun(
        identity=Identity(
            hardware=reader.text(identity, "hardware", "identity.hardware"),
            model=reader.text(identity, "model", "identity.model"),
            suite=reader.text(identity, "suite", "identity.suite"),
            config=reader.text(identity, "config", "identity.config"),
            argv_sha256=argv_digest(argv),
            workload=reader.text(identity, "workload", "identity.workload"),
            workload_fingerprint=reader.text(identity, "workload_fingerprint", "identity.workload_fingerprint"),
        ),
        context=Context(
            vllm_version=reader.optional_text(context, "vllm_version", "context.vllm_version"),
            gpu_name=reader.optional_text(hardware, "gpu_name", "context.hardware.gpu_name"),
            gpu_count=reader.integer(hardware, "gpu_count", "context.hardware.gpu_count"),
            driver_version=reader.optional_text(hardware, "driver_version", "context.hardware.driver_version"),
            cuda_version=reader.optional_text(hardware, "cuda_version", "context.hardware.cuda_version"),
            cpu_model=reader.optional_text(hardware, "cpu_model", "context.hardware.cpu_model"),
            cpu_count=reader.integer(hardware, "cpu_count", "context.hardware.cpu_count"),
            date=reader.optional_text(context, "started", "context.started"),
        ),
        samples=MappingProxyType(samples),
        lost=MappingProxyType(lost),
        failed=int(failed),
        tokens_match=matches,
        token_detail=str(tokens.get("detail", "")),
        client_bound=reader.optional_text(client, "bound", "client.bound"),
        tolerances=MappingProxyType(_run_tolerances(reader, run.get("tolerances") or {})),
    )


def _run_tolerances(reader: _Reader, value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        raise reader.fail("tolerances", "a JSON object of gated metric -> fraction, or null", value)
    tolerances = {}
    for name, fraction in value.items():
        info = find(name)
        if info is None or not info.gated:
            raise reader.fail(f"tolerances.{name}", "a gated metric (" + ", ".join(GATED) + ")", name)
        if reader.number(fraction, f"tolerances.{name}") >= 1:
            raise reader.fail(f"tolerances.{name}", "a fraction in [0, 1)", fraction)
        tolerances[name] = float(fraction)
    return tolerances


def _run_samples(
    reader: _Reader, run: Mapping[str, Any], metrics: Mapping[str, Any]
) -> tuple[dict[str, tuple[float, ...]], dict[str, str]]:
    """(samples, lost) of the gated metrics: see :func:`parse_run`."""
    repeats = run.get("samples") or {}
    if not isinstance(repeats, dict):
        raise reader.fail("samples", "a JSON object of metric -> list of values, or null", repeats)
    found: dict[str, tuple[float, ...]] = {}
    lost: dict[str, str] = {}
    for name in {*metrics, *GATED, *repeats}:
        info = find(name)
        if info is None or not info.gated:
            continue
        if name in repeats:
            values = repeats[name]
            gaps = [i for i, v in enumerate(values) if _no_number(v)] if isinstance(values, list) else []
            if gaps:
                lost[name] = f"samples.{name}[{gaps[0]}] is {json.dumps(values[gaps[0]])}"
            else:
                found[name] = reader.numbers(values, f"samples.{name}")
            continue
        value = number_at(run, info.path)
        if value is not None:
            found[name] = (value,)
        elif _no_number(leaf := _leaf(run, info.path)):
            lost[name] = f"{'.'.join(info.path)} is {json.dumps(leaf)}"
    return {name: found[name] for name in gate_order(found)}, {name: lost[name] for name in gate_order(lost)}


def _no_number(value: object) -> bool:
    """A JSON value that stands where a number was not measured: null, NaN or an infinity."""
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _leaf(tree: Mapping[str, Any], path: Sequence[str]) -> object:
    """The value at ``path`` in nested JSON objects; ``_MISSING`` where a step is absent."""
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def number_at(tree: Mapping[str, Any], path: Sequence[str]) -> float | None:
    """The finite number at ``path`` in nested JSON objects; None where a step is missing or
    not an object, or the value is not a finite number (a quantity the run did not measure)."""
    node = _leaf(tree, path)
    if isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
        return float(node)
    return None


def project_commit() -> str | None:
    """This project's git commit when it runs from a checkout; None otherwise."""
    package = Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    top, commit = done.stdout.split()
    return commit if Path(top).resolve() == package.parent else None


def baseline_from_run(run: Mapping[str, Any], *, source: str, git_commit: str | None = None) -> Baseline:
    """A measured baseline holding ``run``'s gated metrics, with the tolerances the run
    carries (its suite's ``tolerances`` table) or the defaults (no checks: see :func:`write_baseline`)."""
    measured = parse_run(run)
    tolerances = measured.tolerances
    if not measured.samples:
        raise RunJsonError("run: metrics: expected at least one gated metric (" + ", ".join(GATED) + ")")
    context = Context(**{**measured.context.as_json(), "git_commit": git_commit})
    metrics = {name: StoredMetric.of(name, samples, tolerances.get(name)) for name, samples in measured.samples.items()}
    return Baseline(measured.identity, context, MappingProxyType(metrics), Provenance("measured", source))


def refusal(run: MeasuredRun) -> str | None:
    """Why ``run`` must not become a baseline; None when it may."""
    if run.failed > 0:
        return f"{run.failed} request(s) failed"
    if run.tokens_match is False:
        return f"client and server token counts disagree ({run.token_detail})"
    if run.client_bound is not None:
        return f"the client could not keep up, so the numbers measure the client, not vLLM ({run.client_bound})"
    return None


def write_baseline(
    root: Path,
    run: Mapping[str, Any],
    *,
    source: str = "qwenperf run",
    git_commit: str | None = None,
    replace_published: bool = False,
) -> Path:
    """Make ``run`` (a run's JSON) the baseline for its identity under ``root``; returns the file.

    The previous metrics move to ``history``. A metric's stored tolerance is kept: the
    file's is authoritative, so one a team set by hand survives the update (a suite's
    changed ``tolerances`` table reaches new baselines only). Raises :class:`BaselineRefused`
    (the file is untouched) for a failed, token-mismatched or client-bound run and for a
    run whose identity differs from the stored file's, :class:`PublishedBaselineKept`
    when the stored file holds published figures and ``replace_published`` is false, and
    :class:`BaselineError` when the stored file cannot be parsed. ``git_commit`` defaults
    to :func:`project_commit`.
    """
    measured = parse_run(run)
    path = measured.identity.path(root)
    reason = refusal(measured)
    if reason:
        raise BaselineRefused(f"{path}: not updated: {reason}")
    new = baseline_from_run(run, source=source, git_commit=git_commit or project_commit())
    previous = load_baseline(path) if path.exists() else None
    history: tuple[HistoryEntry, ...] = ()
    metrics = new.metrics
    if previous is not None:
        differences = previous.identity.differences(measured.identity)
        if differences:
            raise BaselineRefused(
                f"{path}: not updated: the run is not comparable with the stored baseline (stored vs run: "
                + "; ".join(differences)
                + "); move the file away to start a new baseline for the changed setup"
            )
        if previous.provenance.kind == "published" and not replace_published:
            raise PublishedBaselineKept(
                f"{path}: not updated: it holds published figures (provenance {previous.provenance.kind!r}), "
                "which a measured run replaces only when asked to"
            )
        history = (*previous.history, HistoryEntry(previous.context, previous.metrics, previous.provenance))
        metrics = MappingProxyType(
            {
                name: StoredMetric(m.value, m.unit, m.direction, previous.metrics[name].tolerance, m.samples)
                if name in previous.metrics
                else m
                for name, m in new.metrics.items()
            }
        )
    return save_baseline(root, Baseline(new.identity, new.context, metrics, new.provenance, history))


def published_baseline(identity: Identity, values: Mapping[str, float], *, source: str, context: Context) -> Baseline:
    """A baseline from published figures (one sample each) for ``identity`` (``Suite.identity``).

    Taking the identity a suite renders today means re-running it after a suite change
    re-derives the argv hash and workload fingerprint, so the published figures stay
    attached to the rung they describe.
    """
    metrics = {name: StoredMetric.of(name, (value,)) for name, value in values.items()}
    return Baseline(identity, context, MappingProxyType(metrics), Provenance("published", source))
