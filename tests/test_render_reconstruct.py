"""Prompt reconstruction: 100 % fidelity on prompts rendered with the same template, located drift otherwise."""

from __future__ import annotations

import copy
import json
from functools import lru_cache

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_tools.data import DumpMeta, Session, Turn
from trace_tools.reconstruct import first_divergence, reconstruct
from trace_tools.render.canonical import canonicalize_messages
from trace_tools.render.renderer import Renderer
from trace_tools.render.templates import resolve_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


@lru_cache(maxsize=None)
def _renderer(name: str) -> Renderer:
    text, identity = resolve_template(name)
    return Renderer(name, text, template_identity=identity)


def _wire_call(call_id: str, command: str) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "Bash", "arguments": json.dumps({"command": command})},
    }


def _harness_messages(steps: int) -> list[list[dict]]:
    """The request of each turn as an OpenAI-style harness sends it (wire ids, string arguments)."""
    history = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": [{"type": "text", "text": "Inspect the repo."}]},
    ]
    requests = [copy.deepcopy(history)]
    for step in range(steps):
        history.append(
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": f"step {step}",
                "tool_calls": [_wire_call(f"call_{step}", f"ls dir{step}  \n")],
            }
        )
        history.append({"role": "tool", "tool_call_id": f"call_{step}", "content": f"file{step}.py\nREADME  "})
        requests.append(copy.deepcopy(history))
    return requests


def _session(name: str, session_id: str, steps: int = 3, kwargs: dict | None = None) -> Session:
    """A session whose recorded prompt_ids were rendered by a slime-style gateway with `name`'s template."""
    renderer = _renderer(name)
    turns = []
    for index, messages in enumerate(_harness_messages(steps)):
        canonical = canonicalize_messages(messages, "slime")
        prompt = renderer.render(canonical, TOOLS, True, **(kwargs or {}))
        turns.append(
            Turn(
                session_id=session_id,
                turn_index=index,
                messages=messages,
                tools=TOOLS,
                output_ids=renderer.encode("ok<|im_end|>"),
                prompt_ids=prompt,
                chat_template_kwargs=kwargs,
            )
        )
    return Session(session_id, turns, DumpMeta(tokenizer=name))


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])
def test_full_fidelity_when_prompts_came_from_the_same_template(name):
    sessions = [_session(name, "s1"), _session(name, "s2", steps=1, kwargs={"enable_thinking": False})]
    result = reconstruct(sessions, renderer=_renderer(name))
    assert result.summary["turns_compared"] == 6 and result.summary["exact"] == 6 and result.summary["rate"] == 1.0
    assert result.turns["exact"].tolist() == [True] * 6
    assert result.turns["first_divergence"].isna().all()
    assert (result.turns["rendered_len"] == result.turns["recorded_len"]).all()
    assert result.sessions["rate"].tolist() == [1.0, 1.0]


def test_reconstruction_compares_prompts_without_parsing_responses(monkeypatch):
    """Responses are a replay's business: reconstruct renders and compares the prompts only, and
    prepares the same prompts as replay does."""
    from trace_tools.pipeline.prepared import prepare_session

    renderer = _renderer("qwen3")
    parsed: list[int] = []
    real = Renderer.parse_response
    monkeypatch.setattr(Renderer, "parse_response", lambda self, *args: parsed.append(1) or real(self, *args))
    session = _session("qwen3", "s", steps=2)
    assert reconstruct([session], renderer=renderer).summary["exact"] == 3
    assert parsed == []
    full = prepare_session(session, renderer)
    assert len(parsed) == 3 and all(turn.response_message for turn in full.turns)
    prompts_only = prepare_session(session, renderer, responses=False)
    assert [turn.response_message for turn in prompts_only.turns] == [None] * 3
    assert [t.rendered_prompt_ids() for t in prompts_only.turns] == [t.rendered_prompt_ids() for t in full.turns]


def test_turn_kwargs_are_honoured():
    session = _session("qwen3", "s", steps=1, kwargs={"enable_thinking": False})
    for turn in session.turns:
        turn.chat_template_kwargs = None  # lose the kwargs: the generation prompt no longer matches
    result = reconstruct([session], renderer=_renderer("qwen3"))
    assert result.summary["exact"] == 0
    assert result.turns["context"].str.contains("</think>").all()


