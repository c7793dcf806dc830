"""Strategy options of the command line, derived from the declarations (`strategies.declarations`).

`--strategy` lists the declared names; each parameter declared with `flag=True` becomes its own
option (`--fork-threshold`, `--rollback/--no-rollback`), with a help text naming the strategies
that declare it, its values and its default; `--param` lists every parameter. Adding or changing
a declaration changes `--help` and the options without touching a command.
"""

from __future__ import annotations

import functools
import inspect
from typing import Annotated, Any, Callable, Optional

import typer

from trace_tools.options import Param
from trace_tools.strategies.declarations import NAMES, builtin_params, owners

STRATEGY_NAMES = ", ".join(NAMES)
PARAM_HELP = (
    "Any strategy parameter as KEY=VALUE (repeatable), e.g. restore_prompt=false; docs/strategies.md describes each: "
    + ", ".join(builtin_params())
    + "."
)


def flag_params() -> list[Param]:
    """The parameters offered as flags of their own, in declaration order."""
    return [param for param in builtin_params().values() if param.flag]


def with_parameter_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with one option per flagged parameter, placed before its `param` option (`--param`).

    The command declares `flags: dict[str, Any]` instead: the flags' values, None where not given.
    """
    flagged = flag_params()
    signature = inspect.signature(command, eval_str=True)
    before: list[inspect.Parameter] = []
    after: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        if parameter.name != "flags":
            (after if after or parameter.name == "param" else before).append(parameter)
    options = [
        inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=_annotation(p))
        for p in flagged
    ]

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        flags = {param.name: kwargs.pop(param.name) for param in flagged}
        return command(*args, flags=flags, **kwargs)

    parameters = [*before, *options, *after]
    wrapped.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters]
    )
    wrapped.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return wrapped


def _annotation(param: Param) -> Any:
    dashed = param.name.replace("_", "-")
    declared_by = ", ".join(owners(param.name))
    help_text = f"{declared_by}: {param.help} ({param.values()})."
    if param.type is bool:
        return Annotated[Optional[bool], typer.Option(f"--{dashed}/--no-{dashed}", help=help_text, show_default=False)]
    return Annotated[Optional[param.type], typer.Option(f"--{dashed}", help=help_text, show_default=False)]
