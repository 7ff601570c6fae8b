"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, started here under the
package's own process lifecycle (:class:`~pytest_qwenperf.serving.process.ManagedProcess`: it
dies with the test session, even a SIGKILLed one), one fresh database per test.

PostgreSQL refuses to run as root; run as root (CI's containers), the cluster belongs to the
``postgres`` user the package creates and is started through ``runuser``. It listens on a free
loopback port with trust authentication for the local superuser ``qwenperf``: a throwaway
cluster in a temporary folder, removed at the end.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import psycopg.sql

from pytest_qwenperf.serving.process import Launch, ManagedProcess, ProcessSpec

SUPERUSER = "qwenperf"


class PostgresUnavailable(RuntimeError):
    """Debian's postgresql is not installed; the message says how to install it."""


def bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<major>/bin`` (or ``$QWENPERF_PG_BIN``)."""
    if os.environ.get("QWENPERF_PG_BIN"):
        return Path(os.environ["QWENPERF_PG_BIN"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise PostgresUnavailable(
            "the history store's PostgreSQL tests need Debian's postgresql (apt-get install postgresql; "
            ".ci/run installs it), or $QWENPERF_PG_BIN naming the folder of its postgres and initdb"
        )
    return Path(found[-1]).parent


def _as_owner(argv: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


@dataclass
class PostgresServer:
    """A running cluster; :meth:`new_database` gives each test a database of its own."""

    process: ManagedProcess
    folder: Path
    _names: itertools.count[int] = field(default_factory=itertools.count)

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.process.port}/{database}"

    def new_database(self) -> str:
        name = f"history_{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        return self.url(name)

    def stop(self) -> None:
        try:
            self.process.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """initdb a cluster in a new temporary folder and start it; ready when it accepts a connection."""
    binaries = bin_dir()
    owner = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="qwenperf-pg-"))  # under /tmp: reachable by the owner
    data = folder / "data"
    if owner:
        entry = pwd.getpwnam(owner)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    initdb = [str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8"]
    done = subprocess.run(_as_owner(initdb, owner), capture_output=True, text=True, check=False)
    if done.returncode:
        shutil.rmtree(folder, ignore_errors=True)
        raise PostgresUnavailable(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def launch(port: int) -> Launch:
        argv = [str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-k", str(folder), "-c", "listen_addresses=127.0.0.1"]
        argv += ["-c", "fsync=off"]  # a throwaway cluster: crash safety of the server itself is not under test
        return Launch(tuple(_as_owner(argv, owner)), folder / "postgres.log", {})

    process = ManagedProcess(ProcessSpec(
        "PostgreSQL", lambda: _probe(process), lambda code, after: f"postgres exited with {code} after {after:.1f} s",
        host="127.0.0.1", port=None, ready_timeout_s=60, poll_interval_s=0.2,
    ))  # fmt: skip
    server = PostgresServer(process, folder)
    try:
        process.start(launch)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return server


def _probe(process: ManagedProcess) -> str | None:
    try:
        with psycopg.connect(f"postgresql://{SUPERUSER}@127.0.0.1:{process.port}/postgres", connect_timeout=2):
            return None
    except psycopg.OperationalError as exc:
        return str(exc).strip().splitlines()[0]
