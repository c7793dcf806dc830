"""What several strategies share: how a failed request is counted, freeing a finished tree, and
reading token ids without copying them."""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

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


def read_only_list(ids: Sequence[Any]) -> list[Any]:
    """`ids` itself when it is a list, else a list of it, for a strategy that only reads it.

    Token ids are not modified once made: a prompt's are the renderer's cached list (callers must
    not modify it, `render.incremental`), a turn's recorded ones the loaded row's. Copying a
    22,000-token prompt for every turn and strategy was 2 % of a `-s tree` replay."""
    return ids if type(ids) is list else list(ids)
