"""Baselines: what one (hardware, model, config, workload) measured before, as versioned JSON.

A baseline lives at ``baselines/<hardware>/<model-slug>/<config>/<workload>.json`` and
holds six blocks:

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
* ``evidence``: what a diagnosis of a regression against it weighs
  (:data:`~pytest_qwenperf.gate.diagnosis.EVIDENCE`), each repeat's value as the recorded run
  had it (empty in a published baseline, and in one recorded before baselines kept it).

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
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.canary import CANARY
from pytest_qwenperf.core.files import write_atomically
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.identity import Context, Identity, Text, slug
from pytest_qwenperf.core.machine import upgraded
from pytest_qwenperf.core.metrics import GATED, Direction, find, gate_order
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.run_json import MISSING, RunJsonError
from pytest_qwenperf.core.stats import centre
from pytest_qwenperf.core.textfiles import read_text
from pytest_qwenperf.gate.diagnosis import Evidence, evidence_values

SCHEMA = "qwenperf-baseline/1"

ProvenanceKind = Literal["measured", "published"]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]

# ------------------------------------------------------------------ errors


_Doc = TypeVar("_Doc")


class BaselineError(ValueError):
    """A baseline file is unreadable or malformed; the message names file, field and expectation."""


class BaselineRefused(ValueError):
    """A run that must not become the baseline (failed, client-bound, or not comparable)."""


class PublishedBaselineKept(BaselineRefused):
    """The stored baseline holds published figures, and replacing them was not asked for."""


# ------------------------------------------------------------------ the file


class Provenance(msgspec.Struct, frozen=True, kw_only=True):
    kind: ProvenanceKind
    source: Text  # a URL for published figures; what produced it for measured ones


class StoredMetric(msgspec.Struct, frozen=True, kw_only=True):
    value: NonNegative  # centre(samples)
    unit: Text
    direction: Direction
    tolerance: NonNegative  # fraction of the baseline a run may be worse by
    samples: Annotated[tuple[NonNegative, ...], msgspec.Meta(min_length=1)]
    sessions: tuple[Annotated[int, msgspec.Meta(ge=1)], ...] | None = None  # samples per session, in order; None: one session

    @classmethod
    def of(cls, name: str, samples: Sequence[float], tolerance: float | None = None) -> StoredMetric:
        """``tolerance`` overrides the metric's default (a suite's ``tolerances`` table)."""
        info = find(name)
        if info is None or info.tolerance is None:
            raise ValueError(f"{name!r} is not a gated metric")
        tolerance = info.tolerance if tolerance is None else tolerance
        values = tuple(float(s) for s in samples)
        return cls(value=centre(values), unit=info.unit, direction=info.direction, tolerance=tolerance, samples=values)


Metrics = Annotated[dict[str, StoredMetric], msgspec.Meta(min_length=1)]


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    context: Context
    metrics: Metrics
    provenance: Provenance


class Baseline(msgspec.Struct, frozen=True, kw_only=True):
    schema: str = SCHEMA  # checked before the rest is read: see decode_baseline
    identity: Identity
    context: Context
    metrics: Metrics  # in gate order
    provenance: Provenance
    history: tuple[HistoryEntry, ...]  # earlier entries, newest last
    # What a diagnosis weighs (``gate.diagnosis.EVIDENCE``), kept from the run recorded: per quantity its value
    # per repeat (null: lost). Empty in a published baseline and in one recorded before baselines kept it.
    evidence: dict[str, tuple[NonNegative | None, ...]] = msgspec.field(default_factory=dict)


class PooledBaseline(Baseline, frozen=True, kw_only=True):
    """A baseline pooled from runs of a history store, held in memory and never written:
    ``name`` is what its verdicts call it (``history: 5 runs, ...``)."""

    name: str


def decode_document(text: str | bytes, where: str, name: str, shape: type[_Doc]) -> _Doc:
    """A versioned JSON document of the baseline store (``schema`` ``name``) as ``shape``: the
    JSON first, then the schema name (a document of another version says so, whatever else
    differs), then what ``shape`` states; :class:`BaselineError` names ``where``, the field and
    what was expected. A document written before the machine had one record is read too
    (:func:`~pytest_qwenperf.core.machine.upgraded`)."""
    try:
        data = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise BaselineError(
            f"{where}: (document): expected a complete {name} JSON document, but it is not valid JSON ({exc}); "
            "the file may be truncated or half-written"
        ) from None
    if isinstance(data, dict) and data.get("schema") != name:
        got = show(data["schema"]) if "schema" in data else MISSING
        raise BaselineError(f"{where}: schema: expected {name!r}, got {got}")
    if isinstance(data, dict) and isinstance(data.get("history"), list):
        data = data | {"history": [upgraded(entry) for entry in data["history"]]}
    return schema.convert(upgraded(data), shape, lambda m: BaselineError(f"{where}: {m.text(show=show, absent=MISSING)}"), null=True)


def decode_baseline(text: str | bytes, where: str) -> Baseline:
    """Check and convert a baseline document; errors name ``where``, the field and the expectation.

    The schema name first (a document of another version says so, whatever else differs),
    then what the schema states, then what it cannot: a value that is not the centre of its
    samples, a tolerance outside [0, 1)."""
    baseline = decode_document(text, where, SCHEMA, Baseline)
    history = tuple(
        msgspec.structs.replace(entry, metrics=_checked(entry.metrics, f"{where}: history[{i}].metrics"))
        for i, entry in enumerate(baseline.history)
    )
    return msgspec.structs.replace(baseline, metrics=_checked(baseline.metrics, f"{where}: metrics"), history=history)


def _checked(metrics: Mapping[str, StoredMetric], field: str) -> dict[str, StoredMetric]:
    """``metrics`` with each value exactly the centre of its samples, after checking it is (to rounding)."""
    checked = {}
    for name, stored in metrics.items():
        expected = centre(stored.samples)
        if not math.isclose(stored.value, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise BaselineError(f"{field}.{name}.value: expected the centre of its samples ({expected!r}), got {show(stored.value)}")
        if not stored.tolerance < 1:
            raise BaselineError(f"{field}.{name}.tolerance: expected a fraction in [0, 1), got {show(stored.tolerance)}")
        if stored.sessions is not None and sum(stored.sessions) != len(stored.samples):
            raise BaselineError(
                f"{field}.{name}.sessions: expected counts of samples per session adding up to its {len(stored.samples)} "
                f"samples, got {show(list(stored.sessions))}"
            )
        checked[name] = msgspec.structs.replace(stored, value=expected)
    return checked


def load_baseline(path: Path) -> Baseline:
    """Read and check a baseline file; :class:`BaselineError` names the file, the field and what was expected."""
    return decode_baseline(read_text(Path(path), "baseline file", f"a {SCHEMA} JSON document", BaselineError), str(path))


def stored_baselines(root: Path) -> list[tuple[Path, Baseline | BaselineError]]:
    """Every baseline file under ``root`` (``<hardware>/<model>/<config>/<workload>.json``; a
    config's stored canary answer, at the path of the workload :data:`~pytest_qwenperf.core.canary.CANARY`,
    is not one), each read, or the error that says why not."""
    found: list[tuple[Path, Baseline | BaselineError]] = []
    for path in sorted(root.glob("*/*/*/*.json")):
        if path.name == f"{slug(CANARY)}.json":
            continue
        try:
            found.append((path, load_baseline(path)))
        except BaselineError as exc:
            found.append((path, exc))
    return found


def find_baseline(root: Path, identity: Identity) -> Baseline | None:
    """The stored baseline for ``identity`` under ``root``; None when there is none yet."""
    path = identity.path(root)
    return load_baseline(path) if path.exists() else None


def save_baseline(root: Path, baseline: Baseline) -> Path:
    """Write ``baseline`` atomically at its identity's path under ``root``; returns the path."""
    path = baseline.identity.path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(msgspec.to_builtins(baseline), indent=2))
    return path


