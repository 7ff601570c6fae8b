"""Suite files: loading, inheritance, rendering to argv, and errors that name file, key and expectation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_qwenperf.config import SuiteError, load_suite, render_flags

LADDER = """
[suite]
name = "demo"
hardware = "cpu"
model = "embedded:tiny"
env = { A = "1" }
vllm = { dtype = "bfloat16", max-num-seqs = 64 }

[[config]]
id = "base"
vllm = { max-model-len = 2048, enable-prefix-caching = false }

[[config]]
id = "short"
inherits = "base"
description = "shorter context"
vllm = { max-model-len = 512 }
env = { B = "2" }

[[config]]
id = "spec"
inherits = "short"
vllm = { speculative-config = { method = "ngram", num_speculative_tokens = 3 } }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path


def test_ladder_inherits_one_change_per_rung(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, LADDER))
    assert [c.id for c in suite.configs] == ["base", "short", "spec"]
    base, short, spec = suite.configs
    assert base.vllm_args == ("--dtype", "bfloat16", "--max-num-seqs", "64", "--max-model-len", "2048", "--no-enable-prefix-caching")
    assert short.vllm_args == ("--dtype", "bfloat16", "--max-num-seqs", "64", "--max-model-len", "512", "--no-enable-prefix-caching")
    assert spec.vllm_args[-2:] == ("--speculative-config", '{"method":"ngram","num_speculative_tokens":3}')
    assert dict(short.env) == {"A": "1", "B": "2"} and dict(spec.env) == {"A": "1", "B": "2"}
    assert short.inherits == "base" and short.description == "shorter context"
    assert base.served_model_name == "qwenperf-tiny"
    assert suite.config("spec") is spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("[suite]", "[suit]"), r"suite: expected a table, got None"),
        (('name = "demo"', "name = 3"), r"suite.name: expected a non-empty string, got 3"),
        (('inherits = "base"', 'inherits = "later"'), r"config 'short'.inherits: expected the id of an earlier config, got 'later'"),
        (("max-model-len = 512", "max_model_len = 512"), r"config 'short'.vllm.max_model_len: expected a flag name as vLLM spells it"),
        (('env = { B = "2" }', "env = { B = 2 }"), r"config 'short'.env: expected a table of strings"),
        (('id = "spec"', 'id = "base"'), r"config 'base': id used twice"),
        (('description = "shorter context"', 'descripton = "x"'), r"config\[1\].descripton: unknown key"),
    ],
)
def test_bad_suite_names_file_key_and_expectation(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write(tmp_path, LADDER.replace(*change, 1))
    with pytest.raises(SuiteError, match=message) as excinfo:
        load_suite(path)
    assert str(excinfo.value).startswith(str(path))


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="cannot read suite file"):
        load_suite(tmp_path / "missing.toml")
    with pytest.raises(SuiteError, match="not valid TOML"):
        load_suite(write(tmp_path, "[suite\n"))


def test_unknown_config_id_lists_the_known_ones(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path, LADDER))
    with pytest.raises(SuiteError, match=r"no config 'nope'; configs are \['base', 'short', 'spec'\]"):
        suite.config("nope")


flag_names = st.from_regex(r"[a-z][a-z0-9]{0,8}(-[a-z0-9]{1,8}){0,2}", fullmatch=True)
flag_values = st.one_of(st.booleans(), st.integers(), st.text(min_size=1, max_size=8), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3))


@given(st.dictionaries(flag_names, flag_values, max_size=6))
def test_flags_render_in_order_one_option_each(flags: dict) -> None:
    argv = iter(render_flags(flags))
    for name, value in flags.items():
        if isinstance(value, bool):
            assert next(argv) == (f"--{name}" if value else f"--no-{name}")
        else:
            assert next(argv) == f"--{name}"
            assert next(argv) == (json.dumps(value, separators=(",", ":"), sort_keys=True) if isinstance(value, dict) else str(value))
    assert next(argv, None) is None
