"""A harness profile as rows for people: the terminal table and report.html's profile section."""

from __future__ import annotations

import json
from typing import Any

_KEPT = {"call_ids.kept": "call ids kept", "reasoning.kept": "reasoning kept", "text.kept": "text kept"}


def profile_rows(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per transformation: tool, argument, what, count, of, served and echoed examples."""
    return [_row(entry) for entry in profile.get("transformations", [])]


def _row(entry: dict[str, Any]) -> dict[str, Any]:
    example = entry.get("example") or {}
    served, echoed = _example_values(entry, example)
    return {
        "tool": entry.get("tool", "(message)"),
        "argument": entry.get("argument", ""),
        "what": describe(entry),
        "count": entry.get("count") or 0,
        "of": entry.get("of") or 0,
        "served": served,
        "echoed": echoed,
        "where": f"{example.get('session', '')} turn {example.get('turn', '')}".strip(),
    }


def describe(entry: dict[str, Any]) -> str:
    kind = entry["kind"]
    if kind == "message":
        what = entry["what"]
        if what in _KEPT:
            return _KEPT[what]
        head, _, key = what.partition(".")
        return {
            "message_key_added": f"message key added: {key}",
            "message_key_removed": f"message key removed: {key}",
            "call_key_added": f"tool-call key added: {key}",
            "call_key_removed": f"tool-call key removed: {key}",
        }.get(head, what.replace(".", " ").replace("_", " "))
    if kind == "add_key":
        return f"key added: {entry['key']} = {json.dumps(entry['value'])}"
    if kind == "remove_key":
        return f"key removed: {entry['key']}"
    if kind == "key_order":
        rules = ", ".join(entry.get("rules") or []) or "no single rule"
        fixed = entry.get("fixed_orders") or {}
        order = f" → {', '.join(next(iter(fixed.values())))}" if len(fixed) == 1 else ""
        return f"key order rebuilt ({rules}){order}"
    if kind == "rstrip_lines":
        text = "trailing whitespace stripped per line: " + " ".join(c.split()[0] for c in entry["characters"])
        if entry.get("kept_characters"):
            text += "; kept: " + " ".join(c.split()[0] for c in entry["kept_characters"])
        if entry.get("character_class") and entry["character_class"] != "custom":
            text += f" ({entry['character_class']})"
        if entry.get("line_ends") == "crlf-cr":
            text += "; lines end at \\n, \\r\\n (\\r kept) and a lone \\r"
        if entry.get("except_file_types"):
            case = " (any case)" if entry.get("file_types_match") == "case-insensitive" else ""
            text += "; not in " + ", ".join(entry["except_file_types"]) + case
        return text
    if kind == "coerce_types":
        return "string arguments coerced to the schema's " + "/".join(entry.get("types") or ["type"])
    if kind == "strip_prefix":
        return f"prefix removed: {entry['pattern']!r}"
    if kind == "kept_verbatim":
        return "kept verbatim, trailing whitespace included"
    return kind.replace("_", " ")


def _example_values(entry: dict[str, Any], example: dict[str, Any]) -> tuple[Any, Any]:
    kind = entry["kind"]
    if kind == "key_order":
        return example.get("served"), example.get("echoed")
    if kind in ("add_key", "remove_key"):
        return list(example.get("served") or {}), list(example.get("echoed") or {})
    if "served" in example or "echoed" in example:
        return example.get("served"), example.get("echoed")
    return None, example.get("value")


def short(value: Any, limit: int = 60) -> str:
    """A value as one line: JSON escapes make whitespace visible (`\\t`, `\\u00a0`)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=True)
    text = json.dumps(text, ensure_ascii=True)[1:-1] if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def title(profile: dict[str, Any]) -> str:
    harness, measured = profile.get("harness", {}), profile.get("measured", {})
    return (
        f"harness profile: {harness.get('name')} {harness.get('version')} "
        f"({measured.get('echoes', 0)} echoed turns, {measured.get('sessions', 0)} sessions)"
    )


