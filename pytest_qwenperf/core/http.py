"""Plain requests to servers: readiness probes, /version, /v1/models, /metrics scrapes, cache resets."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from pytest_qwenperf.core.apikey import ApiKey

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 5.0, api_key: ApiKey | None = None) -> tuple[int, bytes]:
    """GET without any configured proxy (probes go to local or cluster addresses); (status, body).

    ``api_key``: sent as a bearer token (vLLM wants one under ``/v1`` when run with a key;
    see :mod:`~pytest_qwenperf.core.apikey`)."""
    request = urllib.request.Request(url, headers=api_key.headers() if api_key else {})
    try:
        with _NO_PROXY.open(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post(url: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """POST with an empty body, without any configured proxy; (status, body)."""
    try:
        with _NO_PROXY.open(urllib.request.Request(url, data=b"", method="POST"), timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post_json(url: str, body: object, timeout: float = 120.0, api_key: ApiKey | None = None) -> tuple[int, bytes]:
    """POST ``body`` as JSON, without any configured proxy; (status, body)."""
    headers = {"Content-Type": "application/json", **(api_key.headers() if api_key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with _NO_PROXY.open(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
