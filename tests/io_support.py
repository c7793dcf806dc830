"""Shared builders for the io tests: a small, fully valid baseline dump and ways to spoil it.

The baseline has three sessions (alpha, beta, gamma) of three turns each, every optional column
filled, token ids below `VOCAB`, logprobs exactly representable in float32 (so a round trip
through Parquet compares equal). Variants change one cell or one column of its Arrow table.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_tools.data import DumpMeta, Session, Turn
from trace_tools.io.write import sessions_to_table

VOCAB = 500
SESSION_IDS = ("alpha", "beta", "gamma")
META = DumpMeta(schema_version="1", tokenizer=None, harness="toy-harness", history_mode="tree")
_START = datetime(2025, 3, 1, 9, 30, tzinfo=timezone.utc)
_TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


def _turn(session_id: str, index: int, salt: int) -> Turn:
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": f"task {session_id}"}]
    for earlier in range(index):
        messages.append({"role": "assistant", "content": f"step {earlier} — ok"})
        messages.append({"role": "tool", "content": "exit 0", "tool_call_id": f"c{earlier}"})
    output_ids = [salt + index, 17 * (index + 1), 3, 499]
    return Turn(
        session_id=session_id,
        turn_index=index,
        messages=messages,
        output_ids=output_ids,
        tools=_TOOLS,
        output_logprobs=[-0.5, -0.25, -1.0 * (index + 1), -0.125],
        prompt_ids=[11, 12, 13 + salt, 14 + index],
        response={"role": "assistant", "content": f"step {index} — ok"},
        finish_reason="stop",
        request_id=f"{session_id}-{index}",
        started_at=_START + timedelta(minutes=salt + index),
        finished_at=_START + timedelta(minutes=salt + index, seconds=7),
        chat_template_kwargs={"enable_thinking": index % 2 == 0},
        reward=1.0 if index == 2 else None,
        metadata={"note": "ünïcode", "salt": salt},
    )


def baseline_sessions() -> list[Session]:
    return [Session(sid, [_turn(sid, i, 40 * n) for i in range(3)], META) for n, sid in enumerate(SESSION_IDS)]


def baseline_table() -> pa.Table:
    """Rows grouped by session: alpha 0-2 at rows 0-2, beta at 3-5, gamma at 6-8."""
    return sessions_to_table(baseline_sessions(), META)


def write_dump(path: Path, table: pa.Table | None = None, *, row_group_size: int | None = 2) -> Path:
    """Write `table` (default: the baseline) as one Parquet file, small row groups by default."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(baseline_table() if table is None else table, path, row_group_size=row_group_size)
    return path


def with_cell(table: pa.Table, column: str, row: int, value: Any) -> pa.Table:
    """The table with one cell replaced, the column keeping its type."""
    values = table.column(column).to_pylist()
    values[row] = value
    index = table.schema.get_field_index(column)
    return table.set_column(index, table.schema.field(index), pa.array(values, table.schema.field(index).type))


def with_column(table: pa.Table, column: str, array: pa.Array) -> pa.Table:
    """The table with a column replaced by `array` (any type), field metadata dropped."""
    index = table.schema.get_field_index(column)
    return table.set_column(index, pa.field(column, array.type), array)


def distinct_session_ids(table: pa.Table) -> set[str]:
    """Sessions in the input, counted independently of the loader."""
    if "session_id" not in table.schema.names:
        return set()
    return {str(v) for v in table.column("session_id").to_pylist() if v is not None}


def read_like_workers(stream) -> list[tuple[int, Any]]:
    """Every session of an opened stream as Ray workers read it, from pass 1 alone: each row group
    read once for all the sessions in it (`read_row_group`), then each session checked
    (`read_session`); pass-1 quarantine as is. Compare with `list(stream.positioned())`."""
    from trace_tools.io.load import read_row_group, read_session

    context, slots = stream.context(), list(stream.slots())
    readers: dict[tuple[int, int], list] = {}
    for slot in slots:
        for group in slot.row_groups:
            readers.setdefault(group, []).append(slot)
    parts = {}
    for group, users in readers.items():
        for slot, rows in zip(users, read_row_group(context, *group, [user.session_id for user in users])):
            parts[group, slot.position] = rows
    found = []
    for slot in slots:
        rows = [parts[group, slot.position] for group in slot.row_groups]
        found.append((slot.position, slot.problems or read_session(context, slot, rows)))
    return found


RUN_TABLES = ("turns", "sessions", "samples", "quarantine", "fidelity", "drift")


def run_contents(run_dir: Path) -> dict:
    """Every table's rows (timings dropped) and the summary of a run directory: what must not depend
    on the executor, the worker count or where the dump and the run live."""
    import json

    out = {"summary": json.loads((Path(run_dir) / "summary.json").read_text())}
    from trace_tools.io.sample_parts import read_samples

    for name in RUN_TABLES:
        table = read_samples(Path(run_dir)) if name == "samples" else pq.read_table(Path(run_dir) / f"{name}.parquet")
        out[name] = [{k: v for k, v in row.items() if k != "elapsed_s"} for row in table.to_pylist()]
    return out


def free_port() -> int:
    """A TCP port of loopback that nothing listens on now (for a server a test starts)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# A child's peak RSS (`ru_maxrss`) starts at the size of the process it was forked from, and a
# test process late in the suite holds gigabytes: run the command from this small launcher, which
# prints the command's exit code and its own peak RSS (KiB) on stdout and passes stderr through.
PEAK_RSS_LAUNCHER = """
import os, subprocess, sys
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_pid, status, usage = os.wait4(process.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def measured(command: list[str]) -> list[str]:
    """`command` run by `PEAK_RSS_LAUNCHER` (whose stdout reads "EXIT_CODE PEAK_KIB")."""
    return [sys.executable, "-c", PEAK_RSS_LAUNCHER, *command]