def test_drift_is_located_and_shown():
    renderer = _renderer("qwen3")
    session = _session("qwen3", "drifty", steps=2)
    # The gateway had served the call with its trailing whitespace stripped: recorded ids differ there.
    served = canonicalize_messages(session.turns[2].messages, "slime")
    served[2]["tool_calls"][0]["function"]["arguments"]["command"] = "ls dir0"
    session.turns[2].prompt_ids = renderer.render(served, TOOLS)
    session.turns[1].prompt_ids = None  # not recorded: not compared
    result = reconstruct([session], renderer=renderer)
    rows = result.turns.set_index("turn_index")
    assert rows.loc[0, "exact"] == True  # noqa: E712 (a numpy bool)
    assert pd.isna(rows.loc[1, "exact"]) and pd.isna(rows.loc[1, "recorded_len"]) and rows.loc[1, "rendered_len"] > 0
    assert rows.loc[2, "exact"] == False  # noqa: E712
    at = int(rows.loc[2, "first_divergence"])
    rendered = renderer.render(canonicalize_messages(session.turns[2].messages, "slime"), TOOLS)
    recorded = session.turns[2].prompt_ids
    assert recorded[:at] == rendered[:at] and recorded[at] != rendered[at]
    assert "ls dir0" in rows.loc[2, "context"] and "\\n" in rows.loc[2, "context"]
    assert result.summary == {
        "turns_compared": 2,
        "exact": 1,
        "rate": 0.5,
        "turns": 3,
        "sessions": 1,
        "render_errors": 0,
        "quarantined_sessions": 0,
    }
    assert result.sessions.iloc[0][["turns", "turns_compared", "exact", "rate"]].tolist() == [3, 2, 1, 0.5]


def test_canonicalization_policy_matters():
    session = _session("qwen3", "s", steps=2)
    # The harness sent the user turn as a list of content parts; slime flattens it to text, `none`
    # passes the list through and the Qwen3 template renders non-string content as empty.
    result = reconstruct([session], renderer=_renderer("qwen3"), canonicalization="none")
    assert result.summary["turns_compared"] == 3 and result.summary["exact"] == 0
    assert "Inspect the repo." in result.turns["context"].iloc[0]


def test_render_errors_are_reported_per_turn():
    session = _session("qwen3.5", "s", steps=1)
    session.turns[0].messages = [{"role": "system", "content": "no user"}]
    result = reconstruct([session], renderer=_renderer("qwen3.5"))
    row = result.turns.iloc[0]
    assert not row["exact"] and "No user query" in row["error"] and pd.isna(row["rendered_len"])
    assert result.summary["render_errors"] == 1 and result.summary["exact"] == 1


@pytest.mark.parametrize(
    "recorded, rendered, expected",
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2], [1, 2, 3], 2), ([], [5], 0)],
)
def test_first_divergence(recorded, rendered, expected):
    assert first_divergence(recorded, rendered) == expected


