"""Endpoint sets: for each replica count, the base URLs that reach that many replicas.

For scaling tests against replicas that are already running (on several machines, or
behind Kubernetes Services): the scaling test drives N times the load against the set
with ``replicas = N`` and compares its throughput with the set with ``replicas = 1``.
The file is TOML::

    model = "Qwen/Qwen3.5-27B-FP8"  # optional: the served model name every set must list
    [[set]]
    replicas = 1
    urls = ["http://10.0.0.5:8000"]
    [[set]]
    replicas = 2
    urls = ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    [[set]]
    replicas = 12
    urls = ["http://vllm-dp8.perf.svc.cluster.local:8000"]  # one Service in front of 12 replicas

A set may list fewer URLs than it has replicas (a Service or load balancer in front of
several). Errors name the file, the field (``set[1].urls[0]``: sets and URLs counted
from 0 in file order) and what was expected.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from pytest_qwenperf.core import schema
from pytest_qwenperf.core.options import endpoint_url, masked_repr, redact_credentials
from pytest_qwenperf.core.textfiles import read_text


class EndpointsFileError(ValueError):
    """An endpoints file cannot be read or is malformed."""


@dataclass(frozen=True)
class EndpointSet:
    """Base URLs (as :func:`~pytest_qwenperf.core.options.endpoint_url` normalises them) that together reach ``replicas`` replicas."""

    replicas: int
    urls: tuple[str, ...]


@dataclass(frozen=True)
class EndpointSets:
    """An endpoints file's sets, by replica count (ascending).

    ``model`` is the served model name every set must list (``None`` when the file names
    none); loading does not contact the servers, so it is checked by whoever drives them.
    """

    path: Path
    sets: tuple[EndpointSet, ...]
    model: str | None

    @property
    def replica_counts(self) -> tuple[int, ...]:
        return tuple(s.replicas for s in self.sets)

    def for_replicas(self, n: int) -> EndpointSet:
        for s in self.sets:
            if s.replicas == n:
                return s
        raise EndpointsFileError(f"{self.path}: set: no set with replicas = {n}; the file has {list(self.replica_counts)}")


def load_endpoint_sets(path: Path | str) -> EndpointSets:
    """Read and check an endpoints file (see the module's docstring for the format)."""
    path = Path(path)
    text = read_text(path, "endpoints file", "a TOML file of [[set]] tables", EndpointsFileError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EndpointsFileError(f"{path}: expected a TOML file of [[set]] tables: {exc}") from None
    file = schema.convert(data, _File, lambda m: EndpointsFileError(f"{path}: {m.text(redact_credentials(m.field), masked_repr)}"))
    sets: dict[int, tuple[int, EndpointSet]] = {}  # replica count -> (where in the file, set)
    for n, entry in enumerate(file.sets):
        where = f"set[{n}]"
        if entry.replicas in sets:
            other = f"set[{sets[entry.replicas][0]}]"
            raise _error(path, f"{where}.replicas", f"a replica count that no other set has ({other} has it)", entry.replicas)
        urls = _urls(path, entry.urls, f"{where}.urls")
        if len(urls) > entry.replicas:
            raise _error(path, f"{where}.urls", f"at most {entry.replicas} URLs (one per replica, or fewer fronts)", list(urls))
        sets[entry.replicas] = n, EndpointSet(entry.replicas, urls)
    if 1 not in sets:
        raise EndpointsFileError(
            f"{path}: set: expected a set with replicas = 1, the reference every scaling efficiency is measured"
            f" against; the file has replica counts {sorted(sets)}"
        )
    return EndpointSets(path, tuple(sets[k][1] for k in sorted(sets)), file.model)


class _SetTable(schema.Shape, frozen=True):
    replicas: Annotated[int, Meta(ge=1, description="a whole number of replicas >= 1")]
    urls: Annotated[
        tuple[Annotated[str, Meta(description="a base URL such as http://10.0.0.5:8000")], ...],
        Meta(min_length=1, description='a non-empty list of base URLs such as ["http://10.0.0.5:8000"]'),
    ]


class _File(schema.Shape, frozen=True):
    sets: Annotated[
        tuple[Annotated[_SetTable, Meta(description="a [[set]] table")], ...],
        Meta(min_length=1, description="at least one [[set]] table"),
    ] = msgspec.field(name="set")
    model: Annotated[str, Meta(min_length=1, description="the served model name, a non-empty string")] | None = None


def _error(path: Path, field: str, expected: str, got: object) -> EndpointsFileError:
    """``got`` is shown with any ``user:password@`` of a URL in it masked."""
    return EndpointsFileError(f"{path}: {field}: expected {expected}, got {masked_repr(got)}")


def _urls(path: Path, urls: tuple[str, ...], field: str) -> tuple[str, ...]:
    """The URLs as :func:`~pytest_qwenperf.core.options.endpoint_url` normalises them, or its message for the first it refuses."""
    normalised = []
    for k, url in enumerate(urls):
        try:
            normalised.append(endpoint_url(url))
        except argparse.ArgumentTypeError as exc:  # endpoint_url's message says what it expects
            raise EndpointsFileError(f"{path}: {field}[{k}]: {exc}") from None
    return tuple(normalised)


def endpoints_file(value: str) -> EndpointSets:
    """The path of an endpoints file, read and checked (an argparse ``type=`` callable)."""
    try:
        return load_endpoint_sets(value)
    except EndpointsFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def set_urls(sets: EndpointSets | None) -> tuple[str, ...]:
    """Every URL of the endpoint sets, each once, in file order (none without sets)."""
    return tuple(dict.fromkeys(url for s in sets.sets for url in s.urls)) if sets else ()
