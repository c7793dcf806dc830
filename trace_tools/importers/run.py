"""`import_traces`: stream source logs into a schema-v1 dump, accounting for every record.

Two passes over the sources, neither holding more than one record (or one `.json` document)
and a few integers per session:

1. **Census.** Convert every record and count: per session its records and whether any is
   malformed; per reason the malformed records; rejected requests. The counts go into the dump's
   `trace_tools.import` metadata, which Parquet fixes when the file is opened.
2. **Write.** Convert again (conversion is deterministic) and write each turn of a sound session
   as a row, a row group at a time, `turn_index` = the record's arrival position in its session.
   A format whose records arrive out of order (`ImportFormat.ordered_by_start`: OTel spans are
   exported in batches as they end) keeps one start time per record in pass 1 instead, and
   `turn_index` is the record's rank by start time (arrival breaks ties).

A malformed record quarantines its whole session, as a bad row does in `load` (a session with a
hole cannot be replayed faithfully): its sound records are listed as `session_quarantined`. A
rejected request (non-200) is not a turn; it keeps its arrival position, so the session's
`turn_index` sequence has a gap exactly where it arrived (a gap is legal in schema v1). Both are
written, one JSON object a line, to the *import quarantine* next to the dump
(`<dump>.quarantine.jsonl`: `source`, `session_id`, `turn_index`, `reason`, `detail`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_tools.data import DumpMeta
from trace_tools.errors import UnusableInput
from trace_tools.importers.base import (
    IMPORT_REASONS,
    REJECTED,
    BadRecord,
    Options,
    Outcome,
    dotted,
    json_values,
    source_files,
    step_fields,
)
from trace_tools.importers.formats import get_format
from trace_tools.io.rundir import check_output_file
from trace_tools.io.write import DUMP_ROW_GROUP_ROWS, atomic_open, dump_writer

META_KEY = "import"  # trace_tools.import: the JSON census below
MAX_LISTED_FILES = 50
PROGRESS_EVERY = 1000


@dataclass
class ImportReport:
    """What an import read and wrote. Counts of `records` = turns + rejected + quarantined records."""

    format: str
    out: str
    quarantine_file: str | None  # None when no record needed one (no empty file is written)
    files: int
    records: int = 0
    turns: int = 0
    sessions: int = 0
    rejected_requests: int = 0
    quarantined_records: int = 0
    quarantined_sessions: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    vocab_size: int | None = None
    tokenizer: str | None = None
    chat_template: str | None = None  # the template's identity (its text is in the dump)
    warnings: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.quarantined_records == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "format",
                "out",
                "quarantine_file",
                "files",
                "records",
                "turns",
                "sessions",
                "rejected_requests",
                "quarantined_records",
                "quarantined_sessions",
                "by_reason",
                "vocab_size",
                "tokenizer",
                "chat_template",
                "warnings",
            )
        } | {"vocab_checked": self.vocab_size is not None}


@dataclass(slots=True)
class _SessionCount:
    records: int = 0
    rejected: int = 0
    malformed: int = 0
    first_problem: str = ""  # where and why its first malformed record failed
    seen: int = 0  # pass 2: records met so far, i.e. the next record's arrival position
    starts: list[float] | None = None  # pass 1, formats ordered by start: each record's start, in arrival order
    ranks: list[int] | None = None  # ... and each record's position by start time, in arrival order

    def position(self, arrival: int) -> int:
        return arrival if self.ranks is None else self.ranks[arrival]

    def rank_by_start(self) -> None:
        starts, self.starts = self.starts, None
        if starts is not None:
            self.ranks = [0] * len(starts)
            for rank, arrival in enumerate(sorted(range(len(starts)), key=lambda i: (starts[i], i))):
                self.ranks[arrival] = rank

    @property
    def sound(self) -> bool:
        return self.malformed == 0


def import_traces(
    fmt: str,
    sources: Sequence[str | Path],
    out: str | Path,
    *,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    session_key: str | None = None,
    step_key: str | None = None,
    row_group_rows: int = DUMP_ROW_GROUP_ROWS,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> ImportReport:
    """Convert `sources` in format `fmt` into the schema-v1 dump `out` (see the module docstring).

    `tokenizer` and `chat_template` (a name, `trl:<name>`, a `.jinja` file or a dump that embeds
    one) are written into the dump's metadata, the template as text; ids are checked against the
    tokenizer's vocabulary. Raises `UnusableInput` / `UnknownName` / `TemplateNotFound` for
    unusable input or options, `UsageError` for an `out` (or its quarantine file) that is a
    directory, one of the sources, or an existing file without `overwrite` (all exit 2);
    malformed records are reported, not raised.
    """
    record = get_format(fmt)
    if record.needs_session_key and not session_key:
        raise UnusableInput(
            f"{fmt} logs carry no session id of their own; pass --session-key NAME "
            "(a request header such as x-session-id, or a field such as request.user)"
        )
    out = Path(out)
    files = source_files(sources, record.suffixes)
    check_output_file(out, files, overwrite)
    files = [f for f in files if f.resolve() != quarantine_path(out).resolve()]  # an earlier import's
    check_output_file(quarantine_path(out), files, overwrite)
    report = ImportReport(fmt, str(out), str(quarantine_path(out)), len(files), tokenizer=tokenizer)
    meta = _recording_meta(report, tokenizer, chat_template)
    options = Options(fmt, session_key=session_key, vocab_size=report.vocab_size, step_key=step_key)
    reader = record.load()
    sessions = _census(_outcomes(reader, files, options), report, record.ordered_by_start)
    if not sessions and report.by_reason.get("no_session"):
        looked = f"--session-key {session_key!r} finds nothing" if session_key else "the format's own fields hold none"
        raise UnusableInput(
            f"none of the {report.records} records names a session ({looked}); pass --session-key NAME, "
            "the request header (e.g. x-session-id) or field (e.g. request.metadata.session_id) that holds it"
        )
    if not report.quarantined_records and not report.rejected_requests:
        report.quarantine_file = None
    meta.extra[META_KEY] = json.dumps(_census_meta(report, files), sort_keys=True)
    _write(_outcomes(reader, files, options), sessions, out, meta, report, row_group_rows, progress)
    if report.quarantine_file is None:  # an earlier import's list (--overwrite) no longer describes the dump
        quarantine_path(out).unlink(missing_ok=True)
    return report


def quarantine_path(out: Path) -> Path:
    """`dump.parquet` -> `dump.quarantine.jsonl` (not `.parquet`, so a directory scan never takes it for a dump)."""
    return out.with_name(out.name.removesuffix(".parquet") + ".quarantine.jsonl")


def _recording_meta(report: ImportReport, tokenizer: str | None, chat_template: str | None) -> DumpMeta:
    """The dump's metadata: the tokenizer as given (it must resolve: exit 2 before anything is read)
    and the template text, from `chat_template` or else the tokenizer's own."""
    from trace_tools.errors import TemplateNotFound
    from trace_tools.io.vocab import vocab_size_for
    from trace_tools.render.templates import resolve_template
    from trace_tools.render.tokenizer import check_tokenizer_name

    source = check_tokenizer_name(tokenizer) if tokenizer else None
    report.vocab_size = vocab_size_for(tokenizer)
    if tokenizer and report.vocab_size is None:
        report.warnings.append(f"vocabulary size of tokenizer {tokenizer!r} is unknown; out-of-vocab check skipped")
    if not tokenizer:
        report.warnings.append("no --tokenizer: out-of-vocab check skipped and the dump names no tokenizer")
    text = None
    if chat_template or source:
        try:
            text, report.chat_template = resolve_template(chat_template, tokenizer_name=source)
        except TemplateNotFound as missing:
            if chat_template:
                raise
            report.warnings.append(
                f"no chat template embedded: tokenizer {tokenizer!r} brings none ({missing}); "
                "replay will need --chat-template"
            )
    return DumpMeta(tokenizer=tokenizer, chat_template=text, extra={})


