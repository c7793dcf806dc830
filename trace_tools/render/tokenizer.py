"""Tokenizers by name: the built-in recipes (`tokenizer_recipes`), converted once into a cached
`tokenizer.json` (`tokenizer_files`), encoded with their own fast encoder (`fast_encoder`); or a
local Hugging Face tokenizer directory (or a `tokenizer.json` file). Nothing here imports torch.

`Tokenizer.encode` is the fast path; `encode_reference` and `decode_reference` go through the
`tokenizers` backend, as transformers does (`--reference`, `--verify`).
"""

from __future__ import annotations

import functools
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from trace_tools.errors import UnknownName
from trace_tools.ids import interned
from trace_tools.io.tokenizer_ref import find_tokenizer, resolve_tokenizer
from trace_tools.io.vocab import BUILTIN_VOCAB_SIZES, is_local_tokenizer, vocab_size_for  # noqa: F401 (re-exported)
from trace_tools.render.fast_encoder import FastEncoder
from trace_tools.render.tokenizer_files import (  # noqa: F401 (re-exported)
    build_backend,
    ensure_tokenizer_json,
    import_transformers,
    packaged_path,
    ranks_path,
)
from trace_tools.render.tokenizer_recipes import NO_PACKAGE, PACKAGED, RECIPES, STOP_TOKENS


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the few conveniences the renderer needs.

    `encode` recognises every added token in the text (as a chat template's output requires) and
    adds no BOS/EOS; `decode` keeps special tokens so parsed text still shows `<|im_end|>`.
    """

    def __init__(self, name: str, tokenizer_json: Path, source_dir: Path | None = None):
        self.name = name
        self.tokenizer_json = Path(tokenizer_json)
        self.source_dir = source_dir
        self._backend: Any = None
        self._backend_lock = threading.Lock()  # its own: building `.hf` (under `_hf_lock`) may need the backend
        self._hf = None
        self._hf_lock = threading.Lock()
        self._fast: FastEncoder | None = None
        self._fast_ready = not _has_fast_encoder(name, source_dir)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"

    def __reduce__(self):
        # Rebuild from the file in the receiving process (the locks and the lazy backend and `.hf` do not travel).
        return (Tokenizer, (self.name, self.tokenizer_json, self.source_dir))

    @property
    def backend(self) -> Any:
        """The `tokenizers.Tokenizer` (loaded on first use: a built-in tokenizer encodes through
        its fast encoder and knows its added tokens from the recipe, so a replay never needs it)."""
        with self._backend_lock:
            if self._backend is None:
                from tokenizers import Tokenizer as _RustTokenizer

                self._backend = _RustTokenizer.from_file(str(self.tokenizer_json))
            return self._backend

    @functools.cached_property
    def vocab_size(self) -> int:
        """Full size including added tokens: one past the largest id."""
        if self.builtin:
            return RECIPES[self.name].vocab_size
        return _max_id(self.backend) + 1

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without special-token additions, as the shared int objects
        (`ids.shared_ints`), so they compare fast against recorded ids."""
        fast = self._fast_encoder()
        if fast is not None:
            return fast.encode(text)  # shared ints already
        return interned(self.backend.encode(text, add_special_tokens=False).ids, self.vocab_size)

    def encode_reference(self, text: str) -> list[int]:
        """`encode` through transformers' tokenizer (the `tokenizers` backend), as
        `apply_chat_template(tokenize=True)` encodes: no fast encoder, no special-token additions."""
        return interned(self.hf.encode(text, add_special_tokens=False), self.vocab_size)

    def decode_reference(self, ids: Sequence[int]) -> str:
        """`decode` through the `tokenizers` backend, special tokens kept."""
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def _fast_encoder(self) -> "FastEncoder | None":
        # Built lazily: most processes that load a tokenizer only decode.
        if not self._fast_ready:
            with self._hf_lock:
                if not self._fast_ready:
                    self._fast = FastEncoder(RECIPES[self.name], ranks_path(self.name))
                    self._fast_ready = True
        return self._fast

    @property
    def hard_boundaries(self) -> dict[str, int]:
        """Added tokens that split the text before any normalisation or pre-tokenization (no
        lstrip/rstrip/single-word matching): the text on either side of one encodes independently,
        which is what lets a prompt be tokenized one appended piece at a time."""
        if not hasattr(self, "_boundaries"):
            if self.builtin:  # the recipes add every token without lstrip/rstrip/single_word
                self._boundaries = dict(self._recipe_added)
            else:
                decoder = self.backend.get_added_tokens_decoder()
                self._boundaries = {
                    t.content: i for i, t in decoder.items() if not (t.lstrip or t.rstrip or t.single_word)
                }
        return self._boundaries

    @functools.cached_property
    def _recipe_added(self) -> dict[str, int]:
        return RECIPES[self.name].added_ids()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        fast = self._fast_encoder()
        text = fast.decode(ids) if fast is not None else None
        return text if text is not None else self.backend.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        if self.builtin and token in (added := self._recipe_added):
            return added[token]
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @property
    def builtin(self) -> bool:
        """Built from one of the recipes, not a user's (or a wheel's) tokenizer directory."""
        return self.name in RECIPES and self.source_dir is None

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The special-token variables a chat template sees (`eos_token`, ...), as transformers
        gives them; for the recipes known without building a transformers tokenizer."""
        if self.builtin:
            recipe = RECIPES[self.name]
            return {key: value for key, value in (("bos_token", recipe.bos), ("eos_token", recipe.eos)) if value}
        return dict(self.hf.special_tokens_map)

    @property
    def hf(self) -> Any:
        """A transformers `PreTrainedTokenizerFast` over the same tokenizer.json (built lazily)."""
        with self._hf_lock:
            if self._hf is None:
                self._hf = _make_hf(self)
            return self._hf


def _max_id(backend: Any) -> int:
    vocab = backend.get_vocab(with_added_tokens=True)
    return max(vocab.values()) if vocab else -1


def _make_hf(tok: Tokenizer) -> Any:
    import_transformers()
    from transformers import PreTrainedTokenizerFast

    if tok.source_dir is not None and (tok.source_dir / "tokenizer_config.json").exists():
        # The directory's config carries bos/eos names that some templates read.
        return PreTrainedTokenizerFast.from_pretrained(str(tok.source_dir))
    recipe = RECIPES.get(tok.name)
    eos = recipe.eos if recipe else next((t for t in STOP_TOKENS if tok.token_to_id(t) is not None), None)
    return PreTrainedTokenizerFast(
        tokenizer_file=str(tok.tokenizer_json), eos_token=eos, bos_token=recipe.bos if recipe else None
    )


def known_names() -> tuple[str, ...]:
    return (*RECIPES, *PACKAGED)


def check_tokenizer_name(name_or_path: str) -> str:
    """The built-in name or local path that `load_tokenizer` would load for this `--tokenizer` value
    (`io.tokenizer_ref`); `UnknownName` (exit 2) when it names none. Nothing is loaded."""
    if name_or_path in NO_PACKAGE:  # a family whose tokenizer no package ships: say what to pass instead
        raise UnknownName("tokenizer", name_or_path, [*known_names(), NO_PACKAGE[name_or_path]])
    return resolve_tokenizer(name_or_path).source


def _has_fast_encoder(name: str, source_dir: Path | None) -> bool:
    """Recipes over tiktoken-format ranks get the tiktoken-core encoder."""
    return source_dir is None and name in RECIPES and RECIPES[name].quicktok is None


@lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str) -> Tokenizer:
    """A built-in name (`known_names()`), or a local tokenizer directory / tokenizer.json file.

    Built-in names are converted once and cached on disk; the loaded object is memoised per
    process (it is immutable apart from the lazily built `.hf`). A model id resolves first
    (`io.tokenizer_ref`).
    """
    found = find_tokenizer(name_or_path)
    if found is not None and found.source != name_or_path:
        return load_tokenizer(found.source)
    if name_or_path in RECIPES:
        return Tokenizer(name_or_path, ensure_tokenizer_json(name_or_path))
    if name_or_path in PACKAGED:
        file = packaged_path(name_or_path)
        return Tokenizer(name_or_path, file, source_dir=file.parent)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return Tokenizer(str(path), path / "tokenizer.json", source_dir=path)
    check_tokenizer_name(name_or_path)
    return Tokenizer(str(path), path, source_dir=path.parent)
