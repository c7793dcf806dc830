"""IdentityMemo: one computation per object (and key), never a value computed for another object."""

from __future__ import annotations

from trace_tools.memo import IdentityMemo


def test_values_are_computed_once_per_object_and_key():
    calls: list[tuple] = []
    memo: IdentityMemo[str] = IdentityMemo()
    tools = [{"name": "Read"}]

    def render(options: str):
        return lambda obj: calls.append((id(obj), options)) or f"{obj[0]['name']}/{options}"

    assert memo.get(tools, render("a"), key="a") == "Read/a"
    assert memo.get(tools, render("a"), key="a") == "Read/a"
    assert memo.get(tools, render("b"), key="b") == "Read/b"
    assert memo.get(tools, render("none")) == "Read/none"
    assert len(calls) == 3


def test_an_equal_but_distinct_object_is_computed_again():
    memo: IdentityMemo[int] = IdentityMemo()
    first, second = {"role": "user"}, {"role": "user"}
    seen: list[object] = []
    memo.get(first, seen.append)
    memo.get(second, seen.append)
    assert seen[0] is first and seen[1] is second
