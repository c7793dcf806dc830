"""The metric layer against literal expectations (docs/metrics.md, docs/run_directory.md#what-the-files-hold).

A run small enough to add up by hand: three sessions were read, one quarantined (plus a
file-level problem); two replayed, s1 (Bash, Edit, text turns) and s2 (Edit, Write), under three
strategies. Every expected number below is written out, not recomputed from the tables.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from trace_tools.api import Run
from trace_tools.data import COUNTERS, ReplayResult, Sample, Session, Turn
from trace_tools.replay.turnrows import check_trained_once, session_row, trained_by_turn, turn_event, turn_rows
from trace_tools.report.metrics import drift_causes, summarize, token_savings

# (session, turn, tool, generated, drift cause); the drift cause is the strategy-independent fact
TURNS = [
    ("s1", 0, "Bash", 10, None),
    ("s1", 1, "Edit", 20, "reasoning"),
    ("s1", 2, "text", 5, None),
    ("s2", 0, "Edit", 8, None),
    ("s2", 1, "Write", 12, "key_order_or_spacing"),
]
# per strategy, per turn above: (trained, event, prompt event, failure)
OUTCOMES = {
    "tree": [
        (10, "trained", "clean", None),
        (0, "zeroed_by_realign", "clean", None),
        (5, "trained", "realigned", None),
        (8, "trained", "clean", None),
        (6, "partly_trained", "forked", None),
    ],
    "linear": [
        (10, "trained", "clean", None),
        (20, "trained", "healed", None),
        (5, "trained", "healed", None),
        (8, "trained", "clean", None),
        (12, "trained", "healed", None),
    ],
    "session-v1": [
        (10, "trained", "clean", None),
        (0, "failed", "failed", "No user query found"),
        (0, "failed", "failed", "No user query found"),
        (0, "failed", "failed", "No user query found"),
        (0, "rejected", "rejected", "message mismatch at index N"),
    ],
}
# per strategy and session: samples, generated, trained, forwarded, counters, extra counters
SESSIONS = {
    "tree": [("s1", 2, 35, 15, 80, {"drift_realign": 1}, "{}"), ("s2", 2, 20, 14, 60, {"drift_fork": 1}, "{}")],
    "linear": [("s1", 1, 35, 35, 50, {"healed_turns": 2}, "{}"), ("s2", 1, 20, 20, 40, {"healed_turns": 1}, "{}")],
    "session-v1": [
        ("s1", 1, 35, 10, 30, {"server_errors": 2}, '{"lenient_renders": 2}'),
        ("s2", 0, 20, 0, 0, {"server_errors": 1, "rejected_requests": 1}, '{"lenient_renders": 0}'),
    ],
}


def _turns() -> pd.DataFrame:
    rows = []
    for strategy, outcomes in OUTCOMES.items():
        for (session, turn, tool, generated, cause), (trained, event, prompt, failure) in zip(TURNS, outcomes):
            rows.append(
                {
                    "strategy": strategy,
                    "session_id": session,
                    "turn_index": turn,
                    "tool": tool,
                    "tool_names": [] if tool == "text" else [tool],
                    "generated_tokens": generated,
                    "trained_tokens": trained,
                    "event": event,
                    "prompt_event": prompt,
                    "failure": failure,
                    "drift_cause": cause,
                }
            )
    return pd.DataFrame(rows)


def _sessions() -> pd.DataFrame:
    rows = []
    for strategy, sessions in SESSIONS.items():
        for session, samples, generated, trained, forwarded, counters, extra in sessions:
            rows.append(
                {
                    "strategy": strategy,
                    "session_id": session,
                    "samples": samples,
                    "forks": max(samples - 1, 0),
                    "generated_tokens": generated,
                    "trained_tokens": trained,
                    "forwarded_tokens": forwarded,
                    "context_tokens": forwarded - trained,
                    **{name: counters.get(name, 0) for name in COUNTERS},
                    "extra_counters": extra,
                }
            )
    return pd.DataFrame(rows)


def _tables() -> dict[str, pd.DataFrame]:
    quarantine = pd.DataFrame(
        [
            {"session_id": "s3", "turn_index": 0, "reason": "bad_json", "detail": "line 1 is not JSON"},
            {"session_id": "s3", "turn_index": 1, "reason": "bad_json", "detail": "line 2 is not JSON"},
            {"session_id": None, "turn_index": None, "reason": "missing_column", "detail": "no output_ids column"},
        ]
    )
    fidelity = pd.DataFrame(
        {"session_id": ["s1"] * 3 + ["s2"] * 2, "turn_index": [0, 1, 2, 0, 1], "exact": [True, True, False, True, True]}
    )
    return {"turns": _turns(), "sessions": _sessions(), "quarantine": quarantine, "fidelity": fidelity}


LOADED = SimpleNamespace(session_count=3, rows=7, vocab_checked=True, data_warnings={"turn_index_gap": 1})
NO_COUNTERS = dict.fromkeys(COUNTERS, 0)
NO_FAILURES = {"requests": 5, "failed": 0, "by_reason": {}, "headline": None}


@pytest.fixture(scope="module")
def summary():
    return summarize(_tables(), LOADED, ["tree", "linear", "session-v1"])


def test_run_level_numbers(summary):
    assert {k: v for k, v in summary.items() if k not in ("strategies", "token_savings", "drift_causes")} == {
        "sessions_total": 3,
        "turns_total": 7,
        "sessions_replayed": 2,  # s1 and s2; s3 is quarantined
        "turns_replayed": 5,
        "quarantined": 2,  # s3 and the file
        "quarantined_by_reason": {"bad_json": 1, "missing_column": 1},
        "quarantine_examples": {
            "bad_json": "s3 turn 0: line 1 is not JSON",
            "missing_column": "(no session): no output_ids column",
        },
        "vocab_checked": True,
        "warnings": {"turn_index_gap": 1, "empty_generation": 0},
        "prompt_fidelity": {"turns_compared": 5, "exact": 4, "rate": 0.8},
    }


def test_a_strategy_with_forks_and_a_dropped_turn(summary):
    assert summary["strategies"]["tree"] == {
        "sessions": 2,
        "samples": 4,
        "samples_per_session": {"2": 2},
        "forks": {"total": 2, "mean": 1.0, "max": 1},
        "generated_tokens": 55,
        "trained_tokens": 29,
        "forwarded_tokens": 140,
        "context_tokens": 111,
        "coverage": pytest.approx(0.5272727),
        "coverage_by_tool": {"Bash": 1.0, "Edit": pytest.approx(0.2857143), "Write": 0.5, "text": 1.0},
        "tool_turns": {
            "Bash": {"turns": 1, "dropped_turns": 0, "generated_tokens": 10, "trained_tokens": 10},
            "Edit": {"turns": 2, "dropped_turns": 1, "generated_tokens": 28, "trained_tokens": 8},
            "Write": {"turns": 1, "dropped_turns": 0, "generated_tokens": 12, "trained_tokens": 6},
            "text": {"turns": 1, "dropped_turns": 0, "generated_tokens": 5, "trained_tokens": 5},
        },
        "turn_events": {"partly_trained": 1, "trained": 3, "zeroed_by_realign": 1},
        "prompt_events": {"clean": 3, "forked": 1, "realigned": 1},
        "counters": {**NO_COUNTERS, "drift_realign": 1, "drift_fork": 1},
        "upstream_failures": NO_FAILURES,
    }


def test_a_strategy_that_trains_everything_in_one_sample(summary):
    linear = summary["strategies"]["linear"]
    assert (linear["samples_per_session"], linear["forks"], linear["coverage"]) == (
        {"1": 2},
        {"total": 0, "mean": 0.0, "max": 0},
        1.0,
    )
    assert linear["coverage_by_tool"] == {"Bash": 1.0, "Edit": 1.0, "Write": 1.0, "text": 1.0}
    assert (linear["forwarded_tokens"], linear["context_tokens"]) == (90, 35)
    assert linear["prompt_events"] == {"clean": 2, "healed": 3}
    assert linear["counters"] == {**NO_COUNTERS, "healed_turns": 3}


def test_a_strategy_failing_most_requests_upstream_and_rendering_leniently(summary):
    v1 = summary["strategies"]["session-v1"]
    assert v1["samples_per_session"] == {"0": 1, "1": 1}
    assert v1["coverage_by_tool"] == {"Bash": 1.0, "Edit": 0.0, "Write": 0.0, "text": 0.0}
    assert {tool: row["dropped_turns"] for tool, row in v1["tool_turns"].items()} == {
        "Bash": 0,
        "Edit": 2,
        "Write": 1,
        "text": 1,
    }
    assert v1["turn_events"] == {"failed": 3, "rejected": 1, "trained": 1}
    assert v1["counters"] == {**NO_COUNTERS, "server_errors": 3, "rejected_requests": 1}
    assert v1["upstream_failures"] == {
        "requests": 5,
        "failed": 4,
        "by_reason": {"No user query found": 3, "message mismatch at index N": 1},
        "headline": "session-v1: 4 of 5 requests fail upstream: No user query found (1 more for other reasons)",
    }
    assert v1["lenient_render"] == {
        "requests": 2,
        "label": "session-v1: lenient render: tool-call arguments reach the template as JSON text, not as upstream "
        "passes them; 2 requests that fail upstream were rendered anyway",
    }


def test_token_savings_against_the_tree(summary):
    assert summary["token_savings"] == {
        "linear": {
            "vs": "tree",
            "savings": pytest.approx(0.3571429),
            "samples_delta": -2,
            "forwarded_delta": -50,
            "trained_delta": 26,
            "saves_by_training_less": False,
        },
        "session-v1": {
            "vs": "tree",
            "savings": pytest.approx(0.7857143),
            "samples_delta": -3,
            "forwarded_delta": -110,
            "trained_delta": -19,
            "saves_by_training_less": True,
        },
    }


def test_token_savings_without_a_baseline_or_with_nothing_forwarded():
    assert token_savings({"linear": {"forwarded_tokens": 5}}) == {}
    assert token_savings({"tree": {"forwarded_tokens": 0}, "linear": {"forwarded_tokens": 5}}) == {}
    more = {
        "tree": {"forwarded_tokens": 100, "trained_tokens": 50, "samples": 2},
        "chains": {"forwarded_tokens": 150, "trained_tokens": 40, "samples": 3},
    }
    # forwarding more while training less is a loss, not "saving by training less"
    assert token_savings(more)["chains"] == {
        "vs": "tree",
        "savings": -0.5,
        "samples_delta": 1,
        "forwarded_delta": 50,
        "trained_delta": -10,
        "saves_by_training_less": False,
    }


def test_drift_cause_table(summary):
    assert summary["drift_causes"] == {
        "linear": {
            "key_order_or_spacing": {"turns": 1, "turns_losing_tokens": 0, "tokens_lost": 0},
            "reasoning": {"turns": 1, "turns_losing_tokens": 0, "tokens_lost": 0},
        },
        "session-v1": {
            "key_order_or_spacing": {"turns": 1, "turns_losing_tokens": 1, "tokens_lost": 12},
            "reasoning": {"turns": 1, "turns_losing_tokens": 1, "tokens_lost": 20},
        },
        "tree": {
            "key_order_or_spacing": {"turns": 1, "turns_losing_tokens": 1, "tokens_lost": 6},
            "reasoning": {"turns": 1, "turns_losing_tokens": 1, "tokens_lost": 20},
        },
    }
    assert drift_causes(pd.DataFrame()) == {}


def test_the_python_api_views_of_the_same_run(summary):
    tables = _tables()
    run = Run(Path("unused"), summary, tables["turns"], tables["sessions"], pd.DataFrame(), tables["quarantine"])
    coverage = run.coverage_by_tool()
    assert list(coverage.columns) == ["tree", "linear", "session-v1"]
    assert coverage.loc["Edit"].tolist() == pytest.approx([0.2857143, 1.0, 0.0])
    assert coverage.loc["Write"].tolist() == [0.5, 1.0, 0.0]
    assert run.dropped_turns_by_tool().loc["Edit"].tolist() == [0.5, 0.0, 1.0]
    causes = run.drift_causes()
    assert causes.loc[("tree", "key_order_or_spacing")].tolist() == [1, 6]
    assert causes.loc[("session-v1", "reasoning")].tolist() == [1, 20]
    table = run.strategy_table()
    assert table.loc["tree"].tolist() == [2, 4, 1.0, pytest.approx(0.5272727), 29, 140, 111]
    assert table.loc["session-v1", "samples"] == 1
    assert run.session("s2").loc[(1, "Write")].tolist() == [6, 12, 0]


# -- per turn and per session, from one strategy's samples (replay/turnrows.py) -----------------------------
def _replayed() -> tuple[Session, ReplayResult]:
    turns = [Turn("s", 0, [], [10, 11, 12]), Turn("s", 1, [], [20, 21], reward=1.0), Turn("s", 2, [], [30])]
    # sample 0 trains turn 0; sample 1 repeats turn 0 as context, trains one token of turn 1, none of turn 2
    first = Sample([1, 2, 10, 11, 12], 3, [1, 1, 1], [0.0] * 3, [-1, -1, 0, 0, 0])
    second = Sample(
        [1, 2, 10, 11, 12, 5, 20, 21, 6, 30],
        5,
        [0, 1, 0, 0, 0],
        [0.0] * 5,  # over 5 20 21 6 30
        [-1, -1, 0, 0, 0, -1, 1, 1, -1, 2],
    )
    result = ReplayResult(
        samples=[first, second], turn_events={2: "zeroed_by_realign"}, prompt_events={1: "forked"}, failures={}
    )
    result.counters["drift_fork"] = 1
    return Session("s", turns), result


def test_turn_rows_count_trained_tokens_by_provenance():
    session, result = _replayed()
    assert trained_by_turn(result) == {0: 3, 1: 1}
    rows = turn_rows("tree", session, result, {0: ["Edit"], 1: ["Bash", "Read"]}, {0: 2, 1: 7, 2: 10})
    assert [
        (
            r["turn_index"],
            r["tool"],
            r["tool_names"],
            r["generated_tokens"],
            r["trained_tokens"],
            r["event"],
            r["prompt_event"],
            r["prompt_tokens"],
        )
        for r in rows
    ] == [
        (0, "Edit", ["Edit"], 3, 3, "trained", "clean", 2),
        (1, "Bash", ["Bash", "Read"], 2, 1, "partly_trained", "forked", 7),
        (2, "text", [], 1, 0, "zeroed_by_realign", "clean", 10),
    ]


def test_the_trained_once_check_returns_the_counts_the_rows_use():
    session, result = _replayed()
    trained = check_trained_once(session, result)
    assert trained == trained_by_turn(result) == {0: 3, 1: 1}
    rows = turn_rows("tree", session, result, {}, {}, trained)
    assert rows == turn_rows("tree", session, result, {}, {})
    assert session_row("tree", session, result, 0.5, trained) == session_row("tree", session, result, 0.5)


def test_session_row_forks_and_token_totals():
    session, result = _replayed()
    row = session_row("tree", session, result, elapsed_s=0.5)
    assert {
        k: row[k]
        for k in (
            "samples",
            "forks",
            "generated_tokens",
            "trained_tokens",
            "forwarded_tokens",
            "context_tokens",
            "reward",
            "drift_fork",
            "drift_clean",
        )
    } == {
        "samples": 2,
        "forks": 1,
        "generated_tokens": 6,
        "trained_tokens": 4,
        "forwarded_tokens": 15,
        "context_tokens": 11,
        "reward": 1.0,
        "drift_fork": 1,
        "drift_clean": 0,
    }


def test_turn_event_vocabulary():
    assert [
        turn_event(4, 4, None),
        turn_event(4, 2, "demoted_by_merge"),
        turn_event(4, 0, "demoted_by_merge"),
        turn_event(4, 0, None),
        turn_event(0, 0, None),
    ] == ["trained", "partly_trained", "demoted_by_merge", "untrained", "untrained"]


# -- the streaming end of a run: partial aggregates ---------------------------------------------------
def _run_tables(run: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(run / f"{name}.parquet") for name in ("turns", "sessions", "quarantine", "fidelity")}


def _loaded(summary: dict) -> SimpleNamespace:
    counts = {"session_count": summary["sessions_total"], "rows": summary["turns_total"]}
    return SimpleNamespace(**counts, vocab_checked=summary["vocab_checked"], data_warnings=summary["warnings"])


def test_a_run_read_in_small_batches_sums_to_its_tables_read_whole(sample_run):
    from trace_tools.report.aggregate import aggregate_run

    run, written = sample_run.run_dir, sample_run.summary
    strategies = list(written["strategies"])
    whole = summarize(_run_tables(run), _loaded(written), strategies)
    assert whole == {key: value for key, value in written.items() if key != "reconstruction"}
    for rows in (7, 100, 1000):  # batches cutting sessions anywhere: a session's rows wait for the next
        assert aggregate_run(run, rows).summary(_loaded(written), strategies) == whole


def test_partials_of_two_halves_of_a_run_merge_to_the_whole(sample_run):
    from trace_tools.report.aggregate import RunAggregate

    tables, written = _run_tables(sample_run.run_dir), sample_run.summary
    strategies = list(written["strategies"])
    ids = list(dict.fromkeys(tables["sessions"]["session_id"]))
    halves = []
    for part in (set(ids[: len(ids) // 2]), set(ids[len(ids) // 2 :])):
        partial = RunAggregate()
        partial.add_turns(tables["turns"][tables["turns"]["session_id"].isin(part)])
        partial.add_sessions(tables["sessions"][tables["sessions"]["session_id"].isin(part)])
        halves.append(partial)
    halves[0].add_quarantine(tables["quarantine"])
    halves[1].add_fidelity(tables["fidelity"])
    merged = halves[0].merge(halves[1]).summary(_loaded(written), strategies)
    assert merged == summarize(tables, _loaded(written), strategies)
    assert merged["strategies"]["tree"]["sessions"] == len(ids) > 1
