"""Where a served output meets the template's text for the messages that follow it.

A manager that keeps the exact ids the engine served extends them by `glue + tail`: `tail` is the
template's rendering of the appended messages plus the generation prompt, `glue` the template's
*closer* after the stored assistant message minus what the served output already ends with. The
per-family facts that decide the join are derived from the template by probing (`Closers.probe`)
and checked against the real render every time (`Closers.ending`):

* the closer: `<|im_end|>\\n` (Qwen's ChatML), `<｜end▁of▁sentence｜>` (DeepSeek), `<|eot_id|>`
  (Llama 3.1), `<|call|>` after a gpt-oss tool call and `<|end|>` after its other messages
  (`<|return|>` when the reply ends a training render); GLM-4.5 writes none: the next message's
  role token follows the reply directly;
* the served stop token overlaps that text: it is the closer's first token (Qwen, DeepSeek, Llama,
  gpt-oss calls) or, without a closer, the next message's first token (GLM stops on
  `<|observation|>` / `<|user|>`, which open the tool results / the next user turn);
* a stop token the template does not render there stands in for the closer's end token: gpt-oss
  ends a final answer with `<|return|>` where the continued history has `<|end|>`. Harmony asks
  to swap them before continuing, which would change a trained token, so the served one stays.

When the template re-renders earlier turns (the extended render does not start with the stored
path's render), the tail comes from an *anchored* render: the appended messages after a minimal
user question and a unique assistant reply (a text reply, or a call to the stored reply's tool when
the template wants a call before tool results), cut after that reply's closer, and checked to be
exactly how the real extended render ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from trace_tools.errors import ReplayError
from trace_tools.ids import suffix_prefix_overlap

# Probe bodies whose last characters differ, so the common suffix of two renders is the closer.
PROBE_A = "boundary probe, body one ends in A"
PROBE_B = "boundary probe, body two ends in Z"
ANCHOR_USER = "boundary anchor question"
ANCHOR_BODY = "boundary anchor reply 5e0c9d"
# What a renderer raises when a template refuses some messages: our wrapper of Jinja's errors, or
# the TypeError / ValueError a filter throws.
RENDER_ERRORS = (ReplayError, TypeError, ValueError)


class BoundaryUnverified(Exception):
    """No verified way to place the appended messages after the stored ones.

    `reason`: "close_unresolved" (no closer the template writes ends the stored path) or
    "boundary_unverified" (the anchored tail could not be checked against the full render).
    """

    def __init__(self, detail: str, reason: str = "boundary_unverified"):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Closers:
    """The closers a template writes after assistant messages: an end token, then `glue_after`.

    `writes_closer` False (GLM): nothing follows a reply but the next message.
    """

    writes_closer: bool
    end_tokens: tuple[str, ...]
    glue_after: str

    @classmethod
    def probe(cls, renderer: Any, tools: Sequence[dict] | None, kwargs: dict) -> Closers:
        """Derive the closers from two pairs of renders that differ only in a reply's last character.

        The reply as the last message gives the closer the template writes there; followed by a
        user question it gives the end token of a continued history (they differ for gpt-oss).
        The engine's stop tokens (`renderer.stop_tokens`, when the renderer names them) are end
        tokens too: the template writes them after tool calls.
        """
        last = _common_suffix(
            *(renderer.render_text(_probe_chat(body), tools, False, **kwargs) for body in (PROBE_A, PROBE_B))
        )
        if not last:
            return cls(False, (), "")
        first = _first_token_text(renderer, last)
        ends = [first, *getattr(renderer, "stop_tokens", ())]
        try:
            followed = _common_suffix(
                *(
                    renderer.render_text(
                        [*_probe_chat(body), {"role": "user", "content": ANCHOR_USER}], tools, False, **kwargs
                    )
                    for body in (PROBE_A, PROBE_B)
                )
            )
            ends.append(_first_token_text(renderer, followed))
        except RENDER_ERRORS:  # a template that refuses two user turns: the plain probe must do
            pass
        ordered = sorted({token for token in ends if token}, key=len, reverse=True)
        return cls(True, tuple(ordered), last[len(first) :])

    def ending(self, text: str) -> str | None:
        """The closer `text` ends with ("" for a template without closers), or None if none does."""
        if not self.writes_closer:
            return ""
        return next((end + self.glue_after for end in self.end_tokens if text.endswith(end + self.glue_after)), None)


def anchored_tail(
    renderer: Any,
    appended: Sequence[dict],
    tools: Sequence[dict] | None,
    kwargs: dict,
    closers: Closers,
    after: str,
    last: dict | None = None,
) -> str:
    """The appended messages' text when the template rewrote earlier turns (see the module docstring).

    The anchor reply is plain text; where the template refuses tool results after a text reply
    (gpt-oss) and the stored path ends with a call (`last`), the anchor reply is a call to the
    same tool instead, its arguments carrying the anchor text.
    """
    for base in _anchors(appended, last):
        try:
            text = renderer.render_text([*base, *appended], tools, True, **kwargs)
        except RENDER_ERRORS:
            continue
        tail = _after_anchor(text, closers)
        if tail is not None and after.endswith(tail) and closers.ending(after[: len(after) - len(tail)]) is not None:
            return tail
    raise BoundaryUnverified("no anchored render ends the way the full render does")


def _anchors(appended: Sequence[dict], last: dict | None) -> list[list[dict]]:
    user = {"role": "user", "content": ANCHOR_USER}
    anchors: list[list[dict]] = [[user, {"role": "assistant", "content": ANCHOR_BODY}]]
    calls = (last or {}).get("tool_calls") or []
    if appended and appended[0].get("role") == "tool" and calls and isinstance(calls[0], dict):
        name = (calls[0].get("function") or {}).get("name")
        call = {"type": "function", "function": {"name": name, "arguments": {"anchor": ANCHOR_BODY}}}
        anchors.append([user, {"role": "assistant", "content": "", "tool_calls": [call]}])
    return anchors


def _after_anchor(text: str, closers: Closers) -> str | None:
    """The text after the closer that ends the anchor reply, or None."""
    if text.count(ANCHOR_BODY) != 1:
        return None
    start = text.index(ANCHOR_BODY) + len(ANCHOR_BODY)
    if not closers.writes_closer:
        return text[start:]
    found = [(text.find(end + closers.glue_after, start), end + closers.glue_after) for end in closers.end_tokens]
    found = [(position, closer) for position, closer in found if position >= 0]
    if not found:
        return None
    position, closer = min(found, key=lambda item: (item[0], -len(item[1])))
    return text[position + len(closer) :]


def split_extension(
    renderer: Any,
    path: Sequence[dict],
    appended: Sequence[dict],
    tools: Sequence[dict] | None,
    kwargs: dict,
    closers: Closers,
) -> tuple[str, str, bool]:
    """(closer, tail, rewritten) for extending the stored `path` by `appended`.

    `rewritten`: the template re-rendered earlier turns, so the tail was anchored. Raises
    BoundaryUnverified when no closer ends the stored path in the extended render.
    """
    before = renderer.render_text(list(path), tools, False, **kwargs)
    after = renderer.render_text([*path, *appended], tools, True, **kwargs)
    rewritten = not after.startswith(before)
    if rewritten:
        tail = anchored_tail(renderer, appended, tools, kwargs, closers, after, path[-1] if path else None)
    else:
        tail = after[len(before) :]
    closer = closers.ending(after[: len(after) - len(tail)])
    if closer is None:
        raise BoundaryUnverified("the stored path does not end with a closer the template writes", "close_unresolved")
    return closer, tail, rewritten


def join(
    served: Sequence[int], closer_ids: Sequence[int], tail_ids: Sequence[int], stop_ids: Sequence[int] = ()
) -> tuple[list[int], list[int]]:
    """(glue, tail) such that `served + glue + tail` continues the served ids (module docstring rules)."""
    pieces = [*closer_ids, *tail_ids]
    overlap = suffix_prefix_overlap(served, pieces)
    if not overlap and served and closer_ids and served[-1] in stop_ids:
        overlap = 1  # the served stop token stands in for the closer's end token
    kept_closer = max(len(closer_ids) - overlap, 0)
    rest = pieces[overlap:]
    return rest[:kept_closer], rest[kept_closer:]


def _probe_chat(body: str) -> list[dict]:
    return [{"role": "user", "content": ANCHOR_USER}, {"role": "assistant", "content": body}]


def _first_token_text(renderer: Any, text: str) -> str:
    ids = renderer.encode(text)
    return renderer.decode(ids[:1]) if ids else ""


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n :]
