"""The lines `audit-samples` prints (report.md's section: `report.samples_audit`)."""

from __future__ import annotations

from typing import Any

from trace_tools.report.samples_audit import comparison_lines


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
