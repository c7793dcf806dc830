"""Token-id sequence helpers shared by every layer (no dependencies)."""

from __future__ import annotations

from typing import Sequence


def common_prefix_len(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two sequences (token-id lists, or strings).

    A full comparison first (the common case in replay: one sequence extends the other), then a
    bisection whose every step compares only the current window, so the work stays linear and runs
    at C speed; a Python loop over 50k-token prompts would dominate replay."""
    n = min(len(a), len(b))
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
