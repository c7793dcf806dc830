"""Token-id sequence helpers shared by every layer (no dependencies)."""

from __future__ import annotations

from typing import Sequence

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
    """Length of the longest common prefix of two sequences (token-id lists, or strings).

    `hint`, a likely answer (the previous turn's drift position, say), is tried first: checking
    it compares only the prefix it names. Then a full comparison (the common case in replay: one
    sequence extends the other), then a bisection whose every step compares only the current
    window, so the work stays linear and runs at C speed; a Python loop over 50k-token prompts
    would dominate replay."""
    n = min(len(a), len(b))
    if hint is not None and 0 < hint < n and a[hint] != b[hint] and a[:hint] == b[:hint]:
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
    while a[low] == b[low]:
        low += 1
    return low


def starts_with(seq: Sequence, prefix: Sequence) -> bool:
    """`list(seq[:len(prefix)]) == list(prefix)`, copying at most one slice of `seq`."""
    n = len(prefix)
    if len(seq) < n:
        return False
    head = seq if len(seq) == n else seq[:n]
    return head == prefix if type(head) is type(prefix) else list(head) == list(prefix)


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
