"""Per-session data for the report: a small index the page reads at load, and compressed details.

The index (one entry per session, one per drifted turn) is plain JSON. Each session's details
(turn timeline per strategy, sample bars, drift windows) are grouped into chunks of roughly
CHUNK_BYTES of JSON, gzip-compressed and base64-encoded; the page decompresses a chunk only when
one of its sessions is opened, so the load time does not grow with the number of sessions.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.io.sample_parts import samples_files
from trace_tools.report.escape import visible_bidi
from trace_tools.report.sample_bars import MAX_SESSIONS, SAMPLE_COLUMNS, GatheredBars, add_bars, sorted_bars
from trace_tools.strategies.declarations import label

CHUNK_BYTES = 256 * 1024
TURN_COLUMNS = [
    "strategy",
    "session_id",
    "turn_index",
    "tool",
    "generated_tokens",
    "trained_tokens",
    "event",
    "prompt_event",
]
OPTIONAL_TURN_COLUMNS = ["drift_cause", "behaviour", "genuine"]
BATCH_ROWS = 65_536
SAMPLE_BATCH_ROWS = 64  # samples hold every token: a few at a time
DRIFT_BATCH_ROWS = 1024  # drift findings hold the ids and tokens of an echoed window


@dataclass
class SessionData:
    index: dict[str, Any]
    chunks: list[str] = field(default_factory=list)
    shown: int = 0  # sessions the page details
    total: int = 0  # sessions the run replayed


def build_sessions(
    run_dir: Path,
    strategies: list[str],
    quarantine: pd.DataFrame | None,
    limit: int = MAX_SESSIONS,
    gathered: GatheredBars | None = None,
) -> SessionData:
    """The session index and the compressed per-session chunks of one run directory, for at most
    `limit` sessions (`pick_sessions`): only their rows are read into memory, whatever the run's size.
    `gathered`: the bars of every sample the run wrote, gathered as it wrote them (the samples
    are read back otherwise)."""
    columns = ["strategy", "session_id", "samples", "generated_tokens", "trained_tokens"]
    sessions = _read_columns(run_dir / "sessions.parquet", columns)
    shown, total = pick_sessions(sessions, limit)
    wanted = set(shown)
    samples = {
        (sid, name): n
        for sid, name, n in zip(sessions["session_id"], sessions["strategy"], sessions["samples"])
        if sid in wanted
    }
    del sessions
    turns = TurnTable(run_dir / "turns.parquet", wanted)
    paths = [Path(path) for path in samples_files(run_dir)]
    bars = gathered.bars(wanted) if gathered is not None and paths else None
    if bars is None:
        bars = sample_bars(paths, wanted)
    drift = read_drift(run_dir / "drift.parquet", wanted)
    reasons = _quarantine_reasons(quarantine)
    codes: dict[str, list[str]] = {"causes": [], "behaviours": []}
    entries: list[list[Any]] = []
    drifted: list[list[Any]] = []
    chunks: list[str] = []
    pending: list[str] = []
    pending_bytes = 0
    for position, sid in enumerate(shown):
        detail = session_detail(sid, turns, strategies, bars, drift.get(sid, []) if drift is not None else None)
        pending.append(_json(sid) + ":" + _json(detail))
        pending_bytes += len(pending[-1])
        entries.append(
            _index_entry(
                detail, [samples.get((sid, name)) for name in strategies], len(chunks), reasons.get(sid), codes
            )
        )
        drifted += [
            [position, d["turn"], d["echo"], _code(d["cause"], codes["causes"]), d["divergence"], d["served_len"]]
            for d in detail["drift"] or []
            if d["cause"]
        ]
        if pending_bytes >= CHUNK_BYTES:
            chunks.append(_pack(pending))
            pending, pending_bytes = [], 0
    if pending:
        chunks.append(_pack(pending))
    index = {
        "strategies": strategies,
        "labels": [label(name) for name in strategies],  # the short column headers (twelve must fit 1,400 px)
        **codes,
        "sessions": entries,
        "drifted": drifted,
        "has_drift_table": drift is not None,
    }
    return SessionData(index, chunks, len(shown), total)


def pick_sessions(sessions: dict[str, list[Any]], limit: int) -> tuple[list[str], int]:
    """The sessions the page details, and how many the run has: every one in stream order when
    there are at most `limit`, else the `limit` that lose the most generated tokens (summed over
    the strategies), worst first, ties in stream order."""
    lost: dict[str, int] = {}
    for sid, generated, trained in zip(
        sessions["session_id"], sessions["generated_tokens"], sessions["trained_tokens"]
    ):
        lost[sid] = lost.get(sid, 0) + int(generated or 0) - int(trained or 0)
    if len(lost) <= limit:
        return list(lost), len(lost)
    return sorted(lost, key=lambda sid: -lost[sid])[:limit], len(lost)


def _batches(path: Path, columns: list[str] | None, wanted: set[str], rows: int = BATCH_ROWS) -> Iterator[Any]:
    """The record batches of a run table (`rows` rows read at a time) holding rows of the `wanted`
    sessions, only those rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if "session_id" not in parquet.schema_arrow.names:  # a table written empty
        return
    keep = pa.array(sorted(wanted), pa.string())
    for batch in parquet.iter_batches(batch_size=rows, columns=columns):
        mask = pc.is_in(batch.column("session_id"), value_set=keep)
        kept = mask.true_count
        if kept:  # filtering copies the token lists: skipped when every row is wanted (the usual case)
            yield batch if kept == batch.num_rows else batch.filter(mask)


