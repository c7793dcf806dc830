"""The notebook-facing API: a finished run as pandas DataFrames.

    import trace_tools as tt
    run = tt.open_run("trace-tools-runs/sample_traces-...")
    run.coverage_by_tool()          # tool × strategy token coverage
    run.drift_causes()              # strategy × cause: turns and tokens lost
    run.session("sim-qwen3-s7-0003")  # one session's turns under every strategy
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from trace_tools.errors import UsageError


class UnknownSession(UsageError, LookupError):
    """`Run.session(id)` for an id the run does not hold."""


@dataclass
class Run:
    """A finished run directory loaded as DataFrames (DESIGN §6 columns)."""

    path: Path
    summary: dict[str, Any]
    turns: pd.DataFrame
    sessions: pd.DataFrame
    samples: pd.DataFrame
    quarantine: pd.DataFrame

    @property
    def dump(self) -> Path:
        """The dump this run replayed (from run.json), e.g. for `trace_tools.explain(run.dump, id)`."""
        import json

        return Path(json.loads((self.path / "run.json").read_text())["inputs"]["dump"])

    @property
    def strategies(self) -> list[str]:
        return list(self.summary["strategies"])

    def strategy_table(self) -> pd.DataFrame:
        """One row per strategy: samples, forks, coverage and token totals."""
        rows = []
        for name, s in self.summary["strategies"].items():
            rows.append({"strategy": name, "sessions": s["sessions"], "samples": s["samples"],
                         "forks_mean": s["forks"]["mean"], "coverage": s["coverage"],
                         "trained_tokens": s["trained_tokens"], "forwarded_tokens": s["forwarded_tokens"],
                         "context_tokens": s["context_tokens"]})
        return pd.DataFrame(rows).set_index("strategy")

    def coverage_by_tool(self) -> pd.DataFrame:
        """Token coverage (trained / generated) per tool (rows) and strategy (columns)."""
        grouped = self.turns.groupby(["tool", "strategy"])[["trained_tokens", "generated_tokens"]].sum()
        coverage = grouped["trained_tokens"] / grouped["generated_tokens"].where(grouped["generated_tokens"] > 0)
        return coverage.unstack()[self.strategies]

    def dropped_turns_by_tool(self) -> pd.DataFrame:
        """Share of turns with generated tokens but none trained, per tool and strategy."""
        turns = self.turns[self.turns["generated_tokens"] > 0]
        dropped = (turns["trained_tokens"] == 0).groupby([turns["tool"], turns["strategy"]]).mean()
        return dropped.unstack()[self.strategies]

    def drift_causes(self) -> pd.DataFrame:
        """Per strategy and drift cause: drifted turns and the generated tokens they lost."""
        turns = self.turns.dropna(subset=["drift_cause"])
        lost = (turns["generated_tokens"] - turns["trained_tokens"]).rename("tokens_lost")
        frame = turns.assign(tokens_lost=lost)
        return frame.groupby(["strategy", "drift_cause"]).agg(turns=("turn_index", "size"),
                                                              tokens_lost=("tokens_lost", "sum"))

    def session(self, session_id: str) -> pd.DataFrame:
        """One session's turns: tool, generated and trained tokens, and events, per strategy."""
        frame = self.turns[self.turns["session_id"] == session_id] if len(self.turns) else self.turns
        if not len(frame):
            from trace_tools.report.explain import no_session_message

            ids = list(self.sessions["session_id"].unique()) if len(self.sessions) else []
            raise UnknownSession(no_session_message(session_id, self.path, ids))
        return frame.pivot_table(index=["turn_index", "tool"], columns="strategy",
                                 values="trained_tokens", aggfunc="sum")[self.strategies]


def open_run(path: str | Path) -> Run:
    from trace_tools.replay.rundir import load_summary
    from trace_tools.report.rerender import read_run

    tables = read_run(path)
    return Run(Path(path), load_summary(Path(path)), tables["turns"], tables["sessions"], tables["samples"],
               tables["quarantine"])
