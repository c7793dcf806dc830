"""Typed errors. The CLI maps each to a one-line message that names the fix (see cli/main.py `_guard`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def install_hint(extra: str) -> str:
    """How to install an extra: trace-tools is installed from its repository, not a package index
    (docs/install.md#extras)."""
    return f'pip install ".[{extra}]" in a clone of the trace-tools repository (docs/install.md#extras)'


class TraceToolsError(Exception):
    """Base class: a user-facing problem with a clean message, never shown with a traceback."""

    exit_code: int = 2


class UnusableInput(TraceToolsError):
    """The input cannot be read at all (no such path, not Parquet, truncated file)."""


class UsageError(TraceToolsError):
    """An option, argument or output path that cannot be used; found before any work is done."""


def did_you_mean(value: object, allowed: Iterable[str]) -> str:
    """` (did you mean 'tree'?)`: the closest of `allowed` to a misspelt `value` (up to three), or ''."""
    close = difflib.get_close_matches(str(value), list(allowed), n=3)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


class UnknownName(UsageError):
    """A name (strategy, tokenizer, template, behaviour, model) that is not registered."""

    def __init__(self, kind: str, name: str, available: list[str] | tuple[str, ...]):
        self.kind, self.name, self.available = kind, name, list(available)
        hint = did_you_mean(name, self.available)
        super().__init__(f"unknown {kind} {name!r}{hint}; choose one of: {', '.join(self.available)}")


class InvalidOption(UsageError, ValueError):
    """An option value outside its declared type or choices (see `trace_tools.options`)."""


class TemplateNotFound(UsageError):
    """No chat template could be resolved for a tokenizer."""


class TemplateLimitExceeded(UsageError):
    """A chat template ran past the time or size limit of one render (`render.limits`): it is
    untrusted code that would fail every session the same way, so the run stops."""


class TemplateUnusable(UsageError):
    """A chat template that does not compile, or fails on the simplest conversation: every
    session would fail the same way."""


class MalformedRules(UsageError):
    """A gate rules file that cannot be used (message names the line)."""


class OutputFailed(TraceToolsError):
    """An output could not be written (the disk is full, a file-size limit, a read-only file
    system); the message names the file, and its temporary file is gone."""


class ReplayError(TraceToolsError):
    """A session could not be replayed; the engine quarantines it with reason `replay_error`."""

    exit_code = 1
