"""Plain GETs to servers: readiness probes, /version, /v1/models and /metrics scrapes."""

from __future__ import annotations

import urllib.error
import urllib.request

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET without any configured proxy (probes go to local or cluster addresses); (status, body)."""
    try:
        with _NO_PROXY.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
