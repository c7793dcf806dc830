"""Find drifted turns and name their cause.

A turn N *drifts* when a later request M echoes N's response and M's prompt ids no longer
extend what the engine served for N (`prompt_N + output_N`). The cause comes from a fixed,
documented taxonomy (docs/drift_causes.md), decided from the message-level difference between
the stored response and its echo, plus the token-level difference:

* `whitespace`           trailing whitespace stripped from the lines of string arguments (any
                         known harness's character set: Python's or JavaScript's `trimEnd`)
* `type_coercion`        a string argument came back as the schema's integer, number or boolean
                         (Claude Code: `timeout: "60000"` → 60000)
* `schema_default`       a tool-schema default the model omitted was filled in
* `command_prefix`       a leading `cd <working directory> && ` (or a prefix a harness profile
                         names) was removed from an argument
* `key_order_or_spacing` tool-argument key order rebuilt or JSON spacing changed (same values)
* `reasoning`            reasoning dropped from the echo, re-keyed (other field, inlined), or
                         sent back as plain text ahead of the content
* `tool_call_id`         tool-call `index` / `id` changed (invisible to the template; breaks
                         managers that compare raw messages, e.g. miles strict, uni-agent)
* `template_rewrite`     the template, not the echo, changed history: the same message rendered
                         differently in the longer conversation (reasoning stripped, DeepSeek V3's
                         generation-prompt `<think>` and tool-outputs closer dropped), or an
                         earlier turn re-rendered
* `tokenizer_boundary`   same text, different token split (the model emitted a non-canonical
                         split that re-tokenization merges)
* `unexpressible_rewrite` the same calls and characters, respelled in a way no class states
                         (blanks inside a line, a scalar's type outside the schema): a harness
                         rewrite to measure, not an edit
* `genuine_edit`         the echo changed what the turn says or does

A cosmetic cause is only named when the classes together make the two messages equal; anything
else is `unexpressible_rewrite` or `genuine_edit`, so a real edit is never reported as cosmetic. The
harness profiles consulted are the ones trace-tools ships (`render.harness_echo`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from trace_tools.ids import common_prefix_len
from trace_tools.pipeline.prepared import render_prompt
from trace_tools.render.boundary import RENDER_ERRORS
from trace_tools.render.canonical import canonicalize_response
from trace_tools.render.harness_echo import shipped_echoes, working_directory
from trace_tools.render.normalize import (
    EchoSchema,
    blank_lines_everywhere,
    coerce_to_schema,
    drop_schema_defaults,
    parse_arguments,
    strip_cwd_prefix,
)

CAUSES = (
    "whitespace",
    "type_coercion",
    "schema_default",
    "command_prefix",
    "key_order_or_spacing",
    "reasoning",
    "tool_call_id",
    "template_rewrite",
    "tokenizer_boundary",
    "unexpressible_rewrite",
    "genuine_edit",
)
UNEXPLAINED = ("unexpressible_rewrite", "genuine_edit")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


@dataclass
class DriftFinding:
    """One echoed turn: where its served ids and the next prompt part, and why."""

    turn_index: int  # the generated turn whose response was echoed
    echo_turn: int  # the later turn whose request carries the echo
    token_drift: bool  # served ids are not a prefix of the echo turn's prompt
    divergence: int | None  # first differing position (LCP) when token_drift
    served_len: int
    prompt_len: int  # length of turn N's own prompt (start of its response)
    cause: str | None  # None when neither tokens nor raw messages differ
    causes: list[str] = field(default_factory=list)
    message_diff: list[str] = field(default_factory=list)


def continuation_pairs(
    canonical: Sequence[list[dict]], turn_indices: Sequence[int]
) -> list[tuple[int, int, int | None]]:
    """(N, M, p): turn M is the next request of N's conversation; p is the first message of N's
    request that M changed (None when M extends N's request unchanged).

    `canonical` holds each turn's request under slime's canonicalization, in turn order. M is the
    first later turn that opens with the same first message (the same conversation, not a
    subagent) and is longer than N's request. A turn re-issued with the same request (a retry)
    supersedes N, which then has no continuation of its own.
    """
    pairs = []
    for i, mine in enumerate(canonical):
        for j in range(i + 1, len(canonical)):
            theirs = canonical[j]
            if theirs == mine:
                break  # retried: the later generation supersedes this one
            if theirs[:1] != mine[:1] or len(theirs) <= len(mine):
                continue
            changed = next((p for p, (a, b) in enumerate(zip(mine, theirs)) if a is not b and a != b), None)
            pairs.append((turn_indices[i], turn_indices[j], changed))
            break
    return pairs


def find_drift(prepared: Any) -> list[DriftFinding]:
    """Drift findings for every continued turn of a `PreparedSession`."""

    turns = {p.turn.turn_index: p for p in prepared.turns}
    cwd = working_directory(prepared.turns[0].turn.messages) if prepared.turns else None
    findings = []
    for n, m, changed in continuation_pairs(prepared.canonical("slime"), list(turns)):
        finding = _finding(turns[n], turns[m], changed, prepared.renderer, cwd)
        if finding is not None:
            findings.append(finding)
    return findings


def _finding(earlier: Any, later: Any, changed: int | None, renderer: Any, cwd: str | None) -> DriftFinding | None:
    turn_n, turn_m = earlier.turn, later.turn
    prompt, output, nxt = earlier.prompt_ids, turn_n.output_ids, later.prompt_ids
    lcp = _served_prefix(prompt, output, nxt)
    prompt_len, served_len = len(prompt), len(prompt) + len(output)
    token_drift = lcp < served_len
    # The served ids as one list only where the ids drifted, the only case `classify` reads them.
    served = [*prompt, *output] if token_drift else []
    if changed is not None:
        causes, diff = _history_change(turn_n.messages[changed], turn_m.messages[changed], turn_n.tools, cwd)
    else:
        stored = turn_n.response if turn_n.response is not None else earlier.response_message
        echo = turn_m.messages[len(turn_n.messages)]
        if echo.get("role") != "assistant":
            return None
        causes, diff = classify(
            stored,
            echo,
            turn_n.tools,
            token_drift,
            lcp,
            served,
            nxt,
            prompt_len,
            renderer,
            cwd=cwd,
            byte_exact=lambda: _byte_exact_prompt(earlier, later, renderer),
        )
    return DriftFinding(
        turn_n.turn_index,
        turn_m.turn_index,
        token_drift,
        lcp if token_drift else None,
        served_len,
        prompt_len,
        causes[0] if causes else None,
        causes,
        diff,
    )


def _served_prefix(prompt: Sequence[int], output: Sequence[int], nxt: Sequence[int]) -> int:
    """How many leading ids the next prompt shares with `prompt + output` (the ids served for the
    earlier turn), without joining them: the prompt is nearly all of them, and most turns share
    all of it."""
    lcp = common_prefix_len(prompt, nxt)
    if lcp < len(prompt) or not output:
        return lcp
    return lcp + common_prefix_len(output, nxt[lcp : lcp + len(output)])


def _history_change(before: dict, after: dict, tools, cwd: str | None) -> tuple[list[str], list[str]]:
    """A message earlier than the echo changed: cosmetic only if a normalisation explains it."""
    diff = message_diff(before, after)
    if before.get("role") == "assistant" == after.get("role"):
        return _cosmetic_message_causes(before, after, tools, cwd) or [uncosmetic_cause(before, after)], diff
    if blank_lines_everywhere(before) == blank_lines_everywhere(after):
        return ["whitespace"], diff
    return ["genuine_edit"], diff


def _byte_exact_prompt(earlier: Any, later: Any, renderer: Any) -> list[int] | None:
    """The next prompt had the harness echoed the stored reply exactly (None without a renderer)."""

    if renderer is None or earlier.response_message is None:
        return None
    messages = list(later.messages)
    messages[len(earlier.messages)] = earlier.response_message
    try:
        return render_prompt(renderer, messages, later.tools, later.turn)
    except RENDER_ERRORS:  # a template that cannot render the stored reply explains nothing here
        return None


def classify(
    stored: dict | None,
    echo: dict,
    tools,
    token_drift: bool,
    lcp: int,
    served: list[int],
    nxt: list[int],
    prompt_len: int,
    renderer,
    *,
    cwd: str | None = None,
    byte_exact: Callable[[], list[int] | None] | None = None,
) -> tuple[list[str], list[str]]:
    """Causes (most specific first) and the message-level difference, as readable paths.

    `byte_exact` gives the next prompt as a byte-exact echo would have rendered it: when that
    prompt leaves the served ids no later than the real one, the template (not the echo) made the
    first difference, and `template_rewrite` leads the causes.
    """

    stored = stored or {"role": "assistant", "content": ""}
    diff = message_diff(stored, echo)
    if not token_drift:
        if not diff:
            return [], diff
        return _cosmetic_message_causes(stored, echo, tools, cwd) or [uncosmetic_cause(stored, echo)], diff
    if lcp < prompt_len - _generation_prompt_len(renderer):
        return ["template_rewrite"], diff  # divergence before this turn's block: an earlier turn re-rendered

    def without_the_echo() -> str | None:
        """What leaves the served ids no later than here even had the harness echoed the reply
        byte for byte: the template, or the tokenizer's split of the model's own tokens; None when
        the echo's rewrite is the first difference."""
        exact = byte_exact() if byte_exact is not None and stored != echo else None
        at = common_prefix_len(served, exact) if exact is not None else len(served)
        if exact is None or at > lcp:
            return None
        return "tokenizer_boundary" if _same_characters(served, exact, at, renderer) else "template_rewrite"

    if canonicalize_response(stored) == canonicalize_response(echo):
        cause = _same_message_cause(stored, echo, served, nxt, lcp, renderer)
        first = without_the_echo() if cause not in ("template_rewrite", "tokenizer_boundary") else None
        return ([first, cause] if first else [cause]), diff
    causes = _cosmetic_message_causes(stored, echo, tools, cwd) or [uncosmetic_cause(stored, echo)]
    first = without_the_echo()
    if first:  # a genuine edit (or a rewrite no class states) still leads
        causes = [causes[0], first] if causes[0] in UNEXPLAINED else [first, *causes]
    return causes, diff


def _generation_prompt_len(renderer) -> int:
    """Tokens the generation prompt adds (e.g. `<|im_start|>assistant\n<think>\n`): a divergence
    inside them belongs to this turn's block, since re-rendering can merge across its end."""
    if renderer is None:
        return 0
    known = getattr(renderer, "generation_prompt_tokens", None)
    if known is not None:
        return known
    probe = [{"role": "user", "content": "x"}]
    return max(len(renderer.render(probe, None, True)) - len(renderer.render(probe, None, False)), 0)


def _same_message_cause(stored, echo, served, nxt, lcp, renderer) -> str:
    """The messages agree; the tokens do not. Which layer produced the difference?"""
    if _arguments_key_order_differs(stored, echo) or _raw_json_differs(stored, echo):
        return "key_order_or_spacing"
    if renderer is None:
        return "template_rewrite"
    if _same_characters(served, nxt, lcp, renderer):
        return "tokenizer_boundary"  # same characters, another split
    served_text = renderer.decode(served[lcp:])
    next_text = renderer.decode(nxt[lcp : lcp + len(served) - lcp + 16])
    if _squeeze(next_text).startswith(_squeeze(served_text)) and "<tool_call>" in renderer.decode(served):
        return "key_order_or_spacing"  # the model's JSON spacing differs from the template's
    return "template_rewrite"


def _same_characters(served: list[int], nxt: list[int], lcp: int, renderer) -> bool:
    """The text after the divergence is the same characters on both sides (only the split differs).

    The next prompt goes on far past the served ids; the same number of tokens (plus margin)
    covers the served text, since re-tokenization only merges."""
    served_text = renderer.decode(served[lcp:])
    return renderer.decode(nxt[lcp : lcp + len(served) - lcp + 16]).startswith(served_text)


def _squeeze(text: str) -> str:
    return "".join(text.split())


def _cosmetic_message_causes(stored: dict, echo: dict, tools, cwd: str | None = None) -> list[str]:
    """Name the echo-equivalence classes (`normalize.arguments_view`, applied one at a time) under
    which the canonical messages become equal; [] when together they do not."""

    a, b = canonicalize_response(stored) or {}, canonicalize_response(echo) or {}
    causes = []
    if _reasoning_of(a) != _reasoning_of(b) or _reasoning_rekeyed(echo):
        causes.append("reasoning")
        b = _reasoning_moved_back(a, b)
        a, b = _without_reasoning(a), _without_reasoning(b)
    schema = EchoSchema.of(tools, cwd)
    steps: list[tuple[str, Callable[[str, Any], Any]]] = [
        ("type_coercion", lambda name, args: coerce_to_schema(args, schema.types.get(name))),
        ("schema_default", lambda name, args: drop_schema_defaults(args, schema.defaults.get(name))),
        ("command_prefix", lambda name, args: _without_prefixes(name, args, schema.prefixes, cwd)),
    ]
    for cause, step in steps:
        if a == b:
            break
        na, nb = _with_args(a, step), _with_args(b, step)
        if (na, nb) != (a, b) and _changed_differently(a, na, b, nb):
            causes.append(cause)
        a, b = na, nb
    if a != b and blank_lines_everywhere(a) == blank_lines_everywhere(b):
        causes.append("whitespace")
        a, b = a, a
    if a != b:
        return []
    if _key_order_rebuilt(stored, echo) or (not causes and _raw_json_differs(stored, echo)):
        causes.append("key_order_or_spacing")
    if not causes and _only_wire_ids(message_diff(stored, echo)):
        causes.append("tool_call_id")
    return causes


def _changed_differently(a: Any, na: Any, b: Any, nb: Any) -> bool:
    """A class step explains part of the difference: it changed one side, or both unequally."""
    return (na != a) != (nb != b) or message_diff(a, b) != message_diff(na, nb)


def _without_prefixes(name: str, args: Any, prefixes: tuple[str, ...], cwd: str | None) -> Any:
    """`args` without a `cd <cwd> && ` and without the prefixes a shipped profile names."""
    args = strip_cwd_prefix(args, prefixes)
    for harness in shipped_echoes():
        args = harness.strip_prefixes(name, args, cwd)
    return args


def uncosmetic_cause(stored: dict, echo: dict) -> str:
    """What an echo no class explains is: `unexpressible_rewrite` when it keeps the same calls
    (names, ids, argument keys) and the same characters apart from blanks and the spelling of
    scalars (`"5"` for 5, tabs for spaces, a converted line end): a harness rewrite the classes
    cannot state; else `genuine_edit`, the echo says or does something else."""
    a, b = canonicalize_response(stored) or {}, canonicalize_response(echo) or {}
    if _call_skeleton(a) != _call_skeleton(b):
        return "genuine_edit"
    return "unexpressible_rewrite" if _spelling(a) == _spelling(b) else "genuine_edit"


def _call_skeleton(message: dict) -> list[tuple[Any, Any, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        args = parse_arguments(function.get("arguments"))
        out.append((call.get("id"), function.get("name"), sorted(args) if isinstance(args, dict) else None))
    return out


def _spelling(value: Any) -> Any:
    """`value` with every blank removed from strings and scalars written as their JSON text."""
    if isinstance(value, dict):
        return {key: _spelling(item) for key, item in value.items() if key not in ("id", "index", "type")}
    if isinstance(value, list):
        return [_spelling(item) for item in value]
    if isinstance(value, str):
        return _squeeze(value).strip("\"'")
    return _squeeze(json.dumps(value))


def _reasoning_moved_back(stored: dict, echo: dict) -> dict:
    """`echo` with the stored reasoning taken off the front of its text, where the harness sent
    the reasoning back as text (a gateway that returned it so); otherwise `echo` itself."""
    reasoning, content = _reasoning_of(stored), echo.get("content")
    if not reasoning or _reasoning_of(echo) or not isinstance(content, str) or not content.startswith(reasoning):
        return echo
    rest = content[len(reasoning) :]
    return {**echo, "content": rest.strip()} if rest.strip() == (stored.get("content") or "").strip() else echo


def _key_order_rebuilt(stored: dict, echo: dict) -> bool:
    """Some call's shared argument keys come back in another order."""
    pairs = zip(stored.get("tool_calls") or [], echo.get("tool_calls") or [])
    for a, b in pairs:
        x, y = (parse_arguments((c.get("function") or {}).get("arguments")) for c in (a, b))
        if isinstance(x, dict) and isinstance(y, dict) and [k for k in x if k in y] != [k for k in y if k in x]:
            return True
    return False


def _reasoning_of(message: dict) -> str:
    return (message.get("reasoning_content") or "").strip()


def _reasoning_rekeyed(echo: dict) -> bool:
    content = echo.get("content")
    return any(k in echo for k in REASONING_KEYS[1:]) or (isinstance(content, str) and "<think>" in content)


def _without_reasoning(message: dict) -> dict:
    out = {k: v for k, v in message.items() if k not in REASONING_KEYS}
    content = out.get("content")
    if isinstance(content, str) and "</think>" in content:
        out["content"] = content.split("</think>", 1)[1].lstrip("\n")
    return out


def _with_args(message: dict, fn) -> dict:
    if not message.get("tool_calls"):
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": fn(c["function"]["name"], c["function"]["arguments"])}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def _arguments_key_order_differs(stored: dict, echo: dict) -> bool:
    def orders(message):
        out = []
        for call in message.get("tool_calls") or []:
            args = parse_arguments(call.get("function", {}).get("arguments"))
            if isinstance(args, str):
                return None
            out.append(_key_paths(args))
        return out

    return orders(stored) != orders(echo)


def _key_paths(value: Any) -> Any:
    if isinstance(value, dict):
        return [(k, _key_paths(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_key_paths(v) for v in value]
    return None


def _raw_json_differs(stored: dict, echo: dict) -> bool:
    """Argument strings that differ as text but parse to the same JSON."""

    def raw(message):
        return [c.get("function", {}).get("arguments") for c in message.get("tool_calls") or []]

    a, b = raw(stored), raw(echo)
    if a == b or len(a) != len(b):
        return False
    try:
        return all(
            json.loads(x) == json.loads(y) if isinstance(x, str) and isinstance(y, str) else x == y
            for x, y in zip(a, b)
        )
    except ValueError:
        return False


def message_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Readable differences between two JSON-like values (`path: old → new`)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in b:
                out.append(f"{sub}: {_short(a[key])} → <missing>")
            elif key not in a:
                out.append(f"{sub}: <missing> → {_short(b[key])}")
            elif a[key] is not b[key] and not (isinstance(a[key], str) and a[key] == b[key]):
                # An equal string parses alike: no need to parse JSON arguments to find nothing.
                out += message_diff(_parsed(a[key]), _parsed(b[key]), sub)
        if not out and list(a) != list(b):
            out.append(f"{path or '<message>'}: key order {list(a)} → {list(b)}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = [d for i, (x, y) in enumerate(zip(a, b)) for d in message_diff(x, y, f"{path}[{i}]")]
        out += [f"{path}[{i}]: {_short(x)} → <missing>" for i, x in enumerate(a[len(b) :], start=len(b))]
        return out + [f"{path}[{i}]: <missing> → {_short(y)}" for i, y in enumerate(b[len(a) :], start=len(a))]
    if isinstance(a, str) and isinstance(b, str) and a != b:
        return [f"{path}: {' → '.join(differing_parts(a, b))}"]
    if a != b:  # different shapes: content parts against a string, a number against text
        left, right = _joined_text(a), _joined_text(b)
        if isinstance(left, str) and isinstance(right, str) and left != right:
            return [f"{path} (text): {' → '.join(differing_parts(left, right))}"]
        return [f"{path}: {' → '.join(differing_parts(_text(a), _text(b), quote=False))}"]
    return []


def differing_parts(a: str, b: str, context: int = 16, limit: int = 48, quote: bool = True) -> tuple[str, str]:
    """Both strings cut to the part that differs (plus a little context), as quoted reprs (or, with
    `quote=False`, as they are: JSON text) with `…` where text was left out, so the difference
    shows even deep inside long values."""
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    start = max(prefix - context, 0)

    def cut(text: str) -> str:
        end = min(len(text), max(len(text) - suffix, prefix) + context, prefix + limit)
        shown = repr(text[start:end]) if quote else text[start:end]
        return ("…" if start else "") + shown + ("…" if end < len(text) else "")

    return cut(a), cut(b)


def _parsed(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _only_wire_ids(diff: list[str]) -> bool:
    def wire(entry: str) -> bool:
        head = entry.split(":", 1)[0]
        return head.endswith(".id") or head.endswith(".index") or head.endswith(".type") or head == "tool_call_id"

    return bool(diff) and all(wire(d) for d in diff)


def _joined_text(value: Any) -> Any:
    """A list of text content parts as the one string a template renders from them; else the value."""
    if isinstance(value, list) and value and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    return value


def _text(value: Any) -> str:
    """A value as the JSON text a reader compares (a string stays itself, quoted)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
