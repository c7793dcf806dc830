"""Harness profiles, replayed: what a measured harness does to the replies it echoes.

A harness profile (`trace-tools probe`, docs/probe.md) is a flat list of transformations measured
on the real client. `HarnessEcho(profile).echo(reply, cwd)` applies them to a served reply and
returns the assistant message that harness sends back, in the form a recording stores it:

* the simulator's echo behaviours play a harness this way (`claude-code` is the shipped
  measured profile);
* checkpoint-tree recognises an echo as the same call when the profile's transformations of the
  stored reply give it, and the drift causes name a removed prefix (`strip_prefixes`).

Only transformations that are rules can be replayed: keys added with a constant value, keys
removed, a key order rebuilt, per-line trailing whitespace of a named character set stripped
(except in named file types), a named prefix removed (`cd {cwd} && ` needs the session's working
directory), reasoning dropped or moved into the text, and whole-message key changes seen on every
echo. A free rewrite (`rewritten`, `value_rewritten`, a changed call count, regenerated ids) is
listed in `unsupported`; the simulator refuses such a profile, recognition ignores the entry.

Shipped profiles live in `harness_profiles/` (package data): only our own probe scenarios' text
appears in their examples, never the harness's.
"""

from __future__ import annotations

import copy
import json
import re
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from trace_tools.errors import UsageError
from trace_tools.render.normalize import (
    JS_WHITESPACE,
    LINE_ENDS,
    coerce_to_schema,
    cwd_prefixes,
    parse_arguments,
    rstrip_lines,
    strip_cwd_prefix,
    tool_types,
)

FORMAT, VERSION = "trace-tools-harness-profile", 1
PATH_KEYS = ("file_path", "path", "filename", "notebook_path")
SHIPPED = Path(__file__).with_name("harness_profiles")
# How harnesses state the session's working directory: Claude Code's env block ("Primary working
# directory:" / "Working directory:"), `cwd:` lines, Codex's `<cwd>` element, and Gemini CLI's and
# Qwen Code's "I'm currently working in the directory: ...".
_WORKING_DIRECTORY = re.compile(
    r"(?:Primary working directory|Working directory|cwd|currently working in the directory):[ \t]*[`'\"]?(/[^\s`'\"]*)"
    r"|<cwd>\s*(/[^<\s]*)\s*</cwd>",
    re.IGNORECASE,
)
_CD_ANY = re.compile(r"^cd (\S+) && ")
_REPLAYABLE_MESSAGES = ("reasoning.dropped", "reasoning.moved_to_text", "text.dropped", "call_ids.dropped")
_HARMLESS_MESSAGES = (".kept", "text.empty_representation_changed")


# -- shared small helpers ----------------------------------------------------------------------
def working_directory(messages: Iterable[Any]) -> str | None:
    """The working directory a harness announces in its system or user text, if it does."""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "user"):
            continue
        match = _WORKING_DIRECTORY.search(_text(message.get("content")))
        if match:
            found = match.group(1) or match.group(2)
            return found.rstrip(".,;:") if len(found) > 1 else found
    return None


def file_type(arguments: Any) -> str | None:
    """The suffix (or name, without one) of the file a call's arguments name."""
    if not isinstance(arguments, dict):
        return None
    for key in PATH_KEYS:
        value = arguments.get(key)
        if isinstance(value, str) and value:
            suffix = Path(value).suffix
            return suffix or Path(value).name
    return None


# -- profiles ------------------------------------------------------------------------------------
def read_profile(path: str | Path) -> dict[str, Any]:
    """A harness profile file (usage error when it is missing, not JSON, or another format/version)."""

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no harness profile at {path}; give a profile.json written by `trace-tools probe`") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON ({exc}); give a profile.json written by `trace-tools probe`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"{path} is not a trace-tools harness profile")
    if data.get("version") != VERSION:
        raise UsageError(
            f"{path} is harness profile version {data.get('version')}; this trace-tools reads version {VERSION}"
        )
    return data


@lru_cache(maxsize=None)
def _shipped(name: str) -> dict[str, Any]:
    return read_profile(SHIPPED / name)


def shipped_names() -> list[str]:
    """`<harness>-<version>` of every profile shipped with trace-tools."""
    return sorted(path.stem for path in SHIPPED.glob("*.json"))


