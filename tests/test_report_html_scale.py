"""report.html for a 10,000-session run stays lazy: a small index, compressed per-session chunks
decoded only when a session is opened, and a bounded DOM. The load time is measured and printed
(`-s` shows it; docs/report_html.md records it), not asserted: timings on shared CI are noise."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from trace_tools.report.html import write_html_report
from trace_tools.report.html.chromium import Chromium
from trace_tools.report.html.sessions import MAX_SESSIONS
from trace_tools.strategies.declarations import NAMES

SESSIONS = 10_000
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
pytestmark = pytest.mark.slow


def _bench():
    spec = importlib.util.spec_from_file_location("bench_report_html", BENCHMARKS / "bench_report_html.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def large_page(tmp_path_factory) -> Path:
    run = _bench().synthetic_run(tmp_path_factory.mktemp("large") / "run", SESSIONS)
    return write_html_report(run)


def test_large_report_is_an_index_plus_compressed_chunks(large_page):
    text = large_page.read_text()
    index = json.loads(re.search(r'id="report-index">(.*?)</script>', text, re.DOTALL).group(1))
    chunks = re.findall(r'id="chunk-(\d+)">([^<]*)</script>', text)
    assert len(index["sessions"]) == MAX_SESSIONS < SESSIONS  # the worst sessions only, never every row
    assert f"The {MAX_SESSIONS} sessions of {SESSIONS:,} that lose the most generated tokens" in text
    assert len(chunks) > 1 and max(len(c) for _, c in chunks) < 400_000
    assert {e[5] for e in index["sessions"]} == {int(k) for k, _ in chunks}  # every session points at a chunk
    size = large_page.stat().st_size
    print(
        f"\n{SESSIONS:,}-session report.html: {size / 1e6:.1f} MB, index {len(json.dumps(index)) / 1e6:.2f} MB, "
        f"{len(chunks)} chunks"
    )
    assert len(json.dumps(index)) < size / 4  # the part parsed at load is a small share of the file


def test_large_report_loads_lazily_in_chromium(large_page, chromium_binary):
    with Chromium(chromium_binary) as browser:
        seconds = browser.open(large_page.as_uri(), ready="window.reportReady")
        assert browser.evaluate("window.reportState.decodedChunks()") == 0
        assert browser.evaluate("document.querySelectorAll('#session-rows tr').length") == 100
        assert f"of {MAX_SESSIONS} sessions" in browser.evaluate("document.getElementById('session-count').textContent")
        elements = browser.evaluate("document.getElementsByTagName('*').length")
        assert elements < 20_000  # the overview plus one page of rows, not 10,000 sessions
        last = browser.evaluate("JSON.parse(document.getElementById('report-index').textContent).sessions.at(-1)[0]")
        browser.evaluate(f"location.hash = '#/session/{last}'")
        browser.wait_for(f"document.getElementById('session-body').dataset.session === '{last}'")
        assert browser.evaluate("window.reportState.decodedChunks()") == 1
        assert browser.evaluate("document.querySelectorAll('table.timeline tbody tr').length") == len(
            NAMES
        )  # one per strategy
        assert browser.console_errors() == []
    print(f"\nloaded in {seconds:.2f} s (navigation to drawn overview and session list), {elements:,} DOM elements")
