"""The overview's per-step curves: small multiples drawn as inline SVG from `summary["by_step"]`.

One panel per metric (coverage, coverage of the tools whose training users watch, samples and
forks per session), one line per strategy in a colour the legend above the panels names. A
point's `<title>` gives its exact value. A strategy with nothing to measure at a step (no Edit
turn there) has no point at it, and its line breaks rather than bridging the gap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

from trace_tools.report.palette import STRATEGY_COLOURS

COLOURS = STRATEGY_COLOURS  # the run's PNG plots use the same
WATCHED_TOOLS = ("Edit", "Write", "Bash")
WIDTH, HEIGHT = 330, 190
LEFT, RIGHT, TOP, BOTTOM = 44, 14, 10, 30  # the plot area's margins inside the viewBox
POINTS_UP_TO = 60  # steps beyond which markers would crowd the line: lines only


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    value: Callable[[dict[str, Any]], float | None]  # a strategy's block at one step -> its value
    percent: bool = False


def _coverage(s: dict[str, Any]) -> float | None:
    return s["coverage"] if s.get("generated_tokens") else None


def _tool_coverage(tool: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda s: (s.get("coverage_by_tool") or {}).get(tool)


def _per_session(s: dict[str, Any]) -> float | None:
    return s["samples"] / s["sessions"] if s.get("sessions") else None


def _forks(s: dict[str, Any]) -> float | None:
    return s["forks"]["mean"] if s.get("sessions") else None


PANELS = [
    Panel("coverage", "Coverage (trained / generated tokens)", _coverage, percent=True),
    *(
        Panel(f"coverage-{tool}", f"Coverage of {tool} turns", _tool_coverage(tool), percent=True)
        for tool in WATCHED_TOOLS
    ),
    Panel("samples", "Samples per session", _per_session),
    Panel("forks", "Forks per session", _forks),
]


def step_curves(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The curves section's content, or None when the run has no steps."""
    steps = summary.get("by_step") or []
    if not steps:
        return None
    strategies = list(summary["strategies"])
    colours = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(strategies)}
    panels = []
    for panel in PANELS:
        lines = {name: _series(steps, name, panel.value) for name in strategies}
        if any(value is not None for line in lines.values() for _, value in line):
            panels.append({"key": panel.key, "title": panel.title, "svg": _svg(panel, lines, colours)})
    return {
        "panels": panels,
        "legend": [{"name": name, "colour": colours[name]} for name in strategies],
        "steps": len(steps),
        "first": steps[0]["step"],
        "last": steps[-1]["step"],
        "without_step": int(summary.get("sessions_without_step") or 0),
    }


def _series(steps: list[dict[str, Any]], name: str, value: Callable) -> list[tuple[int, float | None]]:
    out = []
    for block in steps:
        strategy = block["strategies"].get(name)
        out.append((block["step"], value(strategy) if strategy else None))
    return out


# ---- drawing ----


def _svg(panel: Panel, lines: dict[str, list[tuple[int, float | None]]], colours: dict[str, str]) -> Markup:
    xs = [step for line in lines.values() for step, _ in line]
    ys = [value for line in lines.values() for _, value in line if value is not None]
    first, last = min(xs), max(xs)
    # The x axis spans exactly the run's steps (its ticks fall inside); y rounds out to its ticks.
    x_ticks = [tick for tick in nice_ticks(first, last) if first <= tick <= last] if last > first else [float(first)]
    y_ticks = nice_ticks(min(ys), max(ys), floor=0.0 if panel.percent else None)
    to_x = (
        _scale(first - 0.5, last + 0.5, LEFT, WIDTH - RIGHT)
        if last == first
        else _scale(first, last, LEFT, WIDTH - RIGHT)
    )
    to_y = _scale(y_ticks[0], y_ticks[-1], HEIGHT - BOTTOM, TOP)
    fmt = _percent if panel.percent else _number
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(panel.title)} by step, one line per strategy">'
    ]
    for tick in y_ticks:
        y = to_y(tick)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class="tick" x="{LEFT - 5}" y="{y + 3.5:.1f}" text-anchor="end">{fmt(tick, y_ticks)}</text>'
        )
    for tick in x_ticks:
        x = to_x(tick)
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle">'
            f"{_number(tick, x_ticks)}</text>"
        )
    parts.append(f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 3}" text-anchor="end">step</text>')
    markers = len({step for step in xs}) <= POINTS_UP_TO
    for name, line in lines.items():
        parts.append(f'<g class="line" data-strategy="{escape(name)}" style="--c:{colours[name]}">')
        for segment in _segments(line):
            points = " ".join(f"{to_x(step):.1f},{to_y(value):.1f}" for step, value in segment)
            parts.append(f'<polyline points="{points}"/>')
        if markers:
            for step, value in line:
                if value is not None:
                    parts.append(
                        f'<circle cx="{to_x(step):.1f}" cy="{to_y(value):.1f}" r="2.6" data-step="{step}" '
                        f'data-value="{value!r}"><title>{escape(name)} · step {step}: {fmt(value, None)}</title>'
                        "</circle>"
                    )
        parts.append("</g>")
    parts.append("</svg>")
    return Markup("".join(parts))


def _segments(line: list[tuple[int, float | None]]) -> list[list[tuple[int, float]]]:
    """The runs of consecutive steps that have a value (a missing step breaks the line)."""
    segments: list[list[tuple[int, float]]] = [[]]
    for step, value in line:
        if value is None:
            segments.append([])
        else:
            segments[-1].append((step, value))
    return [segment for segment in segments if segment]


def nice_ticks(lo: float, hi: float, floor: float | None = None, target: int = 4) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]; a flat range is
    widened around its value (not below `floor`)."""
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
        if floor is not None:
            lo = max(lo, floor)
    raw = (hi - lo) / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks = [first]
    while ticks[-1] < hi - 1e-9 * step:
        ticks.append(ticks[-1] + step)
    return [round(tick, 12) for tick in ticks]


def _scale(lo: float, hi: float, out_lo: float, out_hi: float) -> Callable[[float], float]:
    span = (hi - lo) or 1.0
    return lambda value: out_lo + (value - lo) / span * (out_hi - out_lo)


def _decimals(ticks: list[float] | None, factor: float = 1.0) -> int:
    """The fewest decimals that tell the ticks apart (a point's own value: three significant places)."""
    if ticks is None or len(ticks) < 2:
        return 2
    step = abs(ticks[1] - ticks[0]) * factor
    return max(0, -math.floor(math.log10(step) + 1e-9)) if step else 0


def _percent(value: float, ticks: list[float] | None) -> str:
    return f"{100 * value:.{_decimals(ticks, 100) if ticks else 1}f}%"


def _number(value: float, ticks: list[float] | None) -> str:
    return f"{value:,.{_decimals(ticks)}f}"