def load_profile(spec: str | Path) -> dict[str, Any]:
    """A profile by file path, or a shipped one by `<harness>-<version>` or `<harness>` (newest)."""

    text = str(spec)
    names = shipped_names()
    if text in names:
        return _shipped(text + ".json")
    versions = [name for name in names if name.rsplit("-", 1)[0] == text]
    if versions:
        return _shipped(max(versions, key=_version_key) + ".json")
    if Path(text).exists():
        return read_profile(text)
    raise UsageError(f"no harness profile {text!r}: give a profile.json path or one of {', '.join(names)}")


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name.rsplit("-", 1)[-1]))


@lru_cache(maxsize=None)
def shipped_echoes() -> tuple["HarnessEcho", ...]:
    """Every shipped profile, ready to apply (what checkpoint-tree and the drift causes know)."""
    return tuple(HarnessEcho(_shipped(name + ".json")) for name in shipped_names())


# -- the echo --------------------------------------------------------------------------------------
class HarnessEcho:
    """One profile's transformations as functions of a served reply (see the module docstring)."""

    def __init__(self, profile: dict[str, Any]):
        harness = profile.get("harness") or {}
        self.name, self.version = str(harness.get("name", "?")), str(harness.get("version", "?"))
        self.protocol = harness.get("protocol", "openai")
        self.unsupported: list[str] = []
        self.message_rules: dict[str, dict[str, Any]] = {}
        self.add: dict[str, dict[str, Any]] = {}
        self.remove: dict[str, set[str]] = {}
        self.orders: dict[str, dict[str, Any]] = {}
        self.strips: dict[str, list[StripRule]] = {}
        self.coerce: set[str] = set()  # tools whose string arguments come back as the schema's type
        self.prefixes: dict[str, list[tuple[str, str]]] = {}
        self.compact_arguments: bool | None = None
        for entry in profile.get("transformations") or ():
            self._take(entry)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    # -- reading the profile --------------------------------------------------------------------
    def _take(self, entry: dict[str, Any]) -> None:
        kind, tool = entry.get("kind"), entry.get("tool", "")
        if not entry.get("count") and not entry.get("observed_in"):
            return  # measured, never seen (`observed_in`: a rule seen outside the probe's scenarios)
        if kind == "message":
            self._message(entry)
        elif kind == "add_key" and entry.get("values_constant", True):
            self.add.setdefault(tool, {})[entry["key"]] = entry["value"]
        elif kind == "remove_key":
            self.remove.setdefault(tool, set()).add(entry["key"])
        elif kind == "key_order":
            self.orders[tool] = entry
        elif kind == "rstrip_lines":
            self.strips.setdefault(tool, []).append(_strip_rule(entry))
        elif kind == "coerce_types":
            self.coerce.add(tool)
        elif kind == "strip_prefix":
            self.prefixes.setdefault(tool, []).append((entry["argument"], entry["pattern"]))
        elif kind == "arguments_reserialized":
            self.compact_arguments = _compact_example(entry.get("example") or {})
            if self.compact_arguments is None:
                self.unsupported.append(f"{tool}: arguments_reserialized")
        elif kind not in ("kept_verbatim", "arguments_type_changed"):
            where = ".".join(part for part in (tool, entry.get("argument")) if part)
            self.unsupported.append(f"{where}: {kind}")

    def _message(self, entry: dict[str, Any]) -> None:
        what = entry["what"]
        always = entry.get("count") == entry.get("of")
        example = entry.get("example") or {}
        if what.endswith(_HARMLESS_MESSAGES):
            return
        if what == "reasoning.moved_to_text" and "separator" not in entry:
            self.unsupported.append("message: reasoning.moved_to_text with varying separators")
        elif what in _REPLAYABLE_MESSAGES and always:
            self.message_rules[what] = entry
        elif what.startswith(("message_key_removed.", "message_key_added.")) and (
            always or example.get("value") is None
        ):
            self.message_rules[what] = entry
        else:
            self.unsupported.append(f"message: {what}")

    # -- applying it ----------------------------------------------------------------------------------
    def echo(self, reply: dict[str, Any], cwd: str | None = None, tools: Sequence[dict] | None = None) -> dict:
        """The assistant message this harness sends back for the served `reply` (OpenAI form)."""
        message = self.served(reply)
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = parse_arguments(function.get("arguments"))
            if isinstance(arguments, dict):
                changed = self.arguments(function.get("name", ""), arguments, cwd, tools)
                function["arguments"] = self._spelled(function.get("arguments"), changed)
        return self._message_level(message)

    def arguments(
        self, name: str, arguments: dict, cwd: str | None = None, tools: Sequence[dict] | None = None
    ) -> dict:
        """One call's arguments as the harness echoes them."""
        out = copy.deepcopy(arguments)
        if name in self.coerce or "*" in self.coerce:
            out = coerce_to_schema(out, tool_types(tools).get(name))
        for key in self.remove.get(name, ()):
            out.pop(key, None)
        added = [key for key in self.add.get(name, {}) if key not in out]
        for key in added:
            out[key] = copy.deepcopy(self.add[name][key])
        out = self.strip_prefixes(name, out, cwd)
        kind = file_type(out)
        for rule in self.strips.get(name, ()):
            if not rule.exempts(kind):
                strip = partial(rstrip_lines, characters=rule.characters, line_ends=rule.line_ends)
                out = _map_path(out, rule.argument, strip)
        if name in self.orders:
            out = _reorder(out, self.orders[name], added, _schema_keys(tools, name))
        return out

    def strip_prefixes(self, name: str, arguments: Any, cwd: str | None) -> Any:
        """`arguments` with only this profile's prefix removals applied (the drift cause `command_prefix`)."""
        for path, pattern in self.prefixes.get(name, ()) if isinstance(arguments, dict) else ():
            arguments = _map_path(arguments, path, partial(_strip_prefix, pattern=pattern, cwd=cwd))
        return arguments

    def served(self, reply: dict) -> dict:
        """The reply as a recording of this harness's protocol holds it (a copy): OpenAI as is;
        Anthropic as the adapter translates content blocks (ids kept, no `index`)."""
        message = copy.deepcopy(reply)
        if self.protocol != "anthropic":
            return message
        # An Anthropic client echoes content blocks; the recording stores them as the adapter
        # translates them: text joined, thinking as reasoning_content, tool_use inputs as objects.
        out: dict[str, Any] = {"role": "assistant", "content": _text(message.get("content"))}
        if message.get("reasoning_content"):
            out["reasoning_content"] = message["reasoning_content"]
        calls = message.get("tool_calls") or []
        if calls:
            out["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {
                        "name": (call.get("function") or {}).get("name"),
                        "arguments": parse_arguments((call.get("function") or {}).get("arguments")) or {},
                    },
                }
                for call in calls
            ]
        return out

    def _spelled(self, served: Any, arguments: dict) -> Any:
        if not isinstance(served, str):
            return arguments
        if self.compact_arguments:
            return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        if self.compact_arguments is False or parse_arguments(served) != arguments:
            return json.dumps(arguments, ensure_ascii=False)
        return served

    def _message_level(self, message: dict) -> dict:
        rules = self.message_rules
        reasoning = message.get("reasoning_content")
        if reasoning and "reasoning.moved_to_text" in rules:
            separator = rules["reasoning.moved_to_text"].get("separator", "")
            text = message.get("content") or ""
            message["content"] = reasoning + (separator + text if text else "")
            message.pop("reasoning_content")
        elif "reasoning.dropped" in rules:
            message.pop("reasoning_content", None)
        if "text.dropped" in rules:
            message["content"] = ""
        for what, entry in rules.items():
            head, _, key = what.partition(".")
            if head == "message_key_removed" and key in message:
                if entry.get("count") == entry.get("of") or message[key] is None:
                    message.pop(key)
            elif head == "message_key_added" and key not in message:
                message[key] = copy.deepcopy((entry.get("example") or {}).get("value"))
        if "call_ids.dropped" in rules:
            for call in message.get("tool_calls") or ():
                call.pop("id", None)
        return message


