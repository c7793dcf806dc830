"""Which harness, at which version, made a recording; and which shipped profile fits it.

A recording names its harness in three places, read in this order: the dump's `harness`
metadata (`trace-tools record --harness "claude-code 2.1.332"`, or a probe's harness name), each
turn's recorded `user_agent`, and the `User-Agent` header of the request log (`requests.jsonl`)
next to the dump. Harnesses announce themselves in the header (`claude-cli/2.1.332 (external,
cli)`, `QwenCode/0.0.14 (linux; x64)`); `USER_AGENTS` maps those spellings to the names probe
and the shipped profiles use.

`pick_shipped(identity)` is what `replay --harness-profile auto` does with it: the shipped
profile of that harness and version, or none and a one-line note saying why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from trace_tools.data import SIMULATED_HARNESS

# (harness name, the pattern of its User-Agent with the version as group 1)
USER_AGENTS = (
    ("claude-code", re.compile(r"\bclaude-cli/([0-9][\w.+-]*)")),
    ("qwen-code", re.compile(r"\bQwenCode/([0-9][\w.+-]*)")),
    ("gemini-cli", re.compile(r"\bGeminiCLI/([0-9][\w.+-]*)")),
    ("codex", re.compile(r"\bcodex_(?:cli_rs|exec)/([0-9][\w.+-]*)")),
    ("opencode", re.compile(r"\bopencode/([0-9][\w.+-]*)")),
)
_LABEL = re.compile(r"^\s*([A-Za-z][\w.-]*?)(?:[ /@]v?([0-9][\w.+-]*))?\s*$")
_UNLABELLED = ("", "trace-tools record", SIMULATED_HARNESS)  # labels that name no harness
_LOG_LINES = 200  # request-log lines read for a User-Agent (one harness per recording)


@dataclass(frozen=True)
class HarnessIdentity:
    name: str
    version: str | None = None
    source: str = ""  # where it was read: metadata, user_agent, request_log

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}" if self.version else self.name


def from_label(label: str | None) -> HarnessIdentity | None:
    """`claude-code 2.1.332`, `claude-code/2.1.332`, `claude-code@2.1.332` or a bare name."""
    if not label or label in _UNLABELLED:
        return None
    match = _LABEL.match(label)
    return HarnessIdentity(match.group(1), match.group(2), "metadata") if match else None


def from_user_agent(agent: str | None, source: str = "user_agent") -> HarnessIdentity | None:
    for name, pattern in USER_AGENTS:
        match = pattern.search(agent or "")
        if match:
            return HarnessIdentity(name, match.group(1), source)
    return None


def from_request_log(path: Path) -> HarnessIdentity | None:
    """The harness the first requests of a `requests.jsonl` announce in their User-Agent."""
    if not path.is_file():
        return None
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines):
            if number >= _LOG_LINES:
                break
            try:
                headers = json.loads(line).get("headers") or {}
            except (ValueError, AttributeError):
                continue
            agent = next((v for k, v in headers.items() if k.lower() == "user-agent"), None)
            found = from_user_agent(agent, "request_log")
            if found:
                return found
    return None


def recorded_harness(
    meta_label: str | None, turn_metadata: Iterable[dict[str, Any]] = (), request_log: Path | None = None
) -> HarnessIdentity | None:
    """The harness a recording names (module docstring: metadata, turns, request log); a version
    found later fills in a name found earlier without one."""
    found = from_label(meta_label)
    if found is None or found.version is None:
        agent = next((m.get("user_agent") for m in turn_metadata if isinstance(m, dict) and m.get("user_agent")), None)
        later = from_user_agent(agent) or (from_request_log(request_log) if request_log else None)
        if later is not None and (found is None or later.name == found.name):
            found = later
    return found


def pick_shipped(identity: HarnessIdentity | None, shipped: list[str]) -> tuple[str | None, str | None]:
    """(the shipped profile `<name>-<version>` measured on exactly this harness, a note when the
    recording names a harness but none is)."""
    if identity is None:
        return None, None  # nothing recorded to match: every shipped profile, nothing to warn about
    if identity.version and f"{identity.name}-{identity.version}" in shipped:
        return f"{identity.name}-{identity.version}", None
    same = [name for name in shipped if name.rsplit("-", 1)[0] == identity.name]
    if same:
        return None, f"no shipped profile measures {identity.label} (shipped: {', '.join(same)})"
    return None, f"no shipped profile for {identity.label}"


def resolve_auto_profile(params: dict[str, Any], meta_label: str | None, dump: Any) -> str | None:
    """`harness_profile=auto` (the default) made concrete for one recording, in `params`: the
    shipped profile of the recorded harness and version; when none fits, `auto` stays (every
    shipped profile, besides the generic classes), with a one-line note when the recording names
    a harness (a simulated or unlabelled dump names none)."""
    from trace_tools.render.harness_echo import shipped_names

    if params.get("harness_profile", "auto") != "auto":
        return None
    log = _request_log(dump)
    name, why = pick_shipped(recorded_harness(meta_label, (), log), shipped_names())
    if name is not None:
        params["harness_profile"] = name
    if why is None:
        return None
    return (
        f"harness profile auto: {why}; checkpoint-tree uses the generic echo classes and every shipped profile "
        "(measure this harness: trace-tools profile DUMP --out profile.json; replay --harness-profile profile.json)"
    )


def _request_log(dump: Any) -> Path | None:
    """The `requests.jsonl` a recording keeps beside (or above) its dump directory, if local."""
    if not isinstance(dump, Path):
        return None
    for folder in (dump, dump.parent) if dump.is_dir() else (dump.parent, dump.parent.parent):
        if (folder / "requests.jsonl").is_file():
            return folder / "requests.jsonl"
    return None
