"""Incremental rendering: a conversation that extends one already rendered costs only its new part.

A gateway's replay renders the same history again and again: every turn re-sends the whole
conversation, and every strategy renders it in its own variants. Rendering and tokenizing the
whole conversation each time is what made replay as slow as a throwaway script. This engine
keeps, per conversation prefix, the rendered text (`add_generation_prompt=False`) and its token
ids, and extends them:

**Text.** For `messages = prefix + delta`, the delta's text comes from rendering a short
*window* instead of the whole conversation: the prefix's messages that are neither `assistant`
nor `tool` (system prompts and user turns: what templates compute global state from, such as
Qwen's "last user query" that decides where reasoning is shown), then the prefix from its last
assistant message on, then the delta. With `A = render(window_context)` and
`B = render(window_context + delta)`, the conversation's text is `text(prefix) + B[len(A):]`.
Three rules keep that exact, each checked on every use:

* the delta holds only `assistant` and `tool` messages (a new user or system message can make
  a template rewrite earlier turns, e.g. Qwen3 drops old reasoning after a new user query);
* the window renders the kept tail of the prefix exactly as the full render did (its text is a
  suffix of `text(prefix)`), so the template's state at the boundary is the same;
* `B` starts with `A` (the template does not rewrite history within the window).

Anything else falls back to a full render and is counted by reason (`stats`). Each template is
also checked once, on synthetic conversations, against full renders (`self_check`); a template
that fails is always rendered in full.

**Ids.** Added tokens (`<|im_start|>`, `<|im_end|>`, `<tool_call>`, ...) are hard boundaries:
the tokenizer splits them off before anything else, so the text on either side encodes
independently. A new text that shares a prefix with a cached one reuses the cached ids up to
the last such boundary inside the shared part and encodes only the rest. This holds for full
renders too, so even a fallback tokenizes only what changed.

Caches live for one session (`reset()` between sessions keeps memory bounded by the largest
session); message digests are memoised by object identity, which is safe because canonical
messages cannot change: the pipeline freezes them (`render.canonical.freeze`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from trace_tools.ids import common_prefix_len
from trace_tools.io.write import read_cached, write_cached
from trace_tools.memo import IdentityMemo

_DELTA_ROLES = ("assistant", "tool")
_SCAN = 4096  # characters searched back for a boundary before widening the search
_MAX_ENTRIES = 4096


def _dumps(value: Any) -> bytes:
    try:
        import orjson

        return orjson.dumps(value)
    except (ImportError, TypeError):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr).encode("utf-8")


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _content_digest(message: Any) -> bytes:
    return _digest(_dumps(message))


@dataclass(frozen=True)
class Rules:
    """How a template may be rendered incrementally, decided per template by `self_check`.

    `tools`: pass the tools to window renders (False when they only shape the header, which the
    window cuts off anyway). `suffix`: the generation prompt only appends to the plain render, so
    one window render gives both.
    """

    tools: bool
    suffix: bool


# Cheapest first; the first that reproduces every probe conversation exactly is used.
CANDIDATES = tuple(Rules(tools, suffix) for tools in (False, True) for suffix in (True, False))


@dataclass(slots=True)
class _Text:
    """A rendered text and (lazily) its ids; `base` is a cached text this one extends or shares a
    prefix with, `shared` the length of that common prefix."""

    text: str
    base: "_Text | None"
    shared: int
    ids: list[int] | None = None
    # (message index, text offset) where the last incrementally appended messages start, so the
    # next extension can read its context's text off this one instead of rendering it again.
    tail: tuple[int, int] | None = None
    # Set where a text encoded right after this one took its list over and extended it: this
    # text's ids are the first `size` of `ids` (`_span`). The list, not the text, is shared, so
    # texts hold no cycle and are freed as soon as the caches drop them.
    size: int | None = None


class IncrementalRenderer:
    """Renders through `apply(messages, tools, add_generation_prompt, kwargs) -> str` incrementally.

    `encode(text) -> list[int]` tokenizes; `boundaries` maps hard-boundary token strings to ids.
    """

    def __init__(
        self,
        apply: Callable[..., str],
        encode: Callable[[str], list[int]],
        boundaries: dict[str, int],
        verdict_path: Callable[[], Path | None] | None = None,
    ):
        self._apply, self._encode = apply, encode
        self._verdict_path = verdict_path
        self._boundaries = _Boundaries(_independent(boundaries))
        self.rules: Rules | None = CANDIDATES[0]
        self.stats: Counter = Counter()
        self._checked = False
        self.reset()

    def reset(self) -> None:
        """Forget every cached text (between sessions)."""
        self._prefixes: OrderedDict[bytes, _Text] = OrderedDict()
        self._results: OrderedDict[bytes, _Text] = OrderedDict()
        self._windows: OrderedDict[bytes, str] = OrderedDict()
        self._messages: IdentityMemo[bytes] = IdentityMemo()
        self._links: dict[tuple[bytes, int], tuple[Any, bytes]] = {}
        self._contexts: IdentityMemo[bytes] = IdentityMemo()
        self._last: _Text | None = None
        self._last_encoded: _Text | None = None  # `encode_text`'s previous text

    # -- public --------------------------------------------------------------------------------
    def text(self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs: dict) -> str:
        return self._render(list(messages), tools, generation, kwargs).text

    def ids(self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool, kwargs: dict) -> list[int]:
        """The render's token ids: the cached list itself (callers must not modify it)."""
        return self._ids_of(self._render(list(messages), tools, generation, kwargs))

    def encode_text(self, text: str) -> list[int]:
        """Ids of a text that usually extends the one encoded here before (a strategy's own prompt
        text, a turn longer each call): the ids of what the two share, up to its last hard
        boundary, are reused and only the rest is encoded. The list is kept: callers must not
        modify it."""
        last = self._last_encoded
        entry = _Text(text, last, common_prefix_len(last.text, text) if last else 0)
        ids = self._ids_of(entry)
        entry.base = None  # the next call's base, not a chain holding every earlier text
        self._last_encoded = entry
        return ids

    # -- rendering -----------------------------------------------------------------------------
    def _render(self, messages: list[dict], tools, generation: bool, kwargs: dict) -> _Text:
        if not self._checked:
            self._decide_rules()
        chain = self._chain(messages, tools, kwargs)
        key = chain[-1] + (b"g" if generation else b"p")
        cached = self._results.get(key)
        if cached is not None:
            self.stats["cache_hits"] += 1
            return cached
        entry = self._extend(messages, tools, generation, kwargs, chain) if self.rules and chain else None
        if entry is None:
            entry = self._full(messages, tools, generation, kwargs, chain)
        self._put(self._results, key, entry)
        self._last = entry
        return entry

    def _extend(self, messages, tools, generation, kwargs, chain) -> _Text | None:
        """The incremental path; None (with the reason counted) when a full render is needed."""
        assert self.rules is not None, "_render extends only under chosen rules"
        k = next((k for k in range(len(messages), 0, -1) if chain[k] in self._prefixes), 0)
        if k == 0:
            self.stats["full:no_cached_prefix"] += 1
            return None
        delta = messages[k:]
        if any(m.get("role") not in _DELTA_ROLES for m in delta):
            self.stats["full:appended_role"] += 1
            return None
        prefix = self._prefixes[chain[k]]
        window = self._window(messages[:k])
        if window is None:
            self.stats["full:media_in_history"] += 1
            return None
        head, context, start = window
        window_tools = tools if self.rules.tools else None
        try:
            head_text = self._window_text(head, window_tools, False, kwargs)
            if context and prefix.tail is not None and prefix.tail[0] == start:
                before = head_text + prefix.text[prefix.tail[1] :]  # the context as the full render has it
            else:
                before = self._window_text(head + context, window_tools, False, kwargs)
                if not (before.startswith(head_text) and prefix.text.endswith(before[len(head_text) :])):
                    self.stats["full:context_mismatch"] += 1
                    return None
            plain, after = self._window_pair(head, head + context + delta, window_tools, generation, kwargs)
        except Exception:  # a window the template refuses; the full render decides
            self.stats["full:window_error"] += 1
            return None
        if not (after.startswith(before) and plain.startswith(before)):
            self.stats["full:history_rewrite"] += 1
            return None
        self.stats["incremental"] += 1
        grown = _Text(prefix.text + plain[len(before) :], prefix, len(prefix.text), tail=(k, len(prefix.text)))
        self._put(self._prefixes, chain[-1], grown)
        if not generation:
            return grown
        return self._with_generation_prompt(grown, prefix.text + after[len(before) :])

    def _window_pair(
        self, head: list[dict], messages: list[dict], tools, generation: bool, kwargs: dict
    ) -> tuple[str, str]:
        """(plain render, render as asked) of a window: one render when the template's generation
        prompt is a pure suffix (the head's own generation prompt tells which). Windows are kept
        (`_window_text`): conversations that differ only before the window (strategies build
        their own histories) and the same conversation asked with and without the generation
        prompt render the same window, a sixth of a replay's window renders."""
        if not generation:
            plain = self._window_text(messages, tools, False, kwargs)
            return plain, plain
        after = self._window_text(messages, tools, True, kwargs)
        assert self.rules is not None, "window renders belong to the incremental path"
        if self.rules.suffix:
            prompt = self._generation_prompt(head, tools, kwargs)
            if prompt is not None and after.endswith(prompt):
                return after[: len(after) - len(prompt)], after
        return self._window_text(messages, tools, False, kwargs), after

    def _generation_prompt(self, head: list[dict], tools, kwargs: dict) -> str | None:
        plain = self._window_text(head, tools, False, kwargs)
        prompted = self._window_text(head, tools, True, kwargs)
        return prompted[len(plain) :] if prompted.startswith(plain) else None

    @staticmethod
    def _with_generation_prompt(plain: _Text, text: str) -> _Text:
        # Usually the generation prompt only appends, so the ids extend the plain render's.
        if text.startswith(plain.text):
            return _Text(text, plain, len(plain.text))
        return _Text(text, plain, common_prefix_len(plain.text, text))

    def _full(self, messages, tools, generation: bool, kwargs: dict, chain) -> _Text:
        self.stats["full"] += 1
        text = self._apply(messages, tools, generation, kwargs)
        plain = text if not generation else self._apply(messages, tools, False, kwargs)
        base = self._last
        shared = common_prefix_len(base.text, plain) if base is not None else 0
        state = _Text(plain, base if shared else None, shared)
        if chain:
            self._put(self._prefixes, chain[-1], state)
        if not generation:
            return state
        return self._with_generation_prompt(state, text)

    @staticmethod
    def _window(prefix: list[dict]) -> tuple[list[dict], list[dict], int] | None:
        """(kept head, context, context start): the prefix's messages before its last assistant
        message that are neither assistant nor tool, then the prefix from that assistant on. None
        when a dropped message carries media (templates count images across the conversation)."""
        last = next((i for i in range(len(prefix) - 1, -1, -1) if prefix[i].get("role") == "assistant"), None)
        if last is None:
            return list(prefix), [], len(prefix)
        head: list[dict] = []
        dropped: list[dict] = []
        for message in prefix[:last]:
            (dropped if message.get("role") in _DELTA_ROLES else head).append(message)
        if any(_has_media(m) for m in dropped):
            return None
        return head, prefix[last:], last

    def _window_text(self, messages: list[dict], tools, generation: bool, kwargs: dict) -> str:
        key = self._chain(messages, tools, kwargs)[-1] + (b"g" if generation else b"p")
        text = self._windows.get(key)
        if text is None:
            text = self._apply(messages, tools, generation, kwargs)
            self._put(self._windows, key, text)
        return text

    # -- ids -----------------------------------------------------------------------------------
    def _ids_of(self, entry: _Text) -> list[int]:
        asked = entry
        pending = []
        while entry.ids is None:
            pending.append(entry)
            if entry.base is None:
                break
            entry = entry.base
        copied: list[int] | None = None  # the list the last text encoded here copied, no one else's yet
        for item in reversed(pending):
            item.ids, copied = self._encode_after(item, copied)
        ids, size = _span(asked)
        if size < len(ids):  # a text whose list a later one took over: its own copy, once asked
            ids = asked.ids = ids[:size]
            asked.size = None
        return ids

    def _encode_after(self, entry: _Text, fresh: list[int] | None) -> tuple[list[int], list[int] | None]:
        """`entry`'s ids, and the same list if it was copied here (no caller holds it yet). A
        base whose list is `fresh` (encoded just before, in the same call) and a prefix of this
        text's ids hands its list over instead of being copied: asking for a turn's prompt with
        the generation prompt then copies the history once, not once for the plain render and
        again for the prompt (a tenth of `reconstruct`'s encoding time)."""
        base = entry.base
        if base is None or base.ids is None or (cut := self._boundary(base, entry.shared)) is None:
            ids = self._encode(entry.text)
            self.stats["tokens_encoded"] += len(ids)
            return ids, None
        text_at, token_at = cut
        tail = self._encode(entry.text[text_at:])
        self.stats["tokens_encoded"] += len(tail)
        self.stats["tokens_reused"] += token_at
        ids, size = _span(base)
        kept = size - token_at  # the base's ids after the cut
        if ids is fresh and base.size is None and tail[:kept] == ids[token_at:size]:
            ids += tail[kept:]
            base.size = size
            return ids, ids
        ids = ids[:token_at]  # extended in place: `a[:k] + b` would copy the prefix twice
        ids += tail
        return ids, ids

    def _boundary(self, base: _Text, limit: int) -> tuple[int, int] | None:
        """(text position, token index) in `base` of its last hard boundary starting before `limit`."""
        text = base.text
        start = max(0, limit - _SCAN)
        while (found := self._boundaries.last(text, start, limit)) is None and start > 0:
            start = max(0, start - 16 * _SCAN)
        if found is None:
            return None
        position, token = found
        # The boundary is the n-th occurrence of its token counting from the end of the text, and
        # every occurrence of an added token's text is that token, so it is the n-th occurrence of
        # its id counting from the end of the ids.
        ids, size = _span(base)
        return position, _nth_from_end(ids, size, self._boundaries.ids[token], text.count(token, position))

    # -- digests -------------------------------------------------------------------------------
    def _chain(self, messages: list[dict], tools, kwargs: dict) -> list[bytes]:
        """Running digests: [context, context+m0, context+m0+m1, ...]; [] when not JSON-like."""
        link = self._context_link(tools, kwargs)
        chain = [link]
        links = self._links
        for message in messages:
            # Keyed by the message object: the same history is chained again on every call.
            hit = links.get((link, id(message)))
            if hit is None or hit[0] is not message:
                hit = links[link, id(message)] = (message, _digest(link + self._message_digest(message)))
            link = hit[1]
            chain.append(link)
        return chain

    def _context_link(self, tools, kwargs: dict) -> bytes:
        return self._contexts.get(tools, lambda _: _digest(_dumps([tools, kwargs])), key=_dumps(kwargs))

    def _message_digest(self, message: Any) -> bytes:
        if len(self._messages) > 8 * _MAX_ENTRIES:
            self._messages.clear()
            self._links.clear()
        return self._messages.get(message, _content_digest)

    @staticmethod
    def _put(cache: OrderedDict, key: bytes, value: Any) -> None:
        cache[key] = value
        cache.move_to_end(key)
        if len(cache) > _MAX_ENTRIES:
            cache.popitem(last=False)

    # -- checks --------------------------------------------------------------------------------
    def _decide_rules(self) -> None:
        """`self_check`'s verdict, remembered on disk per template (the probes cost a second or
        two in every process). Under `--verify` every render is compared with transformers' own
        (`Renderer`), which a wrong verdict could not pass unnoticed."""
        path = self._verdict_path() if self._verdict_path else None
        known = _read_verdict(path) if path else _UNKNOWN
        if known is _UNKNOWN:
            verdict = self.self_check()
            if path:
                _write_verdict(path, verdict)
            return
        self._checked, self.rules = True, known
        if known is None:
            self.stats["template_not_incremental"] += 1

    def self_check(self) -> Rules | None:
        """Find the cheapest rules under which synthetic conversations render exactly as in full;
        None (always render in full) when no candidate does."""
        self._checked = True
        stats = Counter(self.stats)
        try:
            self.rules = next((rules for rules in CANDIDATES if self._passes(rules)), None)
        finally:
            self.stats = stats  # the probes' renders are not the run's
            self.reset()
        if self.rules is None:
            self.stats["template_not_incremental"] += 1
        return self.rules

    def _passes(self, rules: Rules) -> bool:
        self.rules = rules
        try:
            for conversation, tools in _probe_conversations():
                self.reset()
                if not self._probe(conversation, tools):
                    return False
        except Exception:
            return False
        return True

    def _probe(self, conversation: list[dict], tools) -> bool:
        for end in range(2, len(conversation) + 1):
            messages = conversation[:end]
            for generation in (False, True):
                try:
                    expected = self._apply(messages, tools, generation, {})
                except Exception:
                    continue  # the template refuses this shape; nothing to compare
                if self._render(messages, tools, generation, {}).text != expected:
                    return False
        return True


