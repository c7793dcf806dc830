"""`--reference` and `--verify`: the one switch between the fast render path and transformers'
own (`render.spec.RENDER_PATHS`), shared by the commands that render prompts."""

from __future__ import annotations

from typing import Annotated, Any

import typer

ReferenceOpt = Annotated[
    bool,
    typer.Option(
        "--reference",
        help="Render and tokenize with transformers' apply_chat_template and tokenizer end to end, "
        "without the fast path's shortcuts (slower; the results must be the same).",
    ),
]
VerifyOpt = Annotated[
    bool,
    typer.Option(
        "--verify",
        help="Run the fast path and compare every render, encode and decode with the --reference one; "
        "differences are counted, the reference result is kept, and the command exits 1.",
    ),
]


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
