"""Reading, validating and writing trace dumps (docs/trace_schema.md, docs/run_directory.md)."""

from trace_tools.io.load import LoadedDump, SessionStream, find_files, iter_sessions, load, read_dump_meta
from trace_tools.io.schema import COLUMNS, REASONS, REQUIRED, SCHEMA_VERSION, Column
from trace_tools.io.validate import ValidationReport, validate
from trace_tools.io.write import (
    QUARANTINE_SCHEMA,
    meta_to_metadata,
    quarantine_table,
    sessions_to_table,
    write_json_atomic,
    write_parquet_atomic,
    write_text_atomic,
)

__all__ = [
    "COLUMNS",
    "Column",
    "LoadedDump",
    "QUARANTINE_SCHEMA",
    "REASONS",
    "REQUIRED",
    "SCHEMA_VERSION",
    "SessionStream",
    "ValidationReport",
    "find_files",
    "iter_sessions",
    "load",
    "meta_to_metadata",
    "quarantine_table",
    "read_dump_meta",
    "sessions_to_table",
    "validate",
    "write_json_atomic",
    "write_parquet_atomic",
    "write_text_atomic",
]
