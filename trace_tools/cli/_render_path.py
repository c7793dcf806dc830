"""`--reference` and `--verify` (`cli._options`): the one switch between the fast render path and
transformers' own (`render.spec.RENDER_PATHS`), shared by the commands that render prompts."""

from __future__ import annotations

from typing import Any

import typer


def render_path(reference: bool, verify: bool) -> str:
    """The render path the two flags choose (usage error, exit 2, for both)."""
    if reference and verify:
        from trace_tools.errors import UsageError

        raise UsageError("--reference and --verify exclude each other (--verify runs the reference path too)")
    return "reference" if reference else "verify" if verify else "fast"


def verify_outcome(verify: dict[str, Any] | None) -> None:
    """Say what `--verify` found; a fast result that differed from the reference one is a failed
    check (exit 1, docs/commands.md#exit-codes-and-errors)."""
    if verify is None:
        return
    from trace_tools.cli._output import note

    differing = ", ".join(f"{kind} {count:,}" for kind, count in verify["by_kind"].items())
    if not verify["differences"]:
        note(f"verify: {verify['checked']:,} fast results checked against transformers, none differs")
        return
    note(
        f"verify: {verify['differences']:,} of {verify['checked']:,} fast results differ from transformers' "
        f"({differing}); the reference results were used"
    )
    raise typer.Exit(1)
