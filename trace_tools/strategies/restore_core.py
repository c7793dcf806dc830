"""Echo restore: slime PR #2282's `restore_generated_messages`, as a function over a tree manager.

A harness often replays a prior tool call *re-rendered*: it fills in a schema default the model
omitted (Claude Code adds `replace_all: false` to Edit) and right-strips every line of string
arguments. The echo then no longer `==` the generated leaf, so the tree router stops one level
short and the rendered prompt no longer extends the served tokens. Restoring swaps a recognised
echo back to the dict the manager stored *before* the prompt is rendered, which fixes routing and
tokens at once. Recognition compares both messages through a coarser view (schema defaults
dropped, per-line trailing whitespace stripped); it never tries to undo the harness's edits.

The manager is duck-typed: `manager._trees[sid]` is the root node and every node has `role`,
`message`, `children` (insertion order) and `turn` (None for routing-only nodes). That is the
slime `TrajectoryManager` layout that `trace_tools.strategies.tree_core` reproduces.

Counters (documented in docs/upstream_restore_linear.md):
* `restored_echoes`: substitutions made (one per incoming message swapped for a stored dict). A
  history that keeps echoing the same re-rendered call is restored again on every later turn, so
  this counts per turn; `RestoreOutcome.restored_nodes` lets a caller count distinct echoes.
* `unrecognized_echoes`: walks that stopped on an incoming *assistant* message while the node
  reached so far has at least one *generated* assistant child, i.e. an echo of something we
  generated that came back in a form we would not recognise (or recognised ambiguously). The walk
  stops there, so a call counts at most one; once the turn is recorded the tree holds the client's
  version, so the same echo is not counted again on later turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

# Re-exported: the echo-normalisation views live in the render layer, which drift analysis shares.
from trace_tools.render.normalize import drop_schema_defaults, strip_trailing_ws, tool_defaults  # noqa: F401


@dataclass(slots=True)
class RestoreOutcome:
    """What one restore walk did: the (possibly) restored list and what it saw."""

    messages: list[dict]
    restored: int = 0
    unrecognized: int = 0
    restored_nodes: list = field(default_factory=list)  # the generated nodes whose dicts came back


def is_same_tool_call_echo(held: Any, incoming: Any, defaults: dict[str, dict[str, Any]]) -> bool:
    """True when `incoming` is the harness's re-rendered echo of the generated message `held`.

    Asymmetric by design: both must be tool-calling messages of the same role with the same
    number of calls, everything outside `tool_calls` must be exactly equal, and each call pair
    must agree on `type`, function name and arguments once defaults are dropped and lines
    right-stripped. Plain-text assistants are never echoes (there is nothing to normalise).
    """
    if not isinstance(held, dict) or not isinstance(incoming, dict):
        return False
    if held.get("role") != incoming.get("role"):
        return False
    held_calls, incoming_calls = held.get("tool_calls"), incoming.get("tool_calls")
    if (
        not held_calls
        or not incoming_calls
        or not isinstance(held_calls, list)
        or not isinstance(incoming_calls, list)
        or len(held_calls) != len(incoming_calls)
    ):
        return False
    if _without_tool_calls(held) != _without_tool_calls(incoming):
        return False
    return all(_same_call(h, i, defaults) for h, i in zip(held_calls, incoming_calls))


def _without_tool_calls(message: dict) -> dict:
    return {key: value for key, value in message.items() if key != "tool_calls"}


def _same_call(held: Any, incoming: Any, defaults: dict[str, dict[str, Any]]) -> bool:
    if not isinstance(held, dict) or not isinstance(incoming, dict):
        return False
    held_fn, incoming_fn = held.get("function"), incoming.get("function")
    if not isinstance(held_fn, dict) or not isinstance(incoming_fn, dict):
        return False
    if held.get("type") != incoming.get("type") or held_fn.get("name") != incoming_fn.get("name"):
        return False
    name = held_fn.get("name")
    name_defaults = defaults.get(name, {}) if isinstance(name, str) else {}

    def norm(args: Any) -> Any:
        return strip_trailing_ws(drop_schema_defaults(args, name_defaults))

    return norm(held_fn.get("arguments")) == norm(incoming_fn.get("arguments"))


def restore_walk(
    manager: Any, sid: str, messages: list[dict], tools_schema: Sequence[dict] | None = None
) -> RestoreOutcome:
    """Walk the sid's message tree along `messages`, restoring recognised echoes; see the module doc.

    The input list is never mutated; untouched items stay the same objects. With no tree for the
    sid the very same list object comes back.
    """
    root = manager._trees.get(sid)
    if root is None:
        return RestoreOutcome(messages)
    defaults = tool_defaults(tools_schema)
    out, node, depth, outcome = list(messages), root, 0, RestoreOutcome([])
    while depth < len(out):
        message = out[depth]
        exact = _first_exact_child(node, message)
        if exact is not None:
            node, depth = exact, depth + 1
            continue
        echoes = [
            child
            for child in node.children
            if _is_generated_assistant(child) and is_same_tool_call_echo(child.message, message, defaults)
        ]
        if len(echoes) != 1:
            outcome.unrecognized += int(_stops_on_generated_echo(node, message))
            break
        out[depth] = echoes[0].message  # the stored generated dict, whitespace and all
        node, depth = echoes[0], depth + 1
        outcome.restored += 1
        outcome.restored_nodes.append(echoes[0])
    outcome.messages = out
    return outcome


def restore_generated_messages(
    manager: Any, sid: str, messages: list[dict], tools_schema: Sequence[dict] | None = None
) -> list[dict]:
    """PR #2282's pre-render restore: `messages` with recognised echoes swapped for stored dicts.

    Call it after canonicalization and before rendering the prompt, so both the rendered tokens
    and `record_turn`'s routing see the generated message. Returns a new list (or `messages`
    itself when the sid has no tree yet).
    """
    return restore_walk(manager, sid, messages, tools_schema).messages


def _first_exact_child(node: Any, message: dict) -> Any:
    role = message.get("role") if isinstance(message, dict) else None
    for child in node.children:
        if child.role == role and child.message == message:
            return child
    return None


def _is_generated_assistant(node: Any) -> bool:
    return node.role == "assistant" and node.turn is not None


def _stops_on_generated_echo(node: Any, message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and any(_is_generated_assistant(child) for child in node.children)
    )
