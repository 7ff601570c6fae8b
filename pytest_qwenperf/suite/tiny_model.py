"""Deterministic tiny Qwen3-architecture model that vLLM's CPU build can serve offline.

The benchmark suite needs *a* model with the real Qwen3 architecture (so vLLM
takes the same code paths as for a production Qwen3 checkpoint) but it must
never download anything.  This module writes a complete Hugging Face style
model folder from nothing but a :class:`TinyModelSpec`:

* ``config.json`` / ``generation_config.json``
* a byte-level BPE tokenizer trained here on a synthetic corpus
  (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``,
  ``chat_template.jinja``)
* ``model.safetensors`` with seeded random BF16 weights
* :data:`MARKER`, naming the spec and each file's sha256, so that a folder this module
  wrote can be told from anyone else's (which is never written into).

Every byte written is a pure function of the spec (and :data:`GENERATOR_VERSION`),
so folders produced in different processes or on different machines are
identical, and a cache folder keyed by :meth:`TinyModelSpec.fingerprint` can be
shared safely between concurrent test processes.

Runtime dependencies are deliberately limited to the stdlib, numpy,
tokenizers, safetensors and platformdirs (no torch / transformers / vllm).

Kept as one module though over 400 lines: every byte it writes is a function of one spec,
and the marker that tells its folders from others' covers every file; apart, the tokenizer
and the weights would each need that guarantee.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import platformdirs
import safetensors
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from pytest_qwenperf.core.files import umask, write_bytes_atomically

__all__ = [
    "CHAT_TEMPLATE",
    "GENERATOR_VERSION",
    "MARKER",
    "SPECIAL_TOKENS",
    "TinyModelFolderError",
    "TinyModelSpec",
    "cache_dir",
    "ensure_tiny_model",
    "write_tiny_model",
]

#: Bump whenever the bytes produced for a given spec change (corpus, file
#: layout, JSON fields, ...).  It is part of the fingerprint, so old cache
#: folders are simply ignored instead of being reused with stale contents.
GENERATOR_VERSION = 1

#: Special tokens, in id order (0, 1, 2), as in Qwen's tokenizer.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_EOS_TOKEN = "<|endoftext|>"
_EOS_ID = 0

#: ChatML, as used by Qwen.  Content is accessed as a plain string so vLLM
#: detects the "string" content format.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

_CORPUS_SENTENCES = 6000  # ~250 KB of text; trains in well under a second


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the generated model.

    ``head_dim`` defaults to 64 because vLLM's CPU attention backend only
    supports a fixed set of head sizes (32, 64, 80, 96, ...); 16 is rejected.
    """

    vocab_size: int = 512  # BPE vocab including the special tokens
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        # 3 specials + the 256-symbol byte alphabet must fit in the vocab.
        min_vocab = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
        if self.vocab_size < min_vocab:
            raise ValueError(f"vocab_size must be >= {min_vocab}, got {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name != "seed" and value <= 0:
                raise ValueError(f"{field.name} must be positive, got {value}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    def fingerprint(self) -> str:
        """Short stable hex digest of every field plus :data:`GENERATOR_VERSION`."""
        payload = {"generator_version": GENERATOR_VERSION, **dataclasses.asdict(self)}
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# --------------------------------------------------------------------------- #
# Corpus + tokenizer
# --------------------------------------------------------------------------- #

_COMMON_WORDS = (
    "the of and to in is that it was for on are as with his they at be this from "
    "have or by one had not but what all were when we there can an your which their "
    "said if do will each about how up out them then she many some so these would "
    "other into has more her two like him see time could no make than first been its "
    "who now people my made over did down only way find use may water long little "
    "very after words called just where most know hello world model token test bench "
    "request latency throughput server prompt answer question"
).split()


def _corpus(seed: int) -> list[str]:
    """English-like text generated from ``seed`` alone.

    ``random.Random`` with an int seed and only ``random()``/``randrange``-based
    calls is reproducible across platforms and Python 3 versions.
    """
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "y", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "qu", "sh", "st",
              "str", "th", "tr", "wh"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y"]
    codas = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "ck", "st", "th", "rt"]

    def make_word() -> str:
        return "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(1 + rng.randrange(3))
        )

    lexicon = list(_COMMON_WORDS) + [make_word() for _ in range(1500)]
    # Zipf-like weights so that frequent words become whole tokens.
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    cumulative: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        cumulative.append(total)

    def pick() -> str:
        # Manual inverse-CDF sampling: only relies on rng.random().
        x = rng.random() * total
        lo, hi = 0, len(cumulative) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cumulative[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lexicon[lo]

    punctuation = [".", ".", ".", "?", "!", ";"]
    lines: list[str] = []
    for i in range(_CORPUS_SENTENCES):
        words = [pick() for _ in range(4 + rng.randrange(12))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.15:
            words.insert(rng.randrange(len(words)), str(rng.randrange(10_000)))
        if rng.random() < 0.2:
            j = rng.randrange(len(words))
            words[j] = words[j] + ","
        lines.append(" ".join(words) + rng.choice(punctuation))
        if i % 50 == 0:
            lines.append("")  # paragraph breaks give the trainer "\n\n"-ish words
    return lines


def _build_tokenizer(spec: TinyModelSpec) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # BPE training is deterministic regardless of thread count / hash seeds:
    # merges are chosen by (count, pair ids) and ties are broken on ids that are
    # themselves assigned in sorted order.  tests/test_tiny_model.py checks this
    # across processes with different RAYON_NUM_THREADS and PYTHONHASHSEED.
    tokenizer.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    got = tokenizer.get_vocab_size(with_added_tokens=True)
    if got != spec.vocab_size:
        raise RuntimeError(
            f"BPE training produced {got} tokens, wanted {spec.vocab_size}; "
            "the synthetic corpus is too small for this vocab_size"
        )
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected_id:
            raise RuntimeError(f"special token {token!r} did not get id {expected_id}")
    return tokenizer


# --------------------------------------------------------------------------- #
# Weights
# --------------------------------------------------------------------------- #


def _parameter_shapes(spec: TinyModelSpec) -> dict[str, tuple[int, ...]]:
    """Names/shapes of HF ``Qwen3ForCausalLM`` parameters (``lm_head`` is tied, so absent)."""
    h, d = spec.hidden_size, spec.head_dim
    q_out = spec.num_attention_heads * d
    kv_out = spec.num_key_value_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes.update(
            {
                f"{p}.input_layernorm.weight": (h,),
                f"{p}.self_attn.q_proj.weight": (q_out, h),
                f"{p}.self_attn.k_proj.weight": (kv_out, h),
                f"{p}.self_attn.v_proj.weight": (kv_out, h),
                f"{p}.self_attn.o_proj.weight": (h, q_out),
                f"{p}.self_attn.q_norm.weight": (d,),
                f"{p}.self_attn.k_norm.weight": (d,),
                f"{p}.post_attention_layernorm.weight": (h,),
                f"{p}.mlp.gate_proj.weight": (spec.intermediate_size, h),
                f"{p}.mlp.up_proj.weight": (spec.intermediate_size, h),
                f"{p}.mlp.down_proj.weight": (h, spec.intermediate_size),
            }
        )
    shapes["model.norm.weight"] = (h,)
    return shapes


def _float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16, returned as little-endian uint16 bits."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype("<u2")


def _safetensors_bytes(spec: TinyModelSpec) -> bytes:
    # Stored as BF16 (the dtype real Qwen3 checkpoints ship in and what we serve
    # with), so vLLM loads without a cast.  numpy has no bfloat16 dtype, but the
    # safetensors library's own ``serialize`` accepts raw buffers tagged with a
    # dtype name, so we round in numpy (pure integer ops: bit-exact everywhere)
    # and let the library write the file format.
    rng = np.random.default_rng(spec.seed)
    arrays: dict[str, np.ndarray] = {}
    for name, shape in _parameter_shapes(spec).items():
        # RMSNorm weights (one dimension) are ones, the rest small random values
        values = np.ones(shape, dtype=np.float32) if len(shape) == 1 else rng.normal(0.0, 0.02, size=shape).astype(np.float32)
        arrays[name] = _float32_to_bf16_bits(values)
    tensor_specs = {
        name: safetensors.TensorSpec(
            dtype="bfloat16", shape=arr.shape, data_ptr=arr.ctypes.data, data_len=arr.nbytes
        )
        for name, arr in arrays.items()
    }
    # ``arrays`` keeps the buffers alive for the duration of serialize().
    return bytes(safetensors.serialize(tensor_specs, metadata={"format": "pt"}))


# --------------------------------------------------------------------------- #
# JSON files
# --------------------------------------------------------------------------- #


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def _config(spec: TinyModelSpec) -> dict[str, Any]:
    rope_theta = 1_000_000
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        # Legacy key (transformers 4.x) and its transformers 5.x replacement.
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "bos_token_id": _EOS_ID,
        "eos_token_id": _EOS_ID,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": True,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": spec.num_hidden_layers,
        "initializer_range": 0.02,
    }


def _tokenizer_config(spec: TinyModelSpec) -> dict[str, Any]:
    return {
        # Not "TokenizersBackend": transformers < 5 cannot resolve that name.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": spec.max_position_embeddings,
        "eos_token": _EOS_TOKEN,
        "pad_token": _EOS_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": CHAT_TEMPLATE,
    }


def _special_tokens_map() -> dict[str, Any]:
    return {
        "eos_token": _EOS_TOKEN,
        "pad_token": _EOS_TOKEN,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    }


def _model_files(spec: TinyModelSpec) -> dict[str, bytes]:
    tokenizer = _build_tokenizer(spec)
    return {
        "config.json": _json_bytes(_config(spec)),
        "generation_config.json": _json_bytes(
            {"bos_token_id": _EOS_ID, "eos_token_id": _EOS_ID}
        ),
        "tokenizer.json": (tokenizer.to_str(pretty=True) + "\n").encode(),
        "tokenizer_config.json": _json_bytes(_tokenizer_config(spec)),
        "special_tokens_map.json": _json_bytes(_special_tokens_map()),
        "chat_template.jinja": CHAT_TEMPLATE.encode(),
        "model.safetensors": _safetensors_bytes(spec),
    }


# --------------------------------------------------------------------------- #
# Public API
# --------------------------------------------------------------------------- #


#: Written into every model folder: which spec it holds and the sha256 of each file written,
#: so a later write can tell a folder of ours (rewritten freely) from anyone else's (refused).
MARKER = ".qwenperf-tiny-model.json"


class TinyModelFolderError(ValueError):
    """The target folder cannot take the model without overwriting files that are not ours."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _marker_bytes(spec: TinyModelSpec, files: dict[str, list[str]], *, complete: bool) -> bytes:
    """``files``: name -> the sha256 digests a file of that name may have and still be ours.
    While the files are being written, the fingerprint is null: the folder holds no spec yet."""
    return _json_bytes(
        {
            "written_by": "qwenperf tiny-model",
            "generator_version": GENERATOR_VERSION,
            "fingerprint": spec.fingerprint() if complete else None,
            "spec": dataclasses.asdict(spec),
            "files": files,
        }
    )


@dataclass(frozen=True)
class _Contents:
    """What a folder holds, judged against its marker."""

    fingerprint: str | None  # from the marker; None when there is none, or while it is being written
    listed: frozenset[str]  # the files the marker names
    digests: dict[str, str]  # every file of ours in it -> its sha256
    foreign: tuple[str, ...]  # entries not written by us, or changed since, each with why

    def complete(self, spec: TinyModelSpec) -> bool:
        return self.fingerprint == spec.fingerprint() and set(self.digests) == self.listed


def _contents(directory: Path) -> _Contents:
    entries = sorted(p.name for p in directory.iterdir())
    if not entries:
        return _Contents(None, frozenset(), {}, ())
    if MARKER not in entries:
        return _Contents(None, frozenset(), {}, tuple(f"{name} (not written by qwenperf tiny-model)" for name in entries))
    try:
        marker = json.loads((directory / MARKER).read_text())
        accepted = {name: set(digests) for name, digests in marker["files"].items()}
        fingerprint = marker["fingerprint"]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return _Contents(None, frozenset(), {}, (f"{MARKER} (unreadable, so no file here is known to be ours)",))
    digests: dict[str, str] = {}
    foreign = []
    for name in entries:
        if name == MARKER:
            continue
        path = directory / name
        if name not in accepted or path.is_symlink() or not path.is_file():
            foreign.append(f"{name} (not written by qwenperf tiny-model)")
        elif (digest := _sha256(path.read_bytes())) not in accepted[name]:
            foreign.append(f"{name} (changed since qwenperf tiny-model wrote it)")
        else:
            digests[name] = digest
    return _Contents(fingerprint, frozenset(accepted), digests, tuple(foreign))


def write_tiny_model(directory: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write every model file for ``spec`` into ``directory`` (created if missing), and :data:`MARKER`.

    Never overwrites anyone else's file: a folder that holds anything not written here, or
    changed since, is refused with :class:`TinyModelFolderError` naming those files. A
    folder written here before is reused as it is when it holds this spec complete, and
    rewritten otherwise (another seed, a file missing). Each file is written atomically and
    fsynced, the marker before the others (no spec yet, accepting a file's old and new
    contents while they change) and after them (the spec, only the new contents), so an
    interrupted write leaves a folder that is still known to be ours and is rewritten next
    time, and once :func:`ensure_tiny_model` renames the folder into place it holds no
    truncated file.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise TinyModelFolderError(f"{directory}: is a file, not a folder; give a new or empty folder for the model")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TinyModelFolderError(f"{directory}: cannot create the folder: {exc.strerror}") from None
    found = _contents(directory)
    if found.foreign:
        raise TinyModelFolderError(
            f"{directory}: not written, the folder holds files that are not the tiny model's: "
            + ", ".join(found.foreign)
            + "; give a new or empty folder (nothing was changed)"
        )
    if found.complete(spec):
        return directory
    files = _model_files(spec)
    new = {name: [_sha256(data)] for name, data in files.items()}
    during = {name: sorted({*new[name], found.digests[name]}) if name in found.digests else new[name] for name in new}
    write_bytes_atomically(directory / MARKER, _marker_bytes(spec, during, complete=False))
    for name, data in files.items():
        write_bytes_atomically(directory / name, data)
    write_bytes_atomically(directory / MARKER, _marker_bytes(spec, new, complete=True))
    return directory


def cache_dir() -> Path:
    """``$QWENPERF_CACHE`` if set (and non-empty), else the per-user cache dir for qwenperf."""
    override = os.environ.get("QWENPERF_CACHE")
    if override:
        return Path(override)
    return Path(platformdirs.user_cache_dir("qwenperf"))


def ensure_tiny_model(spec: TinyModelSpec = TinyModelSpec(), cache: Path | None = None) -> Path:
    """Return ``<cache>/tiny-qwen3-<fingerprint>``, generating it on first use.

    Concurrency: the model is written into a private temp dir inside the cache
    and published with a single ``os.rename``.  A folder at the target path is
    therefore always complete.  If another process published first, our rename
    fails (the target is a non-empty directory) and we discard our copy; both
    copies are byte-identical anyway.
    """
    root = Path(cache) if cache is not None else cache_dir()
    target = root / f"tiny-qwen3-{spec.fingerprint()}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        tmp.chmod(0o777 & ~umask())  # mkdtemp's 0700 would hide the model from a server run as another user
        write_tiny_model(tmp, spec)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            # Lost the race: someone else's (identical) folder is already there.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
