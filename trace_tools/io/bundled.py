"""The bundled sample dump (`sample_traces/`, shipped as package data) and what it carries.

Its files are self-describing recordings: each names its tokenizer and embeds its chat template
text (TRL's `qwen3.jinja` and `qwen3_5_think.jinja`).
docs/rendering.md#chat-templates-and-the-response-parser makes those embedded templates the defaults
for `qwen3` / `qwen3.5` where `trl` is not installed, so a plain `pip install .` can simulate,
render and replay without the `templates` extra.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import pyarrow.parquet as pq

from trace_tools.io.storage import is_uri

_TOKENIZER_KEY = b"trace_tools.tokenizer"
_TEMPLATE_KEY = b"trace_tools.chat_template"


def sample_dir() -> Path | None:
    """The directory of the bundled sample: package data in an install, `sample_traces/` in a checkout."""
    try:
        candidate = Path(str(resources.files("trace_tools.sample_traces")))
        if any(candidate.glob("*.parquet")):
            return candidate
    except (ModuleNotFoundError, TypeError):
        pass
    checkout = Path(__file__).resolve().parents[2] / "sample_traces"
    return checkout if any(checkout.glob("*.parquet")) else None


SAMPLE_NAME = "sample_traces/"


def shown_dump(dump: str) -> str:
    """How messages name a dump: the bundled sample as `sample_traces/` (every command takes that
    name, `bundled_or`), never the site-packages path it was installed to; other dumps as given."""
    sample = sample_dir()
    if dump and sample is not None and not is_uri(dump) and Path(dump).resolve() == sample.resolve():
        return SAMPLE_NAME
    return dump


def bundled_or(dump: str) -> str:
    """`dump`, or the bundled sample's path when `dump` is `sample_traces/` and no such path exists here."""
    if dump.rstrip("/") == SAMPLE_NAME.rstrip("/") and not Path(dump).exists():
        sample = sample_dir()
        return str(sample) if sample is not None else dump
    return dump


@lru_cache(maxsize=4)
def sample_template(tokenizer: str) -> str | None:
    """The chat template embedded in the bundled sample file recorded with `tokenizer`, if any."""
    directory = sample_dir()
    for path in sorted(directory.glob("*.parquet")) if directory else ():
        metadata = pq.read_schema(path).metadata or {}
        if metadata.get(_TOKENIZER_KEY, b"").decode() == tokenizer and _TEMPLATE_KEY in metadata:
            return metadata[_TEMPLATE_KEY].decode("utf-8")
    return None
