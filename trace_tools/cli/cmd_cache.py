"""`trace-tools cache info` and `trace-tools cache clear` (over `io.cache`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from trace_tools.cli._options import JsonOpt

cache_app = typer.Typer(
    help="Show or clear the on-disk cache (converted tokenizers, template verdicts, test models, benchmark dumps).",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def info_cmd(
    json_out: JsonOpt = False,
) -> None:
    """Where the cache is ($TRACE_TOOLS_CACHE moves it) and, per kind, its entries and size.

    Example: trace-tools cache info
    """
    from trace_tools.io import cache

    _show(cache.info(), json_out, "")


def clear_cmd(
    kind: Annotated[
        Optional[list[str]],
        typer.Option("--kind", "-k", help="Clear only this kind (repeatable; default: every kind). See `cache info`."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Delete cached artefacts; each is rebuilt on its next use.

    Example: trace-tools cache clear --kind render-checks
    """
    from trace_tools.io import cache

    _show(cache.clear(kind), json_out, "cleared ")


def _show(found, json_out: bool, verb: str) -> None:
    from rich.table import Table

    from trace_tools.cli._output import console, note, print_json

    if json_out:
        print_json(found.as_json())
        return
    table = Table(title=f"{verb}cache at {found.location}", title_justify="left")
    for column in ("kind", "entries", "size", "holds"):
        table.add_column(column, justify="right" if column in ("entries", "size") else "left")
    for kind in found.kinds:
        table.add_row(kind.kind, f"{kind.entries:,}", _size(kind.bytes), kind.description)
    console.print(table)
    if not found.from_env:
        note("set TRACE_TOOLS_CACHE to move the cache")


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count:,.1f} GiB"
