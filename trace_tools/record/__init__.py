"""`trace-tools record`: a recording gateway between an agent harness and a model (docs/probe.md).

    from trace_tools.record import make_renderer, open_recorder
    with open_recorder("rec/", script="turns.json", tcp=("127.0.0.1", 8642)) as running:
        ...  # point a client at running.url; rec/dump/ fills turn by turn

The recorder speaks the Anthropic Messages API, the OpenAI Chat Completions and Responses APIs
and Google's Gemini API, renders every request through a chat template and tokenizer, takes each
generation from a scripted model (`--script`) or a token-in/token-out engine (`--upstream`,
SGLang's `/generate`), answers in the client's protocol, and writes trace schema v1 as it goes
(`sink.py`).
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any, Callable

from trace_tools.errors import UnknownName, UsageError


def make_renderer(template: str = "qwen3", tokenizer: str | None = None, chat_template: str | None = None) -> Any:
    """The renderer a recording uses: a model family's (template and tokenizer), or a user's own.

    A template that stamps the date (gpt-oss) is pinned to today, and the dump says so.
    """
    from trace_tools.data import DumpMeta
    from trace_tools.render.renderer import Renderer
    from trace_tools.simulate.formats import FAMILIES

    if template not in FAMILIES and not (tokenizer and chat_template):
        raise UnknownName("template", template, list(FAMILIES))
    family = FAMILIES.get(template)
    name = tokenizer or (family.tokenizer if family else None)
    spec = chat_template or (family.template if family else None)
    return Renderer.from_spec(name, spec, dump_meta=DumpMeta(extra={"render_date": date.today().isoformat()}))


def make_model(renderer: Any, *, script: str | Path | Callable | None = None, upstream: str | None = None) -> Any:
    """The generation source: `script` (a script file, or a `(session, tools) -> Script` callable)
    or `upstream` (an SGLang `/generate` URL); exactly one."""
    from trace_tools.record.model import ScriptedModel, UpstreamModel
    from trace_tools.record.script import load_scripts

    if (script is None) == (upstream is None):
        raise UsageError("give exactly one generation source: --script FILE or --upstream URL")
    if upstream is not None:
        return UpstreamModel(upstream)
    assert script is not None
    return ScriptedModel(renderer, script if callable(script) else load_scripts(script))


def open_recorder(
    out: str | Path,
    *,
    script: str | Path | Callable | None = None,
    upstream: str | None = None,
    template: str = "qwen3",
    tokenizer: str | None = None,
    chat_template: str | None = None,
    harness: str = "",
    reasoning: str = "separate",
    tcp: tuple[str, int] | None = ("127.0.0.1", 0),
    unix: str | Path | None = None,
    **limits: Any,
) -> Any:
    """A started-on-enter `RecorderThread` serving a new Recorder into `out` (`limits`: the
    Recorder's `max_body`, `body_seconds`, `render_threads`, `step`, `weight_version`)."""
    from trace_tools.record.server import Recorder, RecorderThread

    renderer = make_renderer(template, tokenizer, chat_template)
    model = make_model(renderer, script=script, upstream=upstream)
    recorder = Recorder(out, renderer, model, harness=harness, reasoning=reasoning, **limits)
    return RecorderThread(recorder, tcp=tcp, unix=unix)


def serve(out: str | Path, host: str, port: int, on_ready: Callable[[str], None], **options: Any) -> Any:
    """Run a recorder until interrupted (the CLI's `record`); returns its stats."""
    import threading

    if host not in ("127.0.0.1", "localhost", "::1") and not options.pop("allow_remote", False):
        raise UsageError(f"the recorder binds loopback only; --host {host} needs --allow-remote")
    options.pop("allow_remote", None)
    running = open_recorder(out, tcp=(host, port), **options)
    with running:
        on_ready(running.url or "")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return running.recorder.stats
