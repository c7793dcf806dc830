"""`rescore`: teacher-forced logprobs of every recorded output on a model, compared with the recorded ones.

Per turn the prompt is the recorded `prompt_ids` when the gateway kept them, else the prompt
re-rendered from the turn's canonical messages with the session's own renderer (the session
pipeline's components, as `trace-tools reconstruct` and `replay` use them).
Sequences are planned with prefix sharing (`plan.py`), scored in length-bucketed batches with a
chunked output head (`scoring.py`) and compared token by token (`metrics.py`). Turns that cannot
be compared are kept in the tables with a reason and counted, never dropped.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from trace_tools.data import DumpMeta, QuarantineEntry, Session, Turn
from trace_tools.errors import TraceToolsError
from trace_tools.rescore import metrics, plan, require_torch
from trace_tools.rescore.fill import logprobs_source
from trace_tools.rescore.metrics import DEFAULT_MAX_THRESHOLD, DEFAULT_THRESHOLD
from trace_tools.rescore.output import RescoreResult
from trace_tools.rescore.prompts import PromptSource

DEFAULT_TOP_K = 20
CONTEXT_BEFORE, CONTEXT_AFTER = 24, 6  # tokens of decoded context around a flagged turn's worst token
TOKEN_COLUMNS = ["session_id", "turn_index", "position", "token_id", "recorded", "recomputed", "delta"]
TURN_COLUMNS = [
    "session_id",
    "turn_index",
    "comparable",
    "reason",
    "detail",
    "prompt_origin",
    "prompt_tokens",
    "output_tokens",
    *metrics.STAT_KEYS,
    "worst_position",
    "worst_token_id",
    "worst_recorded",
    "worst_recomputed",
    "flagged",
    "context",
]
SESSION_COLUMNS = [
    "session_id",
    "turns",
    "comparable_turns",
    "not_comparable_turns",
    "flagged_turns",
    *metrics.STAT_KEYS,
]


def rescore(
    dump: Any,
    model: Any = "tiny-qwen3",
    *,
    device: str = "auto",
    dtype: str = "auto",
    max_batch_tokens: int | None = None,
    chunk_positions: int | None = None,
    out: str | os.PathLike | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    max_threshold: float = DEFAULT_MAX_THRESHOLD,
    tokenizer: str | None = None,
    chat_template: str | None = None,
    top_k: int = DEFAULT_TOP_K,
    share_prefix: bool = True,
    write_tokens: bool = True,
    canonicalization: str = "slime",
    on_progress: Callable[[int, int], None] | None = None,
) -> RescoreResult:
    """Rescore a dump on a model and compare with the recorded sampling logprobs.

    `dump`: a path (read with `trace_tools.io.load.load`), a loaded dump (`.sessions`, `.meta`,
    `.quarantine`) or a list of `Session`s. `model`: a spec for `load_model` (`tiny-qwen3`,
    `smollm2`, a local directory) or an already loaded `ScoringModel`. `tokenizer` /
    `chat_template` override the dump's metadata for prompts that must be re-rendered and for
    decoding flagged contexts (default tokenizer: the model's). `on_progress(done, total)` counts
    scored tokens. With `out`, the run directory is written there.
    """
    require_torch()
    from trace_tools.rescore.models import ScoringModel, load_model
    from trace_tools.rescore.scoring import DEFAULT_CHUNK_POSITIONS, DEFAULT_MAX_BATCH_TOKENS, check_head, score_turns

    options: dict[str, Any] = {
        "threshold": threshold,
        "max_threshold": max_threshold,
        "share_prefix": share_prefix,
        "max_batch_tokens": max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS,
        "chunk_positions": chunk_positions or DEFAULT_CHUNK_POSITIONS,
    }
    sessions, meta, quarantine = load_sessions(dump, tokenizer, chat_template)
    scoring_model = model if isinstance(model, ScoringModel) else load_model(model, device, dtype)
    check_head(scoring_model)
    prompts = PromptSource(tokenizer, chat_template, scoring_model.tokenizer, canonicalization)
    inputs = [rescore_input(turn, s, prompts, scoring_model.vocab_size) for s in sessions for turn in s.turns]
    scored = score_turns(
        scoring_model,
        inputs,
        share_prefix=share_prefix,
        max_batch_tokens=options["max_batch_tokens"],
        chunk_positions=options["chunk_positions"],
        on_progress=on_progress,
    )
    tables = _Tables.build(inputs, scored.recomputed, threshold, max_threshold, prompts.decoder())
    summary = _summary(
        tables,
        scoring_model.identity(),
        quarantine,
        len(sessions),
        top_k,
        {**options, "prompt_renderer": prompts.identity()},
        scored.throughput(inputs),
    )
    summary["logprobs_source"] = logprobs_source(meta)
    result = RescoreResult(tables.tokens, tables.turns, tables.sessions, summary, threshold)
    if out is not None:
        result.save(out, write_tokens)
    return result


# -- inputs -----------------------------------------------------------------------------------------
RESCORE_COLUMNS = (
    "session_id",
    "turn_index",
    "messages",
    "tools",
    "output_ids",
    "output_logprobs",
    "prompt_ids",
    "chat_template_kwargs",
)


def load_sessions(
    dump: Any, tokenizer: str | None = None, chat_template: str | None = None
) -> tuple[list[Session], DumpMeta, list[QuarantineEntry]]:
    """Sessions, metadata and quarantine from a path (read through the session pipeline's stream,
    only the columns rescoring needs; each session keeps its own file's metadata), a loaded dump or
    a list of sessions."""
    if isinstance(dump, (str, os.PathLike)):
        from trace_tools.pipeline import Pipeline

        pipeline = Pipeline(dump, tokenizer=tokenizer, chat_template=chat_template, columns=RESCORE_COLUMNS)
        items = list(pipeline)
        return (
            [i for i in items if isinstance(i, Session)],
            pipeline.stream.meta,
            [i for i in items if isinstance(i, QuarantineEntry)],
        )
    if hasattr(dump, "sessions"):
        return list(dump.sessions), getattr(dump, "meta", None) or DumpMeta(), list(getattr(dump, "quarantine", []))
    if isinstance(dump, Iterable):
        sessions = list(dump)
        if not all(isinstance(s, Session) for s in sessions):
            raise TraceToolsError("rescore takes a dump path, a loaded dump or a list of Session objects")
        return sessions, (sessions[0].meta if sessions else DumpMeta()), []
    raise TraceToolsError(f"cannot rescore a {type(dump).__name__}; pass a dump path, a loaded dump or sessions")


def rescore_input(turn: Turn, session: Session, prompts: PromptSource, vocab_size: int) -> plan.TurnInput:
    """A turn with its prompt ids and, if it cannot be compared, the reason why."""
    prompt_ids, origin, problem = prompts.prompt(turn, session)
    reason = plan.logprob_problem(turn.output_ids, turn.output_logprobs) or plan.sequence_problem(
        prompt_ids, turn.output_ids, vocab_size
    )
    return plan.TurnInput(
        turn.session_id,
        turn.turn_index,
        list(turn.output_ids),
        None if turn.output_logprobs is None else list(turn.output_logprobs),
        prompt_ids,
        origin,
        reason,
        problem if reason == plan.NO_PROMPT else None,
    )


# -- tables -----------------------------------------------------------------------------------------
@dataclass
class _Tables:
    tokens: pd.DataFrame
    turns: pd.DataFrame
    sessions: pd.DataFrame
    deltas: dict[int, np.ndarray]  # by turn-list index, comparable turns only

    @classmethod
    def build(
        cls,
        inputs: list[plan.TurnInput],
        recomputed: list[np.ndarray | None],
        threshold: float,
        max_threshold: float,
        decode: Callable[[Sequence[int]], str] | None,
    ) -> "_Tables":
        deltas = {i: _delta(t, recomputed[i]) for i, t in enumerate(inputs) if t.skip_reason is None}
        rows = [
            _turn_row(t, recomputed[i], deltas.get(i), threshold, max_threshold, decode) for i, t in enumerate(inputs)
        ]
        turns = pd.DataFrame(rows, columns=TURN_COLUMNS)
        sessions = _session_frame(inputs, turns, deltas, threshold)
        return cls(_token_frame(inputs, recomputed, deltas), turns, sessions, deltas)


def _delta(turn: plan.TurnInput, recomputed: np.ndarray | None) -> np.ndarray:
    """Recorded minus recomputed logprobs of a comparable turn (the scorer scored every one)."""
    assert recomputed is not None, "a comparable turn was not scored"
    return np.asarray(turn.recorded, dtype=np.float64) - recomputed


def _turn_row(
    turn: plan.TurnInput,
    recomputed: np.ndarray | None,
    delta: np.ndarray | None,
    threshold: float,
    max_threshold: float,
    decode: Callable[[Sequence[int]], str] | None,
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session_id": turn.session_id,
        "turn_index": turn.turn_index,
        "comparable": delta is not None,
        "reason": turn.skip_reason,
        "detail": turn.detail,
        "prompt_origin": turn.prompt_origin,
        "prompt_tokens": None if turn.prompt_ids is None else len(turn.prompt_ids),
        "output_tokens": len(turn.output_ids),
    }
    stats = metrics.token_stats(delta if delta is not None else np.empty(0), threshold)
    row.update(stats)
    worst = metrics.worst_token(delta) if delta is not None else None
    row.update(
        worst_position=worst,
        worst_token_id=None,
        worst_recorded=None,
        worst_recomputed=None,
        flagged=metrics.is_flagged(stats, threshold, max_threshold),
        context=None,
    )
    if worst is None:  # no compared token: never flagged
        return row
    assert turn.recorded is not None and recomputed is not None, "a compared turn has both logprob sets"
    row.update(
        worst_token_id=turn.output_ids[worst],
        worst_recorded=float(turn.recorded[worst]),
        worst_recomputed=float(recomputed[worst]),
    )
    if row["flagged"]:
        row["context"] = worst_context(turn, worst, decode)
    return row


def worst_context(turn: plan.TurnInput, worst: int, decode: Callable[[Sequence[int]], str] | None) -> str:
    """`…text before⟦worst token⟧text after…`, decoded when a tokenizer is known, else as ids."""
    sequence = turn.sequence
    at = len(turn.prompt_ids or []) + worst
    before = sequence[max(0, at - CONTEXT_BEFORE) : at]
    after = sequence[at + 1 : at + 1 + CONTEXT_AFTER]
    show = decode or (lambda ids: " ".join(map(str, ids)))
    return f"…{show(before)}⟦{show([sequence[at]])}⟧{show(after)}…"


def _token_frame(
    inputs: list[plan.TurnInput], recomputed: list[np.ndarray | None], deltas: dict[int, np.ndarray]
) -> pd.DataFrame:
    if not deltas:
        return pd.DataFrame({name: [] for name in TOKEN_COLUMNS})
    order = sorted(deltas)
    lengths = [len(deltas[i]) for i in order]
    return pd.DataFrame(
        {
            "session_id": np.repeat([inputs[i].session_id for i in order], lengths),
            "turn_index": np.repeat([inputs[i].turn_index for i in order], lengths).astype(np.int32),
            "position": np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]),
            "token_id": np.concatenate([np.asarray(inputs[i].output_ids, dtype=np.int32) for i in order]),
            "recorded": np.concatenate([np.asarray(inputs[i].recorded, dtype=np.float64) for i in order]),
            "recomputed": np.concatenate([recomputed[i] for i in order]),
            "delta": np.concatenate([deltas[i] for i in order]),
        }
    )


def _session_frame(
    inputs: list[plan.TurnInput], turns: pd.DataFrame, deltas: dict[int, np.ndarray], threshold: float
) -> pd.DataFrame:
    members: dict[str, list[int]] = {}
    for index, turn in enumerate(inputs):
        members.setdefault(turn.session_id, []).append(index)
    rows = []
    for session_id, indices in members.items():
        compared = [i for i in indices if i in deltas]
        rows.append(
            {
                "session_id": session_id,
                "turns": len(indices),
                "comparable_turns": len(compared),
                "not_comparable_turns": len(indices) - len(compared),
                "flagged_turns": int(turns["flagged"].iloc[indices].sum()),
                **metrics.token_stats(metrics.pooled(deltas[i] for i in compared), threshold),
            }
        )
    return pd.DataFrame(rows, columns=SESSION_COLUMNS)


# -- summary ----------------------------------------------------------------------------------------
def _summary(
    tables: _Tables,
    model: dict[str, Any],
    quarantine: list[QuarantineEntry],
    sessions: int,
    top_k: int,
    options: dict[str, Any],
    throughput: dict[str, Any],
) -> dict[str, Any]:
    turns = tables.turns
    run = metrics.token_stats(metrics.pooled(tables.deltas[i] for i in sorted(tables.deltas)), options["threshold"])
    reasons = Counter(turns["reason"].dropna())
    quarantined = {e.session_id for e in quarantine}
    return {
        "model": model,
        "options": options,
        "sessions": sessions,
        "quarantined": len(quarantined),
        "quarantined_by_reason": dict(Counter(e.reason for e in quarantine)),
        "turns": {
            "total": int(len(turns)),
            "comparable": int(turns["comparable"].sum()),
            "not_comparable": int((~turns["comparable"]).sum()),
            "not_comparable_by_reason": dict(sorted(reasons.items())),
            "flagged": int(turns["flagged"].sum()),
            "prompt_recorded": int((turns["prompt_origin"] == "recorded").sum()),
            "prompt_rendered": int((turns["prompt_origin"] == "rendered").sum()),
        },
        "tokens": run["tokens"],
        "delta": {key: run[key] for key in ("mean_delta", "mean_abs_delta", "max_abs_delta", *metrics.QUANTILES)},
        "frac_above_threshold": run["frac_above"],
        "kl": {"k1": run["k1"], "k3": run["k3"]},
        "log_ratio": metrics.turn_log_ratio_summary(turns.loc[turns["comparable"], "log_ratio"]),
        "flagged": _flagged_list(turns, top_k),
        "throughput": throughput,
    }


def _flagged_list(turns: pd.DataFrame, top_k: int) -> list[dict[str, Any]]:
    flagged = turns[turns["flagged"]].sort_values("max_abs_delta", ascending=False).head(top_k)
    keys = [
        "session_id",
        "turn_index",
        "output_tokens",
        "mean_abs_delta",
        "max_abs_delta",
        "frac_above",
        "log_ratio",
        "worst_position",
        "worst_token_id",
        "worst_recorded",
        "worst_recomputed",
        "prompt_origin",
        "context",
    ]
    return [{key: _plain(row[key]) for key in keys} for _, row in flagged.iterrows()]


def _plain(value: Any) -> Any:
    """numpy scalars to JSON-able Python values."""
    return value.item() if isinstance(value, np.generic) else value
