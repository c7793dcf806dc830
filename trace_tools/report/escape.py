"""Text from a dump shown to a person: control and bidirectional-override characters made visible.

Session ids, tool names and messages come from recordings anyone may have written. Printed raw,
`ESC[2J` in a session id clears the reader's terminal, and a right-to-left override (U+202E)
makes text display in another order than it is stored. Every such character is shown as its
escape (`\\x1b`, `\\u202e`) instead: in the terminal (`cli._output`), in report.md cells and
in report.html (where control characters are harmless but bidi overrides are not).
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL and the C1 controls, and the bidirectional formatting marks.
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f"
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
UNSAFE = re.compile(f"[{_CONTROLS}{_BIDI}]")
BIDI = re.compile(f"[{_BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every control (but tab and newline) and bidi character as its escape."""
    return UNSAFE.sub(_escape, text) if UNSAFE.search(text) else text


def visible_bidi(text: str) -> str:
    """`text` with bidi formatting characters as their escapes (for HTML, where only they harm)."""
    return BIDI.sub(_escape, text) if BIDI.search(text) else text


_MARKDOWN = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "[": "\\[", "]": "\\]", "\n": " "})


def markdown_cell(value: object) -> str:
    """A Markdown table cell that stays text: HTML and link syntax escaped, `|` and newlines
    unable to break the table, control and bidi characters visible."""
    return visible(str(value).translate(_MARKDOWN))
