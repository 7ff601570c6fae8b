"""Tests for pytest_qwenperf.suite.tiny_model (no network, no vLLM; a few seconds on 2 cores)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import platformdirs
import pytest

from pytest_qwenperf.suite import tiny_model
from pytest_qwenperf.suite.tiny_model import (
    CHAT_TEMPLATE,
    MARKER,
    SPECIAL_TOKENS,
    TinyModelSpec,
    cache_dir,
    ensure_tiny_model,
    write_tiny_model,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model.safetensors",
    MARKER,
}


def _read_all(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _assert_same_files(a: Path, b: Path) -> None:
    files_a, files_b = _read_all(a), _read_all(b)
    assert set(files_a) == EXPECTED_FILES
    assert set(files_b) == EXPECTED_FILES
    differing = [name for name in files_a if files_a[name] != files_b[name]]
    assert differing == []


def _subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


# --------------------------------------------------------------------------- #
# Determinism
# --------------------------------------------------------------------------- #


def test_writes_expected_files_and_is_byte_identical(model_dir: Path, tmp_path: Path) -> None:
    again = write_tiny_model(tmp_path / "nested" / "again")  # parents created too
    assert again == tmp_path / "nested" / "again"
    _assert_same_files(model_dir, again)


@pytest.mark.parametrize("threads", ["1", "5"])
def test_byte_identical_across_processes_and_thread_counts(
    model_dir: Path, tmp_path: Path, threads: str
) -> None:
    out = tmp_path / "sub"
    code = (
        "import sys; from pathlib import Path;"
        "from pytest_qwenperf.suite.tiny_model import write_tiny_model;"
        "write_tiny_model(Path(sys.argv[1]))"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(out)],
        check=True,
        env=_subprocess_env(RAYON_NUM_THREADS=threads, PYTHONHASHSEED=threads),
        timeout=120,
    )
    _assert_same_files(model_dir, out)


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #


def test_tokenizer_loads_with_transformers(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    assert len(tok) == TinyModelSpec().vocab_size
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert tok.pad_token_id == 0
    assert tok.bos_token is None

    for text in [
        "hello world",
        "The quick brown fox, 1234 jumps!\n\nNew paragraph\twith tab.",
        "  leading spaces and ünïcødé ✓ 日本語 🙂",
    ]:
        ids = tok(text)["input_ids"]
        assert ids, text
        assert all(0 <= i < len(tok) for i in ids)
        assert 0 not in ids  # no BOS/EOS added
        assert tok.decode(ids) == text

    # Special tokens are atomic in text and survive decoding.
    ids = tok("<|im_start|>user\nhi<|im_end|>")["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"

    # Merges were actually learnt: frequent words become single tokens.
    assert len(tok(" the")["input_ids"]) == 1


def test_chat_template_renders(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "world"},
        {"role": "user", "content": "again"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhello<|im_end|>\n"
        "<|im_start|>assistant\nworld<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=False)
    assert no_prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"

    assert (model_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHAT_TEMPLATE
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"


# --------------------------------------------------------------------------- #
# Config + weights
# --------------------------------------------------------------------------- #


def test_config_json(model_dir: Path) -> None:
    spec = TinyModelSpec()
    raw = (model_dir / "config.json").read_text()
    cfg = json.loads(raw)
    assert raw == json.dumps(cfg, sort_keys=True, indent=2) + "\n"  # canonical form
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["model_type"] == "qwen3"
    for field in dataclasses.fields(spec):
        if field.name != "seed":
            assert cfg[field.name] == getattr(spec, field.name), field.name
    assert cfg["tie_word_embeddings"] is True
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"
    assert cfg["eos_token_id"] == cfg["bos_token_id"] == 0
    assert cfg["max_window_layers"] == spec.num_hidden_layers
    assert cfg["sliding_window"] is None and cfg["use_sliding_window"] is False
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 0
    assert not {"temperature", "top_p", "top_k", "do_sample"} & set(gen)

    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    assert hf.model_type == "qwen3"
    assert hf.head_dim == spec.head_dim
    rope = getattr(hf, "rope_parameters", None) or {"rope_theta": hf.rope_theta}
    assert rope["rope_theta"] == 1_000_000


def test_safetensors_match_hf_qwen3(model_dir: Path) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, Qwen3ForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        hf_model = Qwen3ForCausalLM(config)
    expected = {k: tuple(v.shape) for k, v in hf_model.state_dict().items()}
    assert "lm_head.weight" in expected
    del expected["lm_head.weight"]

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  safe_open is not iterable
    assert {k: tuple(t.shape) for k, t in tensors.items()} == expected
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}

    for name, t in tensors.items():
        if t.ndim == 1:
            assert torch.all(t == 1), name
        else:
            std = t.float().std().item()
            assert 0.015 < std < 0.025, (name, std)
            assert abs(t.float().mean().item()) < 0.005, name

    # The real HF model accepts the checkpoint with nothing missing or unexpected.
    model, info = Qwen3ForCausalLM.from_pretrained(
        str(model_dir), local_files_only=True, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_bf16_rounding_matches_torch() -> None:
    import torch

    rng = np.random.default_rng(123)
    x = np.concatenate(
        [
            rng.normal(0, 0.02, 4096),
            rng.normal(0, 1e4, 1024),
            [0.0, -0.0, 1.0, -1.0, 1.00390625, 1.01171875, 3.4e38, -3.4e38, 1e-40],
        ]
    ).astype(np.float32)
    ours = tiny_model._float32_to_bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


def test_different_seeds_give_different_weights(model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    other = write_tiny_model(tmp_path / "seed1", TinyModelSpec(seed=1))
    w0 = load_file(str(model_dir / "model.safetensors"))
    w1 = load_file(str(other / "model.safetensors"))
    assert w0.keys() == w1.keys()
    for name in w0:
        if w0[name].ndim == 2:
            assert not w0[name].equal(w1[name]), name
        else:
            assert w0[name].equal(w1[name]), name
    # The tokenizer corpus is seeded too, so its bytes differ as well.
    assert (model_dir / "tokenizer.json").read_bytes() != (other / "tokenizer.json").read_bytes()


# --------------------------------------------------------------------------- #
# Spec / fingerprint
# --------------------------------------------------------------------------- #


def test_fingerprint_changes_with_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    base = TinyModelSpec()
    fp = base.fingerprint()
    assert fp == TinyModelSpec().fingerprint()
    assert len(fp) == 16 and int(fp, 16) >= 0
    seen = {fp}
    for field in dataclasses.fields(base):
        changed = dataclasses.replace(base, **{field.name: getattr(base, field.name) + 1})
        seen.add(changed.fingerprint())
    assert len(seen) == len(dataclasses.fields(base)) + 1

    monkeypatch.setattr(tiny_model, "GENERATOR_VERSION", tiny_model.GENERATOR_VERSION + 1)
    assert base.fingerprint() != fp


def test_fingerprint_is_stable_across_processes() -> None:
    code = "from pytest_qwenperf.suite.tiny_model import TinyModelSpec; print(TinyModelSpec(seed=3).fingerprint())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=_subprocess_env(PYTHONHASHSEED="99"),
        timeout=120,
    ).stdout.strip()
    assert out == TinyModelSpec(seed=3).fingerprint()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 100}, "vocab_size must be >= "),
        ({"num_attention_heads": 3, "num_key_value_heads": 2}, "num_attention_heads must be a multiple of num_key_value_heads"),
        ({"hidden_size": 0}, "hidden_size must be positive, got 0"),
    ],
)
def test_invalid_spec_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyModelSpec(**kwargs)


# --------------------------------------------------------------------------- #
# Cache
# --------------------------------------------------------------------------- #


def test_cache_dir_env_and_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QWENPERF_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("QWENPERF_CACHE")
    assert cache_dir() == Path(platformdirs.user_cache_dir("qwenperf"))


def test_ensure_generates_once_and_honours_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_dir: Path
) -> None:
    monkeypatch.setenv("QWENPERF_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []
    real_write = tiny_model.write_tiny_model

    def counting_write(directory: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
        calls.append(Path(directory))
        return real_write(directory, spec)

    monkeypatch.setattr(tiny_model, "write_tiny_model", counting_write)

    first = ensure_tiny_model()
    assert first == tmp_path / "cache" / f"tiny-qwen3-{TinyModelSpec().fingerprint()}"
    assert len(calls) == 1 and calls[0] != first  # written elsewhere, then renamed
    _assert_same_files(model_dir, first)
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}

    second = ensure_tiny_model()
    assert second == first
    assert len(calls) == 1
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == mtimes
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]  # no temp leftovers

    # An explicit cache argument wins over the environment variable.
    explicit = ensure_tiny_model(TinyModelSpec(seed=1), cache=tmp_path / "explicit")
    assert explicit.parent == tmp_path / "explicit"
    assert explicit.name == f"tiny-qwen3-{TinyModelSpec(seed=1).fingerprint()}"
    assert len(calls) == 2


def test_ensure_lost_race_discards_own_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Deterministically simulate another process publishing while we generate."""
    spec = TinyModelSpec()
    target = tmp_path / f"tiny-qwen3-{spec.fingerprint()}"
    real_write = tiny_model.write_tiny_model

    def racing_write(directory: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
        real_write(target, spec)  # the "other process" wins
        (target / "marker").write_text("winner")
        return real_write(directory, spec)

    monkeypatch.setattr(tiny_model, "write_tiny_model", racing_write)
    result = ensure_tiny_model(spec, cache=tmp_path)
    assert result == target
    assert (target / "marker").read_text() == "winner"  # the winner's folder was kept
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_ensure_reraises_unrelated_rename_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def failing_rename(src: object, dst: object) -> None:
        raise PermissionError("nope")

    monkeypatch.setattr(tiny_model.os, "rename", failing_rename)
    with pytest.raises(PermissionError):
        ensure_tiny_model(cache=tmp_path)
    assert list(tmp_path.iterdir()) == []  # temp dir cleaned up


def test_ensure_concurrent_processes(tmp_path: Path, model_dir: Path) -> None:
    cache = tmp_path / "shared-cache"
    go = tmp_path / "go"
    # Each worker waits for the same start signal, and lingers after writing its
    # copy so that both are generating when the first rename happens: one rename
    # wins and the other must take the "lost the race" path.
    script = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from pytest_qwenperf.suite import tiny_model
        real_write = tiny_model.write_tiny_model
        generated = []
        def slow_write(directory, spec=tiny_model.TinyModelSpec()):
            generated.append(directory)
            out = real_write(directory, spec)
            time.sleep(1.0)
            return out
        tiny_model.write_tiny_model = slow_write
        go = Path(sys.argv[2])
        Path(sys.argv[3]).touch()  # ready
        while not go.exists():
            time.sleep(0.005)
        path = tiny_model.ensure_tiny_model(cache=Path(sys.argv[1]))
        print(path, len(generated))
        """
    )
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(cache), str(go), str(r)],
            stdout=subprocess.PIPE,
            text=True,
            env=_subprocess_env(),
        )
        for r in ready
    ]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):  # both imported and at the barrier
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()
    outputs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    paths = {Path(o[0]) for o in outputs}
    assert paths == {cache / f"tiny-qwen3-{TinyModelSpec().fingerprint()}"}
    assert [o[1] for o in outputs] == ["1", "1"]  # both generated, so the race really happened
    (final,) = paths
    _assert_same_files(model_dir, final)
    assert [p.name for p in cache.iterdir()] == [final.name]


def test_cache_folder_is_readable_as_the_umask_allows(tmp_path: Path) -> None:
    """mkdtemp makes 0700 folders; a server running as another user must still read the model."""
    code = "from pytest_qwenperf.suite.tiny_model import ensure_tiny_model; print(ensure_tiny_model())"
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=_subprocess_env(QWENPERF_CACHE=str(tmp_path)),
        umask=0o022,
        timeout=120,
    )
    folder = Path(done.stdout.strip())
    assert folder.stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o644}


# --------------------------------------------------------------------------- #
# A folder of ours, and anyone else's
# --------------------------------------------------------------------------- #


def test_an_interrupted_rewrite_leaves_a_folder_still_known_to_be_ours(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = write_tiny_model(tmp_path / "model")
    real_write = tiny_model.write_bytes_atomically

    def interrupted(path: Path, data: bytes) -> None:
        if path.name == "model.safetensors":
            raise KeyboardInterrupt  # Ctrl-C half-way: config and tokenizer are seed 1, the weights seed 0
        real_write(path, data)

    monkeypatch.setattr(tiny_model, "write_bytes_atomically", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_tiny_model(target, TinyModelSpec(seed=1))
    monkeypatch.undo()
    assert write_tiny_model(target, TinyModelSpec(seed=1)) == target
    _assert_same_files(target, write_tiny_model(tmp_path / "fresh", TinyModelSpec(seed=1)))


def test_a_folder_of_someone_else_is_refused_naming_each_file(tmp_path: Path) -> None:
    target = tmp_path / "model"
    (target / "sub").mkdir(parents=True)
    (target / MARKER).write_text("not json")
    with pytest.raises(tiny_model.TinyModelFolderError) as caught:
        write_tiny_model(target)
    assert f"{MARKER} (unreadable, so no file here is known to be ours)" in str(caught.value)
    (target / MARKER).unlink()
    with pytest.raises(tiny_model.TinyModelFolderError, match=r"sub \(not written by qwenperf tiny-model\)"):
        write_tiny_model(target)
    assert [p.name for p in target.iterdir()] == ["sub"]
