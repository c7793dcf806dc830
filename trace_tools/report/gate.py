"""Regression gates over summary.json: threshold rules and maximum regressions against a baseline.

Rules file (TOML), one `[[rule]]` table per rule:

    [[rule]]
    metric = "coverage_by_tool.Edit"   # dotted path into a strategy's block, or a top-level key
    strategy = "tree"                  # optional; without it the rule applies to every strategy
    op = ">="                          # >=, >, <=, <, ==
    value = 0.95

    [[rule]]
    metric = "coverage"
    strategy = "linear"
    max_regression = 0.02              # needs --baseline RUN; fails when the metric got worse by more
    better = "higher"                  # which direction is better (default "higher")

Trend rules read a run's steps (`by_step` in summary.json, a dump with a step column):

    [[rule]]
    metric = "coverage_by_tool.Edit"
    strategy = "checkpoint-tree"
    max_change = 0.05                  # the last `window` of steps against the first: worse by at most this
    window = 0.1                       # share of the steps at each end (default 0.1, at least one step)

    [[rule]]
    metric = "coverage"
    strategy = "tree"
    each_step = true                   # the threshold holds at every step
    op = ">="
    value = 0.9

Either names the failing steps.
"""

from __future__ import annotations

import operator
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeGuard
from xml.sax.saxutils import escape, quoteattr

from trace_tools.data import COUNTERS
from trace_tools.errors import MalformedRules, did_you_mean
from trace_tools.io.rundir import MISMATCH_METRICS, load_summary

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}
TOP_LEVEL = (
    "quarantined",
    "sessions_total",
    "turns_total",
    "sessions_replayed",
    "turns_replayed",
    "prompt_fidelity",
    "quarantined_by_reason",
    "warnings",
)
RULE_KEYS = {
    "metric",
    "strategy",
    "op",
    "value",
    "max_regression",
    "better",
    "name",
    "max_change",
    "window",
    "each_step",
}
DEFAULT_WINDOW = 0.1
STEP_TOP_LEVEL = ("sessions_replayed", "turns_replayed")  # the top-level metrics a step's block holds
# Every metric path summary.json can hold (docs/run_directory.md#what-the-files-hold); `*` is one
# tool, event, reason or count.
STRATEGY_METRICS = (
    "sessions",
    "samples",
    "generated_tokens",
    "trained_tokens",
    "forwarded_tokens",
    "context_tokens",
    "coverage",
    "forks.total",
    "forks.mean",
    "forks.max",
    *(f"counters.{name}" for name in COUNTERS),
    "coverage_by_tool.*",
    *(f"tool_turns.*.{field}" for field in ("turns", "dropped_turns", "generated_tokens", "trained_tokens")),
    "turn_events.*",
    "prompt_events.*",
    "samples_per_session.*",
    "upstream_failures.requests",
    "upstream_failures.failed",
    "lenient_render.requests",
    # an `audit-samples` run's strategy, `trainer` (docs/trainer_dumps.md#audit-samples)
    "reemitted_tokens",
    "one_sample_tokens",
    "trained_tokens_by_tool.*",
    "loss_mask_rules.*.checked",
    "loss_mask_rules.*.violations",
)
# Each strategy's "mismatch" block, written by `rescore RUN --samples` (docs/rescore_samples.md):
# the counts, then the metrics under the names rescore writes.
MISMATCH_KEYS = ("tokens", "sequences", *MISMATCH_METRICS)
MISMATCH_GROUPS = ("by_behaviour", "by_tool", "by_drift_cause", "by_context", "by_step")
CORRECTION_KEYS = ("masked_fraction", "clipped_fraction", "turns_losing_all_gradient")
STRATEGY_METRICS += (
    *(f"mismatch.{key}" for key in MISMATCH_KEYS),
    *(f"mismatch.{group}.*.{key}" for group in MISMATCH_GROUPS for key in MISMATCH_KEYS),
    *(f"mismatch.corrections.*.{key}" for key in CORRECTION_KEYS),
    *(
        f"mismatch.corrections.*.{group}.*.{key}"
        for group in ("by_tool", "by_drift_cause")
        for key in CORRECTION_KEYS[:2]
    ),
)
TOP_METRICS = (
    "quarantined",
    "sessions_total",
    "turns_total",
    "sessions_replayed",
    "turns_replayed",
    "prompt_fidelity.turns_compared",
    "prompt_fidelity.exact",
    "prompt_fidelity.rate",
    "quarantined_by_reason.*",
    "warnings.*",
)


