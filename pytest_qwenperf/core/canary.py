"""What a server answered to the correctness canary, and how far two answers agree.

The canary is a fixed set of prompts sent greedy, at a fixed length, without ``ignore_eos``.
Per prompt it keeps the output token ids and, where the server returns them, the
log-probabilities of the chosen tokens. Two answers (two rungs of one session, or one rung
under two vLLMs) are compared per prompt:

- **match**: the prompt's output token ids are identical;
- **common prefix**: how many tokens agree before the first one that differs. Greedy decoding
  continues from its own output, so after the first difference the two continue from different
  contexts and their later tokens say nothing more; the prefix is what both computed alike;
- **log-prob drift**: the mean absolute difference of the chosen tokens' log-probabilities over
  the common prefix, where both scored the same token in the same context. It is what numerics
  (an FP8 KV cache, a new kernel) change before they change a token.

The fingerprint of an answer is a digest of every prompt's ids: equal fingerprints, equal outputs.

An answer is held to a :class:`CanaryFloor` (the least match rate, and the most drift when one is
set) in two ways: against the rung it inherits from in the same session, where a rung that changes
numerics (an FP8 KV cache) may differ by as much as its suite allows and a speculative one not at
all; and against the same rung's answer from another session (the stored one, or the other side
of ``qwenperf compare``), where :func:`judge_canary` gives ``pass`` or ``changed-output``. An answer
carries its :class:`~pytest_qwenperf.core.identity.Identity`, whose workload is :data:`CANARY`: an
answer of other hardware, another model, other vLLM flags or other prompts is not comparable.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Annotated, ClassVar

import msgspec

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.identity import Context, Identity
from pytest_qwenperf.core.verdict import Verdict

CANARY = "canary"
"""The workload of a canary answer's identity, and so the name of its file beside a config's baselines."""


class CanaryOutput(msgspec.Struct, frozen=True, kw_only=True):
    """One prompt's answer: its output token ids, their log-probabilities (empty when not returned)
    and its text (for a reader; only the ids are compared)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    text: str = ""


class CanaryComparison(msgspec.Struct, frozen=True, kw_only=True):
    """How far an answer agrees with a reference answer, over the prompts both have."""

    prompts: int
    matched: int  # prompts whose output token ids are identical
    prefix_tokens: int  # tokens in the common prefixes, over all prompts
    reference_tokens: int  # tokens the reference produced, over all prompts
    logprob_drift: float | None  # mean |difference| over the common prefixes; None without log-probabilities
    first_mismatch: int | None  # the first prompt (index) whose ids differ

    @property
    def match_rate(self) -> float:
        """The share of prompts whose outputs are identical (1.0 when there are none to compare)."""
        return self.matched / self.prompts if self.prompts else 1.0

    @property
    def prefix_rate(self) -> float:
        """The share of the reference's tokens that the answer reproduced before its first difference."""
        return self.prefix_tokens / self.reference_tokens if self.reference_tokens else 1.0


class CanaryFloor(schema.Shape, frozen=True):
    """The least agreement an answer must reach against its reference: a match rate of at least
    ``match_rate`` and, when ``logprob_drift`` is set, a mean log-prob drift of at most that."""

    match_rate: Annotated[float, msgspec.Meta(ge=0, le=1, description="a fraction between 0 and 1 (the least share of prompts)")] = 1.0
    logprob_drift: Annotated[float, msgspec.Meta(ge=0, description="a number >= 0 (the most mean |difference| of log-probabilities)")] | None = None

    def describe(self) -> str:
        """``match rate >= 0.5, drift <= 0.2``."""
        drift = "no drift floor" if self.logprob_drift is None else f"drift <= {self.logprob_drift:g}"
        return f"match rate >= {self.match_rate:g}, {drift}"

    def shortfall(self, found: CanaryComparison) -> str | None:
        """Why ``found`` falls below this floor; None when it does not. A drift that is unknown (no
        log-probabilities) is not held to a drift floor: the match rate alone decides."""
        short = []
        if found.match_rate < self.match_rate:
            short.append(f"match rate {found.match_rate:.3f} < {self.match_rate:g}")
        drift = found.logprob_drift
        if self.logprob_drift is not None and drift is not None and drift > self.logprob_drift:
            short.append(f"drift {drift:.4g} > {self.logprob_drift:g}")
        return "; ".join(short) or None


EXACT = CanaryFloor(match_rate=1.0)
"""The same tokens for every prompt, whatever the drift: a speculative rung's floor against the rung it
inherits (speculative decoding is lossless), and the default floor of an answer against another
session's answer of the same config."""


class Canary(msgspec.Struct, frozen=True, kw_only=True):
    """A config's answer to the canary in one session: every prompt's output, and their fingerprint."""

    identity: Identity  # what answered (workload: CANARY, its fingerprint: definition_digest)
    context: Context  # the vLLM version, the hardware and the date
    prompts: tuple[str, ...]
    max_tokens: int
    outputs: tuple[CanaryOutput, ...]
    fingerprint: str  # fingerprint(outputs)
    floor: CanaryFloor = EXACT  # the suite's, for another session's answer of this config

    @property
    def config_key(self) -> str:
        """The serving config's key, unique across suites (``cpu/ngram-spec``)."""
        return f"{self.identity.suite}/{self.identity.config}"


