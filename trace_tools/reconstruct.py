"""Reconstruct every turn's prompt stream and measure fidelity against the recorded prompt ids.

For each turn: canonicalize the harness's messages (the gateway's translate step), render them
with the tools, the generation prompt and the turn's own `chat_template_kwargs`, and compare
with `prompt_ids` when the gateway recorded them. A dump whose prompts were rendered with the
same template and tokenizer reconstructs at 100 %; anything less locates the first diverging
token and shows the text around it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from trace_tools.data import DumpMeta, Session, Turn
from trace_tools.errors import TraceToolsError
from trace_tools.render.canonical import canonicalize_messages

CONTEXT_TOKENS = 12  # tokens shown on each side of a divergence
TURN_COLUMNS = ["session_id", "turn_index", "rendered_len", "recorded_len", "exact", "first_divergence",
                "context", "error"]
# Nullable dtypes: "not recorded" stays <NA> instead of turning lengths into floats.
TURN_DTYPES = {"turn_index": "Int64", "rendered_len": "Int64", "recorded_len": "Int64", "exact": "boolean",
               "first_divergence": "Int64"}


@dataclass
class ReconstructResult:
    """`turns`: one row per turn; `sessions`: per-session exact rate; `summary`: run-level fidelity."""

    turns: pd.DataFrame
    sessions: pd.DataFrame
    summary: dict[str, Any]
    renderer_identity: dict[str, Any] = field(default_factory=dict)

    def save(self, directory: str | os.PathLike) -> list[Path]:
        """Write `turns.parquet` and `summary.json` (atomically) into `directory`."""
        from trace_tools.io.write import write_json_atomic, write_parquet_atomic

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(self.turns, out / "turns.parquet")
        write_json_atomic({**self.summary, "renderer": self.renderer_identity}, out / "summary.json")
        return [out / "turns.parquet", out / "summary.json"]


def reconstruct(dump: Any, *, tokenizer: str | None = None, chat_template: str | None = None,
                canonicalization: str = "slime", renderer: Any = None,
                tool_format: str | None = None) -> ReconstructResult:
    """Re-render every turn of a dump and compare with its recorded prompt ids.

    `dump` is a path (read with `trace_tools.io.load.load`), an already loaded dump (anything with
    `.sessions` and `.meta`), or a list of `Session`s. `tokenizer` / `chat_template` override the
    dump's metadata, `tool_format` the detected tool-call format; `renderer` (any RendererLike)
    skips resolution altogether.
    """
    sessions, meta, quarantined = _sessions_and_meta(dump, tokenizer, chat_template)
    if renderer is None:
        from trace_tools.render.renderer import Renderer

        renderer = Renderer.from_spec(tokenizer, chat_template, dump_meta=meta, tool_format=tool_format)
    rows = [turn_fidelity(renderer, turn, canonicalization) for session in sessions for turn in session.turns]
    turns = pd.DataFrame(rows, columns=TURN_COLUMNS).astype(TURN_DTYPES)
    identity = dict(getattr(renderer, "identity", {}) or {})
    summary = {**summarize(turns), "quarantined_sessions": quarantined}
    return ReconstructResult(turns, session_table(turns), summary, identity)


def _sessions_and_meta(dump: Any, tokenizer: str | None,
                       chat_template: str | None) -> tuple[list[Session], DumpMeta, int]:
    """(valid sessions, metadata, number of quarantined sessions) from any accepted input."""
    if isinstance(dump, (str, os.PathLike)):
        from trace_tools.io.load import load

        dump = load(dump, tokenizer=tokenizer, chat_template=chat_template)
    if hasattr(dump, "sessions"):
        quarantined = {entry.session_id for entry in getattr(dump, "quarantine", None) or ()}
        return list(dump.sessions), getattr(dump, "meta", None) or DumpMeta(), len(quarantined)
    if isinstance(dump, Iterable):
        sessions = [s for s in dump if isinstance(s, Session)]
        meta = sessions[0].meta if sessions else DumpMeta()
        return sessions, meta, 0
    raise TraceToolsError(f"cannot reconstruct {type(dump).__name__}; pass a dump path, a loaded dump or sessions")


def turn_fidelity(renderer: Any, turn: Turn, canonicalization: str = "slime") -> dict[str, Any]:
    """One row of the turns table (see TURN_COLUMNS)."""
    recorded = list(turn.prompt_ids) if turn.prompt_ids is not None else None
    row: dict[str, Any] = {"session_id": turn.session_id, "turn_index": turn.turn_index, "rendered_len": None,
                           "recorded_len": len(recorded) if recorded is not None else None, "exact": None,
                           "first_divergence": None, "context": None, "error": None}
    try:
        rendered = render_turn(renderer, turn, canonicalization)
    except TraceToolsError as exc:
        row["error"] = str(exc)
        if recorded is not None:
            row["exact"] = False
        return row
    row["rendered_len"] = len(rendered)
    if recorded is None:
        return row
    divergence = first_divergence(recorded, rendered)
    row["exact"] = divergence is None
    if divergence is not None:
        row["first_divergence"] = divergence
        row["context"] = divergence_context(renderer, recorded, rendered, divergence)
    return row


def render_turn(renderer: Any, turn: Turn, canonicalization: str = "slime") -> list[int]:
    """The prompt ids a gateway with this renderer would have fed for `turn`."""
    messages = canonicalize_messages(turn.messages, canonicalization)
    return renderer.render(messages, turn.tools or None, True, **(turn.chat_template_kwargs or {}))


def first_divergence(recorded: Sequence[int], rendered: Sequence[int]) -> int | None:
    """Index of the first differing token; the shorter length when one is a prefix of the other."""
    for index, (a, b) in enumerate(zip(recorded, rendered)):
        if a != b:
            return index
    return None if len(recorded) == len(rendered) else min(len(recorded), len(rendered))


def divergence_context(renderer: Any, recorded: Sequence[int], rendered: Sequence[int], at: int,
                       width: int = CONTEXT_TOKENS) -> str:
    """`…shared text⟨recorded: '…' | rendered: '…'⟩` around token `at`."""
    shared = renderer.decode(list(recorded[max(0, at - width):at]))
    theirs = renderer.decode(list(recorded[at:at + width]))
    ours = renderer.decode(list(rendered[at:at + width]))
    return f"…{shared}⟨recorded: {theirs!r} | rendered: {ours!r}⟩"


def session_table(turns: pd.DataFrame) -> pd.DataFrame:
    """Per session: turns, turns compared (prompt ids recorded), exact turns and their rate."""
    columns = ["session_id", "turns", "turns_compared", "exact", "rate"]
    if turns.empty:
        return pd.DataFrame(columns=columns)
    grouped = turns.assign(compared=turns["exact"].notna(), hit=turns["exact"].fillna(False).astype(bool))
    table = grouped.groupby("session_id", sort=False).agg(
        turns=("turn_index", "size"), turns_compared=("compared", "sum"), exact=("hit", "sum")).reset_index()
    table["rate"] = [float(e / c) if c else None for e, c in zip(table["exact"], table["turns_compared"])]
    return table[columns]


def summarize(turns: pd.DataFrame) -> dict[str, Any]:
    """`{"turns_compared", "exact", "rate"}` (DESIGN §6 prompt_fidelity) plus totals and render errors."""
    compared = int(turns["exact"].notna().sum()) if not turns.empty else 0
    exact = int(turns["exact"].fillna(False).astype(bool).sum()) if not turns.empty else 0
    return {"turns_compared": compared, "exact": exact, "rate": exact / compared if compared else None,
            "turns": int(len(turns)), "sessions": int(turns["session_id"].nunique()) if not turns.empty else 0,
            "render_errors": int(turns["error"].notna().sum()) if not turns.empty else 0}
