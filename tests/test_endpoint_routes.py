"""Deployed endpoint sets as the routes a scaling measurement drives, and as the URLs the pool checks."""

from __future__ import annotations

from pathlib import Path

from pytest_qwenperf.measure.scaling import Route, endpoint_routes
from pytest_qwenperf.serving.endpoints import load_endpoint_sets, set_urls


def test_endpoint_sets_become_routes_and_only_sets_of_replicas_are_scraped(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.toml"
    path.write_text(
        '[[set]]\nreplicas = 2\nurls = ["http://a:1", "http://b:1"]\n'
        '[[set]]\nreplicas = 1\nurls = ["http://a:1"]\n'
        '[[set]]\nreplicas = 12\nurls = ["http://svc:8000"]\n'
    )
    sets = load_endpoint_sets(path)
    assert endpoint_routes(sets) == (
        Route(1, ("http://a:1",), ("http://a:1",)),
        Route(2, ("http://a:1", "http://b:1"), ("http://a:1", "http://b:1")),
        Route(12, ("http://svc:8000",), ()),  # a Service: a scrape would reach one random pod
    )
    assert set_urls(sets) == ("http://a:1", "http://b:1", "http://svc:8000")
    assert set_urls(None) == ()
