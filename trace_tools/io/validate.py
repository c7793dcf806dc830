"""`validate`: check a dump against trace schema v1 without keeping its sessions in memory.

It streams the dump through `iter_sessions` (same rules as `load`), counts, and keeps only the
quarantine entries. Counts by reason are *sessions* (`quarantined_by_reason`,
docs/run_directory.md#what-the-files-hold): a session quarantined for two reasons counts under both,
once in `quarantined`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.data import DumpMeta, QuarantineEntry, Session
from trace_tools.errors import UnusableInput
from trace_tools.io.load import iter_sessions
from trace_tools.io.schema import REASONS
from trace_tools.io.vocab import check_tokenizer_known
from trace_tools.io.write import quarantine_table, write_parquet_atomic


@dataclass
class ValidationReport:
    """What `validate` found.

    `sessions` counts distinct session ids in the input, `turns` its rows; `sessions ==
    valid_sessions + quarantined` always holds. `unattributed` counts entries whose rows belong
    to no session (null or empty `session_id`, or a file without that column): they make the
    dump unclean without being sessions. `data_warnings` counts legal oddities of the valid
    sessions (`turn_index_gap`: sessions, `empty_generation`: turns), `warning_examples` names one.
    """

    path: str
    files: list[str]
    sessions: int
    turns: int
    valid_sessions: int
    quarantined: int
    by_reason: dict[str, int]
    entries: list[QuarantineEntry]
    vocab_checked: bool
    vocab_size: int | None = None
    meta: DumpMeta = field(default_factory=DumpMeta)
    warnings: list[str] = field(default_factory=list)
    unattributed: int = 0
    data_warnings: dict[str, int] = field(default_factory=dict)
    warning_examples: dict[str, str] = field(default_factory=dict)
    file_metas: list[DumpMeta] = field(default_factory=list)  # each file's recording metadata

    @property
    def clean(self) -> bool:
        return not self.entries

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (for `--json`)."""
        return {
            "path": self.path,
            "files": self.files,
            "sessions": self.sessions,
            "turns": self.turns,
            "valid_sessions": self.valid_sessions,
            "quarantined": self.quarantined,
            "quarantined_by_reason": self.by_reason,
            "unattributed": self.unattributed,
            "vocab_checked": self.vocab_checked,
            "vocab_size": self.vocab_size,
            "tokenizer": self.meta.tokenizer,
            "warnings": self.warnings,
            "data_warnings": self.data_warnings,
            "warning_examples": self.warning_examples,
            "entries": [
                {"session_id": e.session_id, "turn_index": e.turn_index, "reason": e.reason, "detail": e.detail}
                for e in self.entries
            ],
        }


def _sessions_by_reason(entries: list[QuarantineEntry]) -> dict[str, int]:
    sessions: dict[str, set[str]] = defaultdict(set)
    for entry in entries:
        if entry.session_id is not None:
            sessions[entry.reason].add(entry.session_id)
    return {reason: len(sessions[reason]) for reason in REASONS if sessions.get(reason)}


def _write_quarantine(entries: list[QuarantineEntry], path: Path) -> None:
    try:
        write_parquet_atomic(quarantine_table(entries), path)
    except OSError as error:
        raise UnusableInput(f"cannot write {path} ({error.strerror or error}); pass a writable --out path") from None


def validate(path: str | Path, *, quarantine_out: str | Path | None = None, **load_options: Any) -> ValidationReport:
    """Validate a dump; `load_options` are `load`'s keywords (tokenizer, vocab_size, …).

    With `quarantine_out`, the quarantine list is also written there (atomically) as Parquet
    with `quarantine.parquet`'s columns, even when it is empty. Raises `UnusableInput` when the
    path is not a readable dump, holds no usable session at all (no rows, no session ids, a
    required column missing from every file) or `quarantine_out` cannot be written.
    """
    if load_options.get("tokenizer"):
        check_tokenizer_known(load_options["tokenizer"])  # an explicit name must resolve; the dump's may not
    stream = iter_sessions(path, **load_options)
    reason = stream.unusable_reason()
    if reason:
        raise UnusableInput(f"{path}: {reason}")
    valid = 0
    entries: list[QuarantineEntry] = []
    for item in stream:
        if isinstance(item, Session):
            valid += 1
        else:
            entries.append(item)
    quarantined = len({e.session_id for e in entries if e.session_id is not None})
    if quarantine_out is not None:
        _write_quarantine(entries, Path(quarantine_out))
    return ValidationReport(
        path=str(path),
        files=stream.files,
        sessions=stream.session_count,
        turns=stream.rows,
        valid_sessions=valid,
        quarantined=quarantined,
        by_reason=_sessions_by_reason(entries),
        entries=entries,
        vocab_checked=stream.vocab_checked,
        vocab_size=stream.vocab_size,
        meta=stream.meta,
        warnings=stream.warnings,
        unattributed=sum(e.session_id is None for e in entries),
        data_warnings=dict(stream.data_warnings),
        warning_examples=dict(stream.warning_examples),
        file_metas=stream.file_metas,
    )
