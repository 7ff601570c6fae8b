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
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import msgspec


class CanaryOutput(msgspec.Struct, frozen=True, kw_only=True):
    """One prompt's answer: its output token ids and their log-probabilities (empty when not returned)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()


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


class Canary(msgspec.Struct, frozen=True, kw_only=True):
    """A config's answer to the canary in one session: every prompt's output, and their fingerprint."""

    config: str  # the config's key (``cpu/ngram-spec``)
    vllm_version: str | None
    max_tokens: int
    outputs: tuple[CanaryOutput, ...]
    fingerprint: str


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