def _write_dump(path, sessions: list[Session], template: str) -> None:
    """A schema-v1 Parquet dump written by hand, following docs/trace_schema.md."""
    rows = [
        {
            "session_id": t.session_id,
            "turn_index": t.turn_index,
            "messages": json.dumps(t.messages),
            "tools": json.dumps(t.tools),
            "output_ids": t.output_ids,
            "prompt_ids": t.prompt_ids,
            "chat_template_kwargs": json.dumps(t.chat_template_kwargs) if t.chat_template_kwargs else None,
        }
        for s in sessions
        for t in s.turns
    ]
    schema = pa.schema(
        [
            ("session_id", pa.string()),
            ("turn_index", pa.int32()),
            ("messages", pa.string()),
            ("tools", pa.string()),
            ("output_ids", pa.list_(pa.int32())),
            ("prompt_ids", pa.list_(pa.int32())),
            ("chat_template_kwargs", pa.string()),
        ],
        metadata={
            "trace_tools.schema_version": "1",
            "trace_tools.tokenizer": "qwen3.5",
            "trace_tools.chat_template": template,
        },
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def test_end_to_end_from_parquet_and_cli(tmp_path):
    from typer import Typer
    from typer.testing import CliRunner

    from trace_tools.cli.cmd_reconstruct import reconstruct_cmd

    dump = tmp_path / "dump.parquet"
    broken = _session("qwen3.5", "c", steps=1)
    broken.turns[1].prompt_ids = [999_999]  # out of vocabulary: io quarantines the session
    _write_dump(
        dump,
        [_session("qwen3.5", "a"), _session("qwen3.5", "b", steps=2, kwargs={"enable_thinking": False}), broken],
        _renderer("qwen3.5").chat_template,
    )
    result = reconstruct(dump)  # tokenizer and template both come from the dump's metadata
    assert result.summary["rate"] == 1.0 and result.summary["turns_compared"] == 7
    assert result.summary["quarantined_sessions"] == 1 and set(result.turns["session_id"]) == {"a", "b"}
    assert result.renderer_identity["template"].startswith("dump sha256=")

    app = Typer()
    app.command()(reconstruct_cmd)
    runner = CliRunner()
    as_json = runner.invoke(app, [str(dump), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["exact"] == 7
    out = tmp_path / "run"
    table = runner.invoke(app, [str(dump), "--out", str(out), "--chat-template", str(tmp_path / "missing.jinja")])
    assert table.exit_code != 0  # a template that does not exist is a usage error
    table = runner.invoke(app, [str(dump), "--out", str(out)])
    assert table.exit_code == 0, table.output
    assert "overall" in table.output and "100.0%" in table.output
    written = pq.read_table(out / "turns.parquet").to_pandas()
    assert written["exact"].tolist() == [True] * 7
    assert json.loads((out / "summary.json").read_text())["rate"] == 1.0


def test_rows_give_the_summary_and_the_tables_as_pandas_did():
    """The command line prints from the rows (`session_rows`) and builds no DataFrame; the API's
    `turns` and `sessions` are built from the same rows when asked for."""
    import math

    from trace_tools.reconstruct import ReconstructResult, summarize

    def row(session, turn, exact, error=None):
        return {
            "session_id": session,
            "turn_index": turn,
            "rendered_len": None if error else 10,
            "recorded_len": None if exact is None else 10,
            "exact": exact,
            "first_divergence": 4 if exact is False else None,
            "context": None,
            "error": error,
        }

    rows = [row("b", 0, True), row("b", 1, False), row("a", 0, None), row("b", 2, None, "boom"), row("a", 1, None)]
    summary = summarize(rows)
    assert summary == {"turns_compared": 2, "exact": 1, "rate": 0.5, "turns": 5, "sessions": 2, "render_errors": 1}
    result = ReconstructResult(rows, summary)
    assert result.session_rows() == [
        {"session_id": "b", "turns": 3, "turns_compared": 2, "exact": 1, "rate": 0.5},
        {"session_id": "a", "turns": 2, "turns_compared": 0, "exact": 0, "rate": None},
    ]
    sessions = result.sessions
    assert list(sessions["session_id"]) == ["b", "a"] and math.isnan(sessions["rate"].iloc[1])
    assert str(sessions["turns"].dtype) == "int64"
    turns = result.turns
    assert str(turns["exact"].dtype) == "boolean" and str(turns["recorded_len"].dtype) == "Int64"
    assert turns["exact"].isna().sum() == 3 and turns["recorded_len"].isna().sum() == 3


def test_the_reconstruct_command_imports_no_pandas(tmp_path):
    """Its table is printed from the rows; pyarrow is kept from importing pandas (`arrow_pool`)."""
    import subprocess
    import sys

    code = (
        "import atexit, runpy, sys; "
        "atexit.register(lambda: print('pandas imported:', 'pandas' in sys.modules)); "
        "sys.argv = ['trace-tools', 'reconstruct', 'sample_traces/']; "
        "runpy.run_module('trace_tools.cli.main', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "overall" in done.stdout and "100.0%" in done.stdout
    assert done.stdout.strip().endswith("pandas imported: False")
