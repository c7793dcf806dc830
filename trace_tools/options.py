"""Typed options: the one parser for booleans, integers and enumerations, and parameter declarations.

Every option value, whether it comes from the command line (`--param rollback=off`), the Python
API (`params={"rollback": "false"}`) or a file, is read by the functions here, so `"false"`,
`"off"` and `False` mean the same everywhere and a value outside its declared type or choices is
an `InvalidOption` (a usage error, exit 2) that lists what is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable

from trace_tools.errors import InvalidOption, UsageError, did_you_mean

TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


def parse_bool(value: Any, name: str) -> bool:
    """True/False, or one of TRUE_WORDS / FALSE_WORDS in any case; 1 and 0 as integers."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise InvalidOption(
        f"invalid {name} {value!r} (a boolean); choose one of: {', '.join(TRUE_WORDS)} / {', '.join(FALSE_WORDS)}"
    )


def parse_int(value: Any, name: str, minimum: int | None = None) -> int:
    """An integer, or a string spelling one; `minimum` bounds it from below."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError
        number = int(value)
    except ValueError:
        raise InvalidOption(f"invalid {name} {value!r}; pass an integer") from None
    if minimum is not None and number < minimum:
        raise InvalidOption(f"invalid {name} {number}; pass an integer of at least {minimum}")
    return number


def parse_choice(value: Any, choices: Iterable[str], name: str) -> str:
    """One of `choices`, exactly as spelled there."""
    allowed = list(choices)
    if isinstance(value, str) and value in allowed:
        return value
    raise InvalidOption(f"invalid {name} {value!r}{did_you_mean(value, allowed)}; choose one of: {', '.join(allowed)}")


@dataclass(frozen=True)
class Param:
    """One declared option of a strategy: name, type (bool, int or str), default, choices, help;
    `flag`: `replay` offers it as its own flag (`--fork-threshold`), besides `--param KEY=VALUE`."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    check: Callable[[Any], Any] | None = None  # vets (and may normalise) a parsed value; raises UsageError
    flag: bool = False

    def parse(self, value: Any) -> Any:
        """The typed value; None means the default."""
        parsed = self._typed(value)
        return self.check(parsed) if self.check is not None and value is not None else parsed

    def _typed(self, value: Any) -> Any:
        if value is None:
            return self.default
        if self.type is bool:
            return parse_bool(value, self.name)
        if self.type is int:
            return parse_int(value, self.name, self.minimum)
        if self.choices:
            return parse_choice(value, self.choices, self.name)
        return str(value)

    def values(self) -> str:
        """`choice | choice; default X` (or `int; default X`): what the option takes, for help texts."""
        kind = " | ".join(self.choices) if self.choices else self.type.__name__  # spaced: help text wraps there
        default = "none" if self.default is None else str(self.default).lower() if self.type is bool else self.default
        return f"{kind}; default {default}"


def parse_assignments(items: Iterable[str] | None) -> dict[str, str]:
    """`["key=value", ...]` (as `--param` takes them) as a dict; a missing `=` is a usage error."""
    parsed: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param takes KEY=VALUE, e.g. --param rollback=off (got {item!r})")
        parsed[key.strip()] = value.strip()
    return parsed


def check_known(given: Mapping[str, Any], declared: Mapping[str, Param], what: str) -> None:
    """Every key of `given` must be declared; the error lists the declared names."""
    for key in given:
        if key not in declared:
            names = sorted(declared)
            raise UsageError(f"unknown {what} {key!r}{did_you_mean(key, names)}; choose one of: {', '.join(names)}")