class StripRule(NamedTuple):
    """An `rstrip_lines` entry: which argument, the characters, the line-end convention, and the
    file types left alone (matched case-insensitively when `file_types_match` says so: Claude
    Code leaves `.MD` alone like `.md`)."""

    argument: str
    characters: frozenset[str] | None
    line_ends: str
    exempt: frozenset[str]
    case_insensitive: bool

    def exempts(self, kind: str | None) -> bool:
        if kind is None:
            return False
        return (kind.lower() if self.case_insensitive else kind) in self.exempt


def _strip_rule(entry: dict[str, Any]) -> StripRule:
    line_ends = entry.get("line_ends", "lf")
    if line_ends not in LINE_ENDS:
        raise UsageError(f"harness profile: line_ends {line_ends!r} is not one of {', '.join(LINE_ENDS)}")
    insensitive = entry.get("file_types_match") == "case-insensitive"
    exempt = frozenset(str(k).lower() if insensitive else str(k) for k in entry.get("except_file_types") or ())
    return StripRule(entry["argument"], _character_set(entry), line_ends, exempt, insensitive)


def _character_set(entry: dict[str, Any]) -> frozenset[str] | None:
    klass = entry.get("character_class")
    if klass == "javascript-trimEnd":
        return JS_WHITESPACE
    if klass == "python-rstrip":
        return None
    return frozenset(chr(int(name.split()[0][2:], 16)) for name in entry.get("characters") or ())


