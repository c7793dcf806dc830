"""Regenerate the README's report.html screenshots (docs/img/report_overview.png, report_drift.png).

Replays the bundled sample_traces/ (or uses RUN), opens its report.html in headless Chromium
(`apt-get install chromium`) and captures the overview and the drift view of the claude-code
session whose Edit turn came back with `replace_all: false` filled in. The PNGs are reduced to
a 64-colour palette to keep the repository small.

    python docs/screenshots/make_screenshots.py [RUN]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

IMG = Path(__file__).resolve().parents[1] / "img"
DRIFT_SESSION, DRIFT_TURN = "sim-qwen3-s7-0001", 3
WIDTH = 1200


def make_screenshots(run: Path) -> list[Path]:
    from trace_tools.report.html import write_html_report
    from trace_tools.report.html.chromium import Chromium

    page = write_html_report(run)
    IMG.mkdir(parents=True, exist_ok=True)
    with Chromium(width=WIDTH, height=760) as browser:
        browser.open(page.as_uri(), ready="window.reportReady")
        overview = _small(browser.screenshot(IMG / "report_overview.png"))
        browser.evaluate(f"location.hash = '#/session/{DRIFT_SESSION}/drift/{DRIFT_TURN}'")
        browser.wait_for("!!document.querySelector('.drift-card.focus')")
        drift = _small(browser.screenshot(IMG / "report_drift.png", element=f"#drift-{DRIFT_TURN}"))
    return [overview, drift]


def _small(path: Path) -> Path:
    from PIL import Image

    Image.open(path).convert("RGB").quantize(colors=64, dither=Image.Dither.NONE).save(path, optimize=True)
    return path


def main() -> None:
    if len(sys.argv) > 1:
        paths = make_screenshots(Path(sys.argv[1]))
    else:
        from trace_tools.api import replay

        with tempfile.TemporaryDirectory() as tmp:
            paths = make_screenshots(replay(None, out=Path(tmp) / "sample").run_dir)
    for path in paths:
        print(f"{path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
