"""report.html's per-step curves: drawn from `by_step` (each point the step's value, a line broken
where a strategy had nothing to measure), absent without steps, and readable in Chromium at
1,400 and 800 px (no sideways scrolling; the legend picks out a strategy's line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from step_runs import stepped_run
from trace_tools.report.html.chromium import Chromium
from trace_tools.report.html.curves import PANELS, WATCHED_TOOLS, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"  # html5lib puts inline SVG elements in their own namespace


@pytest.fixture(scope="module")
def stepped(tmp_path_factory) -> Path:
    return stepped_run(tmp_path_factory.mktemp("curves") / "run", sessions_per_step=2)


@pytest.fixture(scope="module")
def tree(stepped):
    import html5lib

    page = (stepped / "report.html").read_text()
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(page)


def _expected(summary: dict, panel_key: str, strategy: str) -> list[tuple[int, float | None]]:
    """A strategy's values per step for a panel, read from by_step independently of the drawing code."""
    out = []
    for block in summary["by_step"]:
        s = block["strategies"][strategy]
        if panel_key == "coverage":
            value = s["coverage"] if s["generated_tokens"] else None
        elif panel_key.startswith("coverage-"):
            value = s["coverage_by_tool"].get(panel_key.removeprefix("coverage-"))
        elif panel_key == "samples":
            value = s["samples"] / s["sessions"] if s["sessions"] else None
        else:
            value = s["forks"]["mean"] if s["sessions"] else None
        out.append((block["step"], value))
    return out


def test_every_point_is_its_steps_value(stepped, tree):
    summary = json.loads((stepped / "summary.json").read_text())
    figures = {fig.get("id"): fig for fig in tree.iter("figure") if (fig.get("id") or "").startswith("curve-")}
    assert set(figures) == {f"curve-{p.key}" for p in PANELS}  # every tool watched has turns in this dump
    for key, figure in figures.items():
        lines = list(figure.iter(SVG + "g"))
        assert [g.get("data-strategy") for g in lines] == list(summary["strategies"]), key
        for line in lines:
            strategy = line.get("data-strategy")
            drawn = [(int(c.get("data-step")), float(c.get("data-value"))) for c in line.iter(SVG + "circle")]
            expected = _expected(summary, key.removeprefix("curve-"), strategy)
            assert drawn == [(step, value) for step, value in expected if value is not None], (key, strategy)
            # one polyline per unbroken run of steps with a value
            runs = sum(
                1 for i, (_, v) in enumerate(expected) if v is not None and (i == 0 or expected[i - 1][1] is None)
            )
            assert len(list(line.iter(SVG + "polyline"))) == runs, (key, strategy)
    assert any(v is None for _, v in _expected(summary, "coverage-Write", "tree")), "the sample has steps without Write"


def test_the_legend_names_every_strategy_in_its_line_colour(stepped, tree):
    summary = json.loads((stepped / "summary.json").read_text())
    legend = {li.get("data-strategy"): li.get("style") for li in tree.iter("li") if li.get("data-strategy")}
    assert list(legend) == list(summary["strategies"])
    lines = {g.get("data-strategy"): g.get("style") for g in tree.iter(SVG + "g") if g.get("data-strategy")}
    assert lines == legend and len(set(legend.values())) == len(legend)


def test_a_run_without_steps_has_no_curves(sample_run):
    page = (sample_run.run_dir / "report.html").read_text()
    assert 'id="over-training"' not in page and "<svg" not in page


@pytest.mark.parametrize(
    "lo, hi, floor", [(0.0, 70.0, None), (0.12, 0.97, 0.0), (0.5, 0.5, 0.0), (3.0, 3.0, None), (0.0, 0.0, 0.0)]
)
def test_ticks_are_round_and_cover_the_range(lo, hi, floor):
    ticks = nice_ticks(lo, hi, floor=floor)
    gaps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
    assert len(ticks) >= 2 and len(gaps) == 1
    gap = gaps.pop()
    assert f"{gap:.0e}"[0] in "125"  # 1, 2 or 5 times a power of ten
    assert ticks[0] <= lo and ticks[-1] >= hi and (floor is None or ticks[0] >= floor)


@pytest.fixture(scope="module", params=[1400, 800])
def sized_browser(chromium_binary, request):
    with Chromium(chromium_binary, width=request.param, height=900) as chromium:
        yield chromium


def test_curves_fit_the_window_and_the_legend_picks_a_line(sized_browser, stepped, tmp_path):
    browser = sized_browser
    browser.open((stepped / "report.html").as_uri(), ready="window.reportReady")
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    boxes = browser.evaluate(
        "[...document.querySelectorAll('.curves figure')].map(f => { const r = f.getBoundingClientRect(); return [r.left, r.right, r.top, r.width]; })"
    )
    assert len(boxes) == 3 + len(WATCHED_TOOLS)
    assert all(right <= browser.width and width >= 300 for _, right, _, width in boxes)
    assert len({top for _, _, top, _ in boxes[:2]}) == 1, "two panels side by side even at 800 px"
    browser.evaluate("document.getElementById('over-training').scrollIntoView()")
    x, y = browser.evaluate(
        "(() => { const r = document.querySelector('.curve-legend li[data-strategy=\"session-v1\"]').getBoundingClientRect();"
        " return [r.x + 5, r.y + r.height / 2]; })()"
    )
    browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    picked = browser.evaluate("[...document.querySelectorAll('.curves .line.picked')].map(g => g.dataset.strategy)")
    assert picked and set(picked) == {"session-v1"}
    faded = browser.evaluate("getComputedStyle(document.querySelector('.curves .line:not(.picked)')).opacity")
    assert float(faded) < 0.5
    shot = browser.screenshot(tmp_path / f"curves-{browser.width}.png", element=".curves")
    from PIL import Image

    assert len(Image.open(shot).convert("RGB").getcolors(1 << 20) or []) > 50
    assert browser.console_errors() == []
