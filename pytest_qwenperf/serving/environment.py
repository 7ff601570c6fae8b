"""What ran a vLLM server, as the server itself reports it (``GET /server_info``).

vLLM serves ``/server_info`` in dev mode (``VLLM_SERVER_DEV_MODE=1``, which servers started by
this package have): the effective engine config (``config_format=json``) and its environment
report (the one ``vllm collect-env`` prints: torch and its CUDA, the driver, the GPUs, the
build flags, and the versions of the NCCL and FlashInfer packages). A server that does not
serve it (not in dev mode, an older release, a gateway) has no environment: ``None``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.environment import Environment, flatten
from pytest_qwenperf.core.http import http_get

_GIT_SHA = re.compile(r"\(git sha: ([0-9a-f]+)")


def server_environment(base_url: str, api_key: ApiKey | None = None, timeout: float = 60.0) -> Environment | None:
    """The server's environment, or None where it does not serve ``/server_info`` as JSON."""
    answer = _server_info(base_url, api_key, timeout)
    return None if answer is None else environment_of(answer)


def _server_info(base_url: str, api_key: ApiKey | None, timeout: float) -> dict[str, Any] | None:
    """The server's ``/server_info`` (engine config as JSON); None where it does not serve one."""
    try:
        status, body = http_get(f"{base_url}/server_info?config_format=json", timeout=timeout, api_key=api_key)
        answer = json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def environment_of(answer: Mapping[str, Any]) -> Environment:
    """The environment in a ``/server_info`` answer (a field the answer lacks is None)."""
    system = _table(answer.get("system_env"))
    config = _table(answer.get("vllm_config"))
    version = _text(system.get("vllm_version"))
    commit = _GIT_SHA.search(version) if version else None
    packages = dict(_package(line) for line in str(system.get("pip_packages") or "").splitlines() if "==" in line)
    gpus = [line.split(":", 1)[-1].strip() for line in str(system.get("nvidia_gpu_models") or "").splitlines() if line.strip()]
    return Environment(
        vllm_version=version.split(" ", 1)[0] if version else None,
        vllm_commit=commit.group(1) if commit else None,
        vllm_build=_text(system.get("vllm_build_flags")),
        torch=_text(system.get("torch_version")),
        cuda=_text(system.get("cuda_compiled_version")),  # torch's CUDA: what the kernels were built for
        driver=_text(system.get("nvidia_driver_version")),
        nccl=next((v for name, v in sorted(packages.items()) if name.startswith("nvidia-nccl")), None),
        flashinfer=packages.get("flashinfer-python") or packages.get("flashinfer"),
        gpu_name=gpus[0] if gpus else None,
        gpu_count=len(gpus) or None,
        engine=flatten(config),
    )


def _table(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _package(line: str) -> tuple[str, str]:
    name, _, version = line.strip().partition("==")
    return name.strip().lower().replace("_", "-"), version.strip()


def _text(value: object) -> str | None:
    """A reported string; None for a missing, empty or "N/A" one."""
    return value if isinstance(value, str) and value and value not in ("N/A", "None") else None


def profiler_dir(base_url: str, api_key: ApiKey | None = None, timeout: float = 60.0) -> str | None:
    """Where the server's torch profiler writes its traces, as ``/server_info`` says: the profiler config's
    ``torch_profiler_dir`` (vLLM 0.32), else the ``VLLM_TORCH_PROFILER_DIR`` it read (older releases); None
    where it says neither (no profiler, no ``/server_info``)."""
    answer = _server_info(base_url, api_key, timeout)
    if answer is None:
        return None
    profiler = _table(_table(answer.get("vllm_config")).get("profiler_config"))
    if profiler.get("profiler") == "torch":
        return _text(profiler.get("torch_profiler_dir"))
    return _text(_table(answer.get("vllm_env")).get("VLLM_TORCH_PROFILER_DIR"))
