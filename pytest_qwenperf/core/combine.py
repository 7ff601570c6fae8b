"""Runs combined into one: the repeats of a point (:func:`combined`) and the sessions, or files,
that ``qwenperf compare`` and the history pool (:func:`pooled`). Whatever makes a part invalid
survives into the whole.

Standard library and msgspec only: the gate imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from pytest_qwenperf.core.run import Loss, Run


def combined(parts: Sequence[Run], chosen: Run, samples: Mapping[str, tuple[float | None, ...]], unit: str) -> Run:
    """``chosen`` standing for all ``parts`` with ``samples``: the one way runs are combined, the
    repeats of a point as much as the files ``qwenperf compare`` pools. Whatever makes any part
    invalid survives into the whole: each condition (once, with how many of the ``unit``s had it),
    every part's failed requests, the first token mismatch and every client-bound reason; and every
    part's load runs measured again, with the conditions that spoiled them."""
    by_reason: dict[str, list[Loss]] = {}
    for part in parts:
        for loss in part.conditions:
            by_reason.setdefault(loss.reason, []).append(loss)
    many = len(parts) > 1
    conditions = tuple(
        Loss(reason=reason, detail=f"{found[0].detail} (in {len(found)} of {len(parts)} {unit})" if many else found[0].detail)
        for reason, found in by_reason.items()
    )
    bound = "; ".join(dict.fromkeys(part.client.bound for part in parts if part.client.bound)) or None
    tokens = next((part.token_check for part in parts if part.token_check.matches is False), chosen.token_check)
    return msgspec.structs.replace(
        chosen,
        client=msgspec.structs.replace(chosen.client, bound=bound),
        token_check=tokens,
        conditions=conditions,
        retaken=tuple(loss for part in parts for loss in part.retaken),
        samples={**samples, "failed": tuple(float(part.failed_requests) for part in parts)},
    )


def pooled(parts: Sequence[Run], chosen: Run, unit: str) -> Run:
    """``parts``, each a session (or sessions already pooled), as one run whose samples are all of
    theirs, ``chosen`` standing for them (see :func:`combined`): a part without a number for a
    metric the others have is a null among the samples, so the lost value stays visible.
    :attr:`~pytest_qwenperf.core.run.Run.sessions` says how many samples each session gave, for the verdicts."""
    gated = [part.gated_samples() for part in parts]
    names = {name for part, found in zip(parts, gated, strict=True) for name in (*found, *part.lost_values())}
    samples = {name: tuple(s for found in gated for s in found.get(name, (None,))) for name in names}
    sessions = {
        name: tuple(n for part, found in zip(parts, gated, strict=True) for n in part.sessions_of(name, len(found.get(name, (None,)))))
        for name in names
    }
    return msgspec.structs.replace(combined(parts, chosen, samples, unit), sessions=sessions)