def _in_gate_order(metrics: Mapping[str, StoredMetric]) -> dict[str, StoredMetric]:
    return {name: metrics[name] for name in gate_order(metrics)}


# ------------------------------------------------------------------ runs


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


def baseline_from_run(run: Run, *, source: str, git_commit: str | None = None) -> Baseline:
    """A measured baseline holding ``run``'s gated metrics, with the tolerances the run
    carries (its suite's ``tolerances`` table) or the defaults (no checks: see :func:`write_baseline`),
    and the sessions of a pooled run (:func:`~pytest_qwenperf.core.combine.pooled`)."""
    tolerances = run.tolerances or {}
    samples = run.gated_samples()
    if not samples:
        raise RunJsonError("run: metrics: expected at least one gated metric (" + ", ".join(GATED) + ")")

    def stored(name: str, values: tuple[float, ...]) -> StoredMetric:
        sessions = run.sessions_of(name, len(values))
        found = StoredMetric.of(name, values, tolerances.get(name))
        return msgspec.structs.replace(found, sessions=sessions) if len(sessions) > 1 else found

    return Baseline(
        identity=run.identity.baseline(),
        context=msgspec.structs.replace(run.baseline_context, git_commit=git_commit),
        metrics={name: stored(name, values) for name, values in samples.items()},
        provenance=Provenance(kind="measured", source=source),
        history=(),
        evidence=evidence_values(run),
    )


