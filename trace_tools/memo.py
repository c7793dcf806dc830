"""Values derived once per object, keyed by the object's identity (no dependencies)."""

from __future__ import annotations

from typing import Any, Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


class IdentityMemo(Generic[T]):
    """`compute(obj)` once per object, for objects that are never mutated once built.

    Replay hands the same message and tool objects to every turn and every strategy of a session,
    so what is derived from one (its template form, digest, lowered copy) is worth keeping; keyed
    by identity, a hit costs a dict lookup where hashing the content would cost as much as the
    work. Each entry holds its object, so no other object can take its id while the entry lives.
    """

    def __init__(self) -> None:
        self._entries: dict[Any, tuple[Any, T]] = {}

    def get(self, obj: Any, compute: Callable[[Any], T], key: Hashable = None) -> T:
        """`compute(obj)`, computed once per object and `key` (what else the value depends on,
        e.g. the template options a tool list is rendered under)."""
        entry = id(obj) if key is None else (id(obj), key)
        hit = self._entries.get(entry)
        if hit is None or hit[0] is not obj:
            hit = self._entries[entry] = (obj, compute(obj))
        return hit[1]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