def page_rows(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for report.html: the examples in full, whitespace made visible."""
    return [
        {**row, "served_text": visible(row["served"]), "echoed_text": visible(row["echoed"])}
        for row in profile_rows(profile)
    ]


def visible(value: Any) -> str:
    """A value for a <pre>: line breaks kept, a trailing space as `·`, other whitespace as escapes."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return "\n".join(_visible_line(line) for line in value.split("\n"))


def _visible_line(line: str) -> str:
    body = line.rstrip(" ")
    text = "".join(c if c == " " or not (c.isspace() or c in "\u200b\ufeff") else _escape(c) for c in body)
    return text + "·" * (len(line) - len(body))


def _escape(char: str) -> str:
    return "\\t" if char == "\t" else f"\\u{ord(char):04x}"


def profile_table(profile: dict[str, Any]) -> Any:
    """A rich table that fits 80 columns (the example column folds)."""
    from rich.table import Table

    table = Table(title=title(profile), title_justify="left", show_lines=True)
    table.add_column("tool", overflow="fold", max_width=10)
    table.add_column("argument", overflow="fold", max_width=11)
    table.add_column("what the echo did", overflow="fold", ratio=3)
    table.add_column("n/of", justify="right", no_wrap=True)
    table.add_column("example (served → echoed)", overflow="fold", ratio=3)
    for row in profile_rows(profile):
        example = (
            f"{short(row['served'], 70)}\n→ {short(row['echoed'], 70)}"
            if row["served"] is not None
            else short(row["echoed"], 70)
        )
        seen = f"{row['count']}/{row['of']}" if row["of"] else "stated"  # `observed_in`: seen outside the probe
        table.add_row(row["tool"], row["argument"], row["what"], seen, example)
    return table


# -- the rewrite classes, per harness (docs/probe.md's table) ----------------------------------------
REWRITE_CLASSES = (
    ("defaults filled", ("add_key",)),
    ("keys removed", ("remove_key",)),
    ("key order", ("key_order",)),
    ("JSON spacing", ("arguments_reserialized", "arguments_type_changed")),
    ("schema-type coercion", ("coerce_types",)),
    ("trailing whitespace per line", ("rstrip_lines",)),
    ("prefixes", ("strip_prefix",)),
    ("reasoning", ("reasoning",)),
    ("tool-call ids", ("call_ids",)),
)


def rewrite_classes(profile: dict[str, Any]) -> dict[str, str]:
    """{rewrite class: what the profile states for it, one short line}; "none seen" when nothing."""
    found: dict[str, list[str]] = {name: [] for name, _ in REWRITE_CLASSES}
    for entry in profile.get("transformations") or ():
        kind = entry["kind"] if entry["kind"] != "message" else entry["what"].split(".")[0]
        for name, kinds in REWRITE_CLASSES:
            if kind in kinds:
                found[name].append(_class_cell(entry))
    return {name: "; ".join(dict.fromkeys(cells)) or "none seen" for name, cells in found.items()}


def _class_cell(entry: dict[str, Any]) -> str:
    where = ".".join(part for part in (entry.get("tool"), entry.get("argument")) if part and part != "*")
    kind = entry["kind"]
    if kind == "message":
        text = entry["what"].split(".", 1)[1].replace("_", " ")
    elif kind == "add_key":
        text = f"{entry['key']}={json.dumps(entry['value'])}"
        where = entry.get("tool", "")
    elif kind == "key_order":
        text = "/".join(entry.get("rules") or []) or "varies"
    elif kind == "rstrip_lines":
        text = (entry.get("character_class") or "custom") + f", {entry.get('line_ends', 'lf')}"
        if entry.get("except_file_types"):
            case = " any case" if entry.get("file_types_match") == "case-insensitive" else ""
            text += ", not " + "/".join(entry["except_file_types"]) + case
    elif kind == "strip_prefix":
        text = f"`{entry['pattern']}`"
    elif kind == "coerce_types":
        text = "/".join(entry.get("types") or [])
    else:
        text = kind.replace("_", " ")
    return f"{where}: {text}" if where else text
