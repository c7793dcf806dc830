"""What a `--tokenizer` value names, resolved without loading anything (docs/model_families.md#model-ids).

A value is, in this order: a local tokenizer directory (holding tokenizer.json) or tokenizer .json
file; a built-in name (`families.TOKENIZERS`); a Hugging Face model id, which resolves to its
snapshot in the local Hugging Face cache when that holds a tokenizer.json (the real tokenizer and
its template), else, for an id in the family records (`families.HUB_IDS`), to that family's
built-in tokenizer. Nothing is downloaded. Anything else is an `UnknownName` (exit 2) that lists
what would work.

Dumps keep the value the user gave (a model id stays a model id), and every reader resolves it
here, so a dump written on one machine reads on another with or without the cache.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from trace_tools.errors import UnknownName
from trace_tools.families import FAMILIES, HUB_IDS, TOKENIZERS

_MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
LOCAL_HINT = "a local directory containing tokenizer.json (--tokenizer PATH)"


@dataclass(frozen=True)
class TokenizerRef:
    """`source`: a built-in tokenizer name or a local path, what `render.tokenizer` loads.
    `family`: the family a model id maps to (None otherwise). `via`: how it was found, for messages."""

    source: str
    family: str | None = None
    via: str = "name"

    @property
    def builtin(self) -> bool:
        return self.source in TOKENIZERS


def is_local_tokenizer(name_or_path: str) -> bool:
    """A tokenizer directory holding tokenizer.json, or a tokenizer .json file."""
    path = Path(name_or_path).expanduser()
    return (path.is_dir() and (path / "tokenizer.json").is_file()) or (path.is_file() and path.name.endswith(".json"))


def hf_hub_folder() -> Path:
    """Where Hugging Face's hub client keeps models: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path("~/.cache/huggingface").expanduser()
    return Path(home).expanduser() / "hub"


def cached_snapshot(model_id: str) -> Path | None:
    """The cached snapshot of `model_id` holding a tokenizer.json: the one `refs/main` names, else the newest."""
    entry = hf_hub_folder() / ("models--" + model_id.replace("/", "--"))
    snapshots = entry / "snapshots"
    if not snapshots.is_dir():
        return None
    main = entry / "refs" / "main"
    if main.is_file():
        pinned = snapshots / main.read_text(encoding="utf-8").strip()
        if (pinned / "tokenizer.json").is_file():
            return pinned
    candidates = [d for d in snapshots.iterdir() if (d / "tokenizer.json").is_file()]
    return max(candidates, key=lambda d: d.stat().st_mtime) if candidates else None


def find_tokenizer(name_or_path: str) -> TokenizerRef | None:
    """The tokenizer a value names (see the module docstring), or None when it names none."""
    if name_or_path in TOKENIZERS:
        return TokenizerRef(name_or_path)
    if is_local_tokenizer(name_or_path):
        return TokenizerRef(name_or_path, via="path")
    family = HUB_IDS.get(name_or_path.lower())
    if _MODEL_ID.match(name_or_path):
        snapshot = cached_snapshot(name_or_path)
        if snapshot is not None:
            return TokenizerRef(str(snapshot), family, via="hub cache")
    if family is not None:
        return TokenizerRef(FAMILIES[family].tokenizer, family, via="model id")
    return None


def resolve_tokenizer(name_or_path: str) -> TokenizerRef:
    """`find_tokenizer`, or `UnknownName` (exit 2) listing the built-in names, the model ids and a path."""
    found = find_tokenizer(name_or_path)
    if found is None:
        raise UnknownName("tokenizer", name_or_path, tokenizer_alternatives())
    return found


def tokenizer_alternatives() -> list[str]:
    """What `--tokenizer` accepts, as an error lists it (typo suggestions are drawn from these)."""
    ids = [hub_id for family in FAMILIES.values() for hub_id in family.hub_ids]
    return [*TOKENIZERS, *ids, f"a model id in {hf_hub_folder()}", LOCAL_HINT]