class TurnTable:
    """turns.parquet as plain column lists, with row numbers grouped by session and strategy.

    Plain lists rather than per-session DataFrame filtering: a 10,000-session run has close to
    a million turn rows, and pandas' per-group overhead would dominate the report's build time.
    """

    def __init__(self, path: Path, wanted: set[str]):
        import pyarrow.parquet as pq

        available = set(pq.read_schema(path).names)
        columns = TURN_COLUMNS + [c for c in OPTIONAL_TURN_COLUMNS if c in available]
        self.cols: dict[str, list[Any]] = {c: [] for c in columns}
        if set(TURN_COLUMNS) <= available:  # a table written empty (every session quarantined) has none
            for batch in _batches(path, columns, wanted):
                for name, values in batch.to_pydict().items():
                    self.cols[name] += values
        rows = len(self.cols["session_id"])
        for column in OPTIONAL_TURN_COLUMNS:
            self.cols.setdefault(column, [None] * rows)
        self.rows: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for i, (sid, name) in enumerate(zip(self.cols["session_id"], self.cols["strategy"])):
            self.rows[sid][name].append(i)
        turn_index = self.cols["turn_index"]
        for by_strategy in self.rows.values():
            for numbers in by_strategy.values():
                numbers.sort(key=turn_index.__getitem__)


