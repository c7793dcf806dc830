"""Rich rendering of an Explanation: colour-coded aligned tokens, message diff, cause."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from trace_tools.report.layout import count

SHARED_CHARS = 40  # how much of the shared context before the divergence to show
DIFF_LINES = 20  # message differences listed in full; --json has them all

CAUSE_TEXT = {
    "whitespace": "whitespace: trailing / per-line whitespace stripped from string arguments",
    "type_coercion": 'string argument coerced to the schema\'s type (`"60000"` → 60000)',
    "schema_default": "schema default filled in: an argument the model omitted came back with its declared default",
    "command_prefix": "command prefix removed: the harness dropped a prefix its profile names (e.g. `cd <cwd> && `)",
    "key_order_or_spacing": "tool-argument key order rebuilt or JSON spacing changed (same values)",
    "reasoning": "reasoning dropped, re-keyed or sent back as text on echo",
    "tool_call_id": "tool-call index/id changed (invisible to the template; breaks raw-message matchers)",
    "template_rewrite": "the template, not the echo, renders this (or an earlier) turn differently in the longer "
    "conversation",
    "tokenizer_boundary": "tokenizer boundary: same text, another token split than the model emitted",
    "unexpressible_rewrite": "a harness rewrite no echo class states (same calls and characters, respelled)",
    "genuine_edit": "genuine content change: the echo says or does something else",
}


def explanation_renderables(result) -> list:
    out: list[Table | Text] = [_findings_table(result)]
    focus = result.focus
    if focus is None:
        out.append(Text("No turn of this session is echoed by a later request: nothing can drift."))
        return out
    out.append(
        Text.assemble(
            ("turn ", "bold"),
            (str(focus.turn_index), "bold cyan"),
            " echoed by turn ",
            (str(focus.echo_turn), "bold cyan"),
            ": ",
            (CAUSE_TEXT.get(focus.cause, "no difference") if focus.cause else "no difference", "bold"),
        )
    )
    if result.window is not None:
        out.append(_aligned(result.window, focus.divergence))
    if focus.message_diff:
        diff = Table(title="Message-level difference (stored response → echo)", title_justify="left")
        diff.add_column("path: stored → echo")
        for line in focus.message_diff[:DIFF_LINES]:
            diff.add_row(line)
        if len(focus.message_diff) > DIFF_LINES:
            diff.add_row(f"… and {len(focus.message_diff) - DIFF_LINES} more (--json lists every one)")
        out.append(diff)
    if result.strategy_turn:
        v = result.strategy_turn
        out.append(
            Text(
                f"{result.strategy}: turn {focus.turn_index} event={v['event']} "
                f"trained {v['trained_tokens']}/{v['generated_tokens']} tokens; "
                f"turn {focus.echo_turn} prompt={_prompt_event(result)}; {count(v['samples'], 'sample')}"
            )
        )
    return out


def _prompt_event(result) -> str:
    return result.strategy_turn.get("prompt_event", "?")


def _findings_table(result) -> Table:
    table = Table(title=f"Session {result.session_id}: echoed turns", title_justify="left")
    for col in ("turn", "echo in", "token drift at", "cause"):
        table.add_column(col)
    for f in result.findings:
        at = f"{f.divergence} / {f.served_len}" if f.token_drift else "none"
        table.add_row(str(f.turn_index), str(f.echo_turn), at, f.cause or "none")
    return table


def _aligned(window, divergence: int) -> Table:
    """The shared context once (its tail), then each side's next tokens in full: the difference is never cut."""
    table = Table(
        title=f"Tokens around the first divergence (position {divergence})", title_justify="left", box=box.SIMPLE_HEAD
    )
    table.add_column("side", no_wrap=True)
    table.add_column("ids", overflow="fold")
    table.add_column("text", overflow="fold")
    table.add_row(
        "shared",
        Text(" ".join(str(i) for i, _ in window.shared), style="dim"),
        Text(_visible("".join(t for _, t in window.shared))[-SHARED_CHARS:], style="dim"),
    )
    for side, tokens, style in (("served", window.served, "red"), ("re-rendered", window.rendered, "green")):
        table.add_row(
            side,
            Text(" ".join(str(i) for i, _ in tokens), style=f"bold {style}"),
            Text(_visible("".join(t for _, t in tokens)), style=f"bold {style}"),
        )
    return table


def _visible(text: str) -> str:
    """Line breaks and tabs as visible marks (a stripped trailing space then shows before a ↵)."""
    return text.replace("\r", "␍").replace("\n", "↵").replace("\t", "→")
