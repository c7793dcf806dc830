"""Issue 40: the verdict a replay opens with, checked against the run's own numbers on the bundled
sample, in the terminal, report.md and report.html (screenshots at 1,400 and 800 px)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.errors import UnknownName
from trace_tools.report.html.chromium import Chromium
from trace_tools.report.verdict import GATEWAYS, verdict_lines
from trace_tools.strategies.declarations import BY_NAME


@pytest.fixture(scope="module")
def summary(sample_run) -> dict:
    return json.loads((sample_run.run_dir / "summary.json").read_text())


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def test_each_system_line_names_its_strategies_and_their_coverage(summary):
    lines = verdict_lines(summary)
    for system in GATEWAYS:
        ran = [n for n in summary["strategies"] if BY_NAME[n].upstream_system == system]
        [line] = [line for line in lines if line.startswith(f"{system} trains")]
        for name in ran:
            assert f"{name} {_pct(summary['strategies'][name]['coverage'])}" in line


def test_the_worst_tool_and_the_top_causes_are_the_runs(summary):
    lines = verdict_lines(summary, "slime")
    assert not any(line.startswith(("miles", "agentcore")) for line in lines)  # narrowed to the gateway
    tools = summary["strategies"]["tree"]["tool_turns"]
    worst = max(tools, key=lambda tool: tools[tool]["generated_tokens"] - tools[tool]["trained_tokens"])
    lost = 1 - tools[worst]["trained_tokens"] / tools[worst]["generated_tokens"]
    assert f"Under tree, {worst} turns lose the most tokens: {_pct(lost)}" in "\n".join(lines)
    causes = summary["drift_causes"]["tree"]
    top = sorted(causes, key=lambda cause: -causes[cause]["tokens_lost"])[:3]
    [cause_line] = [line for line in lines if line.startswith("Top drift causes")]
    assert [c for c in re.findall(r"(\w+) \([\d,]+ tokens\)", cause_line)] == top
    fixes = [line.strip() for line in lines if line.startswith("  ")]
    assert [fix.split(":")[0] for fix in fixes] == top
    for cause, fix in zip(top, fixes):
        name, share = re.match(r"\w+: ([\w+-]+) \(\w[\w-]*\) recovers ([\d.]+)%", fix).groups()
        base, other = causes[cause]["tokens_lost"], summary["drift_causes"][name][cause]["tokens_lost"]
        assert share == f"{100 * (base - other) / base:.1f}"
        if BY_NAME[name].upstream_system == "slime":  # the same system's fix comes first: a setting to switch on
            assert name in ("echo-restore", "continuation")


def test_an_unknown_gateway_is_refused_with_suggestions(summary):
    with pytest.raises(UnknownName, match="did you mean 'slime'"):
        verdict_lines(summary, "slim")
    result = CliRunner().invoke(app, ["report", "nowhere", "--gateway", "slim"])
    assert result.exit_code == 2 and "did you mean 'slime'" in result.output


def test_the_terminal_and_report_md_open_with_the_verdict(sample_run, summary):
    result = CliRunner().invoke(app, ["report", str(sample_run.run_dir), "--gateway", "miles"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines() if line.strip()]
    assert lines[0] == "Verdict" and lines[1] == verdict_lines(summary, "miles")[0]
    report = (sample_run.run_dir / "report.md").read_text()
    assert report.split("\n## ")[1].startswith("Verdict") and verdict_lines(summary)[0] in report


@pytest.mark.parametrize("width", [1400, 800])
def test_report_html_shows_the_verdict_first_within_the_page(chromium_binary, sample_run, summary, width, tmp_path):
    with Chromium(chromium_binary, width=width, height=900) as browser:
        browser.open((sample_run.run_dir / "report.html").as_uri(), ready="window.reportReady")
        items = browser.evaluate("[...document.querySelectorAll('.verdict li')].map(li => li.innerText)")
        assert items == [line.strip() for line in verdict_lines(summary)]
        box = browser.evaluate(
            "(() => { const r = document.querySelector('.verdict').getBoundingClientRect(); return [r.top, r.right]; })()"
        )
        assert box[0] < 200 and box[1] <= width  # it opens the page, and never runs off its side
        assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        browser.screenshot(tmp_path / f"verdict-{width}.png")
        assert browser.console_errors() == []