def session_detail(
    sid: str, turns: TurnTable, strategies: list[str], bars: dict | None, drift: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """Everything the session page shows: turns, each strategy's timeline and sample bars, drift."""
    c = turns.cols
    by_strategy = turns.rows.get(sid, {})
    first = next(iter(by_strategy.values()), [])
    detail: dict[str, Any] = {
        "id": sid,
        "behaviour": c["behaviour"][first[0]] if first else None,
        "turns": [
            {
                "i": c["turn_index"][r],
                "tool": c["tool"][r],
                "gen": c["generated_tokens"][r],
                "cause": c["drift_cause"][r],
                "genuine": c["genuine"][r],
            }
            for r in first
        ],
        "strategies": {},
        "drift": drift,
    }
    for name in strategies:
        rows = by_strategy.get(name)
        if not rows:
            continue
        sample_list = bars.get((name, sid), []) if bars is not None else None
        seen = {seg[0] for sample in sample_list or [] for seg in sample["segs"]}
        detail["strategies"][name] = {
            "turns": [
                [
                    c["trained_tokens"][r],
                    c["event"][r],
                    c["prompt_event"][r],
                    _fate(c["event"][r], c["generated_tokens"][r], c["turn_index"][r], seen, sample_list is not None),
                ]
                for r in rows
            ],
            "samples": sample_list,
        }
    return detail


def sample_bars(paths: list[Path], wanted: set[str]) -> dict[tuple[str, str], list[dict[str, Any]]] | None:
    """Per (strategy, session): each sample (by `sample_index`) as run-length segments `[turn, trained, tokens]`.

    `turn` is the producing turn (-1 for context); `trained` is 1 where the token carries loss.
    Read in batches without the token ids and logprobs, and only the `wanted` sessions' samples, so
    large sample files stay cheap; None when the run wrote no samples (`paths` empty).
    """
    if not paths:
        return None
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for batch in (batch for path in paths for batch in _batches(path, SAMPLE_COLUMNS, wanted, SAMPLE_BATCH_ROWS)):
        add_bars(out, batch)
    return sorted_bars(out)


def read_drift(path: Path, wanted: set[str]) -> dict[str, list[dict[str, Any]]] | None:
    """The `wanted` sessions' rows of drift.parquet grouped by session, each echoed turn ready for
    the page (None when absent)."""
    if not path.exists():
        return None
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for batch in _batches(path, None, wanted, DRIFT_BATCH_ROWS):
        for rec in batch.to_pylist():
            out[rec["session_id"]].append(_drift_entry(rec))
    return dict(out)


def _drift_entry(rec: dict[str, Any]) -> dict[str, Any]:
    served, rendered = rec["served_ids"], rec["rendered_ids"]
    served_to_end = rec["window_start"] + len(rec["shared_ids"]) + len(served) >= rec["served_len"]
    return {
        "turn": rec["turn_index"],
        "echo": rec["echo_turn"],
        "cause": rec["cause"],
        "causes": rec["causes"],
        "token_drift": rec["token_drift"],
        "divergence": rec["divergence"],
        "served_len": rec["served_len"],
        "prompt_len": rec["prompt_len"],
        "diff": rec["message_diff"],
        "start": rec["window_start"],
        "shared": [[i, t] for i, t in zip(rec["shared_ids"], rec["shared_tokens"])],
        "served": [[i, t] for i, t in zip(served, rec["served_tokens"])],
        "rendered": [[i, t] for i, t in zip(rendered, rec["rendered_tokens"])],
        "blocks": align_blocks(served, rendered, served_to_end) if rec["token_drift"] else [],
    }


def align_blocks(served: list[int], rendered: list[int], served_to_end: bool) -> list[list[Any]]:
    """The two sides after the divergence as aligned blocks `[tag, s0, s1, r0, r1]`.

    Tags are difflib's (`equal`, `replace`, `insert`, `delete`), plus `next` for the echo's tokens
    past the end of what was served (the following turn: context, not drift).
    """
    blocks: list[list[Any]] = [list(op) for op in SequenceMatcher(None, served, rendered, autojunk=False).get_opcodes()]
    if served_to_end and len(blocks) > 1 and blocks[-1][0] == "insert":
        blocks[-1][0] = "next"
    return blocks


def _fate(event: str, generated: int, turn: int, seen: set[int], know_samples: bool) -> str:
    """trained / partly / context (its tokens only travel as context) / dropped / empty / untrained."""
    if event == "trained":
        return "trained"
    if event == "partly_trained":
        return "partly"
    if generated == 0:
        return "empty"
    if not know_samples:
        return "untrained"
    return "context" if turn in seen else "dropped"


def _index_entry(
    detail: dict[str, Any], samples: list[int | None], chunk: int, quarantined: str | None, codes: dict[str, list[str]]
) -> list[Any]:
    """[id, behaviour code, turns, cause codes, samples per strategy, chunk, quarantine reason]."""
    causes = sorted({_code(t["cause"], codes["causes"]) for t in detail["turns"] if t["cause"]})
    return [
        detail["id"],
        _code(detail["behaviour"] or "", codes["behaviours"]),
        len(detail["turns"]),
        causes,
        samples,
        chunk,
        quarantined,
    ]


def _code(value: str, table: list[str]) -> int:
    """Index of `value` in `table`, appended when new (keeps repeated strings out of the index)."""
    if value not in table:
        table.append(value)
    return table.index(value)


def _json(value: Any) -> str:
    """Compact JSON, bidi formatting characters shown as their escapes (`report.escape`)."""
    return visible_bidi(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _pack(members: list[str]) -> str:
    """One chunk: the JSON object `{session_id: detail, ...}`, gzip-compressed, base64-encoded."""
    raw = ("{" + ",".join(members) + "}").encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def _read_columns(path: Path, columns: list[str]) -> dict[str, list[Any]]:
    """The columns as lists; a table written empty (every session quarantined) has none of them."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    if not set(columns) <= present:
        return {c: [] for c in columns}
    return pq.read_table(path, columns=columns).to_pydict()


def _quarantine_reasons(quarantine: pd.DataFrame) -> dict[str, str]:
    if quarantine is None or not len(quarantine):
        return {}
    first = quarantine.dropna(subset=["session_id"]).drop_duplicates("session_id")
    return dict(zip(first["session_id"], first["reason"]))


def iter_chunk_sessions(chunk: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Decode one chunk the way the page does (used by tests and by readers of report.html)."""
    yield from json.loads(gzip.decompress(base64.b64decode(chunk))).items()
