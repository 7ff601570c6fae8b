"""What a bench result measured (its :class:`Setup`), and the runs a result file holds (:class:`Result`):
what every reader of :mod:`~pytest_qwenperf.gate.sources` and :mod:`~pytest_qwenperf.gate.tool_results`
shares, and what ``qwenperf compare`` matches results by.

A bench result names no suite config and no vLLM argv (``qwenperf bench``, ``vllm bench serve``,
GuideLLM, AIPerf): what it measured is its setup, compared field by field, and all of them share
one key (:data:`BENCH_KEY`): a column holds one setup.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.formats import show
from pytest_qwenperf.core.metrics import find
from pytest_qwenperf.core.run import Number, Run, RunIdentity
from pytest_qwenperf.core.run_json import MISSING

T = TypeVar("T")
RunKey = tuple[str, str, str]  # suite, config id, workload id
BENCH_KEY: RunKey = ("bench", "", "")
"""The key of every bench result: the columns' bench results meet on it, whatever their setups."""
GREEDY = "greedy"
SUITE_RUN = "a qwenperf suite run"


class SourceError(ValueError):
    """A file that is none of the formats, or holds a wrong field; the message names the file, the field and what was expected."""


_NO_REQUEST = {"input_len": "no request completed", "output_len": "no request completed"}
_UNKNOWN = {
    "vllm bench serve": _NO_REQUEST
    | {
        "dataset": "vllm bench serve saves no dataset name: record it with --metadata dataset_name=NAME",
        "sampling": "vllm bench serve saves no temperature, and without --temperature the server samples with its own "
        "default: record it with --metadata temperature=T",
    },
    "guidellm": _NO_REQUEST
    | {
        "dataset": "the report names no data source",
        "sampling": "GuideLLM saves no temperature, and sends none unless its request body sets one: the server samples "
        "with its own default",
    },
    "aiperf": _NO_REQUEST
    | {
        "dataset": "the export names no dataset",
        "sampling": "AIPerf saves no temperature unless --extra-inputs temperature:T set one: the server samples "
        "with its own default",
    },
}
"""Why a field of a tool's result is unknown, by the tool that wrote it (the first words of ``Setup.client``)."""


def _why_unknown(client: str, name: str) -> str:
    tool = next((tool for tool in _UNKNOWN if client.startswith(tool)), "")
    return _UNKNOWN.get(tool, _NO_REQUEST).get(name, "not recorded")


@dataclass(frozen=True)
class Setup:
    """What a bench result measured, a text per field, the lengths as numbers; None where its file
    cannot tell (``_UNKNOWN`` says why)."""

    client: str  # the command that measured it
    model: str
    dataset: str | None
    input_len: float | None  # tokens per completed request, the mean that was realised
    output_len: float | None
    load: str
    sampling: str | None

    def differences(self, other: Setup) -> tuple[str, ...]:
        """``"field: 'mine' vs 'other'"`` for every field that differs; an unknown differs from any known
        value. The lengths differ only by more than :data:`LENGTH_TOLERANCE`, and say by how much."""
        found = []
        for name in (f.name for f in fields(self)):
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in LENGTHS and mine is not None and theirs is not None:
                apart = abs(mine - theirs) / max(mine, theirs) if max(mine, theirs) else 0.0
                if apart > LENGTH_TOLERANCE:
                    found.append(
                        f"{name}: {mine:.1f} vs {theirs:.1f} tokens per request, {apart:.1%} apart "
                        f"(repeats of one setup are within {LENGTH_TOLERANCE:.0%})"
                    )
            elif mine != theirs:
                found.append(f"{name}: {_shown(name, mine, self.client)} vs {_shown(name, theirs, other.client)}")
        return tuple(found)

    def describe(self) -> str:
        """One line for a table's title; fields not recorded are named, since matching them is an assumption."""
        lengths = f"{_length(self.input_len)} in / {_length(self.output_len)} out tokens per request"
        parts = [self.model, self.dataset or "dataset not recorded", lengths, self.load, self.sampling or "sampling not recorded"]
        return f"{' · '.join(parts)} ({self.client})"

    def as_json(self) -> dict[str, str | None]:
        """Every field as text (the lengths to one decimal), as ``qwenperf-compare/1`` holds a setup."""
        return {f.name: _length(getattr(self, f.name)) if f.name in LENGTHS else getattr(self, f.name) for f in fields(self)}

    def digest(self) -> str:
        """What tells setups apart in a run's identity: every field but the realised lengths, which
        repeats of one setup do not share exactly (:meth:`differences` holds them to a tolerance)."""
        named = {name: value for name, value in self.as_json().items() if name not in LENGTHS}
        return hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:16]


