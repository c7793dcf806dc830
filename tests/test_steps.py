"""Runs over training steps: `simulate --steps`, per-step rows and summaries, `compare --by step`,
trend rules in `gate`, and the API's per-step frames, checked against the simulator's ground truth."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.simulate import StepSchedule, simulate, step_truth

runner = CliRunner()
GROWTH_STEPS, GROWTH_SESSIONS = 5, 20  # 4 sessions a step; json-reserialize in 0, 1, 2, 3, 4 of them
CHANGE_STEPS, CHANGE_AT = 6, 3  # claude-code from step 3 on, nothing growing


def _replay(dump, out, strategies):
    from trace_tools.api import replay

    return replay(dump, out=out, strategies=strategies, workers=1)


@pytest.fixture(scope="module")
def growth(tmp_path_factory):
    """(dump table, run) of a run whose share of re-serializing harnesses grows linearly over 5 steps."""
    root = tmp_path_factory.mktemp("growth")
    schedule = StepSchedule(GROWTH_STEPS, growth="json-reserialize", change=None)
    table = simulate(
        GROWTH_SESSIONS, seed=5, behaviours=["byte-exact"], max_turns=6, steps=schedule, out=str(root / "d.parquet")
    )
    return table, _replay(root / "d.parquet", root / "run", ["tree", "checkpoint-tree"])


@pytest.fixture(scope="module")
def change(tmp_path_factory):
    """(dump table, run) of a run whose harness turns into Claude Code at step 3 of 6."""
    root = tmp_path_factory.mktemp("change")
    schedule = StepSchedule(CHANGE_STEPS, growth=None, change="claude-code", change_at=CHANGE_AT)
    table = simulate(12, seed=2, behaviours=["byte-exact"], max_turns=10, steps=schedule, out=str(root / "d.parquet"))
    return table, _replay(root / "d.parquet", root / "run", ["tree"])


def _sessions_by_step(table):
    """{step: [(session_id, behaviours)]} from the dump's rows."""
    out: dict[int, dict[str, list[str]]] = {}
    for session, step, meta in zip(*(table.column(c).to_pylist() for c in ("session_id", "step", "metadata"))):
        out.setdefault(step, {})[session] = json.loads(meta)["behaviours"]
    return {step: sorted(sessions.items()) for step, sessions in out.items()}


# -- the simulator -----------------------------------------------------------------------------
def test_simulated_steps_follow_the_schedule_and_record_its_ground_truth(growth):
    table, _ = growth
    truth = step_truth(table)
    by_step = _sessions_by_step(table)
    assert [t["step"] for t in truth] == sorted(by_step) == list(range(GROWTH_STEPS))
    for item in truth:
        sessions = by_step[item["step"]]
        grown = [s for s, behaviours in sessions if "json-reserialize" in behaviours]
        assert item["sessions"] == len(sessions) == 4
        assert item["growth_sessions"] == len(grown) == item["step"]  # share step/4 of 4 sessions
        assert item["growth_share"] == pytest.approx(item["step"] / (GROWTH_STEPS - 1))
        assert all(b == ["byte-exact"] for s, b in sessions if s not in grown)  # a rewrite replaces byte-exact
    versions = set(zip(table.column("step").to_pylist(), table.column("weight_version").to_pylist()))
    assert versions == {(step, f"v{step}") for step in range(GROWTH_STEPS)}


def test_a_change_lands_at_its_step(change):
    table, _ = change
    for step, sessions in _sessions_by_step(table).items():
        assert all(("claude-code" in behaviours) == (step >= CHANGE_AT) for _, behaviours in sessions)
    assert [t["changed"] for t in step_truth(table)] == [s >= CHANGE_AT for s in range(CHANGE_STEPS)]


def test_without_steps_a_dump_has_no_step_and_no_step_truth():
    table = simulate(2, seed=1, max_turns=4)
    assert table.column("step").null_count == table.num_rows and step_truth(table) == []
    assert "schedule" not in json.loads(table.schema.metadata[b"trace_tools.simulator"])


