"""Model families at render time: recognising a family from its template, and two template quirks.

The families themselves are records in `trace_tools.families` (docs/model_families.md fixes the
names and templates, all from the pinned `trl` wheel). Each family's response parser follows the serving
engine's tool-call parser for that model (SGLang's detector named in `serving_parser`), and
`detect_family` recognises a family from the template text alone, so a dump that carries its
template needs no option (`--tool-format` overrides the guess).

Two template properties are handled here rather than in every caller:

* text arguments (DeepSeek V3's template, not its TRL training variant): a template that
  concatenates `tool_calls[].function.arguments` as text raises on the dict arguments every
  canonicalization produces, so `template_messages` passes them as JSON text
  (`json.dumps(..., ensure_ascii=False)`, the spelling the model emits). That is what
  reconstructing a recorded prompt needs; it is not what the upstream systems do (they pass
  dicts and fail those requests), which the strategies reproduce through
  `trace_tools.render.upstream`. Everything else reaches the template unchanged.
* a clock (gpt-oss): the template stamps `strftime_now("%Y-%m-%d")` into the system message, so
  a prompt depends on the day it was rendered. `pin_clock` replaces each `strftime_now(...)` call
  by the date a dump names (`trace_tools.render_date`), so replay renders what the recording saw.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Sequence

from trace_tools.families import (  # noqa: F401 (DEFAULT_STOP_TOKENS, TOOL_FORMATS re-exported)
    DEFAULT_STOP_TOKENS,
    DETECTION_ORDER,
    FAMILIES,
    TOOL_FORMATS,
    ModelFamily,
)

_CLOCK_CALL = re.compile(r"""strftime_now\(\s*(["'])(.*?)\1\s*\)""")
_CONCATENATED_ARGUMENTS = re.compile(r"""\[\s*["']arguments["']\s*\]\s*\+""")


def detect_family(template: str) -> ModelFamily | None:
    """The family whose markers all occur in `template`, or None (an unknown tool-call format)."""
    matches = (FAMILIES[name] for name in DETECTION_ORDER)
    return next((family for family in matches if all(m in template for m in family.markers)), None)


def family_for_format(tool_format: str | None) -> ModelFamily | None:
    return next((family for family in FAMILIES.values() if family.tool_format == tool_format), None)


def resolve_family(template: str, tool_format: str | None) -> ModelFamily | None:
    """The family a renderer of `template` follows: the one detected from the text, unless
    `tool_format` (`--tool-format`) names another family's format, then that family."""
    detected = detect_family(template)
    if tool_format is None or (detected is not None and detected.tool_format == tool_format):
        return detected
    return family_for_format(tool_format)


def concatenates_arguments(template: str) -> bool:
    """True when the template joins tool-call arguments to text with `+` (they must be strings)."""
    return bool(_CONCATENATED_ARGUMENTS.search(template))


def template_messages(messages: Sequence[dict], text_arguments: bool) -> list[dict]:
    """The messages as the template can take them: with `text_arguments`, dict arguments as JSON text."""
    if not text_arguments:
        return list(messages)
    return [_with_text_arguments(message) for message in messages]


def has_object_arguments(messages: Sequence[dict]) -> bool:
    """True when some tool call's arguments are not text (what `template_messages` converts)."""
    return any(_object_arguments(call) for message in messages for call in _tool_calls(message))


def _with_text_arguments(message: Any) -> Any:
    calls = _tool_calls(message)
    if not calls:
        return message
    return {**message, "tool_calls": [_text_arguments(call) for call in calls]}


def _tool_calls(message: Any) -> list:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return calls if isinstance(calls, list) else []


def _object_arguments(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and not isinstance(function.get("arguments"), str)


def _text_arguments(call: Any) -> Any:
    if not _object_arguments(call):
        return call
    function = call["function"]
    arguments = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
    return {**call, "function": {**function, "arguments": arguments}}


def stamps_date(template: str) -> bool:
    """True when the template renders the current date (`strftime_now(...)`)."""
    return bool(_CLOCK_CALL.search(template))


def pin_clock(template: str, render_date: str | None) -> str:
    """`template` with every `strftime_now(FORMAT)` call replaced by `render_date` in that format.

    `render_date` is ISO (`YYYY-MM-DD`); None leaves the template alone (it renders today's date,
    as `apply_chat_template` does).
    """
    if not render_date or not stamps_date(template):
        return template
    day = datetime.strptime(render_date, "%Y-%m-%d")
    return _CLOCK_CALL.sub(lambda match: json.dumps(day.strftime(match.group(2))), template)
