"""Importers: other recording formats into trace schema v1 (`trace-tools import FORMAT SRC... --out DUMP`).

`formats.py` declares every format (one record each); each format's reader module exposes
`outcomes(value, where, options)`, which turns one parsed JSON value into `base.Outcome`s.
`run.import_traces` streams the sources through a format and writes the dump plus its import
quarantine. `run` (and with it pyarrow) loads on first use, so `trace-tools --help` can read
`FORMATS` from here quickly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trace_tools.importers.formats import FORMATS, ImportFormat, get_format

if TYPE_CHECKING:
    from trace_tools.importers.run import ImportReport, import_traces, quarantine_path

_FROM_RUN = ("ImportReport", "import_traces", "quarantine_path")

__all__ = ["FORMATS", "ImportFormat", "ImportReport", "get_format", "import_traces", "quarantine_path"]


def __getattr__(name: str) -> Any:
    if name not in _FROM_RUN:
        raise AttributeError(f"module 'trace_tools.importers' has no attribute {name!r}")
    return getattr(importlib.import_module("trace_tools.importers.run"), name)
