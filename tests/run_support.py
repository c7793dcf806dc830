"""Shared helpers for the run-directory tests."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

# Python statements for a `python -c` run: every template a process compiles, or reads compiled
# from the cache, prints "compile PID" on stderr, so a test can tell which processes did (forked
# workers inherit the patch; spawned ones do not run it).
REPORT_COMPILES = (
    "import os as _os, sys as _sys; from trace_tools.render import template_runner as _tr; "
    "_tr._stored_code = (lambda stored: lambda *a: (print('compile', _os.getpid(), file=_sys.stderr, flush=True), "
    "stored(*a))[1])(_tr._stored_code); "
)


def one_turn_dump(path: Path, sessions: int) -> Path:
    """A qwen3 dump of `sessions` one-turn sessions (a system prompt, a question, a short answer):
    the shape that stresses per-session overheads and the number of shard files."""
    import pyarrow as pa

    from trace_tools.data import DumpMeta
    from trace_tools.io.bundled import sample_template
    from trace_tools.io.write import dump_schema
    from trace_tools.render.tokenizer import load_tokenizer

    output = load_tokenizer("qwen3").encode("The answer is 42.<|im_end|>")
    meta = DumpMeta(schema_version="1", tokenizer="qwen3", chat_template=sample_template("qwen3"))
    schema = dump_schema(meta)
    system = {"role": "system", "content": "Answer briefly."}
    with pq.ParquetWriter(path, schema) as writer:
        for first in range(0, sessions, 10_000):
            ids = range(first, min(first + 10_000, sessions))
            rows = {
                "session_id": [f"tiny-{i:07d}" for i in ids],
                "turn_index": [0] * len(ids),
                "messages": [json.dumps([system, {"role": "user", "content": f"Q{i}?"}]) for i in ids],
                "output_ids": [output] * len(ids),
                "response": [json.dumps({"role": "assistant", "content": "The answer is 42."})] * len(ids),
            }
            columns = [pa.array(rows.get(f.name, [None] * len(ids)), f.type) for f in schema]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return path


def process_group(group: int) -> list[tuple[int, str]]:
    """(pid, state) of every process of a process group, zombies (state `Z`) included."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == group:
            members.append((int(stat.parent.name), fields[0]))
    return members
