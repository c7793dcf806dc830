"""The harness profile: what a harness changed in the history it echoed, measured (docs/probe.md).

An *echo pair* is one assistant reply as the gateway served it (a dump row's `response`) and the
same reply as the harness sent it back in a later request's history (found by its tool-call ids,
else by position: the assistant message right after the conversation the reply answered). The
detector compares the two and names each difference precisely enough to be replayed:

* message level: reasoning kept, dropped or rewritten; text kept, dropped or rewritten; message
  keys added (with their values) or removed; tool-call ids kept or rewritten; call-level keys
  added or removed; argument text re-serialized (OpenAI clients echo JSON text);
* per tool and argument: keys added (and their values), keys removed, key order (with the rule
  that explains every call, if one does: served order, added keys first or last, schema order,
  sorted), per-line trailing whitespace removed (which characters were removed and which trailing
  whitespace characters survived), a prefix removed (generalised to `cd {cwd} && ` when it is a
  `cd` into the session's working directory), a suffix removed, anything else as a unified diff;
  and, for whitespace, the file types whose values were left alone while others were stripped.

Every finding has a count, the number of echoes it could have applied to, and one verbatim
example (served and echoed values, session and turn). `transformations` is the flat, versioned
list the simulator and checkpoint-tree's echo rules consume (format in docs/probe.md).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from trace_tools.io.load import load
from trace_tools.io.write import write_json_atomic
from trace_tools.probe.differences import (
    char_name,
    character_class,
    is_blank,
    line_convention,
    matching_call,
    moved_reasoning,
    order_rules,
    prefix_pattern,
    raw_arguments,
    removed_prefix,
    rstripped,
    schema_order,
    trailing_blanks,
    trailing_run,
    unified_diff,
)
from trace_tools.probe.transformations import fixed_order, tool_transformations
from trace_tools.render.harness_echo import FORMAT, VERSION, file_type, working_directory
from trace_tools.render.harness_echo import read_profile as read_profile  # the reader lives with its consumers
from trace_tools.render.normalize import coerce_to_schema, parse_arguments, tool_types


@dataclass
class EchoPair:
    """A served reply and its echo (both OpenAI-form assistant messages)."""

    served: dict
    echoed: dict
    session: str = ""
    turn: int = 0
    cwd: str | None = None
    tools: list[dict] | None = None


@dataclass
class _Finding:
    count: int = 0
    example: Any = None

    def add(self, example: Any) -> None:
        self.count += 1
        if self.example is None:
            self.example = example


class Detector:
    """Accumulates echo pairs; `profile()` gives the result."""

    def __init__(self) -> None:
        self.pairs = 0
        self.messages: dict[str, _Finding] = defaultdict(_Finding)
        self.calls: dict[str, int] = defaultdict(int)
        self.tool: dict[tuple[str, str], _Finding] = defaultdict(_Finding)
        self.arguments: dict[tuple[str, str, str], _Finding] = defaultdict(_Finding)
        self.argument_totals: dict[tuple[str, str], int] = defaultdict(int)
        self.stripped: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.kept_trailing: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.by_type: dict[tuple[str, str], dict[str, dict[str, int]]] = defaultdict(
            lambda: defaultdict(lambda: {"stripped": 0, "kept": 0})
        )
        # per argument and file type: the trailing blanks of each value echoed unchanged
        self.kept_values: dict[tuple[str, str], dict[str, list[frozenset[str]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.orders: dict[str, dict[tuple[tuple[str, ...], tuple[str, ...]], _Finding]] = defaultdict(
            lambda: defaultdict(_Finding)
        )
        self.order_rules: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.added_values: dict[tuple[str, str], list[Any]] = defaultdict(list)
        self.served_with: dict[str, int] = defaultdict(int)
        self.served_calls = 0  # every call served, matched in the echo or not
        self.line_ends: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.separators: set[str] = set()  # between moved reasoning and a non-empty text

    # -- one pair -----------------------------------------------------------------------------
    def add(self, pair: EchoPair) -> None:
        self.pairs += 1
        served, echoed = pair.served, pair.echoed
        where = {"session": pair.session, "turn": pair.turn}
        self._blocks(served, echoed, where)
        self._message_keys(served, echoed, where)
        served_calls, echoed_calls = served.get("tool_calls") or [], echoed.get("tool_calls") or []
        if len(served_calls) != len(echoed_calls):
            self.messages["tool_calls.count_changed"].add(
                {**where, "served": len(served_calls), "echoed": len(echoed_calls)}
            )
        self.served_calls += len(served_calls)
        for position, call in enumerate(served_calls):
            match = matching_call(call, echoed_calls, position)
            if match is None:
                self.messages["tool_calls.dropped"].add({**where, "served": call})
                continue
            self._call(call, match, pair, where)

    def _blocks(self, served: dict, echoed: dict, where: dict) -> None:
        separator = moved_reasoning(served, echoed)
        if separator is not None:
            # The reasoning came back as text ahead of the visible text (a gateway that returned
            # it as text): one finding, not "reasoning dropped" plus "text rewritten".
            self.served_with["reasoning"] += 1
            self.messages["reasoning.moved_to_text"].add(
                {
                    **where,
                    "served": served.get("reasoning_content"),
                    "echoed": echoed.get("content"),
                    "separator": separator,
                }
            )
            return
        for key, label in (("reasoning_content", "reasoning"), ("content", "text")):
            before, after = served.get(key) or "", echoed.get(key) or ""
            self.served_with[label] += int(bool(before))
            if not before:
                if after:
                    self.messages[f"{label}.added"].add({**where, "echoed": after})
                continue
            outcome = "kept" if before == after else ("dropped" if not after else "rewritten")
            example = {**where, "served": before, "echoed": after}
            if outcome == "rewritten":
                example["diff"] = unified_diff(before, after)
            self.messages[f"{label}.{outcome}"].add(example)
        if (
            served.get("content") is None
            and echoed.get("content") == ""
            or served.get("content") == ""
            and echoed.get("content") is None
        ):
            self.messages["text.empty_representation_changed"].add(
                {**where, "served": served.get("content"), "echoed": echoed.get("content")}
            )

    def _message_keys(self, served: dict, echoed: dict, where: dict) -> None:
        if moved_reasoning(served, echoed) is not None:
            served = {key: value for key, value in served.items() if key != "reasoning_content"}
        for key in echoed.keys() - served.keys():
            self.messages[f"message_key_added.{key}"].add({**where, "value": echoed[key]})
        for key in served.keys() - echoed.keys():
            self.messages[f"message_key_removed.{key}"].add({**where, "value": served[key]})

    def _call(self, served: dict, echoed: dict, pair: EchoPair, where: dict) -> None:
        name = (served.get("function") or {}).get("name", "?")
        self.calls[name] += 1
        call_where = {**where, "tool": name}
        sid, eid = served.get("id"), echoed.get("id")
        self.messages["call_ids." + ("kept" if sid == eid else "dropped" if not eid else "rewritten")].add(
            {**call_where, "served": sid, "echoed": eid}
        )
        for key in echoed.keys() - served.keys():
            self.messages[f"call_key_added.{key}"].add({**call_where, "value": echoed[key]})
        for key in served.keys() - echoed.keys():
            self.messages[f"call_key_removed.{key}"].add({**call_where, "value": served[key]})
        served_args, echoed_args = parse_arguments(raw_arguments(served)), parse_arguments(raw_arguments(echoed))
        self._argument_text(name, served, echoed, served_args, echoed_args, call_where)
        if not isinstance(served_args, dict) or not isinstance(echoed_args, dict):
            return
        self._keys(name, served_args, echoed_args, pair, call_where)
        kind = file_type(served_args)
        coerced = coerce_to_schema(served_args, tool_types(pair.tools).get(name))
        for key in served_args.keys() & echoed_args.keys():
            before, after = served_args[key], echoed_args[key]
            if before != coerced[key] and coerced[key] == after and type(coerced[key]) is type(after):
                self.argument_totals[(name, key)] += 1
                self.arguments[(name, key, "type_coerced")].add(
                    {**call_where, "argument": key, "served": before, "echoed": after}
                )
                continue
            self._value(name, key, before, after, pair.cwd, kind, call_where)

    def _argument_text(
        self, name: str, served: dict, echoed: dict, served_args: Any, echoed_args: Any, where: dict
    ) -> None:
        before = (served.get("function") or {}).get("arguments")
        after = (echoed.get("function") or {}).get("arguments")
        if isinstance(before, str) and isinstance(after, str) and before != after and served_args == echoed_args:
            self.tool[(name, "arguments_reserialized")].add({**where, "served": before, "echoed": after})
        if isinstance(before, str) != isinstance(after, str):
            self.tool[(name, "arguments_type_changed")].add({**where, "served": before, "echoed": after})

    def _keys(self, name: str, served: dict, echoed: dict, pair: EchoPair, where: dict) -> None:
        added = [k for k in echoed if k not in served]
        for key in added:
            self.tool[(name, f"key_added.{key}")].add(
                {**where, "value": echoed[key], "served": served, "echoed": echoed}
            )
            self.added_values[(name, key)].append(echoed[key])
        for key in served.keys() - echoed.keys():
            self.tool[(name, f"key_removed.{key}")].add(
                {**where, "value": served[key], "served": served, "echoed": echoed}
            )
        served_order, echoed_order = tuple(served), tuple(echoed)
        self.orders[name][(served_order, echoed_order)].add(
            {**where, "served": list(served_order), "echoed": list(echoed_order)}
        )
        for rule in order_rules(served_order, echoed_order, added, schema_order(pair.tools, name)):
            self.order_rules[name][rule] += 1

    def _value(
        self, name: str, path: str, before: Any, after: Any, cwd: str | None, file_type: str | None, where: dict
    ) -> None:
        if isinstance(before, dict) and isinstance(after, dict):
            for key in before.keys() & after.keys():
                self._value(name, f"{path}.{key}", before[key], after[key], cwd, file_type, where)
            return
        if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
            for b, a in zip(before, after):
                self._value(name, f"{path}[]", b, a, cwd, file_type, where)
            return
        self.argument_totals[(name, path)] += 1
        example = {**where, "argument": path, "served": before, "echoed": after}
        if isinstance(before, str) and isinstance(after, str):
            self._string(name, path, before, after, cwd, file_type, example)
        elif before != after or type(before) is not type(after):
            self.arguments[(name, path, "value_rewritten")].add(example)
        else:
            self.arguments[(name, path, "unchanged")].add(example)

    def _string(
        self, name: str, path: str, before: str, after: str, cwd: str | None, file_type: str | None, example: dict
    ) -> None:
        key = (name, path)
        has_trailing = any(line and is_blank(line[-1]) for line in before.split("\n"))
        if before == after:
            self.arguments[(name, path, "unchanged")].add(example)
            if has_trailing:
                self.kept_values[key][file_type or "(none)"].append(frozenset(trailing_run(after)))
                self.arguments[(name, path, "trailing_whitespace_kept")].add(example)
            return
        prefix, rest = removed_prefix(before, after)
        stripped = rstripped(rest, after)
        if prefix:
            finding = self.arguments[(name, path, "prefix_removed:" + prefix_pattern(prefix, cwd))]
            finding.add({**example, "prefix": prefix})
        if stripped is not None:
            if stripped:
                self.arguments[(name, path, "trailing_whitespace_stripped")].add(example)
                self.line_ends[key].add(line_convention(rest, after))
                self.stripped[key] |= stripped
                self.by_type[key][file_type or "(none)"]["stripped"] += 1
                self.kept_trailing[key] |= trailing_blanks(after)
            return
        if before.endswith(after) or before.startswith(after):
            self.arguments[(name, path, "suffix_removed" if before.startswith(after) else "prefix_removed")].add(
                example
            )
            return
        self.arguments[(name, path, "rewritten")].add({**example, "diff": unified_diff(before, after)})

    # -- the result -----------------------------------------------------------------------------
    def profile(self, harness: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
        tools = {name: self._tool_section(name) for name in sorted(self.calls)}
        messages = {key: _finding_json(finding) for key, finding in sorted(self.messages.items())}
        return {
            "format": FORMAT,
            "version": VERSION,
            "harness": harness,
            "measured": {**measured, "echoes": self.pairs, "calls": dict(sorted(self.calls.items()))},
            "messages": messages,
            "tools": tools,
            "transformations": self.transformations(tools, messages),
        }

    def _tool_section(self, name: str) -> dict[str, Any]:
        mine = {k: f for (tool, k), f in self.tool.items() if tool == name}
        added = {k.split(".", 1)[1]: _finding_json(f) for k, f in mine.items() if k.startswith("key_added.")}
        removed = {k.split(".", 1)[1]: _finding_json(f) for k, f in mine.items() if k.startswith("key_removed.")}
        other = {k: _finding_json(f) for k, f in mine.items() if not k.startswith("key_")}
        orders = [
            {"served": list(served), "echoed": list(echoed), "count": f.count, "example": f.example}
            for (served, echoed), f in self.orders[name].items()
        ]
        calls = self.calls[name]
        rules = sorted(rule for rule, n in self.order_rules[name].items() if n == calls)
        if fixed_order(self.orders[name]):
            rules.append("fixed_order")
        arguments: dict[str, Any] = defaultdict(dict)
        for (tool, path, kind), finding in sorted(self.arguments.items()):
            if tool == name:
                arguments[path][kind] = _finding_json(finding)
        for (tool, path), total in self.argument_totals.items():
            if tool != name:
                continue
            section = arguments[path]
            section["echoes"] = total
            if (tool, path) in self.stripped:
                section["stripped_characters"] = sorted(char_name(c) for c in self.stripped[(tool, path)])
                section["character_class"] = character_class(
                    self.stripped[(tool, path)], self.kept_trailing[(tool, path)]
                )
            if (tool, path) in self.line_ends:
                section["line_ends"] = "crlf-cr" if "crlf-cr" in self.line_ends[(tool, path)] else "lf"
            if self.kept_trailing.get((tool, path)):
                section["kept_trailing_characters"] = sorted(char_name(c) for c in self.kept_trailing[(tool, path)])
            by_type = self._by_type((tool, path))
            if by_type:
                section["by_file_type"] = by_type
        return {
            "calls": calls,
            "keys_added": added,
            "keys_removed": removed,
            "key_order": {"rules_explaining_every_call": rules, "observed": orders},
            **other,
            "arguments": dict(sorted(arguments.items())),
        }

    def _by_type(self, key: tuple[str, str]) -> dict[str, dict[str, int]]:
        """Per file type: values stripped, and values left alone although they ended in characters
        this argument's stripping removes elsewhere (any trailing blank, if it is never stripped)."""
        stripped = self.stripped.get(key)
        counts = {t: dict(v) for t, v in self.by_type[key].items()} if key in self.by_type else {}
        for kind, values in self.kept_values.get(key, {}).items():
            kept = sum(1 for blanks in values if not stripped or blanks & stripped)
            entry = counts.setdefault(kind, {"stripped": 0, "kept": 0})
            entry["kept"] += kept
        return dict(sorted((t, n) for t, n in counts.items() if n["stripped"] or n["kept"]))

    def transformations(self, tools: dict[str, Any], messages: dict[str, Any]) -> list[dict[str, Any]]:
        """The flat list of everything the echo did (and the identities it kept), for replay."""
        out: list[dict[str, Any]] = []
        calls = sum(self.calls.values())
        for key, finding in messages.items():
            of = self._total(key, calls)
            entry = {"kind": "message", "what": key, "count": finding["count"], "of": of, "example": finding["example"]}
            if key == "reasoning.moved_to_text" and len(self.separators) <= 1:
                entry["separator"] = next(iter(self.separators), "")
            out.append(entry)
        for name, section in tools.items():
            out += tool_transformations(name, section, self.added_values)
        return out

    def _total(self, key: str, calls: int) -> int:
        """What a message-level finding could have happened to: calls for call findings (every
        served call for a dropped one), replies served with reasoning / text for what happened to
        them, every echo for anything else (a text added where none was served, say)."""
        label, _, what = key.partition(".")
        if key == "tool_calls.dropped":
            return self.served_calls
        if key.startswith("call_"):
            return calls
        if label in ("reasoning", "text") and what in ("kept", "dropped", "rewritten", "moved_to_text"):
            return self.served_with.get(label, 0)
        return self.pairs


