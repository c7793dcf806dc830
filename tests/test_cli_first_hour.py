"""Issue 12, the first hour of a new user: every option checked, every failure loud, every message useful."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.api import replay
from trace_tools.cli.main import COMMANDS, app
from trace_tools.errors import InvalidOption, UsageError
from trace_tools.options import parse_bool
from trace_tools.replay import engine
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.registry import declared_params, get_strategy

runner = CliRunner()
STRATEGIES_DOC = (__import__("pathlib").Path(__file__).parents[1] / "docs" / "strategies.md").read_text()


def _invoke(*argv, **env):
    return runner.invoke(app, [str(a) for a in argv], env=env or None)


@pytest.fixture(scope="module")
def bare_dump(simulated_dump, tmp_path_factory):
    """The simulated dump without its trace_tools.* metadata: no tokenizer, no embedded template."""
    path = tmp_path_factory.mktemp("bare") / "bare.parquet"
    pq.write_table(pq.read_table(simulated_dump).replace_schema_metadata(None), path)
    return path


@pytest.fixture
def without_trl(monkeypatch):
    """As after `pip install .`: TRL's template files are not installed."""
    monkeypatch.setattr("trace_tools.render.templates.trl_template_dir", lambda: None)


# -- 1. options are typed and checked before any work ------------------------------------------------------
@pytest.mark.parametrize(
    "option, needle",
    [
        (["--tokenizer", "bogus"], "unknown tokenizer 'bogus'; choose one of: qwen3, qwen3.5"),
        (["--chat-template", "bogus.jinja"], "chat template 'bogus.jinja' is neither a known name"),
        (["--matcher", "bogus"], "invalid matcher 'bogus'; choose one of: strict, loose_tool_call"),
        (["--on-nonlinear", "bogus"], "invalid on_nonlinear 'bogus'; choose one of: reset, error, passthrough"),
        (["--realign-gate", "bogus"], "invalid realign_gate 'bogus'; choose one of: output, drift"),
        (["--realign-from", "middle"], "invalid realign_from 'middle'; choose one of: response, divergence"),
        (["--retries", "drop"], "invalid retries 'drop'; choose one of: supersede, keep"),
        (["--canonicalization", "bogus"], "invalid --canonicalization 'bogus'; choose one of: slime, none"),
        (["--prompt-source", "both"], "invalid --prompt-source 'both'; choose one of: auto, recorded, rendered"),
        (["--param", "fork_treshold=3"], "unknown strategy parameter 'fork_treshold' (did you mean 'fork_threshold'?)"),
        (["--param", "rollback=maybe"], "invalid rollback 'maybe' (a boolean); choose one of: true"),
        (["--param", "rollback"], "--param takes KEY=VALUE"),
        (["-s", "tre"], "unknown strategy 'tre' (did you mean 'tree'?); choose one of: areal, chains, checkpoint-tree"),
        (["--tokenizer", "qwen3.6"], "unknown tokenizer 'qwen3.6' (did you mean 'qwen3.5' or 'qwen3'?)"),
        (["--matcher", "strickt"], "invalid matcher 'strickt' (did you mean 'strict'?); choose one of: strict"),
    ],
)
def test_a_mistyped_option_stops_the_run_before_any_work(simulated_dump, tmp_path, option, needle):
    out = tmp_path / "run"
    result = _invoke("replay", simulated_dump, "--out", out, *option)
    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.output.split())
    assert "Traceback" not in result.output and not out.exists()


def test_one_parser_reads_booleans_everywhere():
    for word in ("false", "False", "off", "no", "0", False, 0):
        assert parse_bool(word, "x") is False
    for word in ("true", "on", "YES", "1", True, 1):
        assert parse_bool(word, "x") is True
    with pytest.raises(InvalidOption, match="choose one of"):
        parse_bool("maybe", "x")
    # bool("false") is True: each of these read "false" as on before the declarations
    for name, key in (
        ("checkpoint-tree", "echo_rules"),
        ("tree", "safe_edges"),
        ("chains", "rollback"),
        ("echo-restore", "restore_prompt"),
        ("linear", "delta"),
    ):
        assert get_strategy(name)(ReplayContext(None, params={key: "false"})).setting(key) is False


