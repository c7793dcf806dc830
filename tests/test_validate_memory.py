"""`validate` streams: its peak memory is flat in the dump's size (`io.dump_files.iter_batches`).

Writers often put a whole file in one row group (`pq.write_table` does up to a million rows),
and Arrow reads a row group's column chunks whole by default: a dump four times larger then
costs four times the chunk. Here the file is read page by page through a small buffer.
`benchmarks/bench_validate_memory.py` measures the same on simulated long-context sessions."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from io_support import measured

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "qwen3.parquet"


def replicated_dump(path: Path, copies: int, blob_bytes: int) -> Path:
    """`copies` of the bundled sample, each with its own session ids, in ONE row group; each
    row's `response` a distinct incompressible text of `blob_bytes` (so the file's size is mostly
    what it holds, not what compresses away)."""
    table = pq.read_table(SAMPLE)
    column = table.schema.get_field_index("response")
    parts = []
    for copy in range(copies):
        ids = pc.binary_join_element_wise(table.column("session_id"), pa.scalar(f"-{copy}"), "")
        blobs = pa.array([base64.b64encode(os.urandom(blob_bytes)).decode() for _ in range(table.num_rows)])
        parts.append(table.set_column(0, "session_id", ids).set_column(column, "response", blobs))
    whole = pa.concat_tables(parts)
    pq.write_table(whole, path, row_group_size=whole.num_rows)
    return path


def validate_peak_rss_kib(dump: Path) -> int:
    """Peak RSS of `trace-tools validate DUMP` in its own process (`wait4`)."""
    done = subprocess.run(
        measured([sys.executable, "-m", "trace_tools.cli.main", "validate", str(dump)]),
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # `python -m` imports from the working directory first: $PYTHONPATH decides
        timeout=300,
    )
    code, peak = done.stdout.split()
    assert code == "0", done.stderr
    return int(peak)


def test_validate_peak_memory_is_flat_in_the_dump_size(tmp_path):
    """A 45 MB dump and one four times larger (2,640 rows, 178 MB), each one row group: peak RSS
    within 20 % (a reader holding the row group's chunks grows by their size, above 50 % here)."""
    small = replicated_dump(tmp_path / "small.parquet", copies=4, blob_bytes=48 * 1024)
    large = replicated_dump(tmp_path / "large.parquet", copies=16, blob_bytes=48 * 1024)
    assert large.stat().st_size > 3.8 * small.stat().st_size
    validate_peak_rss_kib(small)  # fills the caches (tokenizer, template verdicts) a first run builds
    small_peak, large_peak = validate_peak_rss_kib(small), validate_peak_rss_kib(large)
    assert large_peak < 1.2 * small_peak, f"{small_peak >> 10} MiB, then {large_peak >> 10} MiB"
