"""The history store: every run that sessions, benches and imports recorded, for the series that
``qwenperf history`` looks for change points in.

One class, two backends: an embedded SQLite file (``--qwenperf-history PATH``) and a
PostgreSQL server (``--qwenperf-history postgresql://...``, for runners that share results;
the ``postgres`` extra installs its driver, psycopg). Both hold the same tables and are read
and written with the same SQL (only the placeholder differs), so a query gives the same rows
from either.

The schema is versioned (:data:`MIGRATIONS`; the version is a row of ``qwenperf_schema``).
Opening a store brings an older one up to date in one transaction; a store of a newer
version than this code knows is refused, never written. Each append is one transaction: a
crash or a SIGKILL in the middle leaves the store as it was (SQLite's journal, PostgreSQL's
transaction), and two sessions appending at once queue up (SQLite's write lock; a busy
timeout waits for it).

A run's key is the sha256 of its JSON, so recording the same run twice (importing a session
file again) adds nothing. The tables:

- ``runs``: the key; when and by what it was recorded; its identity (hardware, model, suite,
  config, workload, the argv's and the workload's digests); the vLLM version and when the
  run started; why its numbers are no verdict on vLLM (``invalid``: failed requests, a token
  mismatch, a client that could not keep up; empty for a valid run: such runs are kept, and
  left out of the series); and the whole run as JSON (nothing it measured is lost to a
  column not made).
- ``samples``: ``(run_key, metric, repeat, value)``, every repeat's value of every gated
  metric (``value`` null where a repeat has none).

Standard library and msgspec only (psycopg imported for a PostgreSQL URL alone): the gate's import stays light.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

import msgspec

from pytest_qwenperf.core.identity import Identity
from pytest_qwenperf.core.run import Run
from pytest_qwenperf.core.run_json import decode_run
from pytest_qwenperf.gate.judge import losses

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 0 -> 1
        "CREATE TABLE qwenperf_schema (version INTEGER NOT NULL)",
        "INSERT INTO qwenperf_schema (version) VALUES (0)",
        """CREATE TABLE runs (
            run_key TEXT PRIMARY KEY,
            recorded_at TEXT NOT NULL,
            source TEXT NOT NULL,
            hardware TEXT NOT NULL,
            model TEXT NOT NULL,
            suite TEXT NOT NULL,
            config TEXT NOT NULL,
            workload TEXT NOT NULL,
            argv_sha256 TEXT NOT NULL,
            workload_fingerprint TEXT NOT NULL,
            vllm_version TEXT,
            started TEXT,
            invalid TEXT NOT NULL,
            run_json TEXT NOT NULL
        )""",
        "CREATE INDEX runs_series ON runs (suite, config, workload, started)",
        """CREATE TABLE samples (
            run_key TEXT NOT NULL REFERENCES runs (run_key),
            metric TEXT NOT NULL,
            repeat INTEGER NOT NULL,
            value DOUBLE PRECISION,
            PRIMARY KEY (run_key, metric, repeat)
        )""",
    ),
)
"""``MIGRATIONS[n]`` takes a store from schema version ``n`` to ``n + 1``."""
VERSION = len(MIGRATIONS)

BUSY_TIMEOUT_S = 60.0
"""How long an append waits for another writer of the same SQLite file."""


class HistoryError(ValueError):
    """The store cannot be opened or used; the message names it and what was expected."""


@dataclass(frozen=True)
class SeriesPoint:
    """One run in a series: when it started, which vLLM measured it, its repeats' values."""

    run_key: str
    started: str | None  # ISO 8601, UTC
    recorded_at: str
    vllm_version: str | None
    values: tuple[float, ...]
    invalid: str = ""  # why the run's numbers are no verdict on vLLM ("": they are)


@dataclass(frozen=True)
class SeriesKey:
    """What one series is of: a config's workload on one machine and model, one metric."""

    hardware: str
    model: str
    suite: str
    config: str
    workload: str
    metric: str

    @property
    def config_key(self) -> str:
        return f"{self.suite}/{self.config}" if self.suite else self.config


class _Backend(Protocol):
    def has_table(self, name: str) -> bool: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def transaction(self) -> Any: ...

    def close(self) -> None: ...


