"""A toy renderer with a template-shaped layout, shared by the restore and linear tests.

Every message renders as [OPEN(role), one id per character of its body, CLOSE(role)]; the
generation prompt is the assistant OPEN alone. An assistant body is its content, then for every
tool call the function name and its JSON arguments. Character ids are 300 + code point; the
served (generated) ids of the tests live at 9000 and above, so they never equal a re-render —
exactly the assistant-only drift a real template shows.

`render_text` uses one private-use character per special token, so `encode(render_text(x)) ==
render(x)` and the text-space delta path can run on it. `merges` (pairs of characters that encode
as one id, like BPE merging "\\n\\n") lets a test build the tokenizer-boundary case.
"""

from __future__ import annotations

import json

SPECIALS = {
    "system": (11, 12),
    "user": (21, 22),
    "assistant": (31, 32),
    "tool": (41, 42),
}
TOOLS_OPEN, TOOLS_CLOSE = 51, 52
A_OPEN, A_CLOSE = SPECIALS["assistant"]
U_OPEN, U_CLOSE = SPECIALS["user"]
CHAR_BASE = 300
MERGE_BASE = 200000
SERVED_BASE = 9000
_SPECIAL_CHAR = {sid: chr(0xE000 + sid) for pair in SPECIALS.values() for sid in pair}
_SPECIAL_CHAR.update({TOOLS_OPEN: chr(0xE000 + TOOLS_OPEN), TOOLS_CLOSE: chr(0xE000 + TOOLS_CLOSE)})
_CHAR_SPECIAL = {c: sid for sid, c in _SPECIAL_CHAR.items()}


class FakeRenderer:
    """RendererLike over the toy vocabulary described in the module docstring."""

    vocab_size = 300000

    def __init__(self, *, sort_args: bool = True, merges: tuple[str, ...] = ()):
        self.sort_args = sort_args
        self.merges = tuple(merges)
        self.render_calls = 0
        self.encoded_chars = 0

    def render_text(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> str:
        parts = []
        if tools:
            parts.append(_SPECIAL_CHAR[TOOLS_OPEN] + json.dumps(tools, sort_keys=True) + _SPECIAL_CHAR[TOOLS_CLOSE])
        for message in messages:
            opening, closing = SPECIALS[message["role"]]
            parts.append(_SPECIAL_CHAR[opening] + self.body(message) + _SPECIAL_CHAR[closing])
        if add_generation_prompt:
            parts.append(_SPECIAL_CHAR[A_OPEN])
        return "".join(parts)

    def render(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> list[int]:
        self.render_calls += 1
        return self.encode(self.render_text(messages, tools, add_generation_prompt, **kwargs))

    def body(self, message: dict) -> str:
        text = message.get("content") or ""
        for call in message.get("tool_calls") or []:
            function = call["function"]
            text += function["name"] + json.dumps(function["arguments"], sort_keys=self.sort_args)
        return text

    def encode(self, text: str) -> list[int]:
        self.encoded_chars += len(text)
        ids, i = [], 0
        while i < len(text):
            pair = text[i : i + 2]
            if pair in self.merges:
                ids.append(MERGE_BASE + self.merges.index(pair))
                i += 2
                continue
            ids.append(_CHAR_SPECIAL.get(text[i], CHAR_BASE + ord(text[i])))
            i += 1
        return ids

    def decode(self, ids) -> str:
        return "".join(_SPECIAL_CHAR.get(i, chr(i - CHAR_BASE) if CHAR_BASE <= i < MERGE_BASE else "?") for i in ids)

    def parse_response(self, output_ids, tools=None):  # pragma: no cover - strategies get responses
        raise NotImplementedError


def chars(text: str) -> list[int]:
    return [CHAR_BASE + ord(c) for c in text]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def system(text: str) -> dict:
    return {"role": "system", "content": text}


def tool_result(text: str) -> dict:
    return {"role": "tool", "content": text}


def assistant(content: str = "", *calls: tuple[str, dict]) -> dict:
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": args}} for name, args in calls
        ]
    return message


# -- the fake itself must be what the module docstring promises ------------------------------------
def test_user_renders_open_chars_close():
    assert FakeRenderer().render([user("hi")], add_generation_prompt=False) == [U_OPEN, *chars("hi"), U_CLOSE]


def test_generation_prompt_is_the_assistant_open():
    rendered = FakeRenderer().render([user("hi")])
    assert rendered[-1] == A_OPEN and rendered[:-1] == FakeRenderer().render([user("hi")], add_generation_prompt=False)


def test_text_and_ids_agree():
    fake = FakeRenderer()
    history = [system("s"), user("q"), assistant("", ("Bash", {"cmd": "ls"})), tool_result("out")]
    assert fake.encode(fake.render_text(history, [{"type": "function"}], True)) == fake.render(
        history, [{"type": "function"}], True
    )


def test_order_sensitive_variant_renders_insertion_order():
    message = assistant("", ("Edit", {"b": 1, "a": 2}))
    assert FakeRenderer(sort_args=False).render([message]) != FakeRenderer().render([message])


def test_merges_encode_a_pair_as_one_id():
    assert FakeRenderer(merges=("\n\n",)).encode("a\n\n") == [CHAR_BASE + ord("a"), MERGE_BASE]
