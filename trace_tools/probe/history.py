"""History events: what a client changes in the history it resends, beyond its echoes (docs/probe.md).

An append-only client's request for turn k+1 is turn k's request, turn k's reply, then new
messages. Real clients also change the history itself. Between each pair of consecutive turns of
a session this module names every such change:

* `volatile_system_line`: a system-prompt line whose value changes while its key stays (Claude
  Code >= 2.1.36 writes `x-anthropic-billing-header: cc_version=...; cch=...` first in the system
  prompt unless `CLAUDE_CODE_ATTRIBUTION_HEADER=0`); `system_prompt_changed` for any other edit;
* `injected_reminder`: a message the client wrote itself (a `<system-reminder>`) added after the
  previous turn's reply;
* `tool_list_changed`: tools added or removed (a tool-search tool loading one);
* `compaction`: earlier messages dropped or replaced (a condenser's summary).

Each event is **append-safe** when it only adds after the previous request and its reply (a
reminder appended after the reply always is; any other event is when the new prompt's token ids
still begin with every id of the previous prompt + output), else **breaking**. Each carries the
pair's first differing token: the index where the new prompt's ids leave the previous prompt +
output ids (None when they extend them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REMINDER_MARK = "<system-reminder>"
MAX_EVENTS = 50  # the profile lists this many events in full; `counts` covers all of them


def history_events(dump_dir: str | Path) -> dict[str, Any]:
    """{counts: {kind: {append_safe, breaking}}, events: the first `MAX_EVENTS`} over a dump's sessions."""
    from trace_tools.io.load import load

    events: list[dict[str, Any]] = []
    for session in load(Path(dump_dir)).sessions:
        for before, after in zip(session.turns, session.turns[1:]):
            events += pair_events(before, after)
    counts: dict[str, dict[str, int]] = {}
    for event in events:
        bucket = counts.setdefault(event["kind"], {"append_safe": 0, "breaking": 0})
        bucket["append_safe" if event["append_safe"] else "breaking"] += 1
    return {"counts": dict(sorted(counts.items())), "events": events[:MAX_EVENTS], "total": len(events)}


def pair_events(before: Any, after: Any) -> list[dict[str, Any]]:
    """The history events between two consecutive turns of one session (module docstring)."""
    previous = [*before.messages, before.response]
    current = list(after.messages)
    where = {"session": after.session_id, "turn": after.turn_index}
    first = first_differing_token([*before.prompt_ids, *before.output_ids], after.prompt_ids)
    found = _system_events(previous, current) + _tool_events(before.tools, after.tools)
    found += _compaction_events(previous, current) + _reminder_events(previous, current)
    return [
        {
            **where,
            **event,
            "append_safe": event["kind"] == "injected_reminder" or first is None,
            "first_differing_token": first,
        }
        for event in found
    ]


def first_differing_token(previous: list[int], current: list[int]) -> int | None:
    """Where `current` stops extending `previous` (None when it begins with all of it)."""
    for index, (a, b) in enumerate(zip(previous, current)):
        if a != b:
            return index
    return None if len(current) >= len(previous) else len(current)


def _system_text(messages: list[dict]) -> str | None:
    if messages and messages[0].get("role") == "system":
        return _text(messages[0])
    return None


def _system_events(previous: list[dict], current: list[dict]) -> list[dict[str, Any]]:
    old, new = _system_text(previous), _system_text(current)
    if old is None or new is None or old == new:
        return []
    old_lines, new_lines = old.split("\n"), new.split("\n")
    changed = [(i, a, b) for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]
    if len(old_lines) == len(new_lines) and changed and all(_key(a) and _key(a) == _key(b) for _, a, b in changed):
        line, a, b = changed[0]
        return [{"kind": "volatile_system_line", "line": line, "key": _key(a), "before": a[:160], "after": b[:160]}]
    line = changed[0][0] if changed else min(len(old_lines), len(new_lines))
    return [{"kind": "system_prompt_changed", "line": line}]


def _key(line: str) -> str:
    """A `key: value` / `key=value` line's key (empty for prose)."""
    for separator in (":", "="):
        head, found, _ = line.partition(separator)
        if found and head and len(head) <= 60 and " " not in head.strip():
            return head.strip()
    return ""


def _tool_events(old: list[dict] | None, new: list[dict] | None) -> list[dict[str, Any]]:
    before, after = _tool_names(old), _tool_names(new)
    if before == after:
        return []
    added = [name for name in after if name not in before]
    removed = [name for name in before if name not in after]
    return [{"kind": "tool_list_changed", "added": added, "removed": removed}]


def _tool_names(tools: list[dict] | None) -> list[str]:
    names = []
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        names.append(str(function.get("name", "")) if isinstance(function, dict) else "")
    return names


def _compaction_events(previous: list[dict], current: list[dict]) -> list[dict[str, Any]]:
    """Earlier messages the new request no longer carries as they were (roles and texts compared)."""
    kept = 0
    for old, new in zip(previous[1:], current[1:]):  # the system prompt has its own events
        if old.get("role") != new.get("role") or (old.get("role") == "user" and _text(old) != _text(new)):
            break
        kept += 1
    if kept + 1 >= len(previous) or len(current) >= len(previous):
        return []
    return [{"kind": "compaction", "kept_messages": kept + 1, "of": len(previous), "now": len(current)}]


def _reminder_events(previous: list[dict], current: list[dict]) -> list[dict[str, Any]]:
    """Client-written text among the messages added after the previous turn's reply."""
    events = []
    for message in current[len(previous) :]:
        text = _text(message)
        if message.get("role") in ("user", "system") and text and REMINDER_MARK in text:
            events.append({"kind": "injected_reminder", "role": message["role"], "text": text[:160]})
    return events


def _text(message: dict | None) -> str:
    content = (message or {}).get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content)
