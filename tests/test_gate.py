"""`trace-tools gate`: pass, fail, baseline regression and malformed rules, with exact exit codes."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app

runner = CliRunner()


def _rules(tmp_path, text: str):
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return path


def _gate(*args):
    return runner.invoke(app, ["gate", *map(str, args)])


def test_all_rules_pass_exit_0(sample_run, tmp_path):
    coverage = sample_run.summary["strategies"]["tree"]["coverage"]
    rules = _rules(
        tmp_path,
        f"""
[[rule]]
metric = "quarantined"
op = "=="
value = 0

[[rule]]
metric = "coverage"
strategy = "tree"
op = ">="
value = {coverage - 1e-9}
""",
    )
    result = _gate(sample_run.run_dir, "--rules", rules)
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "FAIL" not in result.output


def test_failing_rule_exit_1_and_junit(sample_run, tmp_path):
    rules = _rules(
        tmp_path,
        """
[[rule]]
metric = "coverage_by_tool.Edit"
strategy = "tree"
op = ">="
value = 1.01
""",
    )
    junit = tmp_path / "gate.xml"
    result = _gate(sample_run.run_dir, "--rules", rules, "--junit", junit)
    assert result.exit_code == 1, result.output
    xml = junit.read_text()
    assert 'failures="1"' in xml and "tree.coverage_by_tool.Edit" in xml


def test_rule_without_strategy_checks_every_strategy(sample_run, tmp_path):
    rules = _rules(tmp_path, '[[rule]]\nmetric = "samples"\nop = ">"\nvalue = 0\n')
    result = runner.invoke(app, ["gate", str(sample_run.run_dir), "--rules", str(rules), "--json"])
    assert result.exit_code == 0, result.output
    checked = {r["strategy"] for r in json.loads(result.output)}
    assert checked == set(sample_run.summary["strategies"])


def test_baseline_regression_detected(sample_run, tmp_path):
    baseline = tmp_path / "baseline"
    shutil.copytree(sample_run.run_dir, baseline)
    summary = json.loads((baseline / "summary.json").read_text())
    current = summary["strategies"]["tree"]["coverage"]
    summary["strategies"]["tree"]["coverage"] = current + 0.10  # the baseline trained 10 points more
    (baseline / "summary.json").write_text(json.dumps(summary))
    rules = _rules(
        tmp_path,
        """
[[rule]]
metric = "coverage"
strategy = "tree"
max_regression = 0.05
""",
    )
    failed = _gate(sample_run.run_dir, "--rules", rules, "--baseline", baseline, "--json")
    assert failed.exit_code == 1 and json.loads(failed.output)[0]["message"].endswith("worse by 0.1")
    loose = _rules(tmp_path, '[[rule]]\nmetric = "coverage"\nstrategy = "tree"\nmax_regression = 0.2\n')
    assert _gate(sample_run.run_dir, "--rules", loose, "--baseline", baseline).exit_code == 0
    improved = _gate(baseline, "--rules", loose, "--baseline", sample_run.run_dir, "--json")
    assert improved.exit_code == 0 and json.loads(improved.output)[0]["message"].endswith("better by 0.1")


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[[rule]]\nmetric = "coverage"\nop = "=>"\nvalue = 1\n', "rules.toml:3: op must be"),
        ('[[rule]]\nmetric = "coverage"\nop = ">="\nvalue = 1\n\n[[rule]]\nop = ">="\nvalue = 1\n', "rules.toml:6"),
        # TOML allows spaces inside the header and a comment after it; the line is the key's, not the header's
        (
            '# gates\n\n[[rule]] # all\nmetric = "coverage"\nop = ">="\nvalue = 0\n\n  [[ rule ]]\nmetric = "coverage"\n\n'
            'op = ">="\nvalue = "x"\n',
            "rules.toml:12: value must be a number",
        ),
        ('[[rule]]\nmetric = "coverage"\nop = ">="\nvalue = "high"\n', "value must be a number"),
        ("[[rule\nmetric = 1\n", "line 1"),
        ('title = "no rules"\n', "no [[rule]] tables"),
        ('[[rule]]\nmetric = "coverage"\nop = ">="\nvalue = 1\nthreshold = 3\n', "unknown key"),
        (
            '[[rule]]\nmetric = "coverge"\nop = ">="\nvalue = 0.5\n',
            "unknown metric 'coverge' (did you mean 'coverage'?)",
        ),
        ('[[rule]]\nmetric = "coverage_by_tool.Edit.share"\nop = ">="\nvalue = 0.5\n', "rules.toml:2: unknown metric"),
        (
            '[[rule]]\nmetric = "coverage"\nstrategy = "chekpoint-tree"\nop = ">="\nvalue = 0.5\n',
            "rules.toml:3: strategy 'chekpoint-tree' is not in this run (did you mean 'checkpoint-tree'?)",
        ),
        # a misspelt tool is a broken rules file (exit 2, closest names), not a regression (exit 1)
        (
            '[[rule]]\nmetric = "coverage_by_tool.Edt"\nstrategy = "tree"\nop = ">="\nvalue = 0.5\n',
            "rules.toml:2: no turn of this run calls tool 'Edt' (did you mean 'Edit'?)",
        ),
        (
            '[[rule]]\nmetric = "tool_turns.bash.dropped_turns"\nop = "<="\nvalue = 3\n',
            "tool 'bash' (did you mean 'Bash'?)",
        ),
    ],
)
def test_malformed_rules_exit_2_naming_the_line(sample_run, tmp_path, text, needle):
    result = _gate(sample_run.run_dir, "--rules", _rules(tmp_path, text))
    assert result.exit_code == 2
    assert needle in result.output


def test_regression_rule_without_baseline_is_a_usage_error(sample_run, tmp_path):
    rules = _rules(tmp_path, '[[rule]]\nmetric = "coverage"\nmax_regression = 0.1\n')
    result = _gate(sample_run.run_dir, "--rules", rules)
    assert result.exit_code == 2 and "--baseline" in result.output


def test_example_rules_file_is_valid():
    from pathlib import Path

    from trace_tools.report.gate import parse_rules

    rules = parse_rules(Path(__file__).parents[1] / "docs" / "gate-rules.example.toml")
    assert any(r.is_regression for r in rules) and any(r.metric == "coverage_by_tool.Edit" for r in rules)
