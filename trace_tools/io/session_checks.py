"""A session's rows as turns, and the session as a whole once all its rows are read: which row
belongs to which session (`session_key`), a row as a `Turn` or the entry that quarantines its
session (`row_turn`; the row itself is checked in `trace_tools.io.rows`), duplicated turn indices
(quarantine) and gaps or empty generations (warnings). Shared by the stream (`io.load`) and the
workers that read a session from its slot (`io.load.read_session`), so both quarantine with the
same entries and details."""

from __future__ import annotations

from collections import Counter
from typing import Any

from trace_tools.data import DumpMeta, QuarantineEntry, Session, Turn
from trace_tools.io.rows import BadRow, BadText, HistoryParser, turn_from_record


def _duplicates(turns: list[Turn], label: str) -> list[tuple[int, str]]:
    """(turn_index, detail) for every turn_index that occurs more than once in a session."""
    counts = Counter(turn.turn_index for turn in turns)
    return [(index, f"{label}: turn_index {index} occurs {n} times") for index, n in sorted(counts.items()) if n > 1]


def finished_session(session_id: str, turns: list[Turn], meta: DumpMeta) -> Session | list[QuarantineEntry]:
    """All of a valid session's rows have been read: the session (turns sorted by `turn_index`), or
    one `duplicate_turn` entry per repeated index."""
    turns.sort(key=lambda turn: turn.turn_index)
    duplicates = [
        QuarantineEntry(session_id, index, "duplicate_turn", detail)
        for index, detail in _duplicates(turns, f"session {session_id}")
    ]
    return duplicates or Session(session_id, turns, meta)


def session_warnings(session: Session) -> dict[str, tuple[int, str]]:
    """Legal but worth a look (docs/trace_schema.md#loading-validation-and-quarantine), as {kind:
    (count, example)}: a turn_index gap (a dropped request; one per session) and empty generations
    (one per turn)."""
    indices = sorted({turn.turn_index for turn in session.turns})
    missing = [expected for expected, actual in enumerate(indices) if expected != actual][:1]
    empty = [turn.turn_index for turn in session.turns if not len(turn.output_ids)]
    found = {}
    for kind, turns, count in (("turn_index_gap", missing, 1), ("empty_generation", empty, len(empty))):
        if turns:
            found[kind] = (count, f"session {session.session_id}: turn {turns[0]}")
    return found


def row_turn(
    record: dict[str, Any],
    where: str,
    session_id: str,
    vocab_size: int | None,
    parser: HistoryParser,
    ids_checked: frozenset[str],
    oversized: str | None = None,
) -> Turn | QuarantineEntry:
    """One row of a session as a `Turn`, or the entry that quarantines the session (`oversized`
    says which of its cells was over the cell limit, and nulled unread: `without_oversized`)."""
    if oversized is not None:
        return QuarantineEntry(session_id, record.get("turn_index"), "cell_too_large", f"{where}: {oversized}")
    try:
        return turn_from_record(record, vocab_size, parser, ids_checked)
    except BadRow as bad:
        return QuarantineEntry(session_id, record.get("turn_index"), bad.reason, f"{where}: {bad.detail}")


def session_key(value: Any) -> str | None:
    """The session a row belongs to; None for a null or blank id (such rows belong to no session).

    An id that is not valid UTF-8 keeps a printable stand-in, so both passes agree on it."""
    if isinstance(value, BadText):
        return value.lossy
    if value is None or not str(value).strip():
        return None
    return str(value)