def _outcomes(module: Any, files: list[Path], options: Options) -> Iterator[Outcome]:
    for path in files:
        for where, value in json_values(path):
            if isinstance(value, BadRecord):
                yield Outcome(None, where, reason=value.reason, detail=value.detail)
            elif not isinstance(value, dict):
                yield Outcome(None, where, reason="bad_json", detail=f"a JSON {type(value).__name__}, not an object")
            elif options.step_key is None:
                yield from module.outcomes(value, where, options)
            else:
                yield from _with_named_step(module.outcomes(value, where, options), value, options.step_key)


def _with_named_step(outcomes: Iterator[Outcome], value: dict, step_key: str) -> Iterator[Outcome]:
    """`--step-key`: the step the user names in a source value goes on every turn it describes
    (a per-call record's one turn, a session document's all); a value that is not a step quarantines them."""
    try:
        step = step_fields({"step": dotted(value, step_key)})["step"]
    except BadRecord as bad:
        for outcome in outcomes:
            if outcome.turn is not None:
                outcome.turn, outcome.reason = None, bad.reason
                outcome.detail = f"--step-key {step_key}: {bad.detail}"
            yield outcome
        return
    for outcome in outcomes:
        if outcome.turn is not None and step is not None:
            outcome.turn.step = step
        yield outcome