def test_every_declared_parameter_is_documented_and_typed():
    declared = declared_params()
    assert {"fork_threshold", "realign_gate", "matcher", "rollback", "retries", "restore_prompt"} <= set(declared)
    for name, param in declared.items():
        assert f"`{name}`" in STRATEGIES_DOC, f"docs/strategies.md does not document strategy parameter {name}"
        assert param.type in (bool, int, str) and param.help
        assert param.parse(None) == param.default


def test_the_python_api_validates_params_like_the_cli(simulated_dump, tmp_path):
    with pytest.raises(UsageError, match="did you mean 'fork_threshold'"):
        replay(simulated_dump, out=tmp_path / "run", strategies=["tree"], params={"fork_treshold": 0})
    with pytest.raises(InvalidOption, match="pass an integer"):
        replay(simulated_dump, out=tmp_path / "run", strategies=["tree"], params={"fork_threshold": "many"})
    assert not (tmp_path / "run").exists()


def test_a_bare_dump_replays_with_a_named_tokenizer_after_a_plain_install(bare_dump, tmp_path, without_trl):
    result = replay(bare_dump, out=tmp_path / "run", strategies=["tree", "linear"], tokenizer="qwen3")
    assert result.summary["strategies"]["linear"]["trained_tokens"] > 0 and result.quarantined == 0
    run = (tmp_path / "run" / "run.json").read_text()
    assert "sample_traces:qwen3" in run  # the bundled sample's copy of TRL's qwen3.jinja


def test_a_bare_dump_without_a_tokenizer_is_a_usage_error(bare_dump, tmp_path):
    result = _invoke("replay", bare_dump, "-s", "linear", "--out", tmp_path / "run")
    assert result.exit_code == 2 and "pass --tokenizer qwen3|qwen3.5|" in " ".join(result.output.split())


def test_strategy_help_lists_the_names_and_dump_has_help():
    text = " ".join(_invoke("replay", "--help", COLUMNS="200").output.split())
    assert "tree, echo-restore, linear, linear+restore, chains, session-v1, session-v2, checkpoint-tree" in text
    assert "DUMP: a Parquet file or a directory of them (searched recursively); default: the bundled" in text


# -- 3. simulate after a plain install ---------------------------------------------------------------------------
def test_simulate_works_without_trl_and_takes_a_chat_template(tmp_path, without_trl):
    from trace_tools.io.bundled import sample_template

    result = _invoke("simulate", "--sessions", "1", "--seed", "3", "--max-turns", "3", "--out", tmp_path / "a.parquet")
    assert result.exit_code == 0, result.output
    template = tmp_path / "qwen3.jinja"
    template.write_text(sample_template("qwen3"))
    result = _invoke(
        "simulate",
        "--sessions",
        "1",
        "--seed",
        "3",
        "--max-turns",
        "3",
        "--chat-template",
        template,
        "--out",
        tmp_path / "b.parquet",
    )
    assert result.exit_code == 0, result.output
    a, b = (pq.read_table(tmp_path / name) for name in ("a.parquet", "b.parquet"))
    assert a.equals(b) and a.schema.metadata == b.schema.metadata


# -- 5, 13, 15. messages that point at the answer -----------------------------------------------------------------
def test_explain_lists_the_sessions_when_the_id_is_wrong(simulated_dump):
    result = _invoke("explain", simulated_dump, "--session", "sim-qwen3-s3-001")
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "did you mean 'sim-qwen3-s3-00" in text and "(12 in all)" in text


@pytest.mark.parametrize("width", [50, 80])
def test_explain_shows_the_filled_in_default_at_any_width(width):
    """schema_default: both sides used to be cut to the same visible text, hiding `replace_all`."""
    import io

    from rich.console import Console

    from trace_tools.replay.explain import explain
    from trace_tools.report.explain_view import explanation_renderables

    result = explain(engine.default_dump() / "qwen3.parquet", "sim-qwen3-s7-0001", turn=3)  # turn 2 is command_prefix
    assert result.focus.cause == "schema_default"
    console = Console(width=width, file=io.StringIO(), color_system=None)
    for renderable in explanation_renderables(result):
        console.print(renderable)
    text = console.file.getvalue()
    tokens = text[text.index("Tokens around") : text.index("Message-level")]
    assert "replace_all" in tokens.replace(" ", "").replace("\n", "") and "…" not in tokens


def test_run_session_names_unknown_ids(sample_run):
    import trace_tools as tt
    from trace_tools.api import UnknownSession

    run = tt.open_run(sample_run.run_dir)
    with pytest.raises(UnknownSession, match="did you mean 'sim-qwen3-s7-0007'") as raised:
        run.session("sim-qwen3-s7-007")
    assert isinstance(raised.value, LookupError)
    assert len(run.session("sim-qwen3-s7-0007"))


