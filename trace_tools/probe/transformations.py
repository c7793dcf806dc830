"""A harness profile's findings as the flat, versioned list of transformations the simulator and
checkpoint-tree's echo rules consume (format in docs/probe.md)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from trace_tools.render.harness_echo import read_profile as read_profile


def tool_transformations(name: str, section: dict, added_values: dict) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    calls = section["calls"]
    for key, finding in section["keys_added"].items():
        values = added_values[(name, key)]
        entry = {
            "kind": "add_key",
            "tool": name,
            "key": key,
            "value": values[0],
            "values_constant": all(v == values[0] for v in values),
        }
        out.append({**entry, "count": finding["count"], "of": calls, "example": finding["example"]})
    for key, finding in section["keys_removed"].items():
        out.append(
            {
                "kind": "remove_key",
                "tool": name,
                "key": key,
                "count": finding["count"],
                "of": calls,
                "example": finding["example"],
            }
        )
    changed = [o for o in section["key_order"]["observed"] if o["served"] != o["echoed"]]
    if changed:
        out.append(
            {
                "kind": "key_order",
                "tool": name,
                "rules": section["key_order"]["rules_explaining_every_call"],
                "fixed_orders": fixed_order(section_orders(section)) or {},
                "count": sum(o["count"] for o in changed),
                "of": calls,
                "orders": [
                    {"served": o["served"], "echoed": o["echoed"], "count": o["count"]}
                    for o in section["key_order"]["observed"]
                ],
                "example": changed[0]["example"],
            }
        )
    for what in ("arguments_reserialized", "arguments_type_changed"):
        if what in section:
            out.append(
                {
                    "kind": what,
                    "tool": name,
                    "count": section[what]["count"],
                    "of": calls,
                    "example": section[what]["example"],
                }
            )
    for path, argument in section["arguments"].items():
        out += _argument_transformations(name, path, argument)
    return out


def _argument_transformations(name: str, path: str, argument: dict) -> list[dict[str, Any]]:
    out = []
    total = argument.get("echoes", 0)
    for kind, finding in argument.items():
        if not isinstance(finding, dict) or "count" not in finding or kind == "unchanged":
            continue
        entry: dict[str, Any] = {
            "tool": name,
            "argument": path,
            "count": finding["count"],
            "of": total,
            "example": finding["example"],
        }
        if kind == "trailing_whitespace_kept":
            if "trailing_whitespace_stripped" in argument:
                continue  # the exempt file types of the rstrip rule
            entry["kind"] = "kept_verbatim"
        elif kind == "trailing_whitespace_stripped":
            by_type = argument.get("by_file_type", {})
            exempt = sorted(t for t, n in by_type.items() if n["kept"] and not n["stripped"])
            entry.update(
                kind="rstrip_lines",
                characters=argument.get("stripped_characters", []),
                kept_characters=argument.get("kept_trailing_characters", []),
                character_class=argument.get("character_class"),
                line_ends=argument.get("line_ends", "lf"),
                except_file_types=exempt,
                by_file_type=by_type,
            )
            if _case_insensitive(exempt, by_type):
                entry.update(except_file_types=sorted({t.lower() for t in exempt}), file_types_match="case-insensitive")
        elif kind == "type_coerced":
            echoed = finding["example"]["echoed"]
            schema_type = "boolean" if isinstance(echoed, bool) else "integer" if isinstance(echoed, int) else "number"
            entry.update(kind="coerce_types", types=[schema_type])
        elif kind.startswith("prefix_removed:"):
            entry.update(kind="strip_prefix", pattern=kind.split(":", 1)[1])
        else:
            entry["kind"] = kind
        out.append(entry)
    return out


def _case_insensitive(exempt: list[str], by_type: dict[str, dict[str, int]]) -> bool:
    """Exempt file types seen in two spellings of one name (`.md`, `.MD`), none of whose other
    spellings was stripped: the harness compares file types case-insensitively."""
    lowered = [t.lower() for t in exempt]
    if len(set(lowered)) == len(lowered):
        return False
    return not any(n["stripped"] and t.lower() in lowered for t, n in by_type.items())


def fixed_order(orders: dict) -> dict[str, list[str]] | None:
    """{key set: the one order} when every echo of a key set had the same order whatever was served."""
    by_keys: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for _served, echoed in orders:
        by_keys[",".join(sorted(echoed))].add(tuple(echoed))
    if not by_keys or any(len(found) != 1 for found in by_keys.values()):
        return None
    return {keys: list(next(iter(found))) for keys, found in sorted(by_keys.items())}


def section_orders(section: dict) -> dict:
    return {(tuple(o["served"]), tuple(o["echoed"])): o for o in section["key_order"]["observed"]}
