"""The `audit-samples` part of a run's report.md (a run whose summary.json has an `audit` block)."""

from __future__ import annotations

from typing import Any

from trace_tools.report.escape import markdown_cell

_COLUMNS = ("samples", "sessions", "forwarded_tokens", "trained_tokens", "reemitted_tokens", "one_sample_tokens")


def audit_markdown(audit: dict[str, Any]) -> str:
    lines = ["## Trainer samples: per rollout step", ""]
    lines += ["| step | " + " | ".join(c.replace("_", " ") for c in _COLUMNS) + " |", "|---|" + "---:|" * len(_COLUMNS)]
    for step, totals in [*audit["steps"].items(), ("all", audit["run"])]:
        lines.append(f"| {step} | " + " | ".join(str(totals[c]) for c in _COLUMNS) + " |")
    lines += ["", "## Loss-mask rules", "", "| rule | checked | violations | first example |", "|---|---:|---:|---|"]
    for name, rule in audit["rules"].items():
        example = markdown_cell(rule["examples"][0][:160]) if rule["examples"] else ""
        lines.append(f"| `{name}` | {rule['checked']} | {rule['violations']} | {example} |")
    lines += ["", *(f"- {note['what']}: {note['count']}" for note in audit["notes"].values())]
    lines += ["", "## Trained tokens by tool (first tool call of each trained span)", ""]
    lines += [f"- {tool}: {tokens}" for tool, tokens in audit["run"]["trained_tokens_by_tool"].items()]
    comparison = audit.get("comparison")
    if comparison:
        lines += ["", f"## The trainer's samples against `{comparison['strategy']}` on the per-call dump", ""]
        lines += [f"- {markdown_cell(line)}" for line in comparison_lines(comparison)]
    return "\n".join(lines) + "\n"


def comparison_lines(comparison: dict[str, Any]) -> list[str]:
    name = comparison["strategy"]
    verdict = "equal" if comparison["equal"] else "NOT equal"
    lines = [
        f"against {name}: {verdict}: {comparison['equal_samples']} of {comparison['strategy_samples']} "
        f"{name} samples equal, token by token, in {comparison['sessions']} sessions; "
        f"{comparison['differing_samples']} differ, {comparison['missing_samples']} missing from the trainer's, "
        f"{comparison['extra_samples']} only in the trainer's"
    ]
    first = comparison.get("first_difference")
    if first:
        lines.append(f"  first difference: {first['text']}")
    return lines
