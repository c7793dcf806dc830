"""Importers: other recording formats into trace schema v1 (`trace-tools import FORMAT SRC... --out DUMP`).

One module per format; each exposes `NAME`, `NEEDS_SESSION_KEY` and `outcomes(value, where,
options)`, which turns one parsed JSON value into `base.Outcome`s. `run.import_traces` streams
the sources through a format and writes the dump plus its import quarantine.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trace_tools.errors import UnknownName
from trace_tools.importers.run import ImportReport, import_traces, quarantine_path

FORMATS = {"miles": "miles", "openai": "openai", "gateway-traces": "gateway"}

__all__ = ["FORMATS", "ImportReport", "get_format", "import_traces", "quarantine_path"]


def get_format(name: str) -> ModuleType:
    if name not in FORMATS:
        raise UnknownName("import format", name, list(FORMATS))
    return importlib.import_module(f"trace_tools.importers.{FORMATS[name]}")
