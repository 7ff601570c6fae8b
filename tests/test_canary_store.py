"""Stored canary answers beside the baselines: written with them, by the same rules, read with errors
that name the file, the field and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from pytest_qwenperf.gate.baseline import BaselineError, BaselineRefused
from pytest_qwenperf.gate.canary import SCHEMA, canary_path, find_canary, load_canary, write_canary
from pytest_qwenperf.gate.update import update_baselines
from tests.test_baseline import run_of
from tests.test_canary import make_canary


def test_an_answer_is_stored_beside_its_configs_baselines_and_read_back(tmp_path: Path) -> None:
    answer = make_canary("fp8kv")
    assert find_canary(tmp_path, answer) is None
    path = write_canary(tmp_path, answer, git_commit="abc123")
    assert path == canary_path(tmp_path, answer) == tmp_path / "cpu-test-cpu-2c" / "embedded-tiny" / "fp8kv" / "canary.json"
    assert json.loads(path.read_text())["schema"] == SCHEMA
    stored = find_canary(tmp_path, answer)
    assert stored is not None and stored.history == ()
    assert stored.answer == msgspec.structs.replace(answer, context=msgspec.structs.replace(answer.context, git_commit="abc123"))


def test_a_new_answer_moves_the_stored_one_to_history(tmp_path: Path) -> None:
    first = make_canary(version="0.31.0")
    write_canary(tmp_path, first, git_commit="a")
    changed = make_canary(outputs=((9, 9, 9), (4, 5, 6)), version="0.32.0")
    write_canary(tmp_path, changed, git_commit="b")
    stored = load_canary(canary_path(tmp_path, changed))
    assert stored.answer.fingerprint == changed.fingerprint
    ((entry),) = stored.history
    assert entry.fingerprint == first.fingerprint and entry.context.vllm_version == "0.31.0" and entry.context.git_commit == "a"


def test_an_answer_of_another_identity_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    path = write_canary(tmp_path, make_canary())
    before = path.read_bytes()
    other = make_canary()
    other = msgspec.structs.replace(other, identity=msgspec.structs.replace(other.identity, argv_sha256="b" * 64))
    with pytest.raises(BaselineRefused, match=r"not comparable with the stored one \(stored vs answer: argv_sha256: 'a+' vs 'b+'\)") as refused:
        write_canary(tmp_path, other)
    assert str(refused.value).startswith(f"{path}: not updated") and "move the file away" in str(refused.value)
    assert path.read_bytes() == before


def _stored(tmp_path: Path) -> tuple[Path, dict]:
    path = write_canary(tmp_path, make_canary())
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema="qwenperf-canary/9"), "schema: expected 'qwenperf-canary/1', got 'qwenperf-canary/9'"),
        (lambda d: d["answer"]["identity"].pop("config"), "answer.identity.config: expected a string, got nothing (the field is missing)"),
        (lambda d: d["answer"]["outputs"][0].update(token_ids="1,2"), "answer.outputs[0].token_ids: expected `array`, got '1,2'"),
        (lambda d: d["answer"]["outputs"].pop(), "answer.outputs: expected one output per prompt (2), got 1"),
        (lambda d: d["answer"]["outputs"][1].update(token_ids=[4, 5, 7]), "answer.fingerprint: expected the fingerprint of its outputs"),
        (lambda d: d["answer"]["floor"].update(match_rate=2), "answer.floor.match_rate: expected a fraction between 0 and 1"),
    ],
    ids=["schema", "field-missing", "field-type", "outputs", "fingerprint", "floor"],
)
def test_a_bad_file_names_the_file_the_field_and_what_was_expected_and_is_never_overwritten(
    tmp_path: Path, change, message: str
) -> None:
    path, document = _stored(tmp_path)
    change(document)
    path.write_text(json.dumps(document))
    with pytest.raises(BaselineError) as caught:
        load_canary(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    before = path.read_bytes()
    with pytest.raises(BaselineError):
        write_canary(tmp_path, make_canary())
    assert path.read_bytes() == before


def test_a_half_written_file_says_so(tmp_path: Path) -> None:
    path, _ = _stored(tmp_path)
    path.write_text('{"schema": "qwenperf-canary/1", "answer": {')
    with pytest.raises(BaselineError, match="expected a complete qwenperf-canary/1 JSON document, but it is not valid JSON"):
        load_canary(path)


def test_a_session_update_writes_the_answers_with_the_runs_and_nothing_after_a_failure(tmp_path: Path) -> None:
    run = run_of()
    root, refused_root = tmp_path / "baselines", tmp_path / "refused"
    write_canary(refused_root, msgspec.structs.replace(make_canary(), identity=msgspec.structs.replace(make_canary().identity, argv_sha256="c" * 64)))
    answers = [make_canary("base"), make_canary("fp8kv")]
    failed = update_baselines(root, [run], failed_tests=1, replace_published=(), source="t", canaries=answers)
    assert failed.outcomes == () and not root.exists()
    update = update_baselines(root, [run], failed_tests=0, replace_published=(), source="t", canaries=answers)
    written = [o for o in update.outcomes if o.path.name == "canary.json"]
    assert [(o.config_key, o.refused) for o in written] == [("cpu/base", None), ("cpu/fp8kv", None)]
    assert all(o.path.exists() for o in written)
    (refused,) = update_baselines(refused_root, [], failed_tests=0, replace_published=(), source="t", canaries=answers[:1]).outcomes
    assert refused.refused is not None and "not comparable with the stored one" in refused.refused
