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
"""

from __future__ import annotations

import difflib
import operator
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from trace_tools.data import COUNTERS
from trace_tools.errors import MalformedRules

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
RULE_KEYS = {"metric", "strategy", "op", "value", "max_regression", "better", "name"}
# Every metric path summary.json can hold (DESIGN §6); `*` is one tool, event, reason or count.
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

    @property
    def is_regression(self) -> bool:
        return self.max_regression is not None


@dataclass
class RuleResult:
    rule: Rule
    strategy: str | None
    actual: float | None
    expected: str
    passed: bool
    message: str

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
    lines = _rule_lines(text)
    return [_rule(path, t, lines[i] if i < len(lines) else 0) for i, t in enumerate(tables)]


def _rule_lines(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), start=1) if line.strip().startswith("[[rule]]")]


def _rule(path: Path, table: dict[str, Any], line: int) -> Rule:
    where = f"{path}:{line}"
    unknown = set(table) - RULE_KEYS
    if unknown:
        raise MalformedRules(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(RULE_KEYS)}")
    if not isinstance(table.get("metric"), str) or not table["metric"]:
        raise MalformedRules(f'{where}: rule needs a `metric` string such as "coverage_by_tool.Edit"')
    rule = Rule(
        metric=table["metric"],
        line=line,
        strategy=table.get("strategy"),
        op=table.get("op"),
        value=table.get("value"),
        max_regression=table.get("max_regression"),
        better=table.get("better", "higher"),
        name=table.get("name"),
    )
    _check_metric(rule.metric, where)
    if rule.is_regression and (rule.value is not None or rule.op is not None):
        raise MalformedRules(
            f"{where}: a rule has either `op` and `value` (a threshold) or `max_regression` (against --baseline), "
            "not both; split it into two rules"
        )
    if rule.is_regression:
        if not _is_number(rule.max_regression) or rule.max_regression < 0:
            raise MalformedRules(f"{where}: max_regression must be a non-negative number")
        if rule.better not in ("higher", "lower"):
            raise MalformedRules(f'{where}: better must be "higher" or "lower"')
        return rule
    if rule.op not in OPS:
        raise MalformedRules(f"{where}: op must be one of {', '.join(OPS)} (got {rule.op!r})")
    if not _is_number(rule.value):
        raise MalformedRules(f"{where}: value must be a number (got {rule.value!r})")
    return rule


def _check_metric(metric: str, where: str) -> None:
    """A metric path summary.json can hold (a misspelling is a malformed file, not a failed rule)."""
    if any(_matches(metric, pattern) for pattern in (*STRATEGY_METRICS, *TOP_METRICS)):
        return
    known = [*STRATEGY_METRICS, *TOP_METRICS]
    close = difflib.get_close_matches(metric, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = [pattern for pattern in known if not pattern.startswith("counters.")] + ["counters.<counter>"]
    raise MalformedRules(
        f"{where}: unknown metric {metric!r}; {hint}metrics: {', '.join(shown)} (* = a tool, event or reason name)"
    )


def _matches(metric: str, pattern: str) -> bool:
    parts, wanted = metric.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(w == "*" or w == p for p, w in zip(parts, wanted))


def _check_strategy(rule: Rule, summary: dict[str, Any]) -> None:
    """A rule's strategy must have been replayed in the run (a misspelling is a malformed file)."""
    have = list(summary.get("strategies", {}))
    if rule.strategy is not None and rule.strategy not in have:
        close = difflib.get_close_matches(str(rule.strategy), have, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise MalformedRules(
            f"rule at line {rule.line}: strategy {rule.strategy!r} is not in this run; {hint}it has: {', '.join(have)}"
        )


def evaluate(rules: list[Rule], summary: dict[str, Any], baseline: dict[str, Any] | None = None) -> list[RuleResult]:
    results = []
    for rule in rules:
        _check_strategy(rule, summary)
        if rule.is_regression and baseline is None:
            raise MalformedRules(f"rule at line {rule.line} ({rule.metric}) uses max_regression; pass --baseline RUN")
        for strategy in _scopes(rule, summary):
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
    from trace_tools.io.rundir import load_summary

    rules = parse_rules(rules_path)
    baseline = load_summary(Path(baseline_run)) if baseline_run is not None else None
    return evaluate(rules, load_summary(Path(run)), baseline)


def junit_xml(results: list[RuleResult]) -> str:
    from xml.sax.saxutils import escape, quoteattr

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