def evidence(baseline: Baseline) -> Evidence:
    """What ``baseline`` holds for a diagnosis of a run judged against it: its context's versions
    and environment, and the evidence it kept of the run it was recorded from (a published
    baseline, or one recorded before baselines kept any, gives a diagnosis the setup alone)."""
    return Evidence(
        vllm_version=baseline.context.vllm_version,
        environment=baseline.context.environment,
        argv=baseline.identity.argv_sha256,
        values=dict(baseline.evidence),
    )


def refusal(run: Run) -> str | None:
    """Why ``run`` must not become a baseline; None when it may."""
    if run.failed_requests > 0:
        return f"{run.failed_requests} request(s) failed"
    if run.token_check.matches is False:
        return f"client and server token counts disagree ({run.token_check.detail})"
    if run.client_bound is not None:
        return f"the client could not keep up, so the numbers measure the client, not vLLM ({run.client_bound})"
    if run.conditions:
        return "the device's conditions were wrong: " + "; ".join(f"{loss.reason} ({loss.detail})" for loss in run.conditions)
    return None


def write_baseline(
    root: Path,
    run: Run,
    *,
    source: str = "qwenperf run",
    git_commit: str | None = None,
    replace_published: bool = False,
) -> Path:
    """Make ``run`` the baseline for its identity under ``root``; returns the file.

    The previous metrics move to ``history``. A metric's stored tolerance is kept: the
    file's is authoritative, so one a team set by hand survives the update (a suite's
    changed ``tolerances`` table reaches new baselines only). Raises :class:`BaselineRefused`
    (the file is untouched) for a failed, token-mismatched or client-bound run and for a
    run whose identity differs from the stored file's, :class:`PublishedBaselineKept`
    when the stored file holds published figures and ``replace_published`` is false, and
    :class:`BaselineError` when the stored file cannot be parsed. ``git_commit`` defaults
    to :func:`project_commit`.
    """
    reason = refusal(run)
    if reason:
        raise BaselineRefused(f"{run.identity.baseline().path(root)}: not updated: {reason}")
    new = baseline_from_run(run, source=source, git_commit=git_commit or project_commit())
    return replace_baseline(root, new, replace_published=replace_published)


def replace_baseline(root: Path, new: Baseline, *, replace_published: bool = False) -> Path:
    """Write ``new`` as the baseline of its identity under ``root`` by the rules of
    :func:`write_baseline`: the previous metrics move to ``history``, a stored tolerance is kept,
    a stored baseline of another identity or of published figures (unless ``replace_published``)
    is refused and left untouched."""
    identity = new.identity
    path = identity.path(root)
    previous = load_baseline(path) if path.exists() else None
    history: tuple[HistoryEntry, ...] = ()
    metrics = new.metrics
    if previous is not None:
        differences = previous.identity.differences(identity)
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
        history = (*previous.history, HistoryEntry(context=previous.context, metrics=previous.metrics, provenance=previous.provenance))
        metrics = {
            name: msgspec.structs.replace(m, tolerance=previous.metrics[name].tolerance) if name in previous.metrics else m
            for name, m in new.metrics.items()
        }
    return save_baseline(root, msgspec.structs.replace(new, metrics=metrics, history=history))


def published_baseline(identity: Identity, values: Mapping[str, float], *, source: str, context: Context) -> Baseline:
    """A baseline from published figures (one sample each) for ``identity`` (``Suite.identity``).

    Taking the identity a suite renders today means re-running it after a suite change
    re-derives the argv hash and workload fingerprint, so the published figures stay
    attached to the rung they describe.
    """
    metrics = {name: StoredMetric.of(name, (value,)) for name, value in values.items()}
    return Baseline(
        identity=identity,
        context=context,
        metrics=_in_gate_order(metrics),
        provenance=Provenance(kind="published", source=source),
        history=(),
    )
