"""All CLI printing goes through here: rich for people, plain JSON for machines."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.segment import Segment

from trace_tools.families import FAMILY_NAMES, TOOL_FORMATS, tokenizer_choices
from trace_tools.report.escape import UNSAFE, visible


class _VisibleConsole(Console):
    """A console that prints every control and bidi character of the text it is given as its
    escape (`report.escape`): ids, names and messages come from dumps anyone may have written.
    Rich's own control segments (colours, cursor moves) pass untouched."""

    def _render_buffer(self, buffer: Any) -> str:
        return super()._render_buffer(
            Segment(visible(text), style, control)
            if not control and UNSAFE.search(text)
            else Segment(text, style, control)
            for text, style, control in buffer
        )

    def on_broken_pipe(self) -> None:
        """A reader that stopped early (`trace-tools compare ... | head`) is no failure: exit 0
        quietly, not with rich's 1, which is the "check failed" code (docs/commands.md)."""
        closed_pipe_exit()


def closed_pipe_exit() -> None:
    """Stop writing to a stdout whose reader has gone (Python's advice: point it at devnull, so the
    interpreter's final flush cannot fail again) and exit 0."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(0)


console = _VisibleConsole()
err_console = _VisibleConsole(stderr=True)

# Option help shared by the commands that render prompts, listing the family records' names.
FAMILY_CHOICES = " | ".join(FAMILY_NAMES)
TOKENIZER_HELP = (
    f"Tokenizer: {' | '.join(tokenizer_choices())} | a HF model id such as Qwen/Qwen3-8B (its local HF "
    "cache, else its family's) | path to a HF tokenizer dir"
)
TEMPLATE_HELP = f"Template file, or {' / '.join(FAMILY_NAMES)} / trl:<name>"
TOOL_FORMAT_HELP = (
    f"Tool-call format of the responses, instead of the one detected from the template: {' | '.join(TOOL_FORMATS)}."
)


def exiting_on_interrupt() -> None:
    """Ignore further Ctrl-C while the command exits on the first one: a second signal (a repeated
    key press, or one the workers' start-up held back) would otherwise kill the process once
    Python's own handler is gone, with a signal exit code instead of 130."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def print_all(renderables: Any) -> None:
    """Print tables and text lines one after another on stdout."""
    for renderable in renderables:
        console.print(renderable)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def error(message: str) -> None:
    from rich.markup import escape

    err_console.print(f"[bold red]Error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def note(message: str) -> None:
    from rich.markup import escape

    err_console.print(escape(message), highlight=False, soft_wrap=True)