_UNKNOWN: Any = object()


def _read_verdict(path: Path) -> Rules | None:
    rules = read_cached(path, "rules", _UNKNOWN)
    if rules is None or rules is _UNKNOWN:
        return rules
    try:
        return Rules(**rules)
    except TypeError:  # written by another version of `Rules`
        return _UNKNOWN


def _write_verdict(path: Path, rules: Rules | None) -> None:
    write_cached(path, "rules", None if rules is None else dataclasses.asdict(rules))


def _independent(boundaries: dict[str, int]) -> dict[str, int]:
    """Boundary tokens whose text occurs inside no other added token (so every occurrence of it
    in a text is that token)."""
    return {
        token: i
        for token, i in boundaries.items()
        if token and not any(token != other and token in other for other in boundaries)
    }


class _Boundaries:
    """Hard-boundary tokens (text → id) and where the last of them lies in a text.

    Every boundary token's text starts with one of a few characters (`<` for most families), so
    the search jumps back from one such character to the one before with `str.rfind` and tries all
    tokens at once there with one regular expression: one scan, where searching for each of
    Qwen's 26 tokens in turn scanned the window 26 times."""

    def __init__(self, ids: dict[str, int]):
        self.ids = ids
        self._firsts = sorted({token[0] for token in ids})
        # No token is a prefix of another (`_independent`), so at most one alternative matches.
        self._pattern = re.compile("|".join(map(re.escape, ids)))

    def last(self, text: str, start: int, limit: int) -> tuple[int, str] | None:
        """(position, token) of the last boundary token lying wholly in `text[start:limit]`."""
        best: tuple[int, str] | None = None
        for first in self._firsts:
            at = limit
            floor = start if best is None else best[0] + 1
            while (at := text.rfind(first, floor, at)) >= 0:
                match = self._pattern.match(text, at, limit)
                if match is not None:
                    best = (at, match.group())
                    break
        return best