# -- 7. output directories and empty dumps ------------------------------------------------------------------------
def test_out_dir_mistakes_are_usage_errors(simulated_dump, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = _invoke("replay", simulated_dump, "-s", "tree", "--out", blocker)
    assert result.exit_code == 2 and "is a file; pass a directory path" in result.output
    out = tmp_path / "run"
    assert _invoke("replay", simulated_dump, "-s", "tree", "--no-samples", "--out", out).exit_code == 0
    summary = (out / "summary.json").read_text()
    again = _invoke("replay", simulated_dump, "-s", "linear", "--no-samples", "--out", out)
    assert again.exit_code == 2 and "pass --overwrite" in again.output
    assert (out / "summary.json").read_text() == summary  # the finished run is untouched
    assert _invoke("replay", simulated_dump, "-s", "linear", "--no-samples", "--out", out, "--overwrite").exit_code == 0
    assert "linear" in (out / "summary.json").read_text()


def test_a_dump_with_no_rows_is_an_error_that_says_so(simulated_dump, tmp_path):
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(simulated_dump).slice(0, 0), empty)
    for command in ("replay", "validate"):
        result = _invoke(command, empty, *(["--out", tmp_path / "run"] if command == "replay" else []))
        assert result.exit_code == 2 and "it has no rows" in result.output


# -- 8. progress and noise ---------------------------------------------------------------------------------------------
def test_progress_counts_sessions_one_by_one(simulated_dump, tmp_path):
    calls: list[tuple[int, int]] = []
    replay(
        simulated_dump,
        out=tmp_path / "run",
        strategies=["tree"],
        write_samples=False,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert [done for done, _ in calls][:12] == list(range(1, 13)) and {total for _, total in calls} == {12}


def test_loading_a_tokenizer_without_torch_prints_no_transformers_advice():
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from trace_tools.render.tokenizer import load_tokenizer; load_tokenizer('qwen3').hf"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "PyTorch was not found" not in done.stderr + done.stdout


# -- 9. permissions --------------------------------------------------------------------------------------------------
def test_outputs_are_world_readable_under_umask_022(simulated_dump, tmp_path):
    previous = os.umask(0o022)
    try:
        replay(simulated_dump, out=tmp_path / "run", strategies=["tree"])
        _invoke("simulate", "--sessions", "1", "--seed", "2", "--max-turns", "3", "--out", tmp_path / "sim.parquet")
    finally:
        os.umask(previous)
    files = [tmp_path / "sim.parquet", *(tmp_path / "run").glob("*.*"), *(tmp_path / "run" / "plots").glob("*")]
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in files}
    assert len(modes) >= 9 and set(modes.values()) == {0o644}, modes


# -- 11. interrupt and resume ------------------------------------------------------------------------------------------
def test_interrupt_says_how_to_resume_and_the_rerun_says_it_resumed(simulated_dump, tmp_path, monkeypatch):
    from trace_tools.replay.session import SessionReplayer

    out = tmp_path / "run"
    monkeypatch.setenv("TRACE_TOOLS_SHARD_ROWS", "1")  # a shard per session
    real = SessionReplayer.__call__
    calls = []

    def interrupted(self, session):
        calls.append(1)
        if len(calls) == 6:  # five shards finished
            raise KeyboardInterrupt
        return real(self, session)

    monkeypatch.setattr(SessionReplayer, "__call__", interrupted)
    argv = ["replay", simulated_dump, "-s", "tree", "--no-samples", "--out", out]
    first = _invoke(*argv)
    assert first.exit_code == 130
    assert f"run the same command with --out {out} to resume" in " ".join(first.output.split())
    monkeypatch.setattr(SessionReplayer, "__call__", real)
    second = _invoke(*argv)
    assert second.exit_code == 0 and "resumed: 5 finished shard(s)" in second.output
    fresh = replay(simulated_dump, out=tmp_path / "fresh", strategies=["tree"], write_samples=False)
    assert (out / "summary.json").read_text() == (fresh.run_dir / "summary.json").read_text()