@dataclass
class Rule:
    metric: str
    line: int
    strategy: str | None = None
    op: str | None = None
    value: float | None = None
    max_regression: float | None = None
    better: str = "higher"
    name: str | None = None
    path: str = "rules"  # the file and the lines its errors name
    strategy_line: int = 0
    metric_line: int = 0
    max_change: float | None = None
    window: float = DEFAULT_WINDOW
    each_step: bool = False

    @property
    def is_regression(self) -> bool:
        return self.max_regression is not None

    @property
    def is_trend(self) -> bool:
        return self.max_change is not None


@dataclass
class RuleResult:
    rule: Rule
    strategy: str | None
    actual: float | None
    expected: str
    passed: bool
    message: str
    steps: list[int] = field(default_factory=list)  # the failing steps of a per-step or trend rule

    @property
    def label(self) -> str:
        scope = f"{self.strategy}." if self.strategy else ""
        return self.rule.name or f"{scope}{self.rule.metric}"


def parse_rules(path: str | Path) -> list[Rule]:
    """Parse and check a rules file; every problem raises MalformedRules naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MalformedRules(f"cannot read rules file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise MalformedRules(
            f"{path} is not UTF-8 text (byte {exc.start}); save the rules file as UTF-8 TOML"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MalformedRules(f"{path}: {exc}") from None
    except RecursionError:
        raise MalformedRules(
            f"{path}: values nested too deeply for a rules file; see `trace-tools gate --help`"
        ) from None
    tables = data.get("rule")
    if not isinstance(tables, list) or not tables or not all(isinstance(table, dict) for table in tables):
        raise MalformedRules(f"{path}: no [[rule]] tables found; see `trace-tools gate --help` for the format")
    blocks = _rule_blocks(text)
    return [_rule(path, t, blocks[i] if i < len(blocks) else {}) for i, t in enumerate(tables)]


RULE_HEADER = re.compile(r"\s*\[\[\s*(?:rule|\"rule\"|'rule')\s*\]\]")
TABLE_HEADER = re.compile(r"\s*\[")
KEY_LINE = re.compile(r"\s*[\"']?([A-Za-z0-9_-]+)[\"']?\s*=")


def _rule_blocks(text: str) -> list[dict[str, int]]:
    """Per `[[rule]]` table, in order: the line of its header (key "") and of each of its keys,
    so an error names the line to edit (TOML allows `[[ rule ]]` and a comment after it)."""
    blocks: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for n, line in enumerate(text.splitlines(), start=1):
        if RULE_HEADER.match(line):
            current = {"": n}
            blocks.append(current)
        elif TABLE_HEADER.match(line):
            current = None  # another table: its keys are not the rule's
        elif current is not None and (key := KEY_LINE.match(line)):
            current.setdefault(key.group(1), n)
    return blocks


def _rule(path: Path, table: dict[str, Any], lines: dict[str, int]) -> Rule:
    header = lines.get("", 0)

    def where(key: str = "") -> str:
        return f"{path}:{lines.get(key, header)}"

    unknown = set(table) - RULE_KEYS
    if unknown:
        first = min(unknown, key=lambda key: lines.get(key, header))
        raise MalformedRules(f"{where(first)}: unknown key(s) {sorted(unknown)}; allowed: {sorted(RULE_KEYS)}")
    if not isinstance(table.get("metric"), str) or not table["metric"]:
        raise MalformedRules(f'{where("metric")}: rule needs a `metric` string such as "coverage_by_tool.Edit"')
    rule = Rule(
        metric=table["metric"],
        line=header,
        strategy=table.get("strategy"),
        op=table.get("op"),
        value=table.get("value"),
        max_regression=table.get("max_regression"),
        better=table.get("better", "higher"),
        name=table.get("name"),
        path=str(path),
        strategy_line=lines.get("strategy", header),
        metric_line=lines.get("metric", header),
        max_change=table.get("max_change"),
        window=table.get("window", DEFAULT_WINDOW),
        each_step=table.get("each_step", False),
    )
    _check_metric(rule.metric, where("metric"))
    if rule.is_trend or rule.each_step:
        _check_step_rule(rule, where)
    if rule.is_trend:
        return rule
    if rule.is_regression and (rule.value is not None or rule.op is not None):
        raise MalformedRules(
            f"{where()}: a rule has either `op` and `value` (a threshold) or `max_regression` (against --baseline), "
            "not both; split it into two rules"
        )
    if rule.is_regression:
        if not _is_number(rule.max_regression) or rule.max_regression < 0:
            raise MalformedRules(f"{where('max_regression')}: max_regression must be a non-negative number")
        if rule.better not in ("higher", "lower"):
            raise MalformedRules(f'{where("better")}: better must be "higher" or "lower"')
        return rule
    if rule.op not in OPS:
        raise MalformedRules(f"{where('op')}: op must be one of {', '.join(OPS)} (got {rule.op!r})")
    if not _is_number(rule.value):
        raise MalformedRules(f"{where('value')}: value must be a number (got {rule.value!r})")
    return rule


def _check_step_rule(rule: Rule, where: Callable[..., str]) -> None:
    """A trend rule has `max_change` (and maybe `window`), a per-step rule `each_step` with a threshold."""
    if not isinstance(rule.each_step, bool):
        raise MalformedRules(f"{where('each_step')}: each_step must be true or false")
    if rule.is_trend and (rule.each_step or rule.is_regression or rule.op is not None or rule.value is not None):
        raise MalformedRules(
            f"{where()}: a trend rule has `max_change` (and `window`) only, not `op`/`value`, `each_step` or "
            "`max_regression`; split it into two rules"
        )
    if rule.is_trend and (not _is_number(rule.max_change) or rule.max_change < 0):
        raise MalformedRules(f"{where('max_change')}: max_change must be a non-negative number")
    if not _is_number(rule.window) or not 0 < rule.window <= 0.5:
        raise MalformedRules(f"{where('window')}: window must be a share of the steps in (0, 0.5], e.g. 0.1")
    if rule.is_trend and rule.better not in ("higher", "lower"):
        raise MalformedRules(f'{where("better")}: better must be "higher" or "lower"')
    if rule.each_step and rule.is_regression:
        raise MalformedRules(f"{where()}: each_step takes `op` and `value`, not max_regression")
    head = rule.metric.split(".")[0]
    if head in TOP_LEVEL and head not in STEP_TOP_LEVEL:
        raise MalformedRules(
            f"{where('metric')}: {rule.metric} is not measured per step; per-step top-level metrics: "
            f"{', '.join(STEP_TOP_LEVEL)}, or any strategy metric"
        )


def _check_metric(metric: str, where: str) -> None:
    """A metric path summary.json can hold (a misspelling is a malformed file, not a failed rule)."""
    if any(_matches(metric, pattern) for pattern in (*STRATEGY_METRICS, *TOP_METRICS)):
        return
    known = [*STRATEGY_METRICS, *TOP_METRICS]
    hint = did_you_mean(metric, known)
    shown = [pattern for pattern in known if not pattern.startswith("counters.")] + ["counters.<counter>"]
    raise MalformedRules(
        f"{where}: unknown metric {metric!r}{hint}; metrics: {', '.join(shown)} (* = a tool, event or reason name)"
    )


def _matches(metric: str, pattern: str) -> bool:
    parts, wanted = metric.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(w == "*" or w == p for p, w in zip(parts, wanted))


def _check_strategy(rule: Rule, summary: dict[str, Any]) -> None:
    """A rule's strategy must have been replayed in the run (a misspelling is a malformed file)."""
    have = list(summary.get("strategies", {}))
    if rule.strategy is not None and rule.strategy not in have:
        hint = did_you_mean(rule.strategy, have)
        raise MalformedRules(
            f"{rule.path}:{rule.strategy_line}: strategy {rule.strategy!r} is not in this run{hint}; "
            f"it has: {', '.join(have)}"
        )


