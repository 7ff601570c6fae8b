"""The embedded default: vLLM's CPU build serving the generated tiny Qwen3 model.

It needs no GPU, no network and no download, so the whole pipeline (boot, load,
metrics, verdicts) runs on any machine, CI included.
"""

from __future__ import annotations

from pytest_qwenperf.config import ServingConfig
from pytest_qwenperf.tiny_model import TinyModelSpec, ensure_tiny_model

TINY_MODEL_NAME = "qwenperf-tiny"
"""Served model name: stable across machines, unlike the cache path of the model folder."""

CPU_ENV: tuple[tuple[str, str], ...] = (
    ("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB; the tiny model needs little and CI has 24 GiB for everything
    ("HF_HUB_OFFLINE", "1"),  # the model is local; never reach for a hub
    ("TOKENIZERS_PARALLELISM", "false"),
)

CPU_BASE_ARGS: tuple[str, ...] = ("--dtype", "bfloat16", "--max-model-len", "2048")


def tiny_cpu_config(
    config_id: str = "cpu-base", extra_args: tuple[str, ...] = (), spec: TinyModelSpec = TinyModelSpec()
) -> ServingConfig:
    """A CPU serving config for the tiny model (generated into the cache on first use)."""
    return ServingConfig(
        id=config_id,
        model=str(ensure_tiny_model(spec)),
        vllm_args=CPU_BASE_ARGS + extra_args,
        env=CPU_ENV,
        served_model_name=TINY_MODEL_NAME,
    )