def _compact_example(example: dict[str, Any]) -> bool | None:
    echoed = example.get("echoed")
    value = parse_arguments(echoed)
    if not isinstance(echoed, str) or not isinstance(value, dict):
        return None
    if echoed == json.dumps(value, ensure_ascii=False, separators=(",", ":")):
        return True
    if echoed == json.dumps(value, ensure_ascii=False):
        return False
    return None


def _strip_prefix(value: Any, pattern: str, cwd: str | None) -> Any:
    if not isinstance(value, str):
        return value
    if pattern == "cd {cwd} && ":  # any spelling of the directory: bare, trailing slash, quoted
        return strip_cwd_prefix({"": value}, cwd_prefixes(cwd))[""]
    if pattern == "cd {other directory} && ":
        match = _CD_ANY.match(value)
        if match and (cwd is None or match.group(1).rstrip("/") != cwd.rstrip("/")):
            return value[match.end() :]
        return value
    return value[len(pattern) :] if value.startswith(pattern) else value


def _map_path(arguments: Any, path: str, fn: Callable[[Any], Any]) -> Any:
    """`arguments` with `fn` applied to the string values at `path` (`edits[].new_string` nests)."""
    head, _, rest = path.partition(".")
    key, listed = (head[:-2], True) if head.endswith("[]") else (head, False)
    if not isinstance(arguments, dict) or key not in arguments:
        return arguments
    value = arguments[key]
    if listed and isinstance(value, list):
        value = [_map_path(item, rest, fn) if rest else _apply(item, fn) for item in value]
    elif not listed:
        value = _map_path(value, rest, fn) if rest else _apply(value, fn)
    return {**arguments, key: value}


def _apply(value: Any, fn: Callable[[Any], Any]) -> Any:
    return fn(value) if isinstance(value, str) else value


def _schema_keys(tools: Sequence[dict] | None, name: str) -> list[str] | None:
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(function, dict) and function.get("name") == name:
            return list(((function.get("parameters") or function.get("input_schema") or {}).get("properties") or {}))
    return None


def _reorder(arguments: dict, rule: dict[str, Any], added: list[str], schema: list[str] | None) -> dict:
    """Arguments in the order the profile's key-order rule gives (unknown keys keep their place, last)."""
    rules = rule.get("rules") or []
    keys = list(arguments)
    order: list[str] | None = None
    fixed = rule.get("fixed_orders") or {}
    if fixed:
        known = fixed.get(",".join(sorted(keys))) or max(fixed.values(), key=lambda o: len(set(o) & set(keys)))
        order = [key for key in known if key in arguments]
    elif "sorted" in rules:
        order = sorted(keys)
    elif "schema_order" in rules and schema is not None:
        order = [key for key in schema if key in arguments]
    elif "added_keys_first" in rules:
        order = added + [key for key in keys if key not in added]
    if order is None:
        return arguments
    order += [key for key in keys if key not in order]
    return {key: arguments[key] for key in order}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)
