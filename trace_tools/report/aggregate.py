"""Run metrics as mergeable partial aggregates (docs/metrics.md#per-run, #per-step).

A `RunAggregate` is fed the run tables batch by batch (`add_turns`, `add_sessions`,
`add_quarantine`, `add_fidelity`), or merged with another one (`merge`, e.g. one per shard), and
`summary()` turns what it holds into summary.json's values. It holds sums, counts and the
distinct session ids, never a table row, so the end of a run reads its tables in one bounded pass
whatever their length (`summarize_run`). A batch of turns must hold every turn row of each of its
sessions (the run tables keep a session's rows together; `session_batches` cuts them so), which
is what makes "distinct turns" a sum.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from trace_tools.data import COUNTERS
from trace_tools.errors import UnusableInput
from trace_tools.io.schema import DATA_WARNINGS

RUN = "run"  # the scope of the whole run, beside one scope per step
BATCH_ROWS = 65_536  # table rows read at a time
_SESSION_SUMS = ("samples", "forks", "generated_tokens", "trained_tokens", "forwarded_tokens", "context_tokens")


class _Strategy:
    """One strategy's sums within one scope."""

    def __init__(self) -> None:
        self.sessions = 0
        self.sums: Counter = Counter()  # _SESSION_SUMS and COUNTERS
        self.forks_max: int | None = None
        self.samples_per_session: Counter = Counter()
        self.lenient: int | None = None  # None: no session carried the `lenient_renders` counter
        self.tools: dict[str, Counter] = defaultdict(Counter)
        self.turn_events: Counter = Counter()
        self.prompt_events: Counter = Counter()
        self.requests = 0
        self.failures: Counter = Counter()

    def merge(self, other: "_Strategy") -> None:
        self.sessions += other.sessions
        self.sums.update(other.sums)
        if other.forks_max is not None:
            self.forks_max = other.forks_max if self.forks_max is None else max(self.forks_max, other.forks_max)
        self.samples_per_session.update(other.samples_per_session)
        if other.lenient is not None:
            self.lenient = (self.lenient or 0) + other.lenient
        for tool, counts in other.tools.items():
            self.tools[tool].update(counts)
        self.turn_events.update(other.turn_events)
        self.prompt_events.update(other.prompt_events)
        self.requests += other.requests
        self.failures.update(other.failures)

    def summary(self, name: str) -> dict[str, Any]:
        generated, trained = self.sums["generated_tokens"], self.sums["trained_tokens"]
        tools = {tool: _tool_entry(self.tools[tool]) for tool in sorted(self.tools)}
        out = {
            "sessions": self.sessions,
            "samples": self.sums["samples"],
            "samples_per_session": {str(k): v for k, v in sorted(self.samples_per_session.items())},
            "forks": {
                "total": self.sums["forks"],
                "mean": self.sums["forks"] / self.sessions if self.sessions else 0.0,
                "max": self.forks_max or 0,
            },
            "generated_tokens": generated,
            "trained_tokens": trained,
            "forwarded_tokens": self.sums["forwarded_tokens"],
            "context_tokens": self.sums["context_tokens"],
            "coverage": trained / generated if generated else 0.0,
            "coverage_by_tool": {
                tool: v["trained_tokens"] / v["generated_tokens"] if v["generated_tokens"] else 0.0
                for tool, v in tools.items()
            },
            "tool_turns": tools,
            "turn_events": _sorted(self.turn_events),
            "prompt_events": _sorted(self.prompt_events),
            "counters": {c: self.sums[c] for c in COUNTERS},
            "upstream_failures": self.upstream(name),
        }
        if self.lenient is not None:
            label = (
                f"{name}: lenient render: tool-call arguments reach the template as JSON text, not as upstream "
                f"passes them; {self.lenient} requests that fail upstream were rendered anyway"
            )
            out["lenient_render"] = {"requests": self.lenient, "label": label}
        return out

    def upstream(self, name: str) -> dict[str, Any]:
        """Requests answered with an error upstream, by reason, and a headline when they are most."""
        by_reason = _sorted(self.failures)
        failed = sum(by_reason.values())
        headline = None
        if self.requests and 2 * failed > self.requests:
            top, count = max(by_reason.items(), key=lambda item: (item[1], item[0]))
            others = f" ({failed - count} more for other reasons)" if failed > count else ""
            headline = f"{name}: {failed} of {self.requests} requests fail upstream: {top}{others}"
        return {"requests": self.requests, "failed": failed, "by_reason": by_reason, "headline": headline}


