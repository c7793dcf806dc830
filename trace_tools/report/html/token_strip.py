"""report.html's token strips: for each strategy scored by `rescore RUN --samples`, its worst turn.

The turn shown is the (sample, turn) whose trained tokens have the largest |Δ| (Δ = rollout −
trainer logprob; ties by k3), read from `mismatch_turns.parquet`; its tokens come from
`mismatch_tokens.parquet` (Δ, context provenance, each correction mode's outcome) and the sample
itself (its samples: the untrained tokens between and around them, shown dimmed). A strip
is the turn's run of tokens plus `CONTEXT_BEFORE` tokens of the context before it, at most
`MAX_TOKENS` (centred on the worst token when the turn is longer), so the page stays small
whatever the run. Token text comes from the run's tokenizer; ids are shown when it cannot be loaded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trace_tools.io.rundir import load_run_info, read_table
from trace_tools.io.sample_parts import read_samples

MAX_TOKENS = 320
CONTEXT_BEFORE = 24
TURN_KEYS = ["strategy", "session_id", "sample_index", "turn_index"]
SAMPLE_COLUMNS = ["strategy", "session_id", "sample_index", "token_ids", "response_length", "loss_mask"]
TOKEN_COLUMNS = [
    *TURN_KEYS,
    *("position", "delta", "rollout_logprob", "trainer_logprob", "compared", "context_origin", "prompt_event"),
]
# |Δ| (nats) at which the colour saturates, and below which a token reads as uncoloured (float noise)
FULL_COLOUR = 1.0
NOISE_FLOOR = 1e-4
KEPT, CLIPPED, MASKED = 0, 1, 2  # rescore's per-token outcome codes (`rescore.corrections`)
# Modes that decide per sample (`rescore.corrections`): they mask every token or none, so the strip
# says so once instead of marking each token.
SEQUENCE_MODES = ("seq_tis", "seq_mis", "k3_rs")


def token_strips(run_dir: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One strip per strategy with a mismatch block in `summary`, worst turn first; [] without."""
    scored = [name for name, entry in summary.get("strategies", {}).items() if entry.get("mismatch")]
    if not scored:
        return []
    turns = read_table(run_dir, "mismatch_turns")
    modes_of = {name: list(summary["strategies"][name]["mismatch"].get("corrections", {})) for name in scored}
    tokens = read_table(run_dir, "mismatch_tokens", TOKEN_COLUMNS + sorted({m for ms in modes_of.values() for m in ms}))
    if turns.empty or tokens.empty:
        return []
    worst = _worst_turns(turns[turns["strategy"].isin(scored)])
    samples = _samples_of(run_dir, worst)
    decode = _decoder(run_dir)
    strips = []
    for turn in worst.itertuples(index=False):
        key = tuple(getattr(turn, k) for k in TURN_KEYS)
        sample = samples.get(key[:3])
        if sample is not None:
            strips.append(_strip(turn, _turn_tokens(tokens, key), sample, modes_of[turn.strategy], decode))
    return strips


def _worst_turns(turns: pd.DataFrame) -> pd.DataFrame:
    ranked = turns.sort_values(["max_abs_diff", "k3_kl"], ascending=False, na_position="last")
    return ranked.drop_duplicates("strategy").sort_values("max_abs_diff", ascending=False)


def _turn_tokens(tokens: pd.DataFrame, key: tuple) -> pd.DataFrame:
    mine = np.ones(len(tokens), dtype=bool)
    for column, value in zip(TURN_KEYS, key):
        mine &= (tokens[column] == value).to_numpy()
    return tokens[mine].set_index("position")


def _samples_of(run_dir: Path, worst: pd.DataFrame) -> dict[tuple, Any]:
    table = read_samples(run_dir, SAMPLE_COLUMNS)
    samples = pd.DataFrame() if table is None else table.to_pandas()
    wanted = set(zip(worst["strategy"], worst["session_id"], worst["sample_index"]))
    return {
        key: row
        for row in samples.itertuples(index=False)
        if (key := (row.strategy, row.session_id, int(row.sample_index))) in wanted
    }