LENGTHS = ("input_len", "output_len")
LENGTH_TOLERANCE = 0.01
"""How far apart the realised mean lengths of repeats of one setup may be. A random workload's
repeats with different seeds (the usual way to make them independent) realise different means:
three ``vllm bench serve`` runs of one random 128-token workload differed by 0.08 %. One per cent
is ten times that, and far below any change of workload that matters (128 vs 256 tokens: 50 %)."""


def _length(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


def _shown(name: str, value: str | float | None, client: str) -> str:
    if value is None:
        return f"unknown ({_why_unknown(client, name)})"
    return repr(_length(value) if isinstance(value, float) else value)


def differences(reference: Setup | None, run: Setup | None) -> tuple[str, ...]:
    """Why a run is no verdict on the reference (``reference`` vs ``run``); None stands for a
    suite run, which its run identity matches instead. A suite run and a bench result never
    match: one is identified by its config's vLLM argv, the other by its command line."""
    if reference is not None and run is not None:
        return reference.differences(run)
    if reference is None and run is None:
        return ()
    kinds = [SUITE_RUN if s is None else s.client for s in (reference, run)]
    found = [f"source: {kinds[0]!r} vs {kinds[1]!r} (a suite run is identified by its config's vLLM argv, a bench result by its options)"]
    sampling = [GREEDY if s is None else s.sampling for s in (reference, run)]
    if sampling[0] != sampling[1] or None in sampling:
        clients = [SUITE_RUN if s is None else s.client for s in (reference, run)]
        found.append(f"sampling: {_shown('sampling', sampling[0], clients[0])} vs {_shown('sampling', sampling[1], clients[1])}")
    return tuple(found)


# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class Result:
    """One run read from a file: a suite run, or a bench result with its :class:`Setup`."""

    file: Path
    run: Run
    setup: Setup | None = None

    @property
    def key(self) -> RunKey:
        identity = self.run.identity
        return BENCH_KEY if self.setup is not None else (identity.suite, identity.config, identity.workload)



def convert(path: Path, data: object, shape: type[T]) -> T:
    """``data`` as ``shape``; a mismatch is a :class:`SourceError` naming ``path``, the field and what was expected."""
    return schema.convert(data, shape, lambda m: SourceError(f"{path}: {m.text(show=show, absent=MISSING)}"), null=True)


def fault(path: Path, field: str, expected: str, got: str) -> SourceError:
    """``file: field: expected ..., got ...`` as :mod:`~pytest_qwenperf.core.schema` words it; ``got`` as shown."""
    return SourceError(f"{path}: {field}: expected {expected}, got {got}")


def mean_of(total: float | None, completed: float | None) -> float | None:
    """Tokens per completed request; None without one."""
    return total / completed if total is not None and completed else None


def bench_result(path: Path, setup: Setup, metrics: dict[str, Number], **blocks: Any) -> Result:
    """A bench result as a run whose identity is its setup's digest."""
    digest = setup.digest()
    identity = RunIdentity(
        suite=BENCH_KEY[0],
        config=setup.client,
        argv=(),
        model=setup.model,
        workload=setup.dataset or "unknown",
        workload_fingerprint=digest,
        hardware="not recorded",
    )
    return Result(path, Run(identity=identity, metrics=metrics, **blocks), setup)


def sampling(temperature: float) -> str:
    """A setup's sampling for the temperature a tool sent: :data:`GREEDY` for 0, else ``temperature=T``."""
    return GREEDY if temperature == 0 else f"temperature={temperature:g}"


def client_metrics(values: Mapping[str, object]) -> dict[str, Number]:
    """The finite numbers among ``values`` whose names the registry knows as client metrics (``metrics.<name>``)."""
    found: dict[str, Number] = {}
    for name, value in values.items():
        info = find(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and info and info.path == ("metrics", name):
            found[name] = value
    return found