def test_simulate_cli_steps_and_its_usage_errors(tmp_path):
    out = tmp_path / "s.parquet"
    ok = runner.invoke(app, ["simulate", "--sessions", "3", "--steps", "3", "--max-turns", "4", "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert pq.read_table(out, columns=["step"]).column("step").to_pylist().count(None) == 0
    alone = runner.invoke(app, ["simulate", "--sessions", "2", "--change-at", "1", "--out", str(out)])
    assert alone.exit_code == 2 and "--change-at needs --steps" in alone.output
    wrong = runner.invoke(app, ["simulate", "--steps", "2", "--growth", "retry", "--out", str(out)])
    assert wrong.exit_code == 2 and "--growth takes an echo behaviour" in wrong.output


# -- per-step rows and summaries ---------------------------------------------------------------
def test_every_run_row_carries_its_sessions_step(growth):
    from trace_tools.api import open_run

    table, result = growth
    step_of = dict(zip(table.column("session_id").to_pylist(), table.column("step").to_pylist()))
    run = open_run(result.run_dir)
    for frame in (run.turns, run.sessions, run.samples):
        assert len(frame) and all(step_of[s] == step for s, step in zip(frame["session_id"], frame["step"]))


def test_per_step_drift_follows_the_growing_rewrite_share(growth):
    """Each step's drifted sessions under `tree` are exactly the sessions the simulator gave a
    re-serializing harness, and tree's coverage falls where checkpoint-tree's stays whole."""
    from trace_tools.api import open_run

    table, result = growth
    truth = {t["step"]: t for t in step_truth(table)}
    summary = result.summary
    assert [item["step"] for item in summary["by_step"]] == list(range(GROWTH_STEPS))
    assert summary["sessions_without_step"] == 0
    turns = open_run(result.run_dir).turns
    tree = turns[turns["strategy"] == "tree"]
    for item in summary["by_step"]:
        step = item["step"]
        drifted = tree[(tree["step"] == step) & tree["drift_cause"].notna()]["session_id"].nunique()
        assert drifted == truth[step]["growth_sessions"] == step
        assert item["sessions_replayed"] == truth[step]["sessions"]
        causes = item["drift_causes"].get("tree", {})
        assert sum(v["turns"] for v in causes.values()) == len(
            tree[(tree["step"] == step) & tree["drift_cause"].notna()]
        )
        assert (item["strategies"]["tree"]["coverage"] < 1.0) == (step > 0)
        assert item["strategies"]["checkpoint-tree"]["coverage"] == 1.0
    coverages = [item["strategies"]["tree"]["coverage"] for item in summary["by_step"]]
    assert coverages[0] == 1.0 and coverages[-1] == min(coverages)


def test_a_step_block_has_the_shape_of_the_top_level(growth):
    _, result = growth
    summary = result.summary
    for item in summary["by_step"]:
        assert set(item) == {
            "step",
            "sessions_replayed",
            "turns_replayed",
            "strategies",
            "token_savings",
            "drift_causes",
        }
        for name, block in item["strategies"].items():
            assert set(block) == set(summary["strategies"][name])
        assert set(item["token_savings"]) == set(summary["token_savings"])
    for key in ("sessions_replayed", "turns_replayed"):
        assert sum(item[key] for item in summary["by_step"]) == summary[key]
    for name in ("tree", "checkpoint-tree"):
        steps = [item["strategies"][name] for item in summary["by_step"]]
        for metric in ("samples", "trained_tokens", "generated_tokens", "forwarded_tokens"):
            assert sum(s[metric] for s in steps) == summary["strategies"][name][metric]


def test_sessions_without_a_step_are_counted_beside_the_steps(growth):
    from trace_tools.api import open_run
    from trace_tools.report.metrics import step_summaries

    _, result = growth
    run = open_run(result.run_dir)
    orphan = run.sessions["session_id"].iloc[0]
    sessions = run.sessions.assign(step=run.sessions["step"].where(run.sessions["session_id"] != orphan))
    turns = run.turns.assign(step=run.turns["step"].where(run.turns["session_id"] != orphan))
    out = step_summaries(turns, sessions, ["tree", "checkpoint-tree"])
    assert out["sessions_without_step"] == 1
    assert sum(item["sessions_replayed"] for item in out["by_step"]) == GROWTH_SESSIONS - 1


def test_a_dump_without_steps_has_no_by_step_and_the_same_summary(sample_run):
    from trace_tools.api import open_run
    from trace_tools.io.rundir import read_table
    from trace_tools.report.metrics import summarize

    summary = sample_run.summary
    assert "by_step" not in summary and "sessions_without_step" not in summary
    run = open_run(sample_run.run_dir)
    assert run.turns["step"].isna().all() and run.sessions["step"].isna().all() and run.samples["step"].isna().all()
    assert "## Per step" not in (sample_run.run_dir / "report.md").read_text()
    tables = {name: getattr(run, name) for name in ("turns", "sessions", "quarantine")}
    tables["fidelity"] = read_table(sample_run.run_dir, "fidelity")
    loaded = _Loaded(summary)
    with_column = summarize(tables, loaded, run.strategies)
    without = summarize(
        {k: v.drop(columns=["step"], errors="ignore") for k, v in tables.items()}, loaded, run.strategies
    )
    assert with_column == without and with_column["strategies"] == summary["strategies"]


class _Loaded:
    """What `summarize` reads of a loaded dump, taken from a finished summary."""

    def __init__(self, summary):
        self.session_count, self.rows = summary["sessions_total"], summary["turns_total"]
        self.vocab_checked, self.data_warnings = summary["vocab_checked"], summary["warnings"]


def test_report_md_has_a_per_step_table(growth):
    _, result = growth
    text = (result.run_dir / "report.md").read_text()
    section = text.split("## Per step", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == list(range(GROWTH_STEPS))
    assert rows[0].split("|")[5].strip() == "100.0% (0.00)"  # tree at step 0: byte-exact, nothing lost


# -- the API -----------------------------------------------------------------------------------
def test_api_per_step_frames(change):
    from trace_tools.api import open_run

    _, result = change
    run = open_run(result.run_dir)
    edit = run.step_metric("coverage_by_tool.Edit")["tree"]
    assert list(edit.index) == list(range(CHANGE_STEPS))
    assert (edit[edit.index < CHANGE_AT] == 1.0).all() and (edit[edit.index >= CHANGE_AT] < 0.95).all()
    table = run.by_step()
    assert (
        table.loc[(CHANGE_AT, "tree"), "coverage"]
        == result.summary["by_step"][CHANGE_AT]["strategies"]["tree"]["coverage"]
    )
    causes = run.drift_causes_by_step().reset_index()
    assert set(causes["step"]) == set(range(CHANGE_AT, CHANGE_STEPS))
    assert run.has_steps


def test_api_per_step_frames_refuse_a_run_without_steps(sample_run):
    from trace_tools.api import open_run
    from trace_tools.errors import UsageError

    run = open_run(sample_run.run_dir)
    with pytest.raises(UsageError, match="has no steps"):
        run.by_step()


# -- compare --by step -------------------------------------------------------------------------
def test_compare_by_step_names_the_step_two_strategies_diverge(growth, sample_run):
    _, result = growth
    out = runner.invoke(app, ["compare", str(result.run_dir), "-s", "tree", "-s", "checkpoint-tree", "--by", "step"])
    assert out.exit_code == 0, out.output
    assert "first differ at step 1" in out.output
    data = json.loads(
        runner.invoke(
            app, ["compare", str(result.run_dir), "-s", "tree", "-s", "checkpoint-tree", "--by", "step", "--json"]
        ).output
    )
    coverage = {r["step"]: r["delta"] for r in data["steps"] if r["metric"] == "coverage"}
    expected = {
        item["step"]: item["strategies"]["checkpoint-tree"]["coverage"] - item["strategies"]["tree"]["coverage"]
        for item in result.summary["by_step"]
    }
    assert coverage == pytest.approx(expected)
    refused = runner.invoke(app, ["compare", str(sample_run.run_dir), "-s", "tree", "-s", "linear", "--by", "step"])
    assert refused.exit_code == 2 and "has no steps" in refused.output


# -- trend rules -------------------------------------------------------------------------------
def _gate(tmp_path, run_dir, rules: str, *extra):
    path = tmp_path / "rules.toml"
    path.write_text(rules)
    return runner.invoke(app, ["gate", str(run_dir), "--rules", str(path), *extra])


TREND = """
[[rule]]
metric = "coverage_by_tool.Edit"
strategy = "tree"
max_change = 0.05
window = 0.2
"""
EACH_STEP = """
[[rule]]
metric = "coverage_by_tool.Edit"
strategy = "tree"
each_step = true
op = ">="
value = 0.95
"""


def test_a_trend_rule_fails_and_names_the_step_edit_coverage_drops(change, tmp_path):
    _, result = change
    out = _gate(tmp_path, result.run_dir, TREND + EACH_STEP, "--json")
    assert out.exit_code == 1, out.output
    trend, each = json.loads(out.output)
    after = list(range(CHANGE_AT, CHANGE_STEPS))
    assert not trend["passed"] and trend["steps"] == after and f"step {CHANGE_AT} (" in trend["message"]
    assert not each["passed"] and each["steps"] == after
    table = _gate(tmp_path, result.run_dir, TREND)
    assert "FAIL" in table.output and f"step {CHANGE_AT}" in table.output


def test_a_trend_rule_passes_where_coverage_holds(growth, tmp_path):
    _, result = growth
    rules = TREND.replace('"tree"', '"checkpoint-tree"') + EACH_STEP.replace('"tree"', '"checkpoint-tree"')
    out = _gate(tmp_path, result.run_dir, rules)
    assert out.exit_code == 0, out.output


def test_a_trend_rule_on_a_run_without_steps_fails_saying_why(sample_run, tmp_path):
    out = _gate(tmp_path, sample_run.run_dir, TREND, "--json")
    assert out.exit_code == 1 and "has no steps" in json.loads(out.output)[0]["message"]


@pytest.mark.parametrize(
    "rules, message",
    [
        (TREND + "op = '>='\n", "a trend rule has `max_change`"),
        (TREND.replace("window = 0.2", "window = 0.9"), "window must be a share"),
        (TREND.replace("max_change = 0.05", "max_change = -1"), "max_change must be a non-negative"),
        (EACH_STEP.replace("each_step = true", "each_step = 'yes'"), "each_step must be true or false"),
        (TREND.replace("coverage_by_tool.Edit", "quarantined"), "not measured per step"),
    ],
)
def test_malformed_trend_rules_name_the_line(growth, tmp_path, rules, message):
    _, result = growth
    out = _gate(tmp_path, result.run_dir, rules)
    assert out.exit_code == 2 and message in out.output, out.output