def _finding_json(finding: _Finding) -> dict[str, Any]:
    return {"count": finding.count, "example": finding.example}


# -- from a dump ------------------------------------------------------------------------------------
def echo_pairs(sessions: Iterable[Any], cwd: dict[str, str] | None = None) -> Iterator[EchoPair]:
    """Each served reply with its first echo, per session (`cwd`: session id → working directory)."""
    for session in sessions:
        served_by_id: dict[str, Any] = {}
        served_by_length: dict[int, Any] = {}
        echoed: set[int] = set()
        for turn in session.turns:
            for position, message in enumerate(turn.messages):
                if message.get("role") != "assistant":
                    continue
                source = _source(message, served_by_id, served_by_length.get(position))
                if source is None or source.turn_index in echoed:
                    continue
                echoed.add(source.turn_index)
                directory = (cwd or {}).get(session.session_id)
                yield EchoPair(source.response, message, session.session_id, source.turn_index, directory, source.tools)
            if turn.response:
                for call in turn.response.get("tool_calls") or ():
                    if call.get("id"):
                        served_by_id[call["id"]] = turn
                served_by_length[len(turn.messages)] = turn


def _source(message: dict, by_id: dict[str, Any], by_position: Any) -> Any:
    for call in message.get("tool_calls") or ():
        if call.get("id") in by_id:
            return by_id[call["id"]]
    return by_position


