"""Token-id sequence helpers shared by every layer (no dependencies)."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable, Sequence

_SHARED_INTS: list[int] = []


def shared_ints(size: int) -> list[int]:
    """The process-wide table whose i-th entry is the int i, holding at least `size` entries.

    Id lists built from it hold the same int objects, and CPython compares identical items by
    pointer: comparing two such 50k-token lists takes a tenth of the time it takes on lists of
    freshly made ints (what a tokenizer returns), and replay compares prompts all the time."""
    if len(_SHARED_INTS) < size:
        _SHARED_INTS.extend(range(len(_SHARED_INTS), max(size, 1 << 18)))
    return _SHARED_INTS


def interned(ids: Sequence[int], size: int) -> list[int]:
    """`ids` (all below `size`) as a list of the shared int objects (see `shared_ints`)."""
    return list(map(shared_ints(size).__getitem__, ids))


def common_prefix_len(a: Sequence, b: Sequence, hint: int | None = None) -> int:
    """Length of the longest common prefix of two sequences (token-id lists, or strings), their
    items compared as a list comparison compares them (the same object, or equal values).

    Two long lists are first compared by the objects they hold, at memory speed (`same_objects`):
    the common case in replay, since token-id lists hold shared ints (`shared_ints`).
    Otherwise `hint`, a likely answer (the previous turn's drift position, say), is tried first:
    checking it compares only the prefix it names. Then a full comparison (one sequence usually
    extends the other), then a bisection whose every step compares only the current window, so
    the work stays linear and runs at C speed; a Python loop over 50k-token prompts would
    dominate replay."""
    n = min(len(a), len(b))
    if (decided := _prefix_by_objects(a, b, n)) is not None:
        return decided
    if hint is not None and 0 < hint < n and not _same(a[hint], b[hint]) and a[:hint] == b[:hint]:
        return hint
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    low, high = 0, n  # a[:low] == b[:low]; the first difference lies in [low, high)
    while high - low > 16:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    while _same(a[low], b[low]):
        low += 1
    return low


def array_prefix(a: Any, b: Any) -> int:
    """How many leading values two numpy arrays share (the arrays' own methods: no import)."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()[0]
    return int(differ[0]) if len(differ) else n


def same_items(a: Sequence, b: Sequence) -> bool:
    """`list(a) == list(b)` without the copies: long lists are compared by their objects first."""
    if len(a) != len(b):
        return False
    if type(a) is not type(b):  # a tuple never equals a list: compare the items
        return list(a) == list(b)
    return a is b or common_prefix_len(a, b) == len(a)


def _same(x: object, y: object) -> bool:
    """Equal as a list comparison takes two items: the same object (a NaN too), or equal."""
    return x is y or x == y


def starts_with(seq: Sequence, prefix: Sequence) -> bool:
    """`list(seq[:len(prefix)]) == list(prefix)`, copying at most one slice of `seq`."""
    n = len(prefix)
    if len(seq) < n:
        return False
    if (decided := _prefix_by_objects(seq, prefix, n)) is not None:
        return decided == n
    head = seq if len(seq) == n else seq[:n]
    return head == prefix if type(head) is type(prefix) else list(head) == list(prefix)


# -- comparing lists by the objects they hold -----------------------------------------------------
# Comparing two lists of shared ints compares pointers, but costs a function call per item, and a
# prefix needs a slice first (a copy, and as many reference counts): 70 µs for a 40k-token prompt
# that extends another, 270 µs where it diverges near the end. A list's items are an array of
# object pointers: comparing those arrays with `memcmp` (the interpreter lock held, so no other
# thread can change them meanwhile) takes 5–20 µs. The same object in both lists is equal to
# itself, as the list comparison takes it, so the first differing pointer bounds the common
# prefix from below, and is its end unless the two objects there are equal values.
_BY_OBJECTS_MIN = 256  # shorter lists compare as fast the plain way
_WORD = ctypes.sizeof(ctypes.c_void_p)


def _object_comparer() -> Callable[[list, list, int], int] | None:
    """`same_objects(a, b, n)`: the first index below n where lists a and b hold different
    objects (n when none), read off CPython's list layout; None where that layout is not the one
    checked here (another interpreter, a build that lays lists out otherwise)."""
    if sys.implementation.name != "cpython":
        return None
    try:
        items_at = list.__basicsize__ - 2 * _WORD  # PyListObject ends with ob_item, allocated
        memcmp = ctypes.PyDLL(None).memcmp  # PyDLL: called with the interpreter lock held
        memcmp.restype, memcmp.argtypes = ctypes.c_int, (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    except (AttributeError, OSError):
        return None
    pointer_at = ctypes.c_void_p.from_address

    def same_objects(a: list, b: list, n: int) -> int:
        first, second = pointer_at(id(a) + items_at).value, pointer_at(id(b) + items_at).value
        if not first or not second:  # no item array: an empty list, which the callers never pass
            return 0
        if not memcmp(first, second, n * _WORD):
            return n
        low, high = 0, n  # the same objects in [0, low); the first different ones in [low, high)
        while high - low > 32:
            middle = (low + high) // 2
            if memcmp(first + low * _WORD, second + low * _WORD, (middle - low) * _WORD):
                high = middle
            else:
                low = middle
        while a[low] is b[low]:
            low += 1
        return low

    return same_objects if _lays_out_lists_as_expected(same_objects, pointer_at, items_at) else None


def _lays_out_lists_as_expected(same_objects: Callable, pointer_at: Callable, items_at: int) -> bool:
    """Whether the layout read above is this interpreter's: the item array holds the items' ids,
    and `same_objects` finds differences where they are, in lists long and short."""
    try:
        items = [object() for _ in range(3 * _BY_OBJECTS_MIN)]
        allocated = ctypes.c_ssize_t.from_address(id(items) + items_at + _WORD).value
        if not len(items) <= allocated <= 2 * len(items):  # not the layout: read no pointer from it
            return False
        if pointer_at(pointer_at(id(items) + items_at).value + _WORD).value != id(items[1]):
            return False
        for at in (0, 1, 40, _BY_OBJECTS_MIN, len(items) - 1):
            other = list(items)
            other[at] = object()
            if same_objects(items, other, len(items)) != at:
                return False
        return same_objects(items, list(items), len(items)) == len(items)
    except (ValueError, OSError, ctypes.ArgumentError):
        return False


_same_objects = _object_comparer()


def _prefix_by_objects(a: Sequence, b: Sequence, n: int) -> int | None:
    """The common prefix of the first n items of two long lists, found by their objects
    (`same_objects`); None where that does not decide it (short lists, other sequences, another
    interpreter, or equal values in different objects where the objects first differ)."""
    if n < _BY_OBJECTS_MIN or type(a) is not list or type(b) is not list or _same_objects is None:
        return None
    k = _same_objects(a, b, n)
    return k if k == n or a[k] != b[k] else None


def suffix_prefix_overlap(a: Sequence, b: Sequence) -> int:
    """The largest k with `a[-k:] == b[:k]` (0 when none): how much of `b` `a` already ends with.

    Linear time: candidate starts come from C-level searches for `b[0]`; when `b[0]` is too common
    to try them one by one, a Knuth–Morris–Pratt pass decides. (A loop trying every k from the
    longest down compares O(k²) tokens, which on a 5k-token tail dominated a replay.)"""
    limit = min(len(a), len(b))
    if not limit:
        return 0
    tail = list(a[len(a) - limit :])
    head = list(b[:limit])
    start = -1
    for _ in range(_CANDIDATES):
        try:
            start = tail.index(head[0], start + 1)
        except ValueError:
            return 0
        k = limit - start
        if head[k - 1] == tail[-1] and tail[start:] == head[:k]:
            return k
    return _kmp_overlap(tail, head)


_CANDIDATES = 32


def _kmp_overlap(text: list, pattern: list) -> int:
    """Length of the longest prefix of `pattern` that is a suffix of `text`."""
    failure = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = failure[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        failure[i] = k
    k = 0
    for token in text:
        while k and (k == len(pattern) or token != pattern[k]):
            k = failure[k - 1]
        if token == pattern[k]:
            k += 1
    return k