def _window(first: int, last: int, worst: int, length: int) -> tuple[int, int]:
    """[begin, end) of the positions shown: the turn's trained span and some context before it."""
    begin, end = max(0, first - CONTEXT_BEFORE), min(length, last + 1)
    if end - begin > MAX_TOKENS:
        begin = max(0, min(worst - MAX_TOKENS // 2, length - MAX_TOKENS))
        end = min(length, begin + MAX_TOKENS)
    return begin, end


def _strip(turn: Any, tokens: pd.DataFrame, sample: Any, modes: list[str], decode: Any) -> dict[str, Any]:
    ids = np.asarray(sample.token_ids, dtype=np.int64)
    start = len(ids) - int(sample.response_length)
    mask = np.asarray(sample.loss_mask, dtype=np.int8)
    compared = tokens[tokens["compared"]]
    worst = int(compared["delta"].abs().idxmax()) if len(compared) else int(tokens.index.min())
    begin, end = _window(int(tokens.index.min()), int(tokens.index.max()), worst, len(ids))
    cells = []
    for position in range(begin, end):
        trained = position >= start and mask[position - start] == 1
        row = tokens.loc[position] if trained and position in tokens.index else None
        cells.append(_cell(int(ids[position]), decode, row, modes))
    first = tokens.iloc[0]
    return {
        "strategy": turn.strategy,
        "session_id": turn.session_id,
        "sample_index": int(turn.sample_index),
        "turn_index": int(turn.turn_index),
        "tool": turn.tool,
        "cause": turn.cause,
        "context_origin": turn.context_origin,
        "prompt_event": first.get("prompt_event"),
        "tokens": int(turn.tokens),
        "max_abs_diff": turn.max_abs_diff,
        "k3_kl": turn.k3_kl,
        "shown": (begin, end),
        "length": len(ids),
        "cells": cells,
        "modes": [_mode_count(tokens, mode) for mode in modes if mode in tokens],
        "whole_sample": [m for m in SEQUENCE_MODES if m in compared and (compared[m] == MASKED).any()],
    }


def _cell(token_id: int, decode: Any, row: Any, modes: list[str]) -> dict[str, Any]:
    text = decode(token_id)
    cell: dict[str, Any] = {"text": _shown(text), "newline": text.endswith("\n"), "trained": row is not None}
    if row is None:
        cell["title"] = f"id {token_id} · not trained (loss mask 0)"
        return cell
    delta = row["delta"]
    masked = [m for m in modes if m in row and _code(row[m]) == MASKED]
    clipped = [m for m in modes if m in row and _code(row[m]) == CLIPPED]
    cell.update(
        delta=None if pd.isna(delta) else float(delta),
        strength=_strength(delta),
        sign="up" if not pd.isna(delta) and delta > 0 else "down",
        served=row["context_origin"] == "served",
        masked=any(m not in SEQUENCE_MODES for m in masked),
        title=_title(token_id, row, masked, clipped),
    )
    return cell


def _title(token_id: int, row: Any, masked: list[str], clipped: list[str]) -> str:
    parts = [f"id {token_id}"]
    if pd.isna(row["delta"]):
        parts.append("not compared (a logprob is missing)")
    else:
        parts.append(
            f"Δ {row['delta']:+.3g} (rollout {row['rollout_logprob']:.3f}, trainer {row['trainer_logprob']:.3f})"
        )
    parts.append(f"context {row['context_origin']}")
    parts.append("masked by " + ", ".join(masked) if masked else "masked by no mode")
    if clipped:
        parts.append("clipped by " + ", ".join(clipped))
    return " · ".join(parts)


def _code(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def _strength(delta: Any) -> float:
    """0 at the noise floor, 1 at FULL_COLOUR nats, on a log scale between."""
    if pd.isna(delta) or abs(delta) <= NOISE_FLOOR:
        return 0.0
    span = math.log10(FULL_COLOUR / NOISE_FLOOR)
    return round(min(1.0, math.log10(abs(delta) / NOISE_FLOOR) / span), 3)


def _mode_count(tokens: pd.DataFrame, mode: str) -> dict[str, Any]:
    codes = tokens[mode]
    return {"mode": mode, "masked": int((codes == MASKED).sum()), "clipped": int((codes == CLIPPED).sum())}


def _shown(text: str) -> str:
    """Whitespace a reader can see: a newline as ↵ (the strip breaks the line after it), a tab as →."""
    return text.replace("\n", "↵").replace("\t", "→") or "∅"


def _decoder(run_dir: Path) -> Any:
    """token id → text with the run's tokenizer, else `#id`."""
    name = _tokenizer_name(run_dir)
    try:
        from trace_tools.render.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(name) if name else None
    except Exception:  # a tokenizer that cannot be loaded here only costs the text: ids are shown
        tokenizer = None
    if tokenizer is None:
        return lambda token_id: f"#{token_id}"
    return lambda token_id: tokenizer.decode([token_id])


def _tokenizer_name(run_dir: Path) -> str | None:
    info = load_run_info(run_dir)
    renderers = info.get("renderers") or [{}]
    dump_meta = (info.get("inputs") or {}).get("dump_meta") or {}
    return (info.get("options") or {}).get("tokenizer") or renderers[0].get("tokenizer") or dump_meta.get("tokenizer")
