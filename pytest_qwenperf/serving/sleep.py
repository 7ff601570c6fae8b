"""Servers that take turns on one node's GPUs through vLLM's sleep mode.

Why: a pinned vLLM and a candidate measured in one session, their repeats alternating, see the
same node in the same minutes, so the drift between sessions leaves the verdict
(:func:`~pytest_qwenperf.measure.sequential.measure_interleaved`). On a GPU node each server
wants the GPUs' memory to itself. Asleep (level 1), a vLLM server keeps its weights in CPU RAM,
drops its KV cache and holds next to no GPU memory; waking it takes seconds, not a boot. vLLM
serves ``POST /sleep?level=1``, ``POST /wake_up`` and ``GET /is_sleeping`` when started with
``--enable-sleep-mode`` in dev mode (``VLLM_SERVER_DEV_MODE=1``, which managed servers always
have). The CPU build has no sleep mode: there both servers stay awake, side by side.

Turns are taken between repeats, never inside one: every repeat warms up before it measures,
so the empty KV and prefix caches a wake-up leaves are behind it by then.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from pytest_qwenperf.core.http import http_get, http_post
from pytest_qwenperf.serving.process import ServerError
from pytest_qwenperf.serving.server import Server
from pytest_qwenperf.suite.config import ServingConfig
from pytest_qwenperf.suite.vllm_args import ParserUnavailable, sleep_mode_problem

SLEEP_FLAG = "--enable-sleep-mode"
SLEEP_LEVEL = 1  # weights kept in CPU RAM: level 2 drops them and a wake-up would have to reload them
TURN_TIMEOUT_S = 600.0  # moving a large model's weights between GPU and CPU RAM takes a while
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


class SleepError(ServerError):
    """A server could not go to sleep or wake up."""


@dataclass(frozen=True)
class TurnCounts:
    """What taking turns cost a session: wake-ups and the seconds spent on them and on going to sleep."""

    wakes: int = 0
    sleeps: int = 0
    seconds: float = 0.0


class Turns:
    """Servers that share one node's GPUs: the one taken last is awake, every other one asleep.

    A server joins when it has booted (awake: the others were put to sleep before its boot) and
    leaves when it stops; :meth:`take` is called before each use."""

    def __init__(self, timeout_s: float = TURN_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.counts = TurnCounts()
        self._servers: list[Server] = []
        self._awake: Server | None = None

    def rest(self) -> None:
        """Put the awake server to sleep: before a boot that needs its GPU memory."""
        if self._awake is not None:
            self._turn(self._awake, "sleep")
            self._awake = None

    def join(self, server: Server) -> None:
        """``server`` has just booted, awake, the others asleep."""
        self._servers.append(server)
        self._awake = server

    def take(self, server: Server) -> None:
        """``server`` awake, every other one asleep (the awake one goes to sleep first, freeing its memory)."""
        if server is self._awake or not any(s is server for s in self._servers):
            return
        self.rest()
        self._turn(server, "wake_up")
        self._awake = server

    def leave(self, server: Server) -> None:
        """``server`` has stopped."""
        self._servers = [s for s in self._servers if s is not server]
        if self._awake is server:
            self._awake = None

    def _turn(self, server: Server, route: str) -> None:
        started = time.monotonic()
        for base_url in server.base_urls:
            path = f"/sleep?level={SLEEP_LEVEL}" if route == "sleep" else "/wake_up"
            status, body = http_post(base_url + path, timeout=self.timeout_s)
            if status != 200:
                raise SleepError(_failed(base_url, path, status, body))
            _check_state(base_url, asleep=route == "sleep")
        seconds = time.monotonic() - started
        c = self.counts
        woke, slept = (1, 0) if route == "wake_up" else (0, 1)
        self.counts = TurnCounts(c.wakes + woke, c.sleeps + slept, c.seconds + seconds)


def _check_state(base_url: str, *, asleep: bool) -> None:
    """Raise unless ``GET /is_sleeping`` says what the last call should have made it."""
    status, body = http_get(base_url + "/is_sleeping", timeout=30.0)
    try:
        said = json.loads(body)["is_sleeping"] if status == 200 else None
    except (ValueError, KeyError, TypeError):
        said = None
    if said is not asleep:
        raise SleepError(f"{base_url}/is_sleeping answered {status} {body[:200]!r}; expected is_sleeping: {str(asleep).lower()}")


def _failed(base_url: str, path: str, status: int, body: bytes) -> str:
    head = f"{base_url}{path} answered {status} {body[:300].decode(errors='replace')!r}"
    if status == 404:
        return head + f": the server serves no sleep routes (start it with {SLEEP_FLAG} and VLLM_SERVER_DEV_MODE=1)"
    return head


def turns_problem(configs: Iterable[ServingConfig], pythons: Iterable[str]) -> str | None:
    """Why ``configs`` cannot be measured taking turns through sleep mode, None where they can.

    ``pythons``: each side's Python running vLLM. Its vLLM must offer sleep mode on this machine
    (asked of it: :func:`~pytest_qwenperf.suite.vllm_args.sleep_mode_problem`), and this machine's
    free RAM must hold each config's weights twice over, for every replica (at a turn, the server
    going to sleep offloads its weights before the next one takes its own back)."""
    for python in pythons:
        try:
            problem = sleep_mode_problem(python)
        except ParserUnavailable as exc:
            return str(exc)
        if problem is not None:
            return problem
    return _ram_problem(tuple(configs))


def _ram_problem(configs: tuple[ServingConfig, ...]) -> str | None:
    free = psutil.virtual_memory().available
    for cfg in configs:
        weights = weights_bytes(cfg.model)
        if weights is None:
            continue  # not on this machine yet (vLLM downloads it at boot) or embedded (small): nothing to size
        needed = 2 * weights * cfg.replicas
        if needed > free:
            return (
                f"config {cfg.key}: asleep, its {cfg.replicas} replica(s) keep {weights / 2**30:.1f} GiB of weights each in CPU "
                f"RAM, and two servers' worth may be there at a turn ({needed / 2**30:.1f} GiB); "
                f"this machine has {free / 2**30:.1f} GiB free"
            )
    return None


def weights_bytes(model: str) -> int | None:
    """The size of a model's weight files: a folder's, or those of a hub name's ``main`` snapshot in the
    Hugging Face cache (found as :mod:`~pytest_qwenperf.loadgen.tokenizer` finds a tokenizer there: by
    its ``config.json``); None where neither is on this machine."""
    folder = Path(model) if Path(model).is_dir() else _hub_snapshot(model)
    if folder is None:
        return None
    return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())


def _hub_snapshot(name: str) -> Path | None:
    # Imported here, as the tokenizer's lookup does: a folder's model needs no huggingface_hub.
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repo id (an embedded model's name, a mistyped path)
        return None
    return Path(found).parent if isinstance(found, str) else None
