"""Run-level metrics (docs/metrics.md#per-run), and per step when the dump has steps
(docs/metrics.md#per-step), computed from the run tables; `summary.json` is their JSON form."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from trace_tools.data import COUNTERS
from trace_tools.io.schema import DATA_WARNINGS
from trace_tools.render.renderer import verify_summary


def summarize(tables: dict[str, pd.DataFrame], loaded, strategies: list[str]) -> dict[str, Any]:
    quarantine = tables["quarantine"]
    summary: dict[str, Any] = {
        "sessions_total": int(loaded.session_count),
        "turns_total": int(loaded.rows),
        "sessions_replayed": _distinct(tables["sessions"], ["session_id"]),
        "turns_replayed": _distinct(tables["turns"], ["session_id", "turn_index"]),
        "quarantined": _distinct_sessions(quarantine),
        "quarantined_by_reason": _quarantined_by_reason(quarantine),
        "quarantine_examples": _quarantine_examples(quarantine),
        "vocab_checked": bool(loaded.vocab_checked),
        "warnings": {kind: int(getattr(loaded, "data_warnings", {}).get(kind, 0)) for kind in DATA_WARNINGS},
        "prompt_fidelity": prompt_fidelity(tables["fidelity"]),
        "strategies": {},
    }
    for name in strategies:
        summary["strategies"][name] = strategy_summary(tables["turns"], tables["sessions"], name)
    summary["token_savings"] = token_savings(summary["strategies"])
    summary["drift_causes"] = drift_causes(tables["turns"])
    summary.update(step_summaries(tables["turns"], tables["sessions"], strategies))
    return summary


def step_summaries(turns: pd.DataFrame, sessions: pd.DataFrame, strategies: list[str]) -> dict[str, Any]:
    """`{"by_step": [...], "sessions_without_step": n}` when the run's sessions carry steps, else {}.

    Each item holds, for the sessions of one step, what the top level holds for the run: sessions
    and turns replayed, `strategies` (`strategy_summary`), `token_savings` and `drift_causes`
    (docs/metrics.md#per-step)."""
    if not has_steps(sessions):
        return {}
    turns_by_step = dict(tuple(turns.groupby("step", sort=False))) if len(turns) else {}
    by_step = []
    for step, s in sessions.groupby("step", sort=True):
        t = turns_by_step.get(step, turns.iloc[:0])
        per_strategy = {name: strategy_summary(t, s, name) for name in strategies}
        by_step.append(
            {
                "step": int(step),
                "sessions_replayed": _distinct(s, ["session_id"]),
                "turns_replayed": _distinct(t, ["session_id", "turn_index"]),
                "strategies": per_strategy,
                "token_savings": token_savings(per_strategy),
                "drift_causes": drift_causes(t),
            }
        )
    without = sessions[sessions["step"].isna()]
    return {"by_step": by_step, "sessions_without_step": _distinct(without, ["session_id"])}


def has_steps(table: pd.DataFrame) -> bool:
    """Whether a run table's rows carry a step (runs of dumps without steps, and older runs, do not)."""
    return bool(len(table)) and "step" in table and bool(table["step"].notna().any())


def _distinct(table: pd.DataFrame, columns: list[str]) -> int:
    """How many distinct `columns` values a run table holds (sessions or turns, whatever the strategy)."""
    return int(len(table[columns].drop_duplicates())) if len(table) else 0


def drift_causes(turns: pd.DataFrame) -> dict[str, dict[str, dict[str, int]]]:
    """Per strategy and cause: drifted turns, turns that lost tokens, and the tokens lost."""
    if not len(turns) or "drift_cause" not in turns:
        return {}
    drifted = turns.dropna(subset=["drift_cause"])
    out: dict[str, dict[str, dict[str, int]]] = {}
    for (strategy, cause), group in drifted.groupby(["strategy", "drift_cause"], sort=True):
        lost = group["generated_tokens"] - group["trained_tokens"]
        out.setdefault(str(strategy), {})[str(cause)] = {
            "turns": int(len(group)),
            "turns_losing_tokens": int((lost > 0).sum()),
            "tokens_lost": int(lost.sum()),
        }
    return out


def strategy_summary(turns: pd.DataFrame, sessions: pd.DataFrame, name: str) -> dict[str, Any]:
    s = sessions[sessions["strategy"] == name] if len(sessions) else sessions
    t = turns[turns["strategy"] == name] if len(turns) else turns
    generated = _int_sum(s, "generated_tokens")
    trained = _int_sum(s, "trained_tokens")
    return {
        "sessions": int(len(s)),
        "samples": _int_sum(s, "samples"),
        "samples_per_session": _distribution(s, "samples"),
        "forks": {"total": _int_sum(s, "forks"), "mean": _mean(s, "forks"), "max": _max(s, "forks")},
        "generated_tokens": generated,
        "trained_tokens": trained,
        "forwarded_tokens": _int_sum(s, "forwarded_tokens"),
        "context_tokens": _int_sum(s, "context_tokens"),
        "coverage": trained / generated if generated else 0.0,
        "coverage_by_tool": {
            tool: v["trained_tokens"] / v["generated_tokens"] if v["generated_tokens"] else 0.0
            for tool, v in tool_turns(t).items()
        },
        "tool_turns": tool_turns(t),
        "turn_events": _value_counts(t, "event"),
        "prompt_events": _value_counts(t, "prompt_event"),
        "counters": {c: _int_sum(s, c) for c in COUNTERS},
        "upstream_failures": upstream_failures(t, name),
        **lenient_render(s, name),
    }


def upstream_failures(turns: pd.DataFrame, name: str) -> dict[str, Any]:
    """Requests the reproduced upstream system answers with an error (turns `failed` or `rejected`),
    by reason, and `headline`: one line naming the most common reason when they are most requests."""
    requests = int(len(turns))
    reasons = turns["failure"].dropna() if len(turns) and "failure" in turns else pd.Series(dtype=str)
    by_reason = {str(k): int(v) for k, v in reasons.value_counts().sort_index().items()}
    failed = int(sum(by_reason.values()))
    headline = None
    if requests and 2 * failed > requests:
        top, count = max(by_reason.items(), key=lambda item: (item[1], item[0]))
        others = f" ({failed - count} more for other reasons)" if failed > count else ""
        headline = f"{name}: {failed} of {requests} requests fail upstream: {top}{others}"
    return {"requests": requests, "failed": failed, "by_reason": by_reason, "headline": headline}


def lenient_render(sessions: pd.DataFrame, name: str) -> dict[str, Any]:
    """`{"lenient_render": {...}}` for a strategy run with `lenient_render` on (its sessions carry
    the `lenient_renders` counter, zero too), else nothing: the label every view must show."""
    counts = [json.loads(extra).get("lenient_renders") for extra in _extra_counters(sessions)]
    if not any(count is not None for count in counts):
        return {}
    renders = int(sum(count or 0 for count in counts))
    label = (
        f"{name}: lenient render: tool-call arguments reach the template as JSON text, not as upstream "
        f"passes them; {renders} requests that fail upstream were rendered anyway"
    )
    return {"lenient_render": {"requests": renders, "label": label}}


def upstream_lines(summary: dict[str, Any]) -> list[str]:
    """The one-line notes every view prints: lenient renders, and strategies failing most requests."""
    lines = []
    for s in summary.get("strategies", {}).values():
        if "lenient_render" in s:
            lines.append(s["lenient_render"]["label"])
        headline = (s.get("upstream_failures") or {}).get("headline")
        if headline:
            lines.append(headline)
    return lines


def _extra_counters(sessions: pd.DataFrame) -> list[str]:
    if not len(sessions) or "extra_counters" not in sessions:
        return []
    return [extra for extra in sessions["extra_counters"] if isinstance(extra, str)]


def tool_turns(turns: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per tool (first call's name, or `text`): turns, dropped turns and token totals."""
    if not len(turns):
        return {}
    out = {}
    for tool, group in turns.groupby("tool", sort=True):
        out[str(tool)] = {
            "turns": int(len(group)),
            "dropped_turns": int(((group["trained_tokens"] == 0) & (group["generated_tokens"] > 0)).sum()),
            "generated_tokens": int(group["generated_tokens"].sum()),
            "trained_tokens": int(group["trained_tokens"].sum()),
        }
    return out


def prompt_fidelity(fidelity: pd.DataFrame) -> dict[str, Any]:
    compared = int(len(fidelity))
    exact = int(fidelity["exact"].sum()) if compared else 0
    return {"turns_compared": compared, "exact": exact, "rate": exact / compared if compared else None}


def token_savings(strategies: dict[str, dict[str, Any]], baseline: str = "tree") -> dict[str, Any]:
    """`1 - forwarded_A / forwarded_B` against `tree`; savings only count when trained tokens do not fall."""
    base = strategies.get(baseline)
    if not base or not base["forwarded_tokens"]:
        return {}
    out = {}
    for name, s in strategies.items():
        if name == baseline:
            continue
        savings = 1 - s["forwarded_tokens"] / base["forwarded_tokens"]
        trained_delta = s["trained_tokens"] - base["trained_tokens"]
        out[name] = {
            "vs": baseline,
            "savings": savings,
            "samples_delta": s["samples"] - base["samples"],
            "forwarded_delta": s["forwarded_tokens"] - base["forwarded_tokens"],
            "trained_delta": trained_delta,
            "saves_by_training_less": bool(savings > 0 and trained_delta < 0),
        }
    return out


def _distinct_sessions(quarantine: pd.DataFrame) -> int:
    if not len(quarantine):
        return 0
    return int(quarantine["session_id"].fillna("<file>").nunique())


def _quarantined_by_reason(quarantine: pd.DataFrame) -> dict[str, int]:
    if not len(quarantine):
        return {}
    grouped = quarantine.assign(session_id=quarantine["session_id"].fillna("<file>")).groupby("reason")
    return {str(k): int(v) for k, v in grouped["session_id"].nunique().items()}


def _quarantine_examples(quarantine: pd.DataFrame) -> dict[str, str]:
    """The first entry's message per reason, prefixed with its session (and turn), e.g. for the terminal."""
    examples: dict[str, str] = {}
    for row in quarantine.itertuples() if len(quarantine) else ():
        session = "(no session)" if pd.isna(row.session_id) else row.session_id
        turn = "" if pd.isna(row.turn_index) else f" turn {int(row.turn_index)}"
        examples.setdefault(str(row.reason), f"{session}{turn}: {row.detail}")
    return examples


def _int_sum(frame: pd.DataFrame, col: str) -> int:
    return int(frame[col].sum()) if len(frame) and col in frame else 0


def _mean(frame: pd.DataFrame, col: str) -> float:
    return float(frame[col].mean()) if len(frame) else 0.0


def _max(frame: pd.DataFrame, col: str) -> int:
    return int(frame[col].max()) if len(frame) else 0


def _distribution(frame: pd.DataFrame, col: str) -> dict[str, int]:
    if not len(frame):
        return {}
    return {str(int(k)): int(v) for k, v in frame[col].value_counts().sort_index().items()}


def _value_counts(frame: pd.DataFrame, col: str) -> dict[str, int]:
    if not len(frame):
        return {}
    return {str(k): int(v) for k, v in frame[col].value_counts().sort_index().items()}


def reconstruction_summary(stats: dict[str, int]) -> dict[str, Any]:
    """How the run's prompts were rendered: incrementally, or in full and why (`render.incremental`).

    `full_renders_by_reason["no_cached_prefix"]` counts the first render of each conversation;
    the other reasons are fallbacks from the incremental path (e.g. `history_rewrite` where a
    template re-renders earlier turns, `appended_role` for a new user or system message)."""

    reasons = {key.split(":", 1)[1]: int(value) for key, value in sorted(stats.items()) if key.startswith("full:")}
    return {
        "incremental_renders": int(stats.get("incremental", 0)),
        "full_renders": int(stats.get("full", 0)),
        "full_renders_by_reason": reasons,
        "cache_hits": int(stats.get("cache_hits", 0)),
        "tokens_encoded": int(stats.get("tokens_encoded", 0)),
        "tokens_reused": int(stats.get("tokens_reused", 0)),
        "templates_not_incremental": int(stats.get("template_not_incremental", 0)),
        # only on the other render paths, so a default run's summary is what it was
        **({"reference_renders": int(stats["reference_renders"])} if stats.get("reference_renders") else {}),
        **({"verify": verify_summary(stats)} if stats.get("verify:checked") else {}),
    }
