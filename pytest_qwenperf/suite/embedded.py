"""The embedded models: generated Qwen3 models that need no network and no download.

``embedded:tiny`` is the embedded default: vLLM's CPU build serves it, so the whole
pipeline (boot, load, metrics, verdicts) runs on any machine, CI included.
``embedded:gpu`` is the same generator at the size of a small real model (0.8B parameters),
for one GPU: real vLLM serves it, or the stand-in of ``scripts/gpu-check`` where vLLM
cannot be installed. Both are generated into a cache folder once, the same bytes everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from pytest_qwenperf.suite.tiny_model import TinyModelSpec, ensure_tiny_model


@dataclass(frozen=True)
class EmbeddedModel:
    """A generated model as suites name it."""

    spec: TinyModelSpec
    served_name: str  # stable across machines, unlike the cache path of the model folder
    cpu: bool  # served by the CPU build (its servers and client get disjoint cores)


TINY_MODEL_REF = "embedded:tiny"
"""How suite files and configs name the tiny model; resolved to its cache folder at boot."""

TINY_MODEL_NAME = "qwenperf-tiny"

GPU_MODEL_REF = "embedded:gpu"

EMBEDDED = MappingProxyType(
    {
        TINY_MODEL_REF: EmbeddedModel(TinyModelSpec(), TINY_MODEL_NAME, cpu=True),
        # Qwen3-0.6B's layer shapes at twice its width: 16 layers of 2048 with 16 query and 8 KV heads of
        # 128, so a batch of a hundred sequences keeps one GPU's matrix units busy (stand-in on an H200:
        # ~11 ms a decoding step at batch 128); the 512-token vocabulary is the tiny model's.
        GPU_MODEL_REF: EmbeddedModel(
            TinyModelSpec(
                hidden_size=2048,
                intermediate_size=6144,
                num_hidden_layers=16,
                num_attention_heads=16,
                num_key_value_heads=8,
                head_dim=128,
                max_position_embeddings=8192,
            ),
            "qwenperf-gpu",
            cpu=False,
        ),
    }
)
"""Every embedded model by the name suites give it."""

CPU_ENV: tuple[tuple[str, str], ...] = (
    ("HF_HUB_OFFLINE", "1"),  # the model is local; never reach for a hub
    ("TOKENIZERS_PARALLELISM", "false"),
    ("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB; the tiny model needs little and CI has 24 GiB for everything
)

CPU_BASE_ARGS: tuple[str, ...] = ("--dtype", "bfloat16", "--max-model-len", "2048")


def resolve_model(model: str) -> str:
    """The model argument vLLM gets: an embedded model's folder (generated once) or ``model`` itself."""
    embedded = EMBEDDED.get(model)
    return str(ensure_tiny_model(embedded.spec)) if embedded else model


def served_name(model: str) -> str | None:
    """The served model name of an embedded model; None for any other model."""
    embedded = EMBEDDED.get(model)
    return embedded.served_name if embedded else None


def on_cpu_build(model: str) -> bool:
    """Whether ``model`` is an embedded model served by vLLM's CPU build."""
    embedded = EMBEDDED.get(model)
    return embedded is not None and embedded.cpu
