"""The two tools as a user runs them, on the same requests: the command lines that
``agreement.py`` and ``lean.py`` time, and the order they take turns in."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


@dataclass(frozen=True)
class Requests:
    """Random prompts both tools send alike (``ignore_eos``, no per-chunk usage): their lengths,
    how many after how many warm-up requests, and how many at once, to ``url``."""

    url: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int
    warmup: int = 0


def qwenperf_bench(r: Requests, out: Path, *extra: str) -> list[str]:
    """``qwenperf bench`` for ``r``, its result in ``out`` (which must not exist), then ``extra``."""
    argv = [sys.executable, "-m", "pytest_qwenperf.cli.main", "bench", "--endpoint", r.url, "--progress", "off"]
    argv += ["--input-len", str(r.input_len), "--output-len", str(r.output_len), "--num-prompts", str(r.num_prompts)]
    argv += ["--warmup", str(r.warmup), "--max-concurrency", str(r.concurrency), "--json", str(out)]
    return [*argv, "--no-continuous-usage", *extra]  # the same request body as vllm bench serve sends


def vllm_bench_serve(r: Requests, out: Path, model: str, tokenizer: str, *extra: str) -> list[str]:
    """``vllm bench serve`` (through ``vllm_bench_serve.py``) for ``r``, its result saved as ``out``, then ``extra``."""
    argv = [sys.executable, str(HERE / "vllm_bench_serve.py"), "--base-url", r.url, "--model", model, "--tokenizer", tokenizer]
    argv += ["--dataset-name", "random", "--ignore-eos", "--random-input-len", str(r.input_len), "--random-output-len", str(r.output_len)]
    argv += ["--num-prompts", str(r.num_prompts), "--num-warmups", str(r.warmup), "--max-concurrency", str(r.concurrency), "--disable-tqdm"]
    return [*argv, "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name, *extra]


def turns(tools: Sequence[T], round_index: int) -> Sequence[T]:
    """``tools`` in the order they run in round ``round_index``: ABBA, so that a machine speeding up
    or slowing down over the rounds favours none of them."""
    return tools if round_index % 2 == 0 else tools[::-1]
