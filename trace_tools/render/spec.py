"""`RenderSpec`: every input a renderer reads, resolved, in one frozen value.

A renderer's output depends on its tokenizer, its template text, the default template kwargs,
the tool-call format it parses, the date a date-stamping template (gpt-oss) prints, and the
limits its template runs under. Two recordings that differ in any of these need two renderers,
so `RenderSpec` is what the renderer pool keys on (`pipeline.RendererPool`), and its `identity()`
is what run.json records for each renderer. `path` says how a renderer computes its output
(`RENDER_PATHS`): the fast path, transformers' own functions end to end, or both with every
result compared.

    spec = RenderSpec.resolve("qwen3", chat_template=None, dump_meta=meta)   # names → texts
    renderer = Renderer.from_render_spec(spec)                               # render.renderer
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trace_tools.data import DumpMeta
from trace_tools.errors import (
    TraceToolsError,
    UnknownName,
    UnusableInput,
)
from trace_tools.io.cache import library_version
from trace_tools.render import families
from trace_tools.render.limits import TemplateLimits
from trace_tools.render.templates import resolve_template
from trace_tools.render.tokenizer import check_tokenizer_name

# How a renderer computes its renders and ids:
#   fast       our shortcuts (incremental windowed renders, our own Jinja environment and BPE
#              encoder), each one checked where it is decided (probe verdicts, boundaries);
#   reference  transformers' `apply_chat_template` on the whole conversation and transformers'
#              tokenizer (the `tokenizers` backend) for every render, encode and decode;
#   verify     the fast path, every result compared with the reference one: a difference is
#              counted (`verify:*` render counters) and the reference result is used.
RENDER_PATHS = ("fast", "reference", "verify")


@dataclass(frozen=True)
class RenderSpec:
    """Tokenizer (a name or path), template text and where it came from, default template kwargs
    (JSON), the tool-call format when given instead of the template's, the render date, limits."""

    tokenizer: str
    template: str = field(repr=False)
    template_identity: str
    template_kwargs: str = "{}"
    tool_format: str | None = None
    render_date: str | None = None
    limits: TemplateLimits = field(default_factory=TemplateLimits.from_env)
    path: str = "fast"

    def __post_init__(self) -> None:
        if self.path not in RENDER_PATHS:
            raise UnknownName("render path", self.path, RENDER_PATHS)

    @classmethod
    def resolve(
        cls,
        tokenizer: str | None,
        chat_template: str | None = None,
        dump_meta: DumpMeta | None = None,
        template_kwargs: dict | None = None,
        tool_format: str | None = None,
        path: str = "fast",
    ) -> "RenderSpec":
        """Resolve names the way the CLI does: options first, then the dump's own metadata
        (`trace_tools.tokenizer`, `.chat_template`, `.render_date`). Nothing is loaded; unknown
        names raise (exit 2)."""

        name = tokenizer or (dump_meta.tokenizer if dump_meta else None)
        if not name:
            raise TraceToolsError(
                "no tokenizer: the dump names none (`trace_tools.tokenizer`); pass `--tokenizer NAME|PATH`"
            )
        name = check_tokenizer_name(name)  # first, so a wrong name is reported as a tokenizer, not a template
        text, identity = resolve_template(
            chat_template, tokenizer_name=name, dump_template=dump_meta.chat_template if dump_meta else None
        )
        render_date = dump_meta.extra.get("render_date") if dump_meta else None
        _check_date(render_date)
        kwargs = json.dumps(template_kwargs or {}, sort_keys=True, default=repr)
        return cls(name, text, identity, kwargs, tool_format, render_date, path=path)

    @functools.cached_property
    def family(self) -> families.ModelFamily | None:
        """The model family this spec renders for, detected once (`families.resolve_family`): the
        renderer built from the spec and run.json's identity both read it."""
        return families.resolve_family(self.template, self.tool_format)

    @property
    def effective_tool_format(self) -> str | None:
        return self.tool_format or (self.family.tool_format if self.family else None)

    def identity(self) -> dict[str, Any]:
        """What run.json records of a renderer: every input except the template text (its source
        and digest stand for it), the effective tool-call format and the library versions; the render
        path only when it is not the default one, so a default run's run.json is what it was."""

        identity = {
            "tokenizer": self.tokenizer,
            "template": self.template_identity,
            "template_kwargs": json.loads(self.template_kwargs),
            "tool_format": self.effective_tool_format,
            "render_date": self.render_date,
            "limits": self.limits.identity(),
            "transformers": library_version("transformers"),
            "tokenizers": library_version("tokenizers"),
        }
        return identity if self.path == "fast" else {**identity, "path": self.path}


def _check_date(render_date: str | None) -> None:
    if render_date is None:
        return
    try:
        datetime.strptime(render_date, "%Y-%m-%d")  # what `families.pin_clock` reads
    except (TypeError, ValueError):
        raise UnusableInput(
            f"trace_tools.render_date {render_date!r} is not a date (YYYY-MM-DD); fix the dump's metadata"
        ) from None
