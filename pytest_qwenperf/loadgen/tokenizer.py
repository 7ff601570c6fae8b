"""The model's tokenizer, loaded offline, for building prompts of exact token lengths.

Only fast tokenizers (a ``tokenizer.json``, which every Qwen checkpoint ships) are
supported: the ``tokenizers`` library reads it directly, so neither transformers nor
the network is involved.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"


class PromptTokenizer:
    """Token ids in and out, plus what prompt builders must know about the vocabulary."""

    def __init__(self, tokenizer: Tokenizer, source: str = "<in memory>") -> None:
        self._tokenizer = tokenizer
        self.source = source
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        # Every added token, not only those flagged special: Qwen's <think>, <tool_call>, ...
        # are added tokens too, and a random prompt containing them would change how the
        # model behaves (and how the chat template or reasoning parser sees the text).
        self.special_ids: frozenset[int] = frozenset(tokenizer.get_added_tokens_decoder())

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str],
        *,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
    ) -> PromptTokenizer:
        """From a local model folder, else from the Hugging Face cache; never downloads.

        ``revision`` and ``cache_dir`` apply to the cache lookup only (defaults: ``main``
        and the hub's own cache, i.e. ``HF_HUB_CACHE`` / ``HF_HOME``).
        """
        folder = Path(model)
        if folder.is_dir():
            file = folder / TOKENIZER_FILE
            if not file.is_file():
                raise FileNotFoundError(f"{folder}: model folder has no {TOKENIZER_FILE} (only fast tokenizers are supported)")
            return cls(Tokenizer.from_file(str(file)), str(folder))
        return cls(Tokenizer.from_file(_from_hf_cache(str(model), revision, cache_dir)), str(model))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without BOS/EOS or any other added special token."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"PromptTokenizer({self.source!r}, vocab_size={self.vocab_size})"


def _from_hf_cache(model: str, revision: str | None, cache_dir: str | Path | None) -> str:
    # Imported here so that loading from a folder works without huggingface_hub.
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model, TOKENIZER_FILE, cache_dir=cache_dir, revision=revision)
    except ValueError:  # HFValidationError: not a valid repo id (e.g. a mistyped local path)
        found = None
    if isinstance(found, str):
        return found
    where = cache_dir if cache_dir is not None else constants.HF_HUB_CACHE
    raise FileNotFoundError(
        f"tokenizer for model {model!r} not found: it is not a local folder, and {TOKENIZER_FILE} "
        f"(revision {revision or 'main'}) is not in the Hugging Face cache at {where}. Nothing is "
        f"downloaded here; fetch it first (hf download {model} {TOKENIZER_FILE}) or pass a model folder."
    )
