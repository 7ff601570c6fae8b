"""A second module on the same config: it must reuse the server booted for test_serving.py."""

from __future__ import annotations

import asyncio

import pytest

from pytest_qwenperf.serving.pool import ServerPool
from pytest_qwenperf.serving.server import ManagedServer
from tests.e2e.tiny import TINY, stream_completion

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("serving_config", [TINY], ids=[TINY.id])]


def test_same_server_serves_another_module(vllm_server: ManagedServer, qwenperf_pool: ServerPool) -> None:
    _, usage = asyncio.run(stream_completion(vllm_server.base_url, vllm_server.model, "again", 5))
    assert usage["completion_tokens"] == 5
    assert qwenperf_pool.boots[TINY.id] == 1
