"""Strategies by name: the built-in classes (`strategies.builtin`), those `register` adds at run
time (a plugin, a test), and checking a run's strategy options against their declarations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trace_tools.errors import UnknownName
from trace_tools.options import Param, check_known
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.builtin import BUILTIN
from trace_tools.strategies.declarations import NAMES, builtin_params

# Strategies registered at run time, besides the built-in ones.
REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Make a strategy that is not built in available by its name (its own `declaration`'s)."""
    if "declaration" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} has no declaration of its own; set `declaration = Declaration(...)`")
    if cls.name in NAMES:
        raise ValueError(f"strategy {cls.name!r} is built in")
    REGISTRY[cls.name] = cls
    return cls


def get_strategy(name: str) -> type[Strategy]:
    try:
        return _classes()[name]
    except KeyError:
        raise UnknownName("strategy", name, sorted(_classes())) from None


def available_strategies() -> list[str]:
    """Every strategy name: the built-in ones in column order
    (docs/strategies.md#the-strategies), then the registered ones."""
    return [*NAMES, *sorted(REGISTRY)]


def declared_params() -> dict[str, Param]:
    """Every option any strategy declares, by name (strategies that share one share its declaration)."""
    return {**builtin_params(), **{param.name: param for cls in REGISTRY.values() for param in cls.params}}


def check_params(strategies: list[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate options before any work: the typed values of `params` (None values dropped).

    Raises `UnknownName` for an unknown strategy, `UsageError` for an option no strategy declares
    and `InvalidOption` for a value outside its declaration; each message lists the valid choices.
    """
    for name in strategies:
        get_strategy(name)
    given = {key: value for key, value in params.items() if value is not None}
    declared = declared_params()
    check_known(given, declared, "strategy parameter")
    return {key: declared[key].parse(value) for key, value in given.items()}


def _classes() -> dict[str, type[Strategy]]:
    """The built-in classes and the registered ones."""
    return {**BUILTIN, **REGISTRY}
