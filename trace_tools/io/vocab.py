"""Vocabulary bounds for the `out_of_vocab` check
(docs/trace_schema.md#loading-validation-and-quarantine), known without loading a tokenizer.

The io layer validates token ids before anything renders; the bounds come from the tokenizer
records (`trace_tools.families`), and a test holds them to the tokenizers `render.tokenizer` builds.
"""

from __future__ import annotations

import json
from pathlib import Path

from trace_tools.errors import UnknownName
from trace_tools.families import TOKENIZERS

# Full size including added tokens: one past the largest id.
BUILTIN_VOCAB_SIZES = {name: tokenizer.vocab_size for name, tokenizer in TOKENIZERS.items()}


def is_local_tokenizer(name_or_path: str) -> bool:
    """A tokenizer directory holding tokenizer.json, or a tokenizer .json file."""
    path = Path(name_or_path).expanduser()
    return (path.is_dir() and (path / "tokenizer.json").is_file()) or (path.is_file() and path.name.endswith(".json"))


def check_tokenizer_known(name_or_path: str) -> None:
    """Raise `UnknownName` (exit 2) unless the name is a built-in tokenizer or a local one."""
    if name_or_path not in BUILTIN_VOCAB_SIZES and not is_local_tokenizer(name_or_path):
        raise UnknownName(
            "tokenizer",
            name_or_path,
            [*BUILTIN_VOCAB_SIZES, "a local directory containing tokenizer.json (--tokenizer PATH)"],
        )


def vocab_size_for(name_or_path: str | None) -> int | None:
    """The vocabulary bound of a built-in tokenizer name or a local tokenizer; None if unknown."""
    if not name_or_path:
        return None
    if name_or_path in BUILTIN_VOCAB_SIZES:
        return BUILTIN_VOCAB_SIZES[name_or_path]
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