TOOL_METRICS = ("coverage_by_tool", "tool_turns")


def _check_tool(rule: Rule, *summaries: dict[str, Any] | None) -> None:
    """A tool a rule names must have turns in the run or its baseline: a misspelt tool is a
    malformed file (exit 2 with the closest names), not a failed rule that reads as a regression."""
    head, _, rest = rule.metric.partition(".")
    if head not in TOOL_METRICS:
        return
    tool = rest.split(".")[0]
    tools = sorted(
        {
            name
            for summary in summaries
            if summary
            for block in summary.get("strategies", {}).values()
            for name in block.get("tool_turns", {})
        }
    )
    if tool not in tools:
        raise MalformedRules(
            f"{rule.path}:{rule.metric_line}: no turn of this run calls tool {tool!r}{did_you_mean(tool, tools)}; "
            f"its tools: {', '.join(tools) or 'none'} (names are case-sensitive)"
        )


def evaluate(rules: list[Rule], summary: dict[str, Any], baseline: dict[str, Any] | None = None) -> list[RuleResult]:
    results = []
    for rule in rules:
        _check_strategy(rule, summary)
        _check_tool(rule, summary, baseline)
        if rule.is_regression and baseline is None:
            raise MalformedRules(
                f"{rule.path}:{rule.line}: rule {rule.metric} uses max_regression; pass --baseline RUN"
            )
        for strategy in _scopes(rule, summary):
            if rule.is_trend or rule.each_step:
                results.append(_check_steps(rule, strategy, summary.get("by_step") or []))
            else:
                results.append(_check(rule, strategy, summary, baseline))
    return results


