"""CLI-wide contracts: fast torch-free help, every command documented, user errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import COMMANDS, app

runner = CliRunner()
COMMANDS_DOC = (Path(__file__).parents[1] / "docs" / "commands.md").read_text()


def test_help_imports_no_heavy_modules():
    code = (
        "import sys; from trace_tools.cli.main import app; from typer.testing import CliRunner; "
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
        "heavy = [m for m in ('torch', 'transformers', 'ray', 'pandas', 'matplotlib', 'pyarrow', 'numpy', 'aiohttp', 'jinja2', 'tensorboard', 'wandb') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_every_command_has_help_and_a_docs_entry(name):
    result = runner.invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert f"`trace-tools {name}" in COMMANDS_DOC, f"docs/commands.md does not list `trace-tools {name}`"


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "/no/such/dump.parquet"],
        ["validate", "/no/such/dump.parquet"],
        ["reconstruct", "/no/such/dump.parquet"],
        ["report", "/no/such/run"],
    ],
)
def test_missing_input_is_exit_2_with_one_line_error(argv, tmp_path):
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "Error:" in result.output


def test_not_parquet_is_exit_2(tmp_path):
    bogus = tmp_path / "dump.parquet"
    bogus.write_text("this is not parquet")
    result = runner.invoke(app, ["replay", str(bogus), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "Parquet" in result.output


def test_unknown_strategy_names_the_choices(tmp_path):
    result = runner.invoke(app, ["replay", "--strategy", "nope", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "tree" in result.output
