"""The bundled sample_traces/: reproducible from its README's commands, valid, small, complete."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.io.validate import validate
from trace_tools.simulate import BEHAVIOURS

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces"
COMMANDS = [
    shlex.split(line)
    for line in (SAMPLE / "README.md").read_text().splitlines()
    if line.startswith("trace-tools simulate ")
]


def _out(argv: list[str]) -> str:
    return argv[argv.index("--out") + 1]


def _content(path: Path):
    table = pq.read_table(path)
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k.startswith(b"trace_tools.")}
    return table.to_pylist(), meta


def test_readme_names_a_command_for_every_bundled_file():
    bundled = sorted(p.name for p in SAMPLE.glob("*.parquet"))
    assert bundled and sorted(Path(_out(argv)).name for argv in COMMANDS) == bundled


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: Path(_out(argv)).name)
def test_readme_command_regenerates_the_bundled_file(argv, tmp_path):
    from trace_tools.cli.main import app

    target = tmp_path / Path(_out(argv)).name
    args = list(argv[1:])
    args[args.index("--out") + 1] = str(target)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _content(target) == _content(SAMPLE / target.name)


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLE.glob("*.parquet")))
def test_each_file_validates_clean_and_covers_every_behaviour(name):
    report = validate(SAMPLE / name)
    assert report.clean and report.vocab_checked and not report.warnings
    labels = {tuple(json.loads(m)["behaviours"]) for m in pq.read_table(SAMPLE / name).column("metadata").to_pylist()}
    assert {b for label in labels for b in label} == set(BEHAVIOURS)
    assert any(len(label) > 1 for label in labels)
    row = re.search(rf"\| `{re.escape(name)}` \|.*\| (\d+) \| (\d+) \|", (SAMPLE / "README.md").read_text())
    assert row and (int(row.group(1)), int(row.group(2))) == (report.sessions, report.turns)


def test_bundle_is_small():
    assert sum(p.stat().st_size for p in SAMPLE.glob("*.parquet")) <= 5 * 1024 * 1024
