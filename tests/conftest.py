"""Settings for the plugin's own tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from pytest_qwenperf.serving.router import NGINX_ENV, RouterUnavailable, find_nginx

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def nginx() -> str:
    """The nginx binary; skips only where nginx is not installed.

    A wrong ``$QWENPERF_NGINX`` fails instead, and so does a missing nginx in CI
    (``.ci/run`` installs it): a skip there would hide that the router went untested.
    """
    try:
        return find_nginx()
    except RouterUnavailable as exc:
        if os.environ.get(NGINX_ENV) or os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster for the session (Debian's postgresql); skips only where it is not
    installed, and fails instead in CI (``.ci/run`` installs it), as ``nginx`` does."""
    from tests.postgres import PostgresUnavailable, start_postgres

    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()