def _census(outcomes: Iterator[Outcome], report: ImportReport, ordered: bool = False) -> dict[str, _SessionCount]:
    """Pass 1: per-session counts (and, when `ordered`, each record's start), and the report's totals."""
    sessions: dict[str, _SessionCount] = {}
    reasons: Counter = Counter()
    for outcome in outcomes:
        report.records += 1
        if outcome.malformed:
            reasons[outcome.reason] += 1
        if outcome.session_id is None:
            continue
        count = sessions.setdefault(outcome.session_id, _SessionCount(starts=[] if ordered else None))
        count.records += 1
        if count.starts is not None:  # a record without a start goes after those with one
            count.starts.append(math.inf if outcome.order is None else outcome.order)
        count.rejected += outcome.rejected is not None
        if outcome.malformed:
            count.malformed += 1
            count.first_problem = count.first_problem or f"{outcome.where}: {outcome.reason}"
    for count in sessions.values():
        count.rank_by_start()
    sound = [count for count in sessions.values() if count.sound]
    bad = [count for count in sessions.values() if not count.sound]
    reasons["session_quarantined"] = sum(count.records - count.malformed for count in bad)
    report.by_reason = {reason: reasons[reason] for reason in IMPORT_REASONS if reasons[reason]}
    report.sessions, report.quarantined_sessions = len(sound), len(bad)
    report.rejected_requests = sum(count.rejected for count in sound)
    report.turns = sum(count.records - count.rejected for count in sound)
    report.quarantined_records = sum(report.by_reason.values())
    return sessions


def _census_meta(report: ImportReport, files: list[Path]) -> dict[str, Any]:
    """What `trace_tools.import` records: the format, the sources and every count."""
    shown = [str(f) for f in files[:MAX_LISTED_FILES]]
    return {
        "format": report.format,
        "files": len(files),
        "sources": shown,
        "records": report.records,
        "turns": report.turns,
        "sessions": report.sessions,
        "rejected_requests": report.rejected_requests,
        "quarantined_records": report.quarantined_records,
        "quarantined_sessions": report.quarantined_sessions,
        "quarantined_by_reason": report.by_reason,
        "vocab_checked": report.vocab_size is not None,
        "quarantine_file": Path(report.quarantine_file).name if report.quarantine_file else None,
    }


def _write(
    outcomes: Iterator[Outcome],
    sessions: dict[str, _SessionCount],
    out: Path,
    meta: DumpMeta,
    report: ImportReport,
    row_group_rows: int,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Pass 2: rows of sound sessions into the dump, everything else into the import quarantine."""
    done = 0
    listing = atomic_open(report.quarantine_file, "w") if report.quarantine_file else contextlib.nullcontext(None)
    with dump_writer(out, meta, row_group_rows=row_group_rows) as dump, listing as quarantine:
        for outcome in outcomes:
            count = None if outcome.session_id is None else sessions.get(outcome.session_id)
            position = None
            if count is not None:
                position, count.seen = count.position(count.seen), count.seen + 1
            if outcome.turn is not None and count is not None and position is not None and count.sound:
                outcome.turn.turn_index = position
                dump.write(outcome.turn)
            elif quarantine is None:  # pass 1 counted no such record
                raise UnusableInput("the sources changed while importing; import again from a stable copy")
            else:
                quarantine.write(json.dumps(_entry(outcome, position, count), ensure_ascii=False) + "\n")
            done += 1
            if progress and (done % PROGRESS_EVERY == 0 or done == report.records):
                progress(done, report.records)
        if dump.rows != report.turns:  # both passes convert the same bytes the same way; abort the write
            raise UnusableInput(
                f"the sources changed while importing ({dump.rows} turns written, "
                f"{report.turns} counted); import again from a stable copy"
            )


def _entry(outcome: Outcome, position: int | None, count: _SessionCount | None) -> dict[str, Any]:
    if outcome.malformed:
        reason, detail = outcome.reason, outcome.detail
    elif count is not None and not count.sound:
        reason, detail = "session_quarantined", f"its session holds a malformed record ({count.first_problem})"
    else:
        reason, detail = REJECTED, outcome.rejected or ""
    return {
        "source": outcome.where,
        "session_id": outcome.session_id,
        "turn_index": position,
        "reason": reason,
        "detail": detail,
    }