def _scopes(rule: Rule, summary: dict[str, Any]) -> list[str | None]:
    if rule.metric.split(".")[0] in TOP_LEVEL:
        return [None]
    if rule.strategy is not None:
        return [rule.strategy]
    return list(summary.get("strategies", {}))


def _check(rule: Rule, strategy: str | None, summary: dict, baseline: dict | None) -> RuleResult:
    actual = lookup(summary, rule.metric, strategy)
    if actual is None:
        return RuleResult(rule, strategy, None, "present", False, f"{rule.metric} is not in this run")
    if rule.max_regression is None:  # a threshold rule
        assert rule.op is not None and rule.value is not None, "parse_rules gives a threshold rule op and value"
        ok = OPS[rule.op](actual, rule.value)
        return RuleResult(rule, strategy, actual, f"{rule.op} {rule.value:g}", ok, "")
    base = lookup(baseline, rule.metric, strategy)
    if base is None:
        return RuleResult(rule, strategy, actual, "baseline", False, f"{rule.metric} is not in the baseline run")
    worse_by = (base - actual) if rule.better == "higher" else (actual - base)
    ok = worse_by <= rule.max_regression + 1e-12
    higher = rule.better == "higher"
    expected = f"{'≥' if higher else '≤'} {base:g} {'-' if higher else '+'} {rule.max_regression:g}"
    change = f"worse by {worse_by:g}" if worse_by > 0 else f"better by {-worse_by:g}" if worse_by < 0 else "unchanged"
    return RuleResult(rule, strategy, actual, expected, ok, f"baseline {base:g}, {change}")


def _check_steps(rule: Rule, strategy: str | None, by_step: list[dict[str, Any]]) -> RuleResult:
    """A per-step threshold or a trend over the run's steps; the failing steps named."""
    series = [(item["step"], lookup(item, rule.metric, strategy)) for item in by_step]
    points = [(step, value) for step, value in series if value is not None]
    if not points:
        why = "this run has no steps (replay a dump with a step column)" if not by_step else "no step measures it"
        return RuleResult(rule, strategy, None, "per step", False, f"{rule.metric}: {why}")
    if rule.each_step:
        return _each_step(rule, strategy, points)
    return _trend(rule, strategy, points)