def detect(
    pairs: Iterable[EchoPair], harness: dict[str, Any] | None = None, measured: dict[str, Any] | None = None
) -> dict[str, Any]:
    detector = Detector()
    for pair in pairs:
        detector.add(pair)
    return detector.profile(harness or {}, measured or {})


def detect_from_dump(
    dump: str | Path, *, harness: str, version: str, protocol: str, cwd: dict[str, str] | None = None
) -> dict[str, Any]:
    from trace_tools import __version__

    loaded = load(dump)
    cwd = cwd if cwd is not None else _working_directories(loaded.sessions)
    measured = {
        "sessions": len(loaded.sessions),
        "turns": sum(len(s.turns) for s in loaded.sessions),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trace_tools": __version__,
    }
    return detect(
        echo_pairs(loaded.sessions, cwd), {"name": harness, "version": version, "protocol": protocol}, measured
    )


def _working_directories(sessions: list[Any]) -> dict[str, str]:
    """Each session's working directory as its harness announced it (the first request that does)."""
    found = {session.session_id: _announced(session) for session in sessions}
    return {key: value for key, value in found.items() if value}


def _announced(session: Any) -> str | None:
    return next(filter(None, (working_directory(turn.messages) for turn in session.turns)), None)


# -- from any recording ---------------------------------------------------------------------------
def profile_recording(source: str | Path, *, harness: str | None = None, version: str | None = None) -> dict[str, Any]:
    """The harness profile of any recording (`trace-tools profile`): a probe or `record` run
    directory (its `dump/`), a dump file or directory (a `record` dump, an imported gateway log).
    The harness and version come from `harness`/`version`, else the recording
    (`render.harness_identity`: dump metadata, User-Agent, a probe's version log); each session's
    working directory from the session itself, where the harness states it."""
    from trace_tools import __version__
    from trace_tools.errors import UsageError
    from trace_tools.render.harness_identity import recorded_harness

    path = Path(source)
    if not path.exists():
        raise UsageError(f"no recording at {path}; give a dump (file or directory) or a probe / record run directory")
    run_dir = path if (path / "dump").is_dir() else None
    loaded = load(run_dir / "dump" if run_dir else path)
    metadata = (turn.metadata or {} for session in loaded.sessions for turn in session.turns)
    log = next((p for p in _request_logs(path) if p.is_file()), None)
    identity = recorded_harness(loaded.meta.harness, metadata, log)
    name = harness or (identity.name if identity else "unknown")
    found_version = version or _probe_version(run_dir) or (identity.version if identity else None)
    protocols = {(turn.metadata or {}).get("protocol") for session in loaded.sessions for turn in session.turns}
    cwd = _working_directories(loaded.sessions)
    measured = {
        "sessions": len(loaded.sessions),
        "turns": sum(len(s.turns) for s in loaded.sessions),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trace_tools": __version__,
        "source": str(path),
        "harness_from": "options" if harness else (identity.source if identity else "none"),
        "working_directories": len(cwd),
    }
    protocol = "anthropic" if protocols == {"anthropic"} else "openai"
    identity_json = {"name": name, "version": found_version or "unknown", "protocol": protocol}
    return detect(echo_pairs(loaded.sessions, cwd), identity_json, measured)


def _request_logs(path: Path) -> list[Path]:
    folder = path if path.is_dir() else path.parent
    return [folder / "requests.jsonl", folder.parent / "requests.jsonl"]


def _probe_version(run_dir: Path | None) -> str | None:
    """The version a probe run's `harness-logs/version.log` printed (`2.1.332 (Claude Code)`)."""
    log = run_dir / "harness-logs" / "version.log" if run_dir else None
    text = log.read_text(errors="replace").strip() if log and log.is_file() else ""
    return text.split()[0] if text else None


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    return write_json_atomic(profile, path)
