"""The embedded default: vLLM's CPU build serving the generated tiny Qwen3 model.

It needs no GPU, no network and no download, so the whole pipeline (boot, load,
metrics, verdicts) runs on any machine, CI included.
"""

from __future__ import annotations

from pytest_qwenperf.suite.tiny_model import ensure_tiny_model

TINY_MODEL_REF = "embedded:tiny"
"""How suite files and configs name the tiny model; resolved to its cache folder at boot."""

TINY_MODEL_NAME = "qwenperf-tiny"
"""Served model name: stable across machines, unlike the cache path of the model folder."""

CPU_ENV: tuple[tuple[str, str], ...] = (
    ("HF_HUB_OFFLINE", "1"),  # the model is local; never reach for a hub
    ("TOKENIZERS_PARALLELISM", "false"),
    ("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB; the tiny model needs little and CI has 24 GiB for everything
)

CPU_BASE_ARGS: tuple[str, ...] = ("--dtype", "bfloat16", "--max-model-len", "2048")


def resolve_model(model: str) -> str:
    """The model argument vLLM gets: the tiny model's folder (generated once) or ``model`` itself."""
    return str(ensure_tiny_model()) if model == TINY_MODEL_REF else model
