"""The audit in words: report.md's audit section and the lines `audit-samples` prints."""

from __future__ import annotations

from typing import Any

_COLUMNS = ("samples", "sessions", "forwarded_tokens", "trained_tokens", "reemitted_tokens", "one_sample_tokens")


def audit_markdown(audit: dict[str, Any]) -> str:
    lines = ["## Trainer samples: per rollout step", ""]
    lines += ["| step | " + " | ".join(c.replace("_", " ") for c in _COLUMNS) + " |", "|---|" + "---:|" * len(_COLUMNS)]
    for step, totals in [*audit["steps"].items(), ("all", audit["run"])]:
        lines.append(f"| {step} | " + " | ".join(str(totals[c]) for c in _COLUMNS) + " |")
    lines += ["", "## Loss-mask rules", "", "| rule | checked | violations | first example |", "|---|---:|---:|---|"]
    for name, rule in audit["rules"].items():
        example = _cell(rule["examples"][0]) if rule["examples"] else ""
        lines.append(f"| `{name}` | {rule['checked']} | {rule['violations']} | {example} |")
    lines += ["", *(f"- {note['what']}: {note['count']}" for note in audit["notes"].values())]
    lines += ["", "## Trained tokens by tool (first tool call of each trained span)", ""]
    lines += [f"- {tool}: {tokens}" for tool, tokens in audit["run"]["trained_tokens_by_tool"].items()]
    comparison = audit.get("comparison")
    if comparison:
        lines += ["", f"## The trainer's samples against `{comparison['strategy']}` on the per-call dump", ""]
        lines += [f"- {line}" for line in comparison_lines(comparison)]
    return "\n".join(lines) + "\n"


def audit_lines(result: dict[str, Any]) -> list[str]:
    """What the command prints: totals, one line per step, the rules, the comparison."""
    run = result["run"]
    lines = [
        f"samples: {run['samples']} in {run['sessions']} sessions ({run['samples_per_session']:.2f} per session); "
        f"forwarded {run['forwarded_tokens']} tokens, trained {run['trained_tokens']}, "
        f"re-emitted {run['reemitted_tokens']} (one sample per session would forward {run['one_sample_tokens']})",
    ]
    for step, totals in result["steps"].items():
        lines.append(
            f"  step {step}: {totals['samples']} samples, {totals['sessions']} sessions, "
            f"forwarded {totals['forwarded_tokens']}, trained {totals['trained_tokens']}, "
            f"re-emitted {totals['reemitted_tokens']}"
        )
    by_tool = ", ".join(f"{tool} {tokens}" for tool, tokens in run["trained_tokens_by_tool"].items())
    lines.append(f"trained tokens by tool: {by_tool or 'none'}")
    for name, rule in result["rules"].items():
        mark = "ok  " if not rule["violations"] else "FAIL"
        lines.append(f"{mark} {name}: {rule['violations']} of {rule['checked']} ({rule['what']})")
        lines += [f"       e.g. {example}" for example in rule["examples"]]
    lines += [f"     {note['what']}: {note['count']}" for note in result["notes"].values() if note["count"]]
    if result["quarantined_samples"]:
        lines.append(f"set aside: {result['quarantined_samples']} samples (quarantine.parquet says why)")
    if result.get("comparison"):
        lines += comparison_lines(result["comparison"])
    if result.get("run_dir"):
        lines.append(f"run directory: {result['run_dir']}")
    return lines


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


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "\\n")[:160]
