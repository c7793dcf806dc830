"""Vocabulary bounds for the `out_of_vocab` check
(docs/trace_schema.md#loading-validation-and-quarantine), known without loading a tokenizer.

The io layer validates token ids before anything renders; the bounds come from the tokenizer
records (`trace_tools.families`), and a test holds them to the tokenizers `render.tokenizer` builds.
"""

from __future__ import annotations

import json
from pathlib import Path

from trace_tools.families import TOKENIZERS
from trace_tools.io.tokenizer_ref import find_tokenizer, is_local_tokenizer, resolve_tokenizer

# Full size including added tokens: one past the largest id.
BUILTIN_VOCAB_SIZES = {name: tokenizer.vocab_size for name, tokenizer in TOKENIZERS.items()}


__all__ = ["BUILTIN_VOCAB_SIZES", "check_tokenizer_known", "is_local_tokenizer", "vocab_size_for"]


def check_tokenizer_known(name_or_path: str) -> None:
    """Raise `UnknownName` (exit 2) unless the value names a tokenizer (`io.tokenizer_ref`)."""
    resolve_tokenizer(name_or_path)


def vocab_size_for(name_or_path: str | None) -> int | None:
    """The vocabulary bound of the tokenizer a `--tokenizer` value names; None if it names none."""
    found = find_tokenizer(name_or_path) if name_or_path else None
    if found is None:
        return None
    if found.builtin:
        return BUILTIN_VOCAB_SIZES[found.source]
    path = Path(found.source).expanduser()
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
