"""Token-sequence helpers: exact against the obvious quadratic definitions, on random sequences
over small alphabets (many repeats, so every search path is taken)."""

from __future__ import annotations

import random

from trace_tools.ids import common_prefix_len, suffix_prefix_overlap


def _overlap_by_definition(a: list[int], b: list[int]) -> int:
    return next((k for k in range(min(len(a), len(b)), 0, -1) if a[len(a) - k :] == b[:k]), 0)


def _prefix_by_definition(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _pairs(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        alphabet = rng.randint(1, 4)
        a = [rng.randrange(alphabet) for _ in range(rng.randint(0, 40))]
        b = [rng.randrange(alphabet) for _ in range(rng.randint(0, 40))]
        if a and rng.random() < 0.5:
            b = a[len(a) - rng.randint(0, len(a)) :] + b
        yield a, b


def test_suffix_prefix_overlap_matches_the_definition():
    for a, b in _pairs(seed=1, count=20000):
        assert suffix_prefix_overlap(a, b) == _overlap_by_definition(a, b), (a, b)


def test_common_prefix_len_matches_the_definition_on_lists_and_strings():
    for a, b in _pairs(seed=2, count=20000):
        assert common_prefix_len(a, b) == _prefix_by_definition(a, b), (a, b)
        text_a, text_b = "".join(map(str, a)), "".join(map(str, b))
        assert common_prefix_len(text_a, text_b) == _prefix_by_definition(text_a, text_b)


def test_common_prefix_len_ignores_a_wrong_hint():
    rng = random.Random(3)
    for a, b in _pairs(seed=3, count=5000):
        expected = _prefix_by_definition(a, b)
        for hint in (expected, rng.randint(-2, 45), None):
            assert common_prefix_len(a, b, hint) == expected, (a, b, hint)


def test_long_overlaps_stay_cheap():
    """A 20k-token tail whose first token is everywhere: the linear pass, not 20k² comparisons."""
    served = [7] * 20000
    assert suffix_prefix_overlap(served, [7] * 19999 + [8]) == 19999


def test_starts_with_matches_the_definition_across_sequence_types():
    from trace_tools.ids import starts_with

    rng = random.Random(5)
    for _ in range(500):
        seq = [rng.randrange(3) for _ in range(rng.randrange(6))]
        prefix = [rng.randrange(3) for _ in range(rng.randrange(6))]
        expected = list(seq[: len(prefix)]) == prefix
        assert starts_with(seq, prefix) == starts_with(tuple(seq), prefix) == expected, (seq, prefix)


def _long_pairs(seed: int, count: int):
    """Long lists as replay compares them: shared ints (the same objects in both lists), with
    runs of equal values in different objects, floats (NaN too: equal to itself as one object,
    as a list comparison takes it), and first differences anywhere, bisection edges included."""
    from trace_tools.ids import interned

    rng = random.Random(seed)
    nan = float("nan")
    for _ in range(count):
        size = rng.choice([256, 257, 300, 1000, 4096, 20000])
        base = interned([rng.randrange(5) for _ in range(size)], 8)
        kind = rng.random()
        if kind < 0.2:  # values from elsewhere: equal ints that are other objects
            other = [int(str(x)) + 1000 - 1000 if rng.random() < 0.5 else x for x in base]
        elif kind < 0.3:
            base = [nan if x == 0 else float(x) for x in base]
            other = [x if rng.random() < 0.9 else float(x) for x in base]  # same values, other objects
        else:
            other = list(base)
        at = rng.choice([0, 1, 31, 32, 33, size // 2, size - 1, size, rng.randrange(size)])
        if at < size and rng.random() < 0.8:
            other[at] = -1  # a value in neither list
        other = other[: rng.choice([size, size - 5, at]) or size] + [3] * rng.randint(0, 3)
        yield base, other


def _same_as_list_comparison(a, b) -> int:
    """The common prefix as Python's own list comparison sees it (identity, then ==)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if not (x is y or x == y)), min(len(a), len(b)))


def test_long_lists_compare_by_their_objects_as_python_does():
    from trace_tools import ids

    assert ids._same_objects is not None  # CPython: the fast path is on, so this test exercises it
    for a, b in _long_pairs(seed=6, count=600):
        expected = _same_as_list_comparison(a, b)
        assert ids.common_prefix_len(a, b) == ids.common_prefix_len(b, a) == expected
        assert ids.starts_with(a, b) == (expected == len(b) <= len(a))
        assert ids.starts_with(b, a) == (expected == len(a) <= len(b))
        assert ids.same_items(a, b) == ids.same_items(tuple(a), b) == (list(a) == list(b))
