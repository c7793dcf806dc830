"""What the recorder writes as it goes: one Parquet file per turn, and the raw request log.

The dump is a directory (the loader reads a directory of Parquet files as one dump, docs/trace_schema.md):
`DUMP/<session>/turn-000007.parquet`, each a one-row schema-v1 file carrying the recording's
`trace_tools.*` metadata, written atomically (temporary file, then rename: a reader never sees a
half-written file, and the loader skips the dot-named temporaries). A killed recorder therefore
leaves every finished turn readable and loses at most the turn in flight.

Every row passes the same gate as `validate` and `replay` (`io.rows.turn_from_record` on the
row as Arrow types it) before it is written; a row that fails is not written to the dump but
counted and kept in `rejected.jsonl` with its reason.

The request log (`requests.jsonl`) holds every HTTP request, one JSON object per line, flushed
after each: what kind it was (turn, side request, count_tokens, other), the body as sent, the
reply as served, and the session and turn it became. API keys and authorization headers are
replaced by `<redacted>`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from trace_tools.data import DumpMeta, Turn

_SECRET_HEADERS = {"x-api-key", "authorization", "proxy-authorization", "cookie"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(session: str) -> str:
    """A session key as a directory name (the key itself stays in the rows)."""
    name = _UNSAFE.sub("_", session).strip("._") or "session"
    return name[:80]


class TurnSink:
    """Validates and writes one Parquet file per turn under `dump_dir`."""

    def __init__(self, dump_dir: str | Path, meta: DumpMeta, vocab_size: int | None):
        from trace_tools.io.write import dump_schema

        self.dump_dir, self.meta, self.vocab_size = Path(dump_dir), meta, vocab_size
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        self._schema = dump_schema(meta)
        self.written = 0
        self.rejected: list[dict[str, Any]] = []

    def write(self, turn: Turn) -> str | None:
        """Write `turn`; returns None, or the validation reason when the row was rejected."""
        import pyarrow as pa

        from trace_tools.io.rows import BadRow, records, turn_from_record
        from trace_tools.io.write import turn_row, write_parquet_atomic

        table = pa.Table.from_pylist([turn_row(turn)], schema=self._schema)
        try:
            turn_from_record(records(table.to_batches()[0])[0], self.vocab_size)
        except BadRow as bad:
            self._reject(turn, bad.reason, bad.detail)
            return bad.reason
        target = self.dump_dir / safe_name(turn.session_id) / f"turn-{turn.turn_index:06d}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(table, target)
        self.written += 1
        return None

    def _reject(self, turn: Turn, reason: str, detail: str) -> None:
        entry = {"session_id": turn.session_id, "turn_index": turn.turn_index, "reason": reason, "detail": detail}
        self.rejected.append(entry)
        with open(self.dump_dir.parent / "rejected.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(entry, ensure_ascii=False) + "\n")


class RequestLog:
    """Appends one JSON line per request; safe to call from any thread."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._handle = open(self.path, "a", encoding="utf-8")
        self.count = 0

    def write(self, entry: dict[str, Any]) -> int:
        with self._lock:
            self.count += 1
            line = {"seq": self.count, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **entry}
            self._handle.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
            self._handle.flush()
            return self.count

    def close(self) -> None:
        with self._lock:
            self._handle.close()


def redact(headers: Any) -> dict[str, str]:
    return {k: ("<redacted>" if k.lower() in _SECRET_HEADERS else v) for k, v in dict(headers).items()}


def read_requests(path: str | Path) -> list[dict[str, Any]]:
    """The request log's entries (a torn last line, from a killed recorder, is skipped)."""
    entries = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries
