"""report.html on the replayed bundled sample: contents, faithfulness to the run tables, and the
page itself in headless Chromium (DOM text, a highlighted drift token, a non-blank screenshot,
internal links and ids)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.io.rundir import DRIFT_SCHEMA
from trace_tools.io.sample_parts import read_samples
from trace_tools.report.html import write_html_report
from trace_tools.report.html.chromium import Chromium
from trace_tools.report.html.sessions import iter_chunk_sessions

SCHEMA_DEFAULT_SESSION, SCHEMA_DEFAULT_TURN = "sim-qwen3-s7-0001", 3  # claude-code fills Edit's replace_all


@pytest.fixture(scope="module")
def run(sample_run) -> Path:
    return sample_run.run_dir


@pytest.fixture(scope="module")
def page(run) -> str:
    return (run / "report.html").read_text()


@pytest.fixture(scope="module")
def details(page) -> dict:
    """Every session's embedded details, decoded as the page decodes them."""
    out = {}
    for chunk in re.findall(r'<script type="application/octet-stream" id="chunk-\d+">([^<]+)</script>', page):
        out.update(iter_chunk_sessions(chunk.strip()))
    return out


@pytest.fixture(scope="module")
def browser(chromium_binary):
    with Chromium(chromium_binary) as chromium:
        yield chromium