def _span(entry: _Text) -> tuple[list[int], int]:
    """(a list, n): an encoded text's ids are the list's first n (`_Text.size`)."""
    assert entry.ids is not None, "only an encoded text has ids"
    return entry.ids, len(entry.ids) if entry.size is None else entry.size


def _nth_from_end(ids: list[int], end: int, token_id: int, nth: int) -> int:
    """Index of the `nth` occurrence (1 for the last) of `token_id` in `ids[:end]`, counting from
    the end.

    Counted a window at a time at C speed (a window's copy and `list.count`), the window doubling,
    then found in its window with `list.index`: a Python loop stepping back token by token cost a
    replay of every strategy about 0.1 s."""
    size = 256
    while True:
        low = max(0, end - size)
        window = ids[low:end]
        seen = window.count(token_id)
        if seen >= nth:
            break
        assert low > 0, "the text and its ids hold the same boundary tokens"
        nth, end, size = nth - seen, low, size * 2
    at = -1
    for _ in range(seen - nth + 1):  # the (seen - nth + 1)-th occurrence from the window's start
        at = window.index(token_id, at + 1)
    return low + at


def _has_media(message: dict) -> bool:
    content = message.get("content")
    if not isinstance(content, list):
        return False
    return any(
        isinstance(part, dict) and part.get("type") not in ("text", "input_text", "output_text") for part in content
    )


def _probe_conversations() -> list[tuple[list[dict], list[dict] | None]]:
    """Shapes every strategy renders: tools or not, reasoning or not, parallel calls, multi-tool
    results, text turns, follow-up user turns."""
    tools: list[dict] = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a key up.",
                "parameters": {
                    "type": "object",
                    "properties": {"key": {"type": "string"}, "n": {"type": "integer"}},
                    "required": ["key"],
                },
            },
        }
    ]
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": "alpha", "n": 2}}}
    with_tools: list[dict] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Find alpha."},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [call]},
        {"role": "tool", "content": "alpha = 1"},
        {"role": "assistant", "content": "Two more.", "tool_calls": [call, call]},
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "second\n"},
        {"role": "assistant", "content": "Done: 1.", "reasoning_content": "All found."},
        {"role": "user", "content": "Again?"},
        {"role": "assistant", "content": "", "reasoning_content": "Once more.", "tool_calls": [call]},
        {"role": "tool", "content": "alpha = 1"},
        {"role": "assistant", "content": "Still 1."},
    ]
    plain: list[dict] = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye."},
        {"role": "assistant", "content": "<think>\nshort\n</think>\n\nBye."},
    ]
    return [(with_tools, tools), (with_tools[1:], None), (plain, None)]