class _Sqlite:
    def __init__(self, path: Path, *, create: bool) -> None:
        if not create and not path.is_file():
            raise HistoryError(f"{path}: no history store there (a command that reads a store never creates one)")
        mode = "rwc" if create else "rw"
        try:
            self._conn = sqlite3.connect(
                f"{path.absolute().as_uri()}?mode={mode}", timeout=BUSY_TIMEOUT_S, isolation_level=None, uri=True
            )  # transactions are ours
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # a file that is not SQLite fails here, not later
        except sqlite3.Error as exc:
            raise HistoryError(f"{path}: cannot open the history store: {exc}") from None

    def has_table(self, name: str) -> bool:
        return bool(self.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")  # take the write lock now: a second writer waits here
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()


class _Postgres:
    LOCK = 0x7177_656E_7065_7266  # "qwenperf": the advisory lock every writer of a store takes

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise HistoryError(
                f"{_redacted(url)}: a PostgreSQL history store needs psycopg: pip install 'pytest-qwenperf[postgres]'"
            ) from None
        try:
            self._conn = psycopg.connect(url, autocommit=True)
        except psycopg.Error as exc:
            raise HistoryError(f"{_redacted(url)}: cannot open the history store: {exc}") from None

    def has_table(self, name: str) -> bool:
        return bool(self.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?", (name,)))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cursor = self._conn.execute(sql.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """A transaction that holds the store's advisory lock: writers (and a first migration) queue up."""
        with self._conn.transaction():
            self.execute("SELECT pg_advisory_xact_lock(?)", (self.LOCK,))
            yield

    def close(self) -> None:
        self._conn.close()


def _redacted(url: str) -> str:
    """``url`` without a password (it goes into messages)."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"


def is_url(where: str) -> bool:
    return where.startswith(("postgresql://", "postgres://"))


class HistoryStore:
    """A history store, opened (and migrated) by :meth:`open`; a context manager that closes it."""

    def __init__(self, backend: _Backend, where: str) -> None:
        self._db = backend
        self.where = where

    @classmethod
    def open(cls, where: str | Path, *, create: bool = True) -> HistoryStore:
        """The store at a path (SQLite) or a ``postgresql://`` URL. ``create=False`` (a command that
        only reads): a path with no file, or a database without a store's tables, is an error,
        never a new empty store that a check would then pass on."""
        text = str(where)
        backend: _Backend = _Postgres(text) if is_url(text) else _Sqlite(Path(text), create=create)
        store = cls(backend, _redacted(text))
        try:
            if not create and not backend.has_table("qwenperf_schema"):
                raise HistoryError(f"{store.where}: not a history store (no qwenperf_schema table); record into it first")
            store._migrate()
        except BaseException:
            backend.close()
            raise
        return store

    def _version(self) -> int:
        if not self._db.has_table("qwenperf_schema"):
            return 0
        rows = self._db.execute("SELECT version FROM qwenperf_schema")
        if len(rows) != 1:
            raise HistoryError(f"{self.where}: qwenperf_schema: expected one row with the schema version, got {len(rows)}")
        return int(rows[0][0])

    def _migrate(self) -> None:
        with self._db.transaction():
            version = self._version()
            if version > VERSION:
                raise HistoryError(
                    f"{self.where}: schema version {version} is newer than this pytest-qwenperf knows ({VERSION}); upgrade it"
                )
            for steps in MIGRATIONS[version:]:
                for sql in steps:
                    self._db.execute(sql)
            if version < VERSION:
                self._db.execute("UPDATE qwenperf_schema SET version = ?", (VERSION,))

    @property
    def version(self) -> int:
        return self._version()

    def append(self, runs: Iterable[Run], *, source: str) -> int:
        """Record ``runs`` in one transaction; how many were new (a run recorded before is skipped)."""
        recorded_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        added = 0
        with self._db.transaction():
            for run in runs:
                added += self._insert(run, source, recorded_at)
        return added

    def _insert(self, run: Run, source: str, recorded_at: str) -> int:
        text = msgspec.json.encode(run).decode()
        key = hashlib.sha256(text.encode()).hexdigest()
        if self._db.execute("SELECT 1 FROM runs WHERE run_key = ?", (key,)):
            return 0
        identity = run.identity.baseline()
        self._db.execute(
            "INSERT INTO runs (run_key, recorded_at, source, hardware, model, suite, config, workload, argv_sha256, "
            "workload_fingerprint, vllm_version, started, invalid, run_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                recorded_at,
                source,
                identity.hardware,
                identity.model,
                identity.suite,
                identity.config,
                identity.workload,
                identity.argv_sha256,
                identity.workload_fingerprint,
                run.context.vllm_version,
                run.context.started,
                ", ".join(loss.reason for loss in losses(run)),
                text,
            ),
        )
        for metric, values in self._samples(run).items():
            for repeat, value in enumerate(values):
                self._db.execute(
                    "INSERT INTO samples (run_key, metric, repeat, value) VALUES (?, ?, ?, ?)", (key, metric, repeat, value)
                )
        return 1

    @staticmethod
    def _samples(run: Run) -> dict[str, tuple[float | None, ...]]:
        """Every gated metric's repeats, with a null where a repeat has none (lost data stays visible)."""
        found: dict[str, tuple[float | None, ...]] = dict(run.gated_samples())
        for name in run.lost_values():
            found[name] = tuple((run.samples or {}).get(name) or (None,))
        return found

    def keys(self, *, config: str | None = None, workload: str | None = None, metric: str | None = None) -> list[SeriesKey]:
        """Every series the store holds, optionally of one config (its id or ``suite/id``), workload or metric."""
        rows = self._db.execute(
            "SELECT DISTINCT r.hardware, r.model, r.suite, r.config, r.workload, s.metric "
            "FROM runs r JOIN samples s ON s.run_key = r.run_key "
            "ORDER BY r.suite, r.config, r.workload, s.metric, r.hardware, r.model"
        )
        keys = [SeriesKey(*row) for row in rows]
        return [
            k
            for k in keys
            if (config is None or config in (k.config, k.config_key))
            and (workload is None or k.workload == workload)
            and (metric is None or k.metric == metric)
        ]

    def series(self, key: SeriesKey) -> list[SeriesPoint]:
        """The runs of ``key`` in the order they started (then recorded), each with its repeats' values
        and why it is invalid, if it is."""
        rows = self._db.execute(
            "SELECT r.run_key, r.started, r.recorded_at, r.vllm_version, r.invalid, s.repeat, s.value "
            "FROM runs r JOIN samples s ON s.run_key = r.run_key "
            "WHERE r.hardware = ? AND r.model = ? AND r.suite = ? AND r.config = ? AND r.workload = ? AND s.metric = ? "
            "ORDER BY r.started, r.recorded_at, r.run_key, s.repeat",
            (key.hardware, key.model, key.suite, key.config, key.workload, key.metric),
        )
        points: dict[str, SeriesPoint] = {}
        values: dict[str, list[float]] = {}
        for run_key, started, recorded_at, version, invalid, _repeat, value in rows:
            points.setdefault(run_key, SeriesPoint(run_key, started, recorded_at, version, (), invalid))
            if value is not None:
                values.setdefault(run_key, []).append(float(value))
        return [dataclasses.replace(p, values=tuple(values.get(k, ()))) for k, p in points.items()]

    def valid_runs(self, identity: Identity) -> list[Run]:
        """The valid runs recorded of ``identity`` (hardware, model, suite, config, argv and workload
        all equal), whole, in the order they started (then were recorded)."""
        matched = " AND ".join(f"{name} = ?" for name in identity.__struct_fields__)  # the columns are named as the fields
        rows = self._db.execute(
            f"SELECT run_key, run_json FROM runs WHERE {matched} AND invalid = '' ORDER BY started, recorded_at, run_key",
            msgspec.structs.astuple(identity),
        )
        return [decode_run(json.loads(text), f"{self.where}: run {key}") for key, text in rows]

    def latest_valid_run(self, key: SeriesKey) -> Run | None:
        """The valid run of ``key``'s config and workload on its machine and model (any metric) that
        started last; None when there is none."""
        rows = self._db.execute(
            "SELECT run_key, run_json FROM runs WHERE hardware = ? AND model = ? AND suite = ? AND config = ? "
            "AND workload = ? AND invalid = '' ORDER BY started DESC, recorded_at DESC, run_key DESC LIMIT 1",
            (key.hardware, key.model, key.suite, key.config, key.workload),
        )
        return decode_run(json.loads(rows[0][1]), f"{self.where}: run {rows[0][0]}") if rows else None

    def run(self, run_key: str) -> Run:
        """The whole run recorded under ``run_key``."""
        rows = self._db.execute("SELECT run_json FROM runs WHERE run_key = ?", (run_key,))
        if not rows:
            raise HistoryError(f"{self.where}: no run with the key {run_key}")
        return decode_run(json.loads(rows[0][0]), f"{self.where}: run {run_key}")

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM runs")[0][0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
