"""A point's operator profile, captured: one more load run between ``/start_profile`` and ``/stop_profile``.

Servers booted with ``--qwenperf-profile`` (or started by hand with vLLM's ``--profiler-config``)
have the torch profiler ready but off. After a point's measured repeats, :func:`capture` turns it on
on every server of the point, drives one more load run (whose figures nothing keeps), turns it off,
and waits until every ``/stop_profile`` has returned: vLLM answers it only once its workers have
written their traces, so nothing measured afterwards runs with the profiler on. The new files are
moved from the folder each server writes into (which ``/server_info`` names) to the point's folder
beside the session JSON, and summarized (:func:`~pytest_qwenperf.core.profile.summarize`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_qwenperf.core.apikey import ApiKey
from pytest_qwenperf.core.http import http_post
from pytest_qwenperf.core.profile import OperatorProfile, TraceError, is_trace, summarize
from pytest_qwenperf.serving.environment import profiler_dir
from pytest_qwenperf.serving.server import ServerError

STOP_TIMEOUT_S = 1800.0
"""How long ``/stop_profile`` may take: it returns once the traces are written, which vLLM's profiling
guide puts at about 10 minutes for 100 requests of a 70B model on an H100."""


class ProfilingFailed(ServerError):
    """The profiler could not be turned on, or left no trace that could be read; the message names the server."""


class ProfilerLeftOn(ProfilingFailed):
    """``/stop_profile`` failed: the server's profiler may still be on, so it must measure nothing more
    (the plugin stops it; the next test that needs it boots it again)."""


@dataclass(frozen=True)
class ProfileSetting:
    """Where the traces of profiled points go: ``folder/<config key>/<workload>``, and their paths
    as runs record them: relative to ``relative_to`` (the session JSON's folder), else absolute."""

    folder: Path
    relative_to: Path | None = None

    def under(self, side: str) -> ProfileSetting:
        """The same, in a subfolder of its own (one side of a comparison: ``reference``, ``candidate``)."""
        return ProfileSetting(self.folder / side, self.relative_to)

    def point(self, config_key: str, workload_id: str) -> Path:
        """The folder of one point's traces (a config key's ``/`` makes a folder per suite)."""
        return self.folder.joinpath(*config_key.split("/"), workload_id)


def capture(
    base_urls: Sequence[str], drive: Callable[[], object], folder: Path | None, *, relative_to: Path | None = None, api_key: ApiKey | None = None
) -> OperatorProfile:
    """The operator profile of ``drive()`` on the servers at ``base_urls`` (see the module's docstring).
    Their traces move into ``folder`` (None: they stay where the servers wrote them)."""
    if not base_urls:
        raise ProfilingFailed("no server to profile: the point's replicas are reached through a gateway that names none of them")
    writes = {url: _trace_folder(url, api_key) for url in base_urls}
    before = {url: _files(where) for url, where in writes.items()}
    started: list[str] = []
    try:
        for url in base_urls:
            _post(url, "/start_profile", 120.0)
            started.append(url)
        drive()
    finally:
        begun = time.monotonic()
        failures = [why for url in started if (why := _stopped(url)) is not None]
        stop_s = time.monotonic() - begun
        if failures:
            raise ProfilerLeftOn("; ".join(failures))
    found = [(i, path) for i, (url, where) in enumerate(writes.items()) for path in sorted(_files(where) - before[url])]
    kept = [_move(path, folder, i if len(writes) > 1 else None) for i, path in found] if folder is not None else [p for _, p in found]
    traces = [path for path in kept if is_trace(path)]
    if not traces:
        raise ProfilingFailed(f"no trace appeared in {', '.join(str(w) for w in writes.values())} once /stop_profile returned")
    try:
        cpu, gpu = summarize(traces)
    except TraceError as exc:
        raise ProfilingFailed(str(exc)) from None
    return OperatorProfile(traces=tuple(_recorded(path, relative_to) for path in traces), cpu=cpu, gpu=gpu, stop_s=stop_s)


def _trace_folder(url: str, api_key: ApiKey | None) -> Path:
    where = profiler_dir(url, api_key)
    if where is None:
        raise ProfilingFailed(
            f"{url} does not say where its profiler writes (GET /server_info, served with VLLM_SERVER_DEV_MODE=1): start it with "
            "--profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": \"/abs/dir\"}' (VLLM_TORCH_PROFILER_DIR before vLLM 0.32)"
        )
    return Path(where)


def _files(folder: Path) -> set[Path]:
    return {path for path in folder.iterdir() if path.is_file()} if folder.is_dir() else set()


def _post(url: str, route: str, timeout: float) -> None:
    try:
        status, body = http_post(f"{url}{route}", timeout=timeout)
    except OSError as exc:
        raise ProfilingFailed(f"POST {url}{route}: {exc}") from None
    if status != 200:
        hint = ": the server runs without a profiler (--profiler-config)" if status == 404 else ""
        raise ProfilingFailed(f"POST {url}{route} answered {status}{hint} {body[:200]!r}")


def _stopped(url: str) -> str | None:
    """None once the server's profiler is off and its traces are written; else why not."""
    try:
        _post(url, "/stop_profile", STOP_TIMEOUT_S)
    except ProfilingFailed as exc:
        return str(exc)
    return None


def _move(path: Path, folder: Path, server: int | None) -> Path:
    """``path`` moved into ``folder``, named after its server (``r<i>.``) where several wrote; a name
    already there (an earlier session's) is kept, the new file numbered."""
    folder.mkdir(parents=True, exist_ok=True)
    name = path.name if server is None else f"r{server}.{path.name}"
    target, n = folder / name, 2
    while target.exists():
        target, n = folder / f"{n}.{name}", n + 1
    return Path(shutil.move(path, target))


def _recorded(path: Path, relative_to: Path | None) -> str:
    """A trace's path as a run records it: relative to ``relative_to`` when inside it, else absolute."""
    path = path.resolve()
    if relative_to is not None and path.is_relative_to(relative_to.resolve()):
        return str(path.relative_to(relative_to.resolve()))
    return str(path)
