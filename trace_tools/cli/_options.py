"""The options and arguments several commands share, declared once.

An alias (`TokenizerOpt`, `JsonOpt`, ...) is a whole option: its type, flag names and help, for
the commands where it means the same. Where a command says something of its own about an
option (what `--json` prints, what `--out` holds), the command writes the type and its help and
takes the flag names from the `*_option` function, so that a flag is spelled in one place.

    def some_cmd(dump: DumpArg, tokenizer: TokenizerOpt = None, json_out: JsonOpt = False) -> None: ...
    def other_cmd(json_out: Annotated[bool, json_option("Print the audit as JSON.")] = False) -> None: ...
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from trace_tools.cli._output import TEMPLATE_HELP, TOKENIZER_HELP, TOOL_FORMAT_HELP


def json_option(help: str) -> Any:
    return typer.Option("--json", help=help)


def tokenizer_option(help: str) -> Any:
    return typer.Option("--tokenizer", help=help)


def template_option(help: str) -> Any:
    return typer.Option("--chat-template", help=help)


def strategy_option(help: str) -> Any:
    """`--strategy/-s`, taking a name or the short label the terminal tables print (`ckpt`)."""
    return typer.Option("--strategy", "-s", help=help, callback=_full_names)


def _bundled_or(value: str) -> str:
    from trace_tools.io.bundled import bundled_or

    return bundled_or(value)


def _full_names(value: Any) -> Any:
    from trace_tools.strategies.declarations import full_name

    if value is None:
        return None
    return full_name(value) if isinstance(value, str) else [full_name(name) for name in value]


def out_option(help: str) -> Any:
    return typer.Option("--out", help=help)


def overwrite_option(help: str) -> Any:
    return typer.Option("--overwrite", help=help)


def strict_option(help: str) -> Any:
    return typer.Option("--strict", help=help)


# -- the inputs ------------------------------------------------------------------------------------
DumpArg = Annotated[
    str,
    typer.Argument(
        help="Parquet file or directory of them, a path or a URI (sample_traces/: the bundled sample).",
        callback=lambda value: _bundled_or(value),
    ),
]
RunArg = Annotated[str, typer.Argument(help="A finished run directory, a path or a URI.")]

# -- how prompts are rendered: the commands that re-render a dump's turns ----------------------------
TokenizerOpt = Annotated[Optional[str], tokenizer_option(TOKENIZER_HELP + " (overrides the dump).")]
ChatTemplateOpt = Annotated[Optional[str], template_option(TEMPLATE_HELP + " (overrides the dump).")]
ToolFormatOpt = Annotated[Optional[str], typer.Option("--tool-format", help=TOOL_FORMAT_HELP)]
PromptSourceOpt = Annotated[
    str,
    typer.Option("--prompt-source", help="auto (recorded ids when present, else render) | recorded | rendered."),
]
# `--reference` and `--verify` choose the render path (`cli._render_path.render_path`).
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

# -- output ----------------------------------------------------------------------------------------
JsonOpt = Annotated[bool, json_option("Print machine-readable JSON.")]