class _Scope:
    """The run, or one step: distinct sessions and turns, per-strategy sums, drift causes."""

    def __init__(self) -> None:
        self.session_ids: set[str] = set()
        self.turns = 0  # distinct (session, turn) pairs
        self.strategies: dict[str, _Strategy] = defaultdict(_Strategy)
        self.drift: dict[tuple[str, str], Counter] = defaultdict(Counter)

    def merge(self, other: "_Scope") -> None:
        self.session_ids |= other.session_ids
        self.turns += other.turns
        for name, partial in other.strategies.items():
            self.strategies[name].merge(partial)
        for key, counts in other.drift.items():
            self.drift[key].update(counts)

    def per_strategy(self, strategies: list[str]) -> dict[str, dict[str, Any]]:
        return {name: self.strategies.get(name, _Strategy()).summary(name) for name in strategies}

    def drift_causes(self) -> dict[str, dict[str, dict[str, int]]]:
        out: dict[str, dict[str, dict[str, int]]] = {}
        for (strategy, cause), counts in sorted(self.drift.items()):
            out.setdefault(strategy, {})[cause] = {
                "turns": counts["turns"],
                "turns_losing_tokens": counts["turns_losing_tokens"],
                "tokens_lost": counts["tokens_lost"],
            }
        return out


