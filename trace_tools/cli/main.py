"""The `trace-tools` command line: thin typer commands over the library.

Command modules import only typer/pathlib at top level; library code (and with it pandas,
tokenizers, torch for rescore) loads inside each command, so `trace-tools --help` stays fast.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
from typing import Annotated, NoReturn

import click
import typer
from typer.core import TyperCommand

app = typer.Typer(
    name="trace-tools",
    help="Offline trace replay and analysis for agent-RL rollout gateways: re-tokenization drift, forks, "
    "loss-mask coverage by tool. `trace-tools COMMAND -h` shows a command's options and an example.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from trace_tools import __version__

        typer.echo(f"trace-tools {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """The commands share `--version` and `-h`."""


# (command name, module under trace_tools.cli, function) in the order `--help` lists them.
COMMANDS = [
    ("replay", "cmd_replay", "replay_cmd"),
    ("report", "cmd_replay", "report_cmd"),
    ("compare", "cmd_analysis", "compare_cmd"),
    ("gate", "cmd_analysis", "gate_cmd"),
    ("explain", "cmd_analysis", "explain_cmd"),
    ("reconstruct", "cmd_reconstruct", "reconstruct_cmd"),
    ("validate", "cmd_validate", "validate_cmd"),
    ("import", "cmd_import", "import_cmd"),
    ("export", "cmd_export", "export_cmd"),
    ("export-metrics", "cmd_export_metrics", "export_metrics_cmd"),
    ("audit-template", "cmd_audit", "audit_template_cmd"),
    ("audit-samples", "cmd_audit_samples", "audit_samples_cmd"),
    ("simulate", "cmd_simulate", "simulate_cmd"),
    ("record", "cmd_probe", "record_cmd"),
    ("probe", "cmd_probe", "probe_cmd"),
    ("profile", "cmd_probe", "profile_cmd"),
    ("rescore", "cmd_rescore", "rescore_cmd"),
]
# (group name, module, its typer app, [(command name, function)]): `trace-tools cache info`, ...
GROUPS = [("cache", "cmd_cache", "cache_app", [("info", "info_cmd"), ("clear", "clear_cmd")])]


# Below this width rich's option table (five name columns) leaves a command's descriptions about 25
# cells; click's plain layout gives them the rest of the line.
RICH_HELP_MIN_WIDTH = 100


class _Command(TyperCommand):
    """A command whose `--help` is rich's boxed table on wide terminals and click's plain layout on narrow ones."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.rich_markup_mode = "rich" if shutil.get_terminal_size().columns >= RICH_HELP_MIN_WIDTH else None
        super().format_help(ctx, formatter)


def _register() -> None:
    for name, module, func in COMMANDS:
        mod = importlib.import_module(f"trace_tools.cli.{module}")
        app.command(name, cls=_Command)(_guard(getattr(mod, func)))
    for group, module, sub_app, commands in GROUPS:
        mod = importlib.import_module(f"trace_tools.cli.{module}")
        for name, func in commands:
            getattr(mod, sub_app).command(name)(_guard(getattr(mod, func)))
        app.add_typer(getattr(mod, sub_app), name=group)


def _guard(command):
    """Turn library errors into a one-line message and the exit code of
    docs/commands.md#exit-codes-and-errors, never a traceback. The command owns its process, so
    Arrow allocates with jemalloc there (`arrow_pool`): `main` chose it before parsing anything,
    this covers a command run in a process that loaded pyarrow already (typer's test runner)."""

    @functools.wraps(command)
    def guarded(*args, **kwargs):
        from trace_tools.arrow_pool import prefer_jemalloc
        from trace_tools.errors import TraceToolsError
        from trace_tools.render.limits import TemplateLimitHit

        prefer_jemalloc()
        try:
            return command(*args, **kwargs)
        except TraceToolsError as exc:
            _fail(str(exc), exc.exit_code)
        except BrokenPipeError:  # the reader of stdout stopped early (`| head`): not an error
            from trace_tools.cli._output import closed_pipe_exit

            closed_pipe_exit()
        except OSError as exc:  # the file system refused something the library did not foresee
            _fail(f"{exc}; check the path, its permissions and the free space", 2)
        except KeyboardInterrupt:
            from trace_tools.cli._output import exiting_on_interrupt

            exiting_on_interrupt()
            _fail("interrupted", 130)
        except TemplateLimitHit as hit:  # raised past every `except Exception` on purpose (render.limits)
            _fail(str(hit), 2)

    return guarded


def _fail(message: str, code: int) -> None:
    """One line on stderr and the exit code; with TRACE_TOOLS_DEBUG the exception itself."""
    if os.environ.get("TRACE_TOOLS_DEBUG"):
        raise
    from trace_tools.cli._output import error

    error(f"{message} (set TRACE_TOOLS_DEBUG=1 for a traceback)")
    raise typer.Exit(code) from None


_register()


def main() -> None:
    """Run the app; click's own usage errors (a missing argument, an unknown option) become the
    one-line `Error:` of every other usage error, exit 2, instead of typer's boxed panel."""
    import click

    from trace_tools.arrow_pool import prefer_jemalloc

    prefer_jemalloc()  # before anything loads pyarrow, an argument's callback included (`arrow_pool`)
    try:
        code = app(standalone_mode=False)
    except click.UsageError as exc:
        from trace_tools.cli._output import error

        if exc.format_message():  # else `trace-tools` alone: the help was the answer
            command = exc.ctx.command_path if exc.ctx else "trace-tools"
            error(f"{exc.format_message()} (see `{command} -h`)")
        code = exc.exit_code
    except click.ClickException as exc:
        from trace_tools.cli._output import error

        error(exc.format_message())
        code = exc.exit_code
    except click.Abort:  # Ctrl-C at a prompt
        code = 130
    except BrokenPipeError:
        from trace_tools.cli._output import closed_pipe_exit

        closed_pipe_exit()
    _exit(code if isinstance(code, int) else 0)


def _exit(code: int) -> NoReturn:
    """Exit with `code` without the interpreter's teardown, when the teardown is all that is left.

    Freeing the modules and objects of a process that loaded pandas, pyarrow and a tokenizer took
    0.12–0.2 s after every command had finished (docs/performance.md#exiting). The exit handlers
    still run (multiprocessing's, logging's, weakref finalizers) after the standard streams are
    flushed; a process with a non-daemon thread still running, or a stdout that cannot be flushed,
    exits the ordinary way."""
    import atexit
    import sys
    import threading

    main_thread = threading.main_thread()
    if any(t.is_alive() and not t.daemon and t is not main_thread for t in threading.enumerate()):
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader of stdout stopped early (`| head`): not an error
        from trace_tools.cli._output import closed_pipe_exit

        closed_pipe_exit()
    except (OSError, ValueError):  # a stream that cannot be flushed: the ordinary exit reports it
        sys.exit(code)
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    main()
