"""The verdict a replay opens with: what each upstream system trains on this dump, which tool's
turns lose the most and why, and per cause what fixes it (docs/commands.md#the-verdict).

Every number comes from the run's summary (`summary.json`): per strategy its coverage, its coverage
by tool and its tokens lost per drift cause. Nothing is canned: a cause no strategy loses tokens to
is not named, and a fix is named only when a replayed strategy lost fewer of that cause's tokens.
`gateway` (slime, miles, agentcore, uni-agent) narrows it to that system: what it does now, and
what to switch on.
"""

from __future__ import annotations

from typing import Any

from trace_tools.errors import UnknownName
from trace_tools.strategies.declarations import BY_NAME

GATEWAYS = tuple(dict.fromkeys(d.upstream_system for d in BY_NAME.values() if d.upstream_system))
TOP_CAUSES = 3


def _system(name: str) -> str | None:
    declaration = BY_NAME.get(name)
    return declaration.upstream_system if declaration else None


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def check_gateway(gateway: str | None) -> None:
    if gateway is not None and gateway not in GATEWAYS:
        raise UnknownName("gateway", gateway, GATEWAYS)


def verdict_lines(summary: dict[str, Any], gateway: str | None = None) -> list[str]:
    """The headline, one sentence a line (empty for a run with no strategy of a known system)."""
    check_gateway(gateway)
    strategies = summary.get("strategies") or {}
    ran = [name for name in strategies if _system(name) and (gateway is None or _system(name) == gateway)]
    if not ran:
        return []
    lines = [_trains_line(system, strategies, ran) for system in dict.fromkeys(_system(n) for n in ran)]
    base = ran[0]  # the system's first strategy in column order: what it runs by default
    lines += _loss_lines(summary, base)
    return lines


def _trains_line(system: str | None, strategies: dict[str, Any], ran: list[str]) -> str:
    parts = [f"{name} {_pct(strategies[name]['coverage'])}" for name in ran if _system(name) == system]
    return f"{system} trains, of the generated tokens here: {', '.join(parts)}."


def _loss_lines(summary: dict[str, Any], base: str) -> list[str]:
    """Which tool loses most under `base`, its top causes, and per cause the strategy that loses least."""
    stats = summary["strategies"][base]
    tools = {
        tool: t for tool, t in (stats.get("tool_turns") or {}).items() if t["generated_tokens"] > t["trained_tokens"]
    }
    causes = (summary.get("drift_causes") or {}).get(base) or {}
    lost = sorted(((c["tokens_lost"], cause) for cause, c in causes.items() if c["tokens_lost"]), reverse=True)
    if not tools and not lost:
        return [f"{base} loses no generated token here."]
    lines = []
    if tools:
        tool, t = max(tools.items(), key=lambda item: item[1]["generated_tokens"] - item[1]["trained_tokens"])
        share = 1 - t["trained_tokens"] / t["generated_tokens"]
        lines.append(
            f"Under {base}, {tool} turns lose the most tokens: {_pct(share)} of their "
            f"{t['generated_tokens']:,} generated tokens ({t['dropped_turns']} of {t['turns']} turns untrained)."
        )
    if lost:
        named = ", ".join(f"{cause} ({tokens:,} tokens)" for tokens, cause in lost[:TOP_CAUSES])
        lines.append(f"Top drift causes of the lost tokens under {base}: {named}.")
    lines += [_fix_line(summary, base, cause, tokens) for tokens, cause in lost[:TOP_CAUSES]]
    return lines


def _fix_line(summary: dict[str, Any], base: str, cause: str, base_lost: int) -> str:
    """The replayed strategies that lose fewer of `cause`'s tokens than `base`, best first (the
    same system's first, as a setting to switch on), with the share of `base`'s loss they recover."""
    by_strategy = summary.get("drift_causes") or {}
    better = []
    for name, causes in by_strategy.items():
        lost = (causes.get(cause) or {}).get("tokens_lost", base_lost)
        if name != base and lost < base_lost:
            better.append((_system(name) != _system(base), lost, name))
    if not better:
        return f"  {cause}: no replayed strategy loses fewer of these tokens than {base}."
    fixes = []
    for _, lost, name in sorted(better)[:2]:
        system = f" ({_system(name)})" if _system(name) else ""
        fixes.append(f"{name}{system} recovers {_pct((base_lost - lost) / base_lost)}")
    return f"  {cause}: {'; '.join(fixes)} of the tokens {base} loses to it."


def upstream_lines(summary: dict[str, Any]) -> list[str]:
    """The one-line notes every view prints: lenient renders, and strategies failing most requests."""
    lines = []
    for s in summary.get("strategies", {}).values():
        if "lenient_render" in s:
            lines.append(s["lenient_render"]["label"])
        headline = (s.get("upstream_failures") or {}).get("headline")
        if headline:
            lines.append(headline)
    return lines
