"""Endpoint sets files (pytest_qwenperf/serving/endpoints.py) and their argparse type."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_qwenperf.core.options import endpoint_url
from pytest_qwenperf.serving.endpoints import (
    EndpointSet,
    EndpointSets,
    EndpointsFileError,
    endpoints_file,
    load_endpoint_sets,
)

VALID = """\
model = "Qwen/Qwen3.5-27B-FP8"
[[set]]
replicas = 12
urls = ["http://vllm-dp8.perf.svc.cluster.local:8000"]   # one Service in front of 12 replicas
[[set]]
replicas = 1
urls = ["http://10.0.0.5:8000/"]
[[set]]
replicas = 2
urls = ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
"""


def _toml(sets: list[tuple[int, list[str]]], model: str | None = None) -> str:
    head = f"model = {json.dumps(model)}\n" if model is not None else ""
    return head + "".join(f"[[set]]\nreplicas = {n}\nurls = {json.dumps(urls)}\n" for n, urls in sets)


def test_valid_file(tmp_path: Path) -> None:
    """Sets come out sorted by replica count, URLs normalised as --endpoint normalises them (no trailing slash)."""
    path = tmp_path / "endpoints.toml"
    path.write_text(VALID)
    loaded = load_endpoint_sets(path)
    assert loaded == EndpointSets(
        path,
        (
            EndpointSet(1, ("http://10.0.0.5:8000",)),
            EndpointSet(2, ("http://10.0.0.5:8000", "http://10.0.0.6:8000")),
            EndpointSet(12, ("http://vllm-dp8.perf.svc.cluster.local:8000",)),
        ),
        "Qwen/Qwen3.5-27B-FP8",
    )
    assert loaded.replica_counts == (1, 2, 12)
    assert loaded.for_replicas(2).urls == ("http://10.0.0.5:8000", "http://10.0.0.6:8000")
    with pytest.raises(EndpointsFileError, match=r"endpoints\.toml: set: no set with replicas = 3; the file has \[1, 2, 12\]"):
        loaded.for_replicas(3)
    assert endpoints_file(str(path)) == loaded  # the argparse type gives the same
    path.write_text(_toml([(1, ["http://a:1"])]))
    assert load_endpoint_sets(str(path)).model is None  # model is optional


URL_RULE = "expected a URL like http://10.0.0.5:8000"  # endpoint_url's own words
BAD = {  # file content -> (field named in the message, what it says was expected)
    "not TOML": ("[[set]\nreplicas = 1", "", "expected a TOML file of [[set]] tables"),
    "unknown top-level key": ('modle = "x"\n' + _toml([(1, ["http://a:1"])]), "modle", "unknown key; expected one of ['model', 'set']"),
    "unknown set key": (_toml([(1, ["http://a:1"])]) + 'url = "http://a:1"\n', "set[0].url", "unknown key; expected one of ['replicas', 'urls']"),
    "model not a string": ("model = 3\n" + _toml([(1, ["http://a:1"])]), "model", "expected the served model name"),
    "model empty": ('model = ""\n' + _toml([(1, ["http://a:1"])]), "model", "expected the served model name, a non-empty string, got ''"),
    "unknown key with credentials": ('"http://u:s3cret@a:1" = 1\n' + _toml([(1, ["http://a:1"])]), "http://u:***@a:1", "unknown key"),
    "no sets": ('model = "m"\n', "set", "expected at least one [[set]] table, got None"),
    "set not a table": ("set = [1]\n", "set[0]", "expected a [[set]] table, got 1"),
    "replicas zero": (_toml([(1, ["http://a:1"]), (0, ["http://b:1"])]), "set[1].replicas", "expected a whole number of replicas >= 1, got 0"),
    "replicas fractional": (_toml([(1, ["http://a:1"])]).replace("= 1\n", "= 1.5\n"), "set[0].replicas", "a whole number of replicas >= 1, got 1.5"),
    "replicas boolean": (_toml([(1, ["http://a:1"])]).replace("= 1\n", "= true\n"), "set[0].replicas", "a whole number of replicas >= 1, got True"),
    "replicas missing": ('[[set]]\nurls = ["http://a:1"]\n', "set[0].replicas", "a whole number of replicas >= 1, got None"),
    "replica count twice": (
        _toml([(1, ["http://a:1"]), (2, ["http://a:1", "http://b:1"]), (2, ["http://c:1"])]),
        "set[2].replicas",
        "expected a replica count that no other set has (set[1] has it), got 2",
    ),
    "no reference set": (
        _toml([(4, ["http://a:1"]), (2, ["http://b:1"])]),
        "set",
        "expected a set with replicas = 1, the reference every scaling efficiency is measured against; the file has replica counts [2, 4]",
    ),
    "urls empty": (_toml([(1, [])]), "set[0].urls", "expected a non-empty list of base URLs"),
    "urls a string": ('[[set]]\nreplicas = 1\nurls = "http://a:1"\n', "set[0].urls", "expected a non-empty list of base URLs"),
    "url not a string": ("[[set]]\nreplicas = 1\nurls = [8000]\n", "set[0].urls[0]", "expected a base URL such as http://10.0.0.5:8000, got 8000"),
    "url without scheme": (_toml([(1, ["http://a:1"]), (2, ["http://a:1", "10.0.0.6:8000"])]), "set[1].urls[1]", URL_RULE),
    "url with /v1": (_toml([(1, ["http://a:1/v1"])]), "set[0].urls[0]", "give the server's base URL without /v1"),
    "https url": (_toml([(1, ["https://a:1"])]), "set[0].urls[0]", "expected an http:// URL, got 'https://a:1': the load generator speaks plain HTTP"),
    "url with credentials": (_toml([(1, ["http://u:s3cret@a:1"])]), "set[0].urls[0]", "expected a URL without user:password@, got 'http://u:***@a:1'"),
    "urls a string with credentials": ('[[set]]\nreplicas = 1\nurls = "http://u:s3cret@a:1"\n', "set[0].urls", "got 'http://u:***@a:1'"),
    "set a table with credentials": ('[set]\nreplicas = 1\nurls = ["http://u:s3cret@a:1"]\n', "set", "got {'replicas': 1, 'urls': ['http://u:***@a:1']}"),
    "more urls than replicas": (_toml([(1, ["http://a:1", "http://b:1"])]), "set[0].urls", "expected at most 1 URLs (one per replica"),
}


@pytest.mark.parametrize("case", BAD)
def test_errors_name_the_file_the_field_and_the_expectation(tmp_path: Path, case: str) -> None:
    content, field, expected = BAD[case]
    path = tmp_path / "endpoints.toml"
    path.write_text(content)
    with pytest.raises(EndpointsFileError) as error:
        load_endpoint_sets(path)
    message = str(error.value)
    assert message.startswith(f"{path}: {field}: " if field else f"{path}: ") and expected in message, message
    assert "s3cret" not in message
    with pytest.raises(argparse.ArgumentTypeError) as as_option:  # as --option, argparse shows the same message
        endpoints_file(str(path))
    assert str(as_option.value) == message


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(EndpointsFileError, match=rf"^{missing}: cannot read the endpoints file: No such file or directory$"):
        load_endpoint_sets(missing)
    with pytest.raises(EndpointsFileError, match=rf"^{tmp_path}: cannot read the endpoints file: Is a directory$"):
        load_endpoint_sets(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(EndpointsFileError, match=rf"^{binary}: not UTF-8 text \(byte 0xff at offset 0\); expected a TOML file of \[\[set\]\] tables$"):
        load_endpoint_sets(binary)


def test_argparse_reports_the_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "endpoints.toml"
    path.write_text(_toml([(2, ["http://a:1"])]))
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints-file", type=endpoints_file)
    with pytest.raises(SystemExit):
        parser.parse_args(["--endpoints-file", str(path)])
    assert f"argument --endpoints-file: {path}: set: expected a set with replicas = 1" in capsys.readouterr().err


_hosts = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)
_urls = st.lists(st.builds("http://{}:{}".format, _hosts, st.integers(1, 65535)), min_size=1, max_size=4)
_sets = st.lists(st.integers(2, 64), unique=True, max_size=6).flatmap(
    lambda counts: st.lists(_urls, min_size=len(counts) + 1, max_size=len(counts) + 1).map(
        lambda urls: [(n, u[:n]) for n, u in zip([1, *counts], urls, strict=True)]  # at most one URL per replica
    )
)


@settings(max_examples=60, deadline=None)
@given(sets=_sets, data=st.data())
def test_any_order_of_sets_loads_the_same(
    tmp_path_factory: pytest.TempPathFactory, sets: list[tuple[int, list[str]]], data: st.DataObject
) -> None:
    """However the sets are ordered in the file, they load sorted by replica count, URLs in file order."""
    path = tmp_path_factory.mktemp("sets") / "endpoints.toml"
    path.write_text(_toml(data.draw(st.permutations(sets)), model="m"))
    loaded = load_endpoint_sets(path)
    assert loaded.sets == tuple(EndpointSet(n, tuple(urls)) for n, urls in sorted(sets))
    assert all(loaded.for_replicas(n).urls == tuple(urls) for n, urls in sets)


@settings(max_examples=300, deadline=None)
@given(secret=st.text(min_size=1, max_size=20), host=st.sampled_from(["10.0.0.5:8000", "[::1]:8000", "vllm.svc", "h:port", "[::1"]))
def test_a_password_in_a_url_never_reaches_a_message(secret: str, host: str) -> None:
    """Whatever the password holds ('@', '/', quotes, '#'), the URL is refused and the message masks it."""
    password = f"Zq9{secret}"
    for url in (f"http://perf:{password}@{host}", f"https://perf:{password}@{host}", f"perf:{password}@{host}"):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            endpoint_url(url)
        assert "Zq9" not in str(refused.value) and "***@" in str(refused.value), str(refused.value)
