"""`report.html`: one self-contained page per run directory (no network, no server).

The overview (strategy tables, plots, quarantine) is static HTML rendered from summary.json with
the Jinja2 templates shipped in `templates/`; the session list, the session pages and the drift
view are drawn by the page's own script from an embedded index and lazily decompressed
per-session chunks (see `sessions.py`). The page reads only the run directory's files.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from types import CodeType
from typing import Any, Callable

import jinja2

from trace_tools.io.bundled import shown_dump
from trace_tools.io.cache import CacheKey, code_digest
from trace_tools.io.rundir import require_run
from trace_tools.io.write import marshalled, write_text_atomic
from trace_tools.report.escape import BIDI, visible_bidi
from trace_tools.report.explain_view import CAUSE_TEXT
from trace_tools.report.harness_profile import page_rows, title
from trace_tools.report.html import curves, overview
from trace_tools.report.html.sessions import GatheredBars, build_sessions
from trace_tools.report.html.token_strip import token_strips
from trace_tools.report.layout import ABSENT, count, signed_pct
from trace_tools.report.render import COUNTERFACTUAL_NOTE, counterfactual_names
from trace_tools.report.verdict import upstream_lines, verdict_lines

REPORT_NAME = "report.html"


def write_html_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    plots_drawn: Callable[[], object] | None = None,
    summary: dict[str, Any] | None = None,
    gathered: GatheredBars | None = None,
) -> Path:
    """Write `RUN/report.html` (or `out`) from a finished run directory; returns its path.

    `plots_drawn` is called, when given, just before RUN/plots are read: the page's other parts
    are built while the plots are still being drawn elsewhere. `summary` is the run's summary
    when the caller has it and summary.json is not written yet (replay writes it last);
    `gathered`, the sample bars replay gathered as it wrote every sample of the run."""

    run = Path(run_dir)
    if summary is None:
        require_run(run)
    target = Path(out) if out is not None else run / REPORT_NAME
    write_text_atomic(render_html(run, plots_drawn, summary, gathered), target)
    return target


def render_html(
    run_dir: Path,
    plots_drawn: Callable[[], object] | None = None,
    summary: dict[str, Any] | None = None,
    gathered: GatheredBars | None = None,
) -> str:
    """The page's HTML text for a finished run directory."""
    import pandas as pd

    if summary is None:
        summary = json.loads((run_dir / "summary.json").read_text())
    quarantine_path = run_dir / "quarantine.parquet"
    quarantine = pd.read_parquet(quarantine_path) if quarantine_path.exists() else None
    strategies = list(summary["strategies"])
    data = build_sessions(run_dir, strategies, quarantine, gathered=gathered)
    tools = overview.tool_columns(summary)
    if plots_drawn is not None:
        plots_drawn()
    context = {
        "run": _run_info(run_dir),
        "summary": summary,
        "strategies": strategies,
        "strategy_rows": overview.strategy_rows(summary, counterfactual_names(summary)),
        "curves": curves.step_curves(summary),
        "tools": tools,
        "tool_rows": overview.tool_rows(summary, tools),
        "counters": overview.counter_table(summary),
        "cause_rows": overview.cause_rows(summary, CAUSE_TEXT),
        "quarantine": overview.quarantine_view(summary, quarantine),
        "plots": overview.inline_plots(run_dir / "plots"),
        "counterfactual_note": COUNTERFACTUAL_NOTE,
        "upstream_lines": upstream_lines(summary),
        "verdict": verdict_lines(summary),
        "has_drift_table": data.index["has_drift_table"],
        "index_json": script_json({**data.index, "cause_text": CAUSE_TEXT}),
        "chunks": data.chunks,
        "sessions_shown": data.shown,
        "sessions_total": data.total,
        "harness_profile": _harness_profile(run_dir),
        "token_strips": token_strips(run_dir, summary),
    }
    env = _environment()
    return env.get_template("report.html.j2").render(
        **context, css=_asset(env, "report.css"), script=_asset(env, "report.js")
    )


def _harness_profile(run_dir: Path) -> dict[str, Any] | None:
    """The run's harness profile (a `trace-tools probe` run directory has one) as table rows."""
    path = run_dir / "profile.json"
    if not path.exists():
        return None

    profile = json.loads(path.read_text(encoding="utf-8"))
    return {"title": title(profile), "rows": page_rows(profile)}


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element: `<`, `>` and `&` escaped (only strings can hold them),
    bidi formatting characters shown as their escapes (`report.escape`)."""
    from markupsafe import Markup

    text = visible_bidi(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _run_info(run_dir: Path) -> dict[str, Any]:
    info_path = run_dir / "run.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    return {
        "name": run_dir.resolve().name,
        "created_at": info.get("created_at", ""),
        "dump": shown_dump((info.get("inputs") or {}).get("dump", "")),
        "version": info.get("trace_tools_version", ""),
    }


def _asset(env, name: str):
    """A CSS/JS file from the templates folder, inlined verbatim (never parsed as a template)."""
    from markupsafe import Markup

    return Markup(env.loader.get_source(env, name)[0])


def _visible(value: Any) -> Any:
    """Every value the page prints, with bidi formatting characters made visible (markup stays markup)."""
    from markupsafe import Markup

    if isinstance(value, str) and BIDI.search(value):
        return Markup(visible_bidi(value)) if isinstance(value, Markup) else visible_bidi(value)
    return value


@functools.cache
def _environment() -> jinja2.Environment:
    """The page's environment, one per process: it keeps the templates it loaded."""
    env = jinja2.Environment(
        loader=_CompiledLoader("trace_tools.report.html", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        finalize=_visible,
    )
    env.filters.update(pct=_pct, num=_num, signed_pct=_signed_pct, count=count)
    return env


class _CompiledLoader(jinja2.PackageLoader):
    """The page's templates, their compiled code kept in trace-tools' cache (kind `templates`), as
    the chat templates' are (`render.template_runner`): compiling the page and the templates it
    includes took 70–100 ms at the end of every run; loading their code takes about 3.5 ms."""

    def load(self, environment: jinja2.Environment, name: str, globals: Any = None) -> jinja2.Template:
        source, filename, uptodate = self.get_source(environment, name)
        code = _stored_code(environment, name, source, filename)
        return environment.template_class.from_code(environment, code, environment.make_globals(globals), uptodate)


def _stored_code(environment: jinja2.Environment, name: str, source: str, filename: str | None) -> CodeType:
    """`environment.compile(source)`, kept as marshal data. Keyed by the template's name and text,
    the source of this module (the environment's settings shape the code) and the Python and
    Jinja2 versions (the code's format, the compiler)."""
    key = CacheKey(
        "templates",
        "page",
        inputs=(name, hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()),
        code=code_digest("report/html/__init__.py"),
        libraries=("python", "jinja2"),
    )
    return marshalled(key.path(".marshal"), CodeType, lambda: environment.compile(source, name, filename))


def _pct(value: float | None) -> str:
    return ABSENT if value is None else f"{100 * value:.1f}%"


def _signed_pct(value: float | None) -> str:
    return ABSENT if value is None else signed_pct(value)


def _num(value: float | None) -> str:
    if value is None:
        return ABSENT
    return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"