class RunAggregate:
    """Mergeable partial aggregates of a run's tables (see the module docstring)."""

    def __init__(self) -> None:
        self.scopes: dict[Any, _Scope] = defaultdict(_Scope)  # RUN, then each step
        self.with_step = False  # some session row carries a step
        self.without_step: set[str] = set()  # sessions without one
        self.quarantined: set[str] = set()
        self.quarantined_by_reason: dict[str, set[str]] = defaultdict(set)
        self.quarantine_examples: dict[str, str] = {}
        self.fidelity: Counter = Counter()

    def merge(self, other: "RunAggregate") -> "RunAggregate":
        """Add `other`'s partials (a later part of the run: quarantine examples keep the first)."""
        for key, scope in other.scopes.items():
            self.scopes[key].merge(scope)
        self.with_step |= other.with_step
        self.without_step |= other.without_step
        self.quarantined |= other.quarantined
        for reason, ids in other.quarantined_by_reason.items():
            self.quarantined_by_reason[reason] |= ids
        for reason, example in other.quarantine_examples.items():
            self.quarantine_examples.setdefault(reason, example)
        self.fidelity.update(other.fidelity)
        return self

    # -- feeding -----------------------------------------------------------------------------
    def add_sessions(self, sessions: pd.DataFrame) -> None:
        if not len(sessions):
            return
        for key, part in _scoped(sessions):
            self._add_sessions(self.scopes[key], part)
        if "step" in sessions:
            stepless = sessions["step"].isna()
            self.with_step |= bool((~stepless).any())
            self.without_step.update(sessions.loc[stepless, "session_id"])

    def add_turns(self, turns: pd.DataFrame) -> None:
        """Turn rows holding every row of each of their sessions (see the module docstring)."""
        if not len(turns):
            return
        for key, part in _scoped(turns):
            self._add_turns(self.scopes[key], part)

    def add_quarantine(self, quarantine: pd.DataFrame) -> None:
        if not len(quarantine):
            return
        ids = quarantine["session_id"].fillna("<file>")
        self.quarantined.update(ids)
        for reason, group in ids.groupby(quarantine["reason"]):
            self.quarantined_by_reason[str(reason)].update(group)
        for row in quarantine.itertuples():
            if str(row.reason) in self.quarantine_examples:
                continue
            session = "(no session)" if pd.isna(row.session_id) else row.session_id
            turn = "" if pd.isna(row.turn_index) else f" turn {int(row.turn_index)}"
            self.quarantine_examples[str(row.reason)] = f"{session}{turn}: {row.detail}"

    def add_fidelity(self, fidelity: pd.DataFrame) -> None:
        if len(fidelity):
            self.fidelity.update(compared=len(fidelity), exact=int(fidelity["exact"].sum()))

    @staticmethod
    def _add_sessions(scope: _Scope, sessions: pd.DataFrame) -> None:
        scope.session_ids.update(sessions["session_id"])
        sums = [c for c in (*_SESSION_SUMS, *COUNTERS) if c in sessions]
        grouped = sessions.groupby("strategy", sort=False)
        totals = grouped[sums].sum()
        sizes = grouped.size()
        maxima = grouped["forks"].max() if "forks" in sessions else None
        for name, row in totals.iterrows():
            partial = scope.strategies[str(name)]
            partial.sessions += int(sizes[name])
            partial.sums.update({c: int(row[c]) for c in sums})
            if maxima is not None:
                top = int(maxima[name])
                partial.forks_max = top if partial.forks_max is None else max(partial.forks_max, top)
        if "samples" in sessions:
            for (name, samples), n in sessions.groupby(["strategy", "samples"]).size().items():
                scope.strategies[str(name)].samples_per_session[int(samples)] += int(n)
        if "extra_counters" in sessions:
            for name, extra in zip(sessions["strategy"], sessions["extra_counters"]):
                count = json.loads(extra).get("lenient_renders") if isinstance(extra, str) else None
                if count is not None:
                    partial = scope.strategies[str(name)]
                    partial.lenient = (partial.lenient or 0) + int(count)

    @staticmethod
    def _add_turns(scope: _Scope, turns: pd.DataFrame) -> None:
        scope.turns += len(turns[["session_id", "turn_index"]].drop_duplicates())
        for name, n in turns.groupby("strategy").size().items():
            scope.strategies[str(name)].requests += int(n)
        tools = turns.assign(
            dropped_turns=(turns["trained_tokens"] == 0) & (turns["generated_tokens"] > 0), turns=1
        ).groupby(["strategy", "tool"])[["turns", "dropped_turns", "generated_tokens", "trained_tokens"]]
        for (name, tool), row in tools.sum().iterrows():
            scope.strategies[str(name)].tools[str(tool)].update({k: int(v) for k, v in row.items()})
        for column, field_ in (("event", "turn_events"), ("prompt_event", "prompt_events"), ("failure", "failures")):
            if column in turns:
                for (name, value), n in turns.groupby(["strategy", column]).size().items():
                    getattr(scope.strategies[str(name)], field_)[str(value)] += int(n)
        if "drift_cause" in turns:
            drifted = turns.dropna(subset=["drift_cause"])
            lost = drifted["generated_tokens"] - drifted["trained_tokens"]
            frame = drifted.assign(lost=lost, losing=lost > 0, one=1)
            for (name, cause), row in (
                frame.groupby(["strategy", "drift_cause"])[["one", "losing", "lost"]].sum().iterrows()
            ):
                scope.drift[(str(name), str(cause))].update(
                    turns=int(row["one"]), turns_losing_tokens=int(row["losing"]), tokens_lost=int(row["lost"])
                )

    # -- the summary -------------------------------------------------------------------------
    def summary(self, loaded: Any, strategies: list[str]) -> dict[str, Any]:
        """summary.json's values (`report.metrics.summarize` documents them), in its key order."""
        run = self.run_scope()
        compared, exact = self.fidelity["compared"], self.fidelity["exact"]
        summary: dict[str, Any] = {
            "sessions_total": int(loaded.session_count),
            "turns_total": int(loaded.rows),
            "sessions_replayed": len(run.session_ids),
            "turns_replayed": run.turns,
            "quarantined": len(self.quarantined),
            "quarantined_by_reason": {
                reason: len(self.quarantined_by_reason[reason]) for reason in sorted(self.quarantined_by_reason)
            },
            "quarantine_examples": self.quarantine_examples,
            "vocab_checked": bool(loaded.vocab_checked),
            "warnings": {kind: int(getattr(loaded, "data_warnings", {}).get(kind, 0)) for kind in DATA_WARNINGS},
            "prompt_fidelity": {
                "turns_compared": compared,
                "exact": exact,
                "rate": exact / compared if compared else None,
            },
            "strategies": run.per_strategy(strategies),
        }
        summary["token_savings"] = token_savings(summary["strategies"])
        summary["drift_causes"] = run.drift_causes()
        summary.update(self.step_summaries(strategies))
        return summary

    def run_scope(self) -> _Scope:
        return self.scopes.get(RUN, _Scope())

    def step_summaries(self, strategies: list[str]) -> dict[str, Any]:
        """`{"by_step": [...], "sessions_without_step": n}` when sessions carry steps, else {}."""
        if not self.with_step:
            return {}
        steps = sorted(key for key, scope in self.scopes.items() if key != RUN and scope.session_ids)
        by_step = []
        for step in steps:
            scope = self.scopes[step]
            per_strategy = scope.per_strategy(strategies)
            by_step.append(
                {
                    "step": int(step),
                    "sessions_replayed": len(scope.session_ids),
                    "turns_replayed": scope.turns,
                    "strategies": per_strategy,
                    "token_savings": token_savings(per_strategy),
                    "drift_causes": scope.drift_causes(),
                }
            )
        return {"by_step": by_step, "sessions_without_step": len(self.without_step)}