@pytest.fixture(scope="module")
def quarantined_run(tmp_path_factory) -> Path:
    """Three sample sessions replayed through `tree`, two of them spoiled: bad JSON and short logprobs."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from trace_tools.api import replay
    from trace_tools.replay.engine import default_dump

    table = pq.read_table(default_dump() / "qwen3.parquet")
    keep = ["sim-qwen3-s7-0000", "sim-qwen3-s7-0001", "sim-qwen3-s7-0002"]
    table = table.filter(pc.is_in(table["session_id"], pa.array(keep)))
    messages, logprobs = table["messages"].to_pylist(), table["output_logprobs"].to_pylist()
    sessions = table["session_id"].to_pylist()
    messages[sessions.index(keep[1]) + 1] = '[{"role": "user"'
    logprobs[sessions.index(keep[2])] = logprobs[sessions.index(keep[2])][:-1]
    table = table.set_column(table.schema.get_field_index("messages"), "messages", pa.array(messages))
    table = table.set_column(
        table.schema.get_field_index("output_logprobs"),
        "output_logprobs",
        pa.array(logprobs, table.schema.field("output_logprobs").type),
    )
    dump = tmp_path_factory.mktemp("spoiled") / "dump.parquet"
    pq.write_table(table, dump)
    return replay(dump, out=dump.parent / "run", strategies=["tree"]).run_dir


@pytest.fixture(scope="module")
def old_run(run, tmp_path_factory) -> Path:
    """The sample run as an older trace-tools wrote it: no drift.parquet, no samples, no report.html."""
    copy = tmp_path_factory.mktemp("old") / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("shards", "drift.parquet", "samples", "report.html"))
    return copy


def test_replay_writes_a_self_contained_report(run, page):
    assert (run / "report.html").is_file()
    external = re.findall(r'(?:src|href)="(?!data:|#)([^"]*)"', page)
    assert external == [], f"report.html must not load anything: {external[:5]}"
    assert "http://" not in page and "https://" not in page
    images = re.findall(r'<img src="data:image/png;base64,', page)
    assert len(images) == len(list((run / "plots").glob("*.png"))) > 0


def test_the_page_written_with_the_bars_gathered_during_replay_equals_one_built_from_the_run(
    simulated_dump, tmp_path, monkeypatch
):
    """Replay gathers the sample bars as it writes the samples; the page built from them is the
    page `trace-tools report` builds from the finished run, which reads the samples back. A
    resumed run whose sample parts are reused as they are reads them back too."""
    from trace_tools.api import replay
    from trace_tools.report.html import render_html, sessions

    real, reads = sessions.sample_bars, []
    monkeypatch.setattr(sessions, "sample_bars", lambda *args: reads.append(1) or real(*args))
    out = tmp_path / "run"
    replay(simulated_dump, out=out, strategies=["tree", "linear", "session-v2"], workers=1)
    assert reads == []  # gathered, not read back
    assert (out / "report.html").read_text() == render_html(out)
    assert reads == [1]
    (out / "summary.json").unlink()
    replay(simulated_dump, out=out, strategies=["tree", "linear", "session-v2"], workers=1)
    assert reads == [1, 1]
    assert (out / "report.html").read_text() == render_html(out)


def test_the_page_templates_compile_once_and_later_processes_load_their_code(run, tmp_path, monkeypatch):
    """The page's templates are compiled into trace-tools' cache once; a process that finds their
    code there compiles nothing and writes the same page."""
    import jinja2

    import trace_tools.report.html as html

    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path / "cache"))
    compiled: list[str] = []
    real_compile = jinja2.Environment.compile
    monkeypatch.setattr(
        jinja2.Environment,
        "compile",
        lambda env, source, name=None, *a, **k: compiled.append(name) or real_compile(env, source, name, *a, **k),
    )
    pages = []
    for _ in range(2):
        html._environment.cache_clear()  # a fresh process's environment
        pages.append(html.render_html(run))
    html._environment.cache_clear()
    assert "report.html.j2" in compiled and len(compiled) == len(set(compiled))  # the first only
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "cache" / "templates").iterdir()) == ["page"] * len(
        compiled
    )
    assert pages[0] == pages[1] == (run / "report.html").read_text()


def test_bars_are_not_gathered_past_the_sessions_the_page_can_detail():
    import pyarrow as pa

    from trace_tools.io.rundir import SAMPLES_SCHEMA
    from trace_tools.report.html.sessions import GatheredBars

    def samples(session: str) -> pa.Table:
        row = {"strategy": "tree", "session_id": session, "sample_index": 0, "token_ids": [1, 2, 3]}
        row |= {"response_length": 1, "loss_mask": [1], "logprobs": [-0.1], "source_turn": [-1, 0, 0]}
        return pa.Table.from_pylist([row], schema=SAMPLES_SCHEMA)

    gathered = GatheredBars(limit=2)
    gathered.add(samples("a"))
    gathered.add(samples("b"))
    assert gathered.bars({"a"}) == {
        ("tree", "a"): [{"i": 0, "n": 3, "trained": 1, "segs": [[-1, 0, 1], [0, 0, 1], [0, 1, 1]]}]
    }
    gathered.add(samples("c"))
    assert gathered.bars({"a"}) is None


def test_html_parses_cleanly_with_unique_ids_and_resolving_anchors(page):
    import html5lib

    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    tree = parser.parse(page)  # raises on any HTML5 parse error
    ids = [el.get("id") for el in tree.iter() if el.get("id")]
    assert len(ids) == len(set(ids)), "duplicate ids"
    anchors = [el.get("href")[1:] for el in tree.iter("a") if (el.get("href") or "").startswith("#")]
    static = [a for a in anchors if not a.startswith("/")]  # `#/...` are the page's own routes
    assert static and all(a in ids for a in static), set(static) - set(ids)


def test_overview_lists_every_strategy_with_its_summary_numbers(run, page):
    summary = json.loads((run / "summary.json").read_text())
    table = page[page.index('id="strategy-table"') : page.index("</table>", page.index('id="strategy-table"'))]
    for name, block in summary["strategies"].items():
        assert f"<code>{name}</code>" in table
        assert f'data-v="{block["coverage"]}"' in table
        assert f'data-v="{block["forwarded_tokens"]}"' in table


def test_drift_table_has_the_contract_schema_and_a_visible_filled_argument(run):
    table = pq.read_table(run / "drift.parquet")
    assert table.schema.names == DRIFT_SCHEMA.names
    frame = table.to_pandas()
    row = frame[(frame.session_id == SCHEMA_DEFAULT_SESSION) & (frame.turn_index == SCHEMA_DEFAULT_TURN)].iloc[0]
    assert row.cause == "schema_default" and row.token_drift
    assert row.window_start + len(row.shared_ids) == row.divergence
    rendered = "".join(row.rendered_tokens)
    # the filled-in default shows past the divergence (Claude Code puts it first: the opening quote is shared)
    assert 'replace_all": false' in rendered
    turns = pd.read_parquet(run / "turns.parquet")
    tree = turns[(turns.strategy == "tree") & turns.drift_cause.notna()]
    drifted = frame[frame.cause.notna()]
    assert sorted(zip(drifted.session_id, drifted.turn_index, drifted.cause)) == sorted(
        zip(tree.session_id, tree.turn_index, tree.drift_cause)
    )


def test_embedded_session_details_match_the_run_tables(run, details):
    turns = pd.read_parquet(run / "turns.parquet")
    sessions = pd.read_parquet(run / "sessions.parquet")
    samples = read_samples(run, columns=["strategy", "session_id", "source_turn"]).to_pandas()
    assert set(details) == set(sessions.session_id)
    for sid in (SCHEMA_DEFAULT_SESSION, "sim-qwen3.5-s7-0013"):
        detail = details[sid]
        for name, strategy in detail["strategies"].items():
            rows = turns[(turns.session_id == sid) & (turns.strategy == name)].sort_values("turn_index")
            assert [t[0] for t in strategy["turns"]] == rows.trained_tokens.tolist()
            assert [t[1] for t in strategy["turns"]] == rows.event.tolist()
            session = sessions[(sessions.session_id == sid) & (sessions.strategy == name)].iloc[0]
            assert len(strategy["samples"]) == session.samples
            assert sum(s["trained"] for s in strategy["samples"]) == session.trained_tokens
            emitted = samples[(samples.session_id == sid) & (samples.strategy == name)]
            assert [s["n"] for s in strategy["samples"]] == [len(x) for x in emitted.source_turn]
            for bar, source in zip(strategy["samples"], emitted.source_turn):
                assert sum(seg[2] for seg in bar["segs"]) == len(source)
                assert sum(seg[2] for seg in bar["segs"] if seg[1]) == bar["trained"]


def test_turn_fates_tell_context_only_from_dropped(details):
    tree = details[SCHEMA_DEFAULT_SESSION]["strategies"]["tree"]
    trained, event, _prompt, fate = tree["turns"][SCHEMA_DEFAULT_TURN]
    assert (trained, event) == (0, "demoted_by_merge")
    in_a_sample = any(seg[0] == SCHEMA_DEFAULT_TURN for s in tree["samples"] for seg in s["segs"])
    assert fate == ("context" if in_a_sample else "dropped")


def test_quarantine_summary_lists_reasons_and_sessions(quarantined_run):
    page = (quarantined_run / "report.html").read_text()
    section = page[page.index('id="quarantine"') : page.index('id="counterfactual"')]
    assert "2 sessions quarantined" in section
    for sid, reason in (("sim-qwen3-s7-0001", "bad_json"), ("sim-qwen3-s7-0002", "logprobs_length")):
        assert re.search(rf"<code>{sid}</code></td><td[^>]*>\d+</td><td[^>]*>{reason}</td>", section), (sid, reason)
    index = json.loads(re.search(r'id="report-index">(.*?)</script>', page, re.DOTALL).group(1))
    assert [e[0] for e in index["sessions"]] == ["sim-qwen3-s7-0000"]


def test_report_command_writes_html_and_the_api_returns_its_path(old_run):
    result = CliRunner().invoke(app, ["report", str(old_run), "--html"])
    assert result.exit_code == 0, result.output
    assert (old_run / "report.html").is_file()
    assert "report.html" in result.output
    import trace_tools as tt

    assert tt.open_run(old_run).html() == old_run / "report.html"


def test_report_command_on_a_non_run_names_the_fix(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--html"])
    assert result.exit_code == 2
    assert "trace-tools replay" in result.output


def test_a_run_with_every_session_quarantined_still_gets_a_page(old_run, tmp_path):
    empty = tmp_path / "run"
    shutil.copytree(old_run, empty)
    for name in ("turns", "sessions"):
        pd.DataFrame().to_parquet(empty / f"{name}.parquet")  # what replay writes when nothing was replayed
    page = write_html_report(empty).read_text()
    index = json.loads(re.search(r'id="report-index">(.*?)</script>', page, re.DOTALL).group(1))
    assert index["sessions"] == [] and index["drifted"] == []


def test_an_older_run_without_drift_table_says_so(old_run):
    page = write_html_report(old_run).read_text()
    assert 'id="drift-missing"' in page and "no <code>drift.parquet</code>" in page


# ---- in the browser ----


def _show(browser, hash_: str, ready: str) -> None:
    browser.evaluate(f"location.hash = {json.dumps(hash_)}")
    browser.wait_for(ready)


def test_overview_renders_in_chromium_and_is_not_blank(browser, run, tmp_path):
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    text = browser.evaluate("document.getElementById('strategy-table').innerText")
    for name in json.loads((run / "summary.json").read_text())["strategies"]:
        assert name in text
    shot = browser.screenshot(tmp_path / "overview.png")
    from PIL import Image, ImageStat

    image = Image.open(shot).convert("RGB")
    assert image.size == (browser.width, browser.height)
    assert len(image.getcolors(1 << 20) or []) > 50, "screenshot is (nearly) one colour"
    assert max(ImageStat.Stat(image).stddev) > 20
    assert browser.console_errors() == []


def test_sorting_the_strategy_table_by_coverage(browser, run):
    summary = json.loads((run / "summary.json").read_text())
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    browser.evaluate(
        "[...document.querySelectorAll('#strategy-table th')].find(th => th.textContent === 'coverage').click()"
    )
    first = browser.evaluate("document.querySelector('#strategy-table tbody tr td code').textContent")
    assert first == max(summary["strategies"], key=lambda n: summary["strategies"][n]["coverage"])


def test_session_search_finds_a_known_session_and_its_behaviour(browser, run):
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    _show(browser, "#sessions", "!document.getElementById('sessions').hidden")
    browser.evaluate(
        "const s = document.getElementById('session-search'); s.value = 'claude-code';"
        "s.dispatchEvent(new Event('input'))"
    )
    rows = browser.evaluate("[...document.querySelectorAll('#session-rows tr')].map(r => r.innerText)")
    turns = pd.read_parquet(run / "turns.parquet")
    labelled = turns[turns.behaviour.str.contains("claude-code")].session_id.unique()
    assert len(rows) == len(labelled) > 0
    assert any(SCHEMA_DEFAULT_SESSION in r and "schema_default" in r for r in rows)


def test_session_page_shows_timeline_and_sample_bars(browser, run):
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    _show(
        browser,
        f"#/session/{SCHEMA_DEFAULT_SESSION}",
        f"document.getElementById('session-body').dataset.session === {json.dumps(SCHEMA_DEFAULT_SESSION)}",
    )
    strategies = browser.evaluate(
        "[...document.querySelectorAll('table.timeline th.strategy')].map(t => t.textContent)"
    )
    assert strategies == list(json.loads((run / "summary.json").read_text())["strategies"])
    turns = pd.read_parquet(run / "turns.parquet")
    tree = turns[(turns.session_id == SCHEMA_DEFAULT_SESSION) & (turns.strategy == "tree")].sort_values("turn_index")
    cells = browser.evaluate(
        "[...document.querySelector('table.timeline tbody tr').querySelectorAll('td')]"
        ".map(td => td.firstChild.textContent)"
    )
    assert cells == [f"{t}/{g}" for t, g in zip(tree.trained_tokens, tree.generated_tokens)]
    sessions = pd.read_parquet(run / "sessions.parquet")
    for name, samples in sessions[sessions.session_id == SCHEMA_DEFAULT_SESSION][["strategy", "samples"]].values:
        block = re.sub(r"[^a-z0-9]+", "-", name, flags=re.IGNORECASE)
        assert browser.evaluate(f"document.querySelectorAll('#bars-{block} .bar').length") == samples
    assert browser.evaluate("document.querySelectorAll('.bar .seg.trained').length") > 0


def test_drift_view_highlights_the_filled_in_argument(browser, run, tmp_path):
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    _show(
        browser,
        f"#/session/{SCHEMA_DEFAULT_SESSION}/drift/{SCHEMA_DEFAULT_TURN}",
        "!!document.querySelector('.drift-card.focus')",
    )
    card = f"document.getElementById('drift-{SCHEMA_DEFAULT_TURN}')"
    assert "schema_default" in browser.evaluate(f"{card}.querySelector('h4').innerText")
    inserted = browser.evaluate(f"[...{card}.querySelectorAll('.tok.diff.rendered')].map(t => t.textContent).join('')")
    assert 'replace_all": false' in inserted
    assert browser.evaluate(f"{card}.querySelectorAll('.tok.diff.served').length") > 0
    assert "replace_all: <missing> → false" in browser.evaluate(f"{card}.querySelector('.mdiff').innerText")
    browser.screenshot(tmp_path / "drift.png")
    assert browser.console_errors() == []


def test_drift_tab_lists_drifted_turns_and_filters_by_cause(browser, run):
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    _show(browser, "#/drift/schema_default", "!document.getElementById('drift').hidden")
    rows = browser.evaluate("[...document.querySelectorAll('#drift-rows tr')].map(r => r.innerText)")
    drift = pd.read_parquet(run / "drift.parquet")
    assert len(rows) == (drift.cause == "schema_default").sum()
    assert all("schema_default" in r for r in rows)
    assert any(r.startswith(SCHEMA_DEFAULT_SESSION) for r in rows)


LINK_CHECK = """(() => {
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id);
  const dup = ids.filter((id, i) => ids.indexOf(id) !== i);
  const known = new Set(JSON.parse(document.getElementById('report-index').textContent).sessions.map(e => e[0]));
  const bad = [];
  for (const a of document.querySelectorAll('a[href]')) {
    const h = a.getAttribute('href');
    if (!h.startsWith('#')) { bad.push(h); continue; }
    const m = h.match(/^#\\/session\\/([^/]+)/);
    if (m) { if (!known.has(decodeURIComponent(m[1]))) bad.push(h); continue; }
    if (h.startsWith('#/drift/')) continue;
    if (!document.getElementById(h.slice(1))) bad.push(h);
  }
  return {dup, bad};
})()"""


def test_rendered_pages_have_no_broken_links_or_duplicate_ids(browser, run):
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    for hash_, ready in (
        ("#sessions", "true"),
        ("#drift", "true"),
        (f"#/session/{SCHEMA_DEFAULT_SESSION}", "!!document.getElementById('session-body').dataset.session"),
    ):
        _show(browser, hash_, ready)
        assert browser.evaluate(LINK_CHECK) == {"dup": [], "bad": []}, hash_


def test_session_page_of_an_older_run_explains_what_is_missing(browser, old_run):
    page = write_html_report(old_run)
    browser.open(page.as_uri(), ready="window.reportReady")
    _show(browser, f"#/session/{SCHEMA_DEFAULT_SESSION}", "!!document.getElementById('session-body').dataset.session")
    text = browser.evaluate("document.getElementById('session-body').innerText")
    assert "No drift.parquet" in text and "has no samples" in text
    assert browser.evaluate("document.querySelectorAll('table.timeline td').length") > 0


def test_explain_text_json_and_html_show_the_same_differing_part(browser, run):
    """The command prefix the harness dropped is what differs: every output of explain shows it."""
    from typer.testing import CliRunner

    from trace_tools.cli.main import app
    from trace_tools.replay.engine import default_dump

    session, turn = "sim-qwen3-s7-0001", 2
    args = ["explain", str(default_dump() / "qwen3.parquet"), "--session", session, "--turn", str(turn)]
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    [line] = data["focus"]["message_diff"]
    assert line.startswith("tool_calls[0].function.arguments.command: 'cd /repo/") and " → 'python -m" in line
    text = CliRunner().invoke(app, args, env={"COLUMNS": "300"}).output
    assert line in text
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    _show(browser, f"#/session/{session}/drift/{turn}", "!!document.querySelector('.drift-card.focus')")
    assert line in browser.evaluate(f"document.getElementById('drift-{turn}').querySelector('.mdiff').innerText")


# ---- at 1,400 and 800 px: nothing that matters needs sideways scrolling ----


@pytest.fixture(scope="module", params=[1400, 800])
def sized_browser(chromium_binary, request):
    with Chromium(chromium_binary, width=request.param, height=900) as chromium:
        yield chromium


FITS = "(id => { const t = document.getElementById(id); return t.scrollWidth <= t.parentElement.clientWidth; })"


def test_counters_and_divergence_are_visible_without_scrolling_sideways(sized_browser, run, tmp_path):
    browser = sized_browser
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert browser.evaluate(f"{FITS}('counter-table')") and browser.evaluate(f"{FITS}('strategy-table')")
    rows = browser.evaluate("[...document.querySelectorAll('#counter-table tbody tr')].map(r => r.innerText)")
    assert any(r.split()[0] == "nonlinear" and "n/a" in r.split() for r in rows)
    shot = browser.screenshot(tmp_path / f"overview-{browser.width}.png")
    from PIL import Image

    image = Image.open(shot)
    assert image.size == (browser.width, browser.height) and len(image.convert("RGB").getcolors(1 << 20) or []) > 50
    for session, turn in (("sim-qwen3-s7-0001", 2), ("sim-qwen3-s7-0001", 3)):
        _show(browser, f"#/session/{session}/drift/{turn}", f"!!document.querySelector('#drift-{turn}.focus')")
        box = browser.evaluate(f"""(() => {{
            const a = document.querySelector('#drift-{turn} .align'), r = a.getBoundingClientRect();
            const first = (sel) => a.querySelector(sel).getBoundingClientRect();
            return [r.left, r.right, first('.divergence').left, first('.tok.diff.rendered').right, a.scrollLeft];
        }})()""")
        left, right, divergence, first_diff, scrolled = box
        assert scrolled == 0 and left < divergence and first_diff <= right, (browser.width, turn, box)
        assert divergence - left > 100  # the tokens right before the divergence show too
    browser.screenshot(tmp_path / f"drift-{browser.width}.png")
    assert browser.console_errors() == []


def test_every_strategy_column_of_the_session_and_cause_tables_is_in_view(sized_browser, run, tmp_path):
    """Twelve strategy columns: short labels (full names in each header's tooltip and the legend) and
    wrapping text columns keep them in view at 1,400 px; at 800 px the session list leaves out its
    behaviour and drift-cause columns (still searchable) and the cause table stacks its counts."""
    browser = sized_browser
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    strategies = list(json.loads((run / "summary.json").read_text())["strategies"])
    for view, table in (("#sessions", "session-table"), ("#drift", "cause-table")):
        _show(browser, view, f"document.getElementById('{table}').offsetParent !== null")
        assert browser.evaluate(f"{FITS}('{table}')"), (browser.width, table)
        titles = browser.evaluate(
            f"[...document.querySelectorAll('#{table} thead th')].filter(th => th.getBoundingClientRect().right <= window.innerWidth).map(th => th.title)"
        )
        shown = [
            name
            for name in strategies
            if any(title.startswith(f"{name}:") or title.endswith(f" {name}") for title in titles)
        ]
        assert shown == strategies, (browser.width, table, titles)
        browser.screenshot(tmp_path / f"{table}-{browser.width}.png")
    assert browser.console_errors() == []


@pytest.mark.parametrize(
    "before, hash_",
    [
        ("#/session/sim-qwen3-s7-0001", "#sessions"),
        ("#sessions", "#drift"),
        ("#drift", "#sessions"),
        ("#/session/sim-qwen3-s7-0001", "#drift"),
    ],
)
def test_tab_links_land_on_their_heading(sized_browser, run, before, hash_):
    browser = sized_browser
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    _show(browser, before, "true")
    browser.evaluate("window.scrollTo(0, document.body.scrollHeight)")  # from deep down the page before
    _show(browser, hash_, f"!document.querySelector('{hash_}').hidden")
    browser.evaluate("new Promise(r => setTimeout(r, 300))")  # the browser's own jump to the anchor comes late
    header = browser.evaluate("document.querySelector('header.top').getBoundingClientRect().bottom")
    top = browser.evaluate(f"document.querySelector('{hash_} h2').getBoundingClientRect().top")
    assert header <= top < browser.height / 2, (hash_, header, top)


def test_dropped_and_untrained_turns_have_their_own_colours(browser, run):
    browser.open((run / "report.html").as_uri(), ready="window.reportReady")
    colour = "(v => getComputedStyle(document.documentElement).getPropertyValue(v).trim())"
    dropped, untrained = (browser.evaluate(f"{colour}('--{fate}')") for fate in ("dropped", "untrained"))
    assert dropped and untrained and dropped != untrained


def test_footnotes_explain_only_the_columns_shown(quarantined_run, page):
    """A run without `tree` has no savings column, so nothing explains one; the full run has both."""
    alone = (quarantined_run / "report.html").read_text()
    assert "savings vs tree" not in alone.lower() and "⚑ =" not in alone and "Forks max = " in alone
    assert "3 sessions · " in alone and "2 sessions quarantined" in alone
    assert "savings vs tree" in page and "Savings vs tree = " in page


def test_a_run_with_more_sessions_than_the_page_holds_details_its_worst_first(run):
    from trace_tools.report.html.sessions import build_sessions

    sessions = pd.read_parquet(run / "sessions.parquet")
    lost = (sessions["generated_tokens"] - sessions["trained_tokens"]).groupby(sessions["session_id"]).sum()
    strategies = list(dict.fromkeys(sessions["strategy"]))
    data = build_sessions(run, strategies, None, limit=3)
    shown = [sid for chunk in data.chunks for sid, _ in iter_chunk_sessions(chunk)]
    assert (data.shown, data.total, len(data.index["sessions"])) == (3, len(lost), 3)
    assert [lost[sid] for sid in shown] == sorted((lost[sid] for sid in shown), reverse=True)
    assert min(lost[shown]) >= lost.drop(shown).max()  # none left out loses more than one shown
    every = build_sessions(run, strategies, None)
    assert [sid for chunk in every.chunks for sid, _ in iter_chunk_sessions(chunk)] == list(
        dict.fromkeys(sessions["session_id"])
    )  # a run the page holds whole: every session, in stream order


def test_the_page_names_how_many_sessions_it_details(run, tmp_path, monkeypatch):
    from trace_tools.report.html import sessions

    monkeypatch.setattr(sessions.build_sessions, "__defaults__", (2, None))  # limit, gathered
    text = write_html_report(run, out=tmp_path / "page.html").read_text()
    total = pd.read_parquet(run / "sessions.parquet")["session_id"].nunique()
    assert f"The 2 sessions of {total} that lose the most generated tokens, worst first" in text


def test_a_failure_gathering_the_bars_leaves_the_report_to_read_the_samples(simulated_dump, tmp_path, monkeypatch):
    from trace_tools.api import replay
    from trace_tools.report.html import render_html, sessions

    def broken(self, table):
        raise ValueError("gathering broke")

    monkeypatch.setattr(sessions.GatheredBars, "add", broken)
    out = tmp_path / "run"
    replay(simulated_dump, out=out, strategies=["tree", "linear"], workers=1)
    assert (out / "report.html").read_text() == render_html(out)
