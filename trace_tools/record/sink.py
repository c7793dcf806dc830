"""What the recorder writes as it goes: one Parquet file per turn, and the raw request log.

The dump is a directory (the loader reads a directory of Parquet files as one dump, docs/trace_schema.md):
`DUMP/<session>/turn-000007.parquet`, each a one-row schema-v1 file carrying the recording's
`trace_tools.*` metadata. The `<session>` folder is the key escaped for a file name plus a short
hash of the exact key (`safe_name`), so two keys that escape alike never share a folder.
A turn file is written to a dot-named temporary file (the loader skips those) and linked into
place only if no file has that name: a reader never sees a half-written file, and no turn ever
replaces another. A session's numbering continues from the highest turn on disk (and in
`rejected.jsonl`), so a recorder restarted into the same folder appends to its sessions.

Every row passes the same gate as `validate` and `replay` (`io.rows.turn_from_record` on the
row as Arrow types it) before it is written; a row that fails, or cannot be written, is not in
the dump but counted and kept in `rejected.jsonl` with its reason.

The request log (`requests.jsonl`) holds every HTTP request, one JSON object per line, flushed
after each: what kind it was (turn, side request, count_tokens, other), the body as sent, the
reply as served, and the session and turn it became. API keys and authorization headers are
replaced by `<redacted>`; bytes that are not UTF-8 (a header a client sent) are written escaped.

`OutLock` holds an exclusive lock on the output folder for the recorder's lifetime: a second
recorder into the same folder would interleave its numbering with the first's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trace_tools.data import DumpMeta, Turn
from trace_tools.errors import TraceToolsError, UsageError

_SECRET_HEADERS = {"x-api-key", "authorization", "proxy-authorization", "cookie"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_TURN_FILE = re.compile(r"turn-(\d+)\.parquet")
LOCK_NAME = ".recorder.lock"


def safe_name(session: str) -> str:
    """A session key as a directory name: the key escaped and cut to 60 characters (readable),
    then 12 hex digits of the exact key's SHA-256, so `a b` and `a_b`, or two long keys sharing
    their first 60 characters, get folders of their own. The key itself stays in the rows."""
    readable = _UNSAFE.sub("_", session).strip("._")[:60] or "session"
    digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{readable}-{digest}"


class TurnSink:
    """Validates and writes one Parquet file per turn under `dump_dir`, numbering each session's
    turns on from what is already on disk."""

    def __init__(self, dump_dir: str | Path, meta: DumpMeta, vocab_size: int | None):
        from trace_tools.io.write import dump_schema

        self.dump_dir, self.meta, self.vocab_size = Path(dump_dir), meta, vocab_size
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        self.rejected_path = self.dump_dir.parent / "rejected.jsonl"
        self._schema = dump_schema(meta)
        self.written = 0
        self.rejected: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._rejected_before = _highest_rejected(self.rejected_path)
        # What the first write imports (pyarrow converts datetimes through pandas: a second or two)
        # is loaded now, not inside a client's request.
        self._checked_table(Turn("warm-up", 0, [{"role": "user", "content": ""}], [0], started_at=_now()))

    def _checked_table(self, turn: Turn) -> Any:
        """The turn as a one-row table, after the row gate (raises `io.rows.BadRow`)."""
        import pyarrow as pa

        from trace_tools.io.rows import records, turn_from_record
        from trace_tools.io.write import turn_row

        table = pa.Table.from_pylist([turn_row(turn)], schema=self._schema)
        turn_from_record(records(table.to_batches()[0])[0], self.vocab_size)
        return table

    def reserve(self, session: str) -> int:
        """The next turn index of `session` (one past its highest turn on disk or rejected, the
        first time this recorder sees it), reserved: no two calls return the same."""
        with self._lock:
            if session not in self._next:
                self._next[session] = 1 + max(self._highest_on_disk(session), self._rejected_before.get(session, -1))
            index = self._next[session]
            self._next[session] += 1
            return index

    def _highest_on_disk(self, session: str) -> int:
        folder = self.dump_dir / safe_name(session)
        names = os.listdir(folder) if folder.is_dir() else []
        return max((int(m.group(1)) for m in map(_TURN_FILE.fullmatch, names) if m), default=-1)

    def write(self, turn: Turn) -> str | None:
        """Write `turn` (never over an existing file); returns None, or the reason it went to
        `rejected.jsonl` instead (it failed validation, or could not be written)."""
        from trace_tools.io.rows import BadRow
        from trace_tools.io.write import write_parquet_atomic

        try:
            table = self._checked_table(turn)
        except BadRow as bad:
            return self._reject(turn, bad.reason, bad.detail)
        target = self.dump_dir / safe_name(turn.session_id) / f"turn-{turn.turn_index:06d}.parquet"
        try:
            write_parquet_atomic(table, target, exclusive=True)
        except FileExistsError:
            return self._reject(turn, "turn_file_exists", f"{target} exists; the turn was not written over it")
        except (OSError, TraceToolsError) as exc:
            return self._reject(turn, "write_failed", str(exc))
        with self._lock:
            self.written += 1
        return None

    def _reject(self, turn: Turn, reason: str, detail: str) -> str:
        entry = {"session_id": turn.session_id, "turn_index": turn.turn_index, "reason": reason, "detail": detail}
        with self._lock:
            self.rejected.append(entry)
            with open(self.rejected_path, "a", encoding="utf-8", errors="backslashreplace") as out:
                out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        return reason


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _highest_rejected(path: Path) -> dict[str, int]:
    """Each session's highest turn index in an earlier recording's `rejected.jsonl`."""
    highest: dict[str, int] = {}
    for entry in read_requests(path) if path.exists() else []:
        session, index = entry.get("session_id"), entry.get("turn_index")
        if isinstance(session, str) and isinstance(index, int):
            highest[session] = max(index, highest.get(session, -1))
    return highest


class OutLock:
    """An exclusive `flock` on `OUT/.recorder.lock`, held until `release`: a second recorder
    into the same folder is refused (UsageError) instead of numbering over the first's turns.
    The lock goes with the process, so a killed recorder never leaves a stale one."""

    def __init__(self, out_dir: Path):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / LOCK_NAME
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            self.release()
            raise UsageError(
                f"another recorder (pid {holder}) is writing into {out_dir}; stop it, or give this one another --out"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None


class RequestLog:
    """Appends one JSON line per request; safe to call from any thread."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._handle = open(self.path, "a", encoding="utf-8", errors="backslashreplace")
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