def _each_step(rule: Rule, strategy: str | None, points: list[tuple[int, float]]) -> RuleResult:
    assert rule.op is not None and rule.value is not None, "parse_rules gives a per-step rule op and value"
    failing = [(step, value) for step, value in points if not OPS[rule.op](value, rule.value)]
    worst = min(points, key=lambda p: p[1]) if rule.op in (">=", ">") else max(points, key=lambda p: p[1])
    shown = worst if not failing else failing[0]
    message = f"fails at {_steps_text(failing)}" if failing else f"{len(points)} steps"
    return RuleResult(
        rule,
        strategy,
        shown[1],
        f"{rule.op} {rule.value:g} at every step",
        not failing,
        message,
        [s for s, _ in failing],
    )


def _trend(rule: Rule, strategy: str | None, points: list[tuple[int, float]]) -> RuleResult:
    """The mean of the last `window` of steps against the mean of the first: worse by at most
    `max_change`. Failing steps: every step worse than the first window's mean by more than it."""
    assert rule.max_change is not None, "a trend rule has max_change"
    size = max(1, round(rule.window * len(points)))
    first, last = points[:size], points[-size:]
    start, end = _mean(first), _mean(last)
    higher = rule.better == "higher"
    worse = (lambda v: start - v) if higher else (lambda v: v - start)
    failing = [step for step, value in points if worse(value) > rule.max_change + 1e-12]
    ok = worse(end) <= rule.max_change + 1e-12
    expected = f"{'≥' if higher else '≤'} {start:g} {'-' if higher else '+'} {rule.max_change:g}"
    message = f"{_span(first)}: {start:.4g} → {_span(last)}: {end:.4g}"
    if failing:
        message += f"; beyond the bound at {_steps_text([(s, dict(points)[s]) for s in failing])}"
    return RuleResult(rule, strategy, end, expected, ok, message, failing if not ok else [])


def _mean(points: list[tuple[int, float]]) -> float:
    return sum(value for _, value in points) / len(points)


def _span(points: list[tuple[int, float]]) -> str:
    return f"step {points[0][0]}" if len(points) == 1 else f"steps {points[0][0]}–{points[-1][0]}"


def _steps_text(points: list[tuple[int, float]], shown: int = 8) -> str:
    """`step 3 (0.41), step 4 (0.38), … (12 steps)`: the failing steps a user reads first."""
    text = ", ".join(f"step {step} ({value:.4g})" for step, value in points[:shown])
    return text + (f", … ({len(points)} steps)" if len(points) > shown else "")


def lookup(summary: dict[str, Any] | None, metric: str, strategy: str | None) -> float | None:
    """Follow a dotted path in the strategy's block (or from the top level); numbers only."""
    node: Any = summary or {}
    if strategy is not None:
        node = node.get("strategies", {}).get(strategy)
    for key in metric.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if _is_number(node) else None


def _is_number(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def gate(run: str | Path, rules_path: str | Path, baseline_run: str | Path | None = None) -> list[RuleResult]:
    """Evaluate a rules file against a finished run (and optionally a baseline run)."""

    rules = parse_rules(rules_path)
    baseline = load_summary(baseline_run) if baseline_run is not None else None
    return evaluate(rules, load_summary(run), baseline)


def junit_xml(results: list[RuleResult]) -> str:
    failures = sum(not r.passed for r in results)
    lines = [
        '<?xml version="1.0" encoding="utf-8"?>',
        f'<testsuite name="trace-tools gate" tests="{len(results)}" failures="{failures}">',
    ]
    for r in results:
        lines.append(f'  <testcase classname="trace-tools.gate" name={quoteattr(r.label)}>')
        if not r.passed:
            text = f"actual {r.actual} expected {r.expected} {r.message}".strip()
            lines.append(f"    <failure message={quoteattr(text)}>{escape(text)}</failure>")
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"