# -- 14. discoverability ----------------------------------------------------------------------------------------
def test_version_and_short_help():
    from trace_tools import __version__

    assert _invoke("--version").output.strip() == f"trace-tools {__version__}"
    assert "Usage: trace-tools" in _invoke("-h").output
    assert "Usage: trace-tools replay" in _invoke("replay", "-h").output


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_every_command_shows_an_example(name):
    assert f"Example: trace-tools {name}" in " ".join(_invoke(name, "--help", COLUMNS="300").output.split())


def test_reconstruct_takes_template_names_like_replay(simulated_dump):
    result = _invoke("reconstruct", simulated_dump, "--chat-template", "qwen3", "--json")
    assert result.exit_code == 0, result.output
    assert '"exact"' in result.output


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_help_is_whole_at_80_columns(name):
    """Rich cuts a word longer than the help column with `…`: no option help may have one."""
    text = _invoke(name, "--help", COLUMNS="80").output
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    # Descriptions get at least 40 cells at 80 columns (issue 40: rich's table left about 25).
    described = [line for line in text.splitlines() if line.startswith("  -") and "   " in line.strip()]
    assert described and all(line.index(line.split("   ")[-1].strip()) <= 40 for line in described), text


@pytest.mark.parametrize("name", ["replay", "import", "validate", "audit-template", "reconstruct", "rescore"])
def test_every_tokenizer_option_lists_every_builtin_tokenizer(name):
    from trace_tools.render.tokenizer import known_names

    text = " ".join(_invoke(name, "--help", COLUMNS="300").output.replace("│", " ").split())
    help_text = text.split("--tokenizer", 1)[1]
    assert all(tokenizer in help_text for tokenizer in known_names()), help_text[:300]


def test_a_piped_replay_shows_progress_lines_and_ends_with_commands_that_work(simulated_dump, tmp_path):
    import shlex

    out = tmp_path / "run"
    result = _invoke("replay", simulated_dump, "-s", "tree", "--out", out, COLUMNS="80")  # not a terminal
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "replaying: reading the input" in lines
    assert any(
        line.startswith("replaying: ")
        and " sessions (" in line
        and line.split()[1].split("/")[0] == line.split()[1].split("/")[1]
        for line in lines
    )  # the last line: every session done
    assert f"  open {out / 'report.html'} in a browser" in lines
    explain = next(shlex.split(line) for line in lines if line.startswith("    trace-tools explain "))
    shown = _invoke(*explain[1:])  # the suggested command, as printed
    assert shown.exit_code == 0 and "drift" in shown.output, shown.output
    assert f"    trace-tools gate {out} --rules rules.toml" in lines


@pytest.mark.parametrize("name, module, func", COMMANDS)
def test_help_paragraphs_wrap_as_paragraphs(name, module, func):
    """Typer keeps the line breaks of every paragraph after the first: each must be one line, or
    `-h` at 80 columns shows ragged, half-empty lines."""
    import importlib
    import inspect

    doc = inspect.cleandoc(getattr(importlib.import_module(f"trace_tools.cli.{module}"), func).__doc__ or "")
    assert all("\n" not in paragraph for paragraph in doc.split("\n\n")[1:]), name


def test_reconstruct_prints_the_worst_sessions_of_a_large_dump(simulated_dump, tmp_path, monkeypatch):
    """Past `SESSIONS_SHOWN` sessions the table keeps the lowest rates and says how many it left out;
    --out still writes every session's turns. Two sessions get a recorded prompt token changed, so their
    rates drop below the others' 100 %."""
    from trace_tools.cli import cmd_reconstruct

    table = pq.read_table(simulated_dump)
    ids = sorted(set(table.column("session_id").to_pylist()))
    damaged = {ids[-1], ids[-3]}  # late in the input: only the sort can bring them into view
    rows = table.to_pylist()
    for row in rows:
        if row["session_id"] in damaged and row["turn_index"] == 1:
            row["prompt_ids"][-1] = 13 if row["prompt_ids"][-1] != 13 else 14
    dump = tmp_path / "damaged.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), dump)

    monkeypatch.setattr(cmd_reconstruct, "SESSIONS_SHOWN", 3)
    output = _invoke("reconstruct", dump, "--out", tmp_path / "out", COLUMNS="200").output
    shown = [sid for sid in ids if f" {sid} " in output]
    assert len(shown) == 3 and damaged < set(shown)
    assert f"… {len(ids) - 3} more (--out: all)" in output
    written = pq.read_table(tmp_path / "out" / "turns.parquet", columns=["session_id"]).column(0)
    assert sorted(set(written.to_pylist())) == ids