def failures_of(turns: pd.DataFrame) -> _Strategy:
    """The upstream failures of turns of one strategy (a `failure` column, null where none)."""
    partial = _Strategy()
    partial.requests = len(turns)
    if "failure" in turns:
        partial.failures.update({str(k): int(v) for k, v in turns["failure"].value_counts().items()})
    return partial


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


def _scoped(table: pd.DataFrame) -> Iterator[tuple[Any, pd.DataFrame]]:
    """(RUN, the whole batch), then (step, its rows) for each step the batch's rows carry."""
    yield RUN, table
    if "step" in table:
        for step, part in table.groupby("step", sort=False):  # rows without a step are in no step
            yield int(step), part


def _tool_entry(counts: Counter) -> dict[str, int]:
    return {key: counts[key] for key in ("turns", "dropped_turns", "generated_tokens", "trained_tokens")}


def _sorted(counts: Counter) -> dict[str, int]:
    return {key: counts[key] for key in sorted(counts)}


# -- reading a run directory in bounded batches ---------------------------------------------------
def session_batches(path: Path, columns: list[str] | None = None, rows: int = BATCH_ROWS) -> Iterator[pd.DataFrame]:
    """A run table (`turns` or `sessions`) as DataFrames of about `rows` rows, each holding every
    row of its sessions: the rows of the batch's last session wait for the next batch. A session
    found in two places (a table not written by replay) is refused rather than counted twice."""
    import pyarrow.parquet as pq

    if not path.exists():
        return
    parquet = pq.ParquetFile(path)
    if "session_id" not in parquet.schema_arrow.names:
        return
    if columns is not None:
        columns = [c for c in columns if c in parquet.schema_arrow.names]
    done: set[str] = set()
    carry: pd.DataFrame | None = None
    for batch in parquet.iter_batches(batch_size=rows, columns=columns):
        frame = batch.to_pandas()
        if carry is not None:
            frame = pd.concat([carry, frame], ignore_index=True)
        last = frame["session_id"].iloc[-1] if len(frame) else None
        tail = frame["session_id"] == last
        carry, ready = frame[tail], frame[~tail]
        _check_together(ready, done, path)
        if len(ready):
            yield ready
    if carry is not None and len(carry):
        _check_together(carry, done, path)
        yield carry


def _check_together(frame: pd.DataFrame, done: set[str], path: Path) -> None:
    ids = set(frame["session_id"].dropna())
    if ids & done:
        raise UnusableInput(
            f"{path} holds a session's rows in two places (it was not written by `trace-tools replay`); "
            "replay again into a fresh run directory"
        )
    done |= ids


def table_batches(path: Path, columns: list[str] | None = None, rows: int = BATCH_ROWS) -> Iterator[pd.DataFrame]:
    """Any run table as DataFrames of at most `rows` rows (nothing when the file is absent or empty)."""
    import pyarrow.parquet as pq

    if not path.exists():
        return
    parquet = pq.ParquetFile(path)
    if columns is not None:
        columns = [c for c in columns if c in parquet.schema_arrow.names]
    for batch in parquet.iter_batches(batch_size=rows, columns=columns):
        if batch.num_rows:
            yield batch.to_pandas()


TURN_COLUMNS = [
    "strategy",
    "session_id",
    "turn_index",
    "tool",
    "generated_tokens",
    "trained_tokens",
    "event",
    "prompt_event",
    "failure",
    "drift_cause",
    "step",
]
SESSION_COLUMNS = ["strategy", "session_id", *_SESSION_SUMS, *COUNTERS, "extra_counters", "step"]


def aggregate_run(run_dir: Path, rows: int = BATCH_ROWS) -> RunAggregate:
    """One bounded pass over a run directory's tables (only the columns the metrics read), about
    `rows` rows at a time."""
    aggregate = RunAggregate()
    for turns in session_batches(run_dir / "turns.parquet", TURN_COLUMNS, rows):
        aggregate.add_turns(turns)
    for sessions in session_batches(run_dir / "sessions.parquet", SESSION_COLUMNS, rows):
        aggregate.add_sessions(sessions)
    for quarantine in table_batches(run_dir / "quarantine.parquet", rows=rows):
        aggregate.add_quarantine(quarantine)
    for fidelity in table_batches(run_dir / "fidelity.parquet", ["exact"], rows):
        aggregate.add_fidelity(fidelity)
    return aggregate