def definition_digest(prompts: Sequence[str], max_tokens: int) -> str:
    """What the canary asks (its prompts and length, greedy), as its identity's workload fingerprint."""
    return hashlib.sha256(json.dumps({"prompts": list(prompts), "max_tokens": max_tokens, "sampling": "greedy"}).encode()).hexdigest()


def fingerprint(outputs: Sequence[CanaryOutput]) -> str:
    """A digest of every prompt's output token ids, in prompt order."""
    digest = hashlib.sha256()
    for output in outputs:
        digest.update(",".join(map(str, output.token_ids)).encode())
        digest.update(b";")
    return digest.hexdigest()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(reference: Sequence[CanaryOutput], answer: Sequence[CanaryOutput]) -> CanaryComparison:
    """``answer`` against ``reference``, prompt by prompt; both must answer the same prompts, in order."""
    if len(reference) != len(answer):
        raise ValueError(f"the answers cover different prompts: {len(reference)} in the reference, {len(answer)} now")
    matched = prefix_tokens = reference_tokens = 0
    drifts: list[float] = []
    first_mismatch = None
    for index, (ref, now) in enumerate(zip(reference, answer, strict=True)):
        shared = _common_prefix(ref.token_ids, now.token_ids)
        same = ref.token_ids == now.token_ids
        matched += same
        if not same and first_mismatch is None:
            first_mismatch = index
        prefix_tokens += shared
        reference_tokens += len(ref.token_ids)
        if len(ref.logprobs) >= shared and len(now.logprobs) >= shared:
            drifts += [abs(a - b) for a, b in zip(ref.logprobs[:shared], now.logprobs[:shared], strict=True)]
    drift = math.fsum(drifts) / len(drifts) if drifts else None
    return CanaryComparison(
        prompts=len(reference),
        matched=matched,
        prefix_tokens=prefix_tokens,
        reference_tokens=reference_tokens,
        logprob_drift=drift,
        first_mismatch=first_mismatch,
    )


class CanaryJudgement(msgspec.Struct, frozen=True, kw_only=True):
    """A config's answer judged against a reference answer of the same config (another session's).

    ``verdict``: ``pass``, ``changed-output``, ``not-comparable`` (other identity) or
    ``no-baseline`` (no reference answer); ``found`` is None unless the two were compared."""

    config: str  # the config's key
    verdict: Verdict
    detail: str
    floor: CanaryFloor
    found: CanaryComparison | None = None

    HEADER: ClassVar[tuple[str, ...]] = ("config", "match rate", "drift", "verdict")

    def row(self) -> tuple[str, ...]:
        """Cells for :data:`HEADER`."""
        found = self.found
        rate = "—" if found is None else f"{found.match_rate:.3f}"
        drift = "—" if found is None or found.logprob_drift is None else f"{found.logprob_drift:.4g}"
        return (self.config, rate, drift, self.verdict)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def judge_canary(reference: Canary | None, answer: Canary, floor: CanaryFloor, *, absent: str = "no reference answer") -> CanaryJudgement:
    """``answer`` against ``reference``, an answer of the same config from another session.

    ``pass`` when the comparison is within ``floor``, else ``changed-output``, whose detail names
    both figures and the first prompt whose tokens differ, with both texts. An answer of another
    identity (hardware, model, vLLM flags, prompts) is ``not-comparable``, never a change; with no
    reference the verdict is ``no-baseline`` with ``absent`` as its detail.
    """

    def verdict(result: Verdict, detail: str, found: CanaryComparison | None = None) -> CanaryJudgement:
        return CanaryJudgement(config=answer.config_key, verdict=result, detail=detail, floor=floor, found=found)

    if reference is None:
        return verdict("no-baseline", absent)
    differences = reference.identity.differences(answer.identity)
    if differences:
        return verdict("not-comparable", "not comparable (reference vs answer): " + "; ".join(differences))
    found = compare(reference.outputs, answer.outputs)
    drift = "unknown (no log-probabilities)" if found.logprob_drift is None else f"{found.logprob_drift:.4g}"
    figures = (
        f"{found.matched} of {found.prompts} prompts give the reference's tokens (match rate {found.match_rate:.3f}), "
        f"mean log-prob drift {drift} over the common prefixes; floor: {floor.describe()}"
    )
    short = floor.shortfall(found)
    if short is None:
        return verdict("pass", f"within the floor: {figures}", found)
    at = found.first_mismatch
    if at is None:
        where = "every prompt gives the same tokens"
    else:
        where = (
            f"first differing prompt {at} {_shown(answer.prompts[at])}: "
            f"reference {_shown(reference.outputs[at].text)}, now {_shown(answer.outputs[at].text)}"
        )
    return verdict("changed-output", f"{short}: {figures}; {where}", found)
