"""What several strategies share: how a failed request is counted, and freeing a finished tree."""

from __future__ import annotations

import re
from typing import Any, Iterable

_NUMBER = re.compile(r"\d+")


def failure_reason(exc: BaseException) -> str:
    """How a request the upstream system answers with an error is counted and shown: the error's
    own `reason` where it names one, else its first line with every number written N (so that
    the same failure at different positions counts once)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _NUMBER.sub("N", first_line)[:200]


def release_tree(roots: Iterable[Any]) -> None:
    """Unlink a finished tree's `parent`/`children` references so that reference counting frees it.

    A linked tree is a reference cycle, and only the cyclic garbage collector frees cycles, after
    walking every token-id list they hold: on long sessions that walk cost more than some strategies.
    """
    stack = list(roots)
    while stack:
        node = stack.pop()
        stack += node.children
        node.children = []
        node.parent = None
