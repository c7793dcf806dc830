"""Rescore end to end on CPU: sample from tiny-qwen3 recording logprobs, write a schema-v1 dump,
rescore it -- with the same model (Δ within float32 noise), a perturbed model, a wrong template --
through the library, the run directory and the CLI; and fill_logprobs as the positive control."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from trace_tools.data import DumpMeta, Session, Turn
from trace_tools.io.write import sessions_to_table, write_parquet_atomic
from trace_tools.reconstruct import render_turn
from trace_tools.render.renderer import Renderer
from trace_tools.rescore import fill_logprobs, load_model, rescore, sample_continuation

# Recorded logprobs come from KV-cached one-token decoding, recomputed ones from a single
# teacher-forced pass: in float32 they differ by reduction order only (observed max 1.9e-6 on
# tiny-qwen3, two rounding steps of a logprob near -12). 1e-4 leaves a 50x margin and is still
# 500x below the smallest real mismatch these tests provoke (mean |Δ| >= 0.05).
TOLERANCE = 1e-4
TITO_TAILS = ["Show me the assertion that fails.", "Now patch it."]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-qwen3", device="cpu")


@pytest.fixture(scope="module")
def renderer():
    return Renderer.from_spec("qwen3", "qwen3")


def _user_turn_ids(renderer, text: str) -> list[int]:
    # What a token-in/token-out gateway appends after a generated turn: close it, add the user turn,
    # open the next assistant turn.
    return renderer.encode(f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def _tito_session(tiny, renderer, meta: DumpMeta) -> Session:
    """Three append-only turns with recorded prompt ids; the last one has no recorded logprobs."""
    messages = [
        {"role": "system", "content": "You maintain a small Rust crate."},
        {"role": "user", "content": "Why does cargo test fail in the parser module?"},
    ]
    prompt = renderer.render(messages)
    turns = []
    for index, length in enumerate((10, 8, 6)):
        sampled = sample_continuation(tiny, prompt, length, seed=20 + index)
        logprobs = sampled.logprobs if index < 2 else None
        turns.append(
            Turn("tito", index, copy.deepcopy(messages), sampled.ids, output_logprobs=logprobs, prompt_ids=list(prompt))
        )
        if index < 2:
            messages += [
                {"role": "assistant", "content": renderer.decode(sampled.ids)},
                {"role": "user", "content": TITO_TAILS[index]},
            ]
            prompt = prompt + sampled.ids + _user_turn_ids(renderer, TITO_TAILS[index])
    return Session("tito", turns, meta)


def _rendered_session(tiny, renderer, meta: DumpMeta) -> Session:
    """One turn whose prompt ids were not recorded: rescore must re-render them."""
    turn = Turn("rendered", 0, [{"role": "user", "content": "Summarise this diff in two sentences."}], [])
    sampled = sample_continuation(tiny, render_turn(renderer, turn), 9, seed=30)
    return Session(
        "rendered", [dataclasses.replace(turn, output_ids=sampled.ids, output_logprobs=sampled.logprobs)], meta
    )


@pytest.fixture(scope="module")
def sessions(tiny, renderer):
    meta = DumpMeta(schema_version="1", tokenizer="qwen3", chat_template=renderer.chat_template)
    return [_tito_session(tiny, renderer, meta), _rendered_session(tiny, renderer, meta)]


@pytest.fixture(scope="module")
def dump_path(sessions, tmp_path_factory):
    path = tmp_path_factory.mktemp("rescore") / "recorded.parquet"
    write_parquet_atomic(sessions_to_table(sessions), path)
    return path


@pytest.fixture(scope="module")
def perturbed_dir(tiny, tmp_path_factory):
    """tiny-qwen3 with every weight jittered by 10 % of its own spread: "another checkpoint"."""
    model = copy.deepcopy(tiny.model)
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1 * parameter.std())
    directory = tmp_path_factory.mktemp("perturbed") / "model"
    model.save_pretrained(str(directory))
    return directory


def test_same_model_reproduces_the_recorded_logprobs(dump_path, tmp_path):
    out = tmp_path / "run"
    result = rescore(dump_path, "tiny-qwen3", device="cpu", out=out)
    turns = result.turns.set_index(["session_id", "turn_index"])
    compared = turns[turns["comparable"]]
    assert sorted(compared.index) == [("rendered", 0), ("tito", 0), ("tito", 1)]
    assert (compared["max_abs_delta"] < TOLERANCE).all()
    assert not turns["flagged"].any()
    assert turns.loc[("rendered", 0), "prompt_origin"] == "rendered"
    assert turns.loc[("tito", 1), "prompt_origin"] == "recorded"
    # The turn without recorded logprobs is kept, with its reason, and counted.
    assert turns.loc[("tito", 2), "reason"] == "no_logprobs" and not turns.loc[("tito", 2), "comparable"]
    summary = result.summary
    assert summary["turns"]["not_comparable_by_reason"] == {"no_logprobs": 1}
    assert summary["tokens"] == 10 + 8 + 9
    assert summary["delta"]["max_abs_delta"] < TOLERANCE and summary["turns"]["flagged"] == 0
    assert abs(summary["kl"]["k3"]) < TOLERANCE**2 * 10  # k3 ~ r^2 / 2 per token
    # The run directory holds what the summary says.
    assert len(pq.read_table(out / "tokens.parquet")) == summary["tokens"]
    assert len(pq.read_table(out / "turns.parquet")) == 4
    assert sorted(pq.read_table(out / "sessions.parquet").column("session_id").to_pylist()) == ["rendered", "tito"]
    assert json.loads((out / "summary.json").read_text())["tokens"] == summary["tokens"]
    assert (out / "plots" / "rescore_delta_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prefix_sharing_gives_the_numbers_of_separate_scoring(sessions, tiny):
    shared = rescore(sessions, tiny, share_prefix=True)
    separate = rescore(sessions, tiny, share_prefix=False)
    keys = ["session_id", "turn_index", "position"]
    both = shared.tokens.merge(separate.tokens, on=keys, suffixes=("_shared", "_separate"))
    assert len(both) == len(shared.tokens) == len(separate.tokens) == 27
    assert np.max(np.abs(both["recomputed_shared"] - both["recomputed_separate"])) < 1e-5
    assert shared.summary["throughput"]["sequences"] == 2  # tito's two comparable turns share one
    assert separate.summary["throughput"]["sequences"] == 3
    assert shared.summary["throughput"]["forwarded_tokens"] < separate.summary["throughput"]["forwarded_tokens"]


def test_a_perturbed_model_is_detected_and_its_turns_flagged(dump_path, perturbed_dir):
    result = rescore(dump_path, str(perturbed_dir), device="cpu")
    compared = result.turns[result.turns["comparable"]]
    assert compared["flagged"].all()
    assert (compared["mean_abs_delta"] > 0.05).all()
    assert result.summary["turns"]["flagged"] == 3
    assert result.summary["frac_above_threshold"] > 0.5
    worst = result.summary["flagged"][0]
    assert worst["max_abs_delta"] == pytest.approx(compared["max_abs_delta"].max())
    assert "⟦" in worst["context"] and "⟧" in worst["context"]


def test_a_wrong_template_is_detected_on_rerendered_prompts(dump_path, tiny):
    # Qwen2.5's template adds a default system prompt the sampler never saw.
    result = rescore(dump_path, tiny, chat_template="trl:qwen2_5")
    turns = result.turns.set_index(["session_id", "turn_index"])
    assert turns.loc[("rendered", 0), "flagged"]
    assert turns.loc[("rendered", 0), "mean_abs_delta"] > 0.05
    # Turns with recorded prompt ids do not depend on the template and stay clean.
    assert turns.loc[("tito", 0), "max_abs_delta"] < TOLERANCE and not turns.loc[("tito", 1), "flagged"]
    assert "trl:qwen2_5.jinja" in result.summary["options"]["prompt_renderer"]["template"]


def test_prompts_recorded_with_another_system_prompt_are_detected(sessions, tiny, renderer):
    # The gateway logged prompt ids that are not what the sampler saw (a different system prompt).
    turn = sessions[1].turns[0]
    other = [{"role": "system", "content": "You are a terse reviewer."}, *turn.messages]
    wrong = dataclasses.replace(turn, prompt_ids=renderer.render(other))
    result = rescore([Session("rendered", [wrong], sessions[1].meta)], tiny)
    assert result.turns.loc[0, "flagged"] and result.turns.loc[0, "prompt_origin"] == "recorded"


def test_cli_rescore_prints_a_table_and_json(dump_path, perturbed_dir, tmp_path):
    from trace_tools.cli.main import app

    runner = CliRunner()
    table_run = runner.invoke(
        app,
        ["rescore", str(dump_path), "--model", str(perturbed_dir), "--device", "cpu", "--out", str(tmp_path / "table")],
    )
    assert table_run.exit_code == 0, table_run.output
    assert "flagged turns" in table_run.output and "Flagged turns" in table_run.output
    json_run = runner.invoke(
        app,
        [
            "rescore",
            str(dump_path),
            "--model",
            "tiny-qwen3",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "json"),
            "--json",
            "--no-tokens",
        ],
    )
    assert json_run.exit_code == 0, json_run.output
    summary = json.loads(json_run.output)
    assert summary["turns"]["comparable"] == 3 and summary["turns"]["flagged"] == 0
    assert not (tmp_path / "json" / "tokens.parquet").exists()
    assert (tmp_path / "json" / "turns.parquet").exists()


def test_cli_rescore_names_the_fix_for_a_bad_model(dump_path, tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_tools.cli.main",
            "rescore",
            str(dump_path),
            "--model",
            "no-such-model",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "tiny-qwen3" in run.stderr and "Traceback" not in run.stderr


def test_fill_logprobs_on_a_table_makes_a_dump_that_rescores_clean(sessions, tiny, tmp_path):
    stripped = [
        dataclasses.replace(s, turns=[dataclasses.replace(t, output_logprobs=None) for t in s.turns]) for s in sessions
    ]
    table = sessions_to_table(stripped)
    filled = fill_logprobs(table, tiny)
    # the recording's metadata is kept, and the file now says who computed its logprobs
    assert filled.schema.metadata == {**table.schema.metadata, b"trace_tools.logprobs": b"teacher-forced:tiny-qwen3"}
    assert filled.column("session_id").to_pylist() == table.column("session_id").to_pylist()
    lengths = [len(v) for v in filled.column("output_logprobs").to_pylist()]
    assert lengths == [len(v) for v in table.column("output_ids").to_pylist()]
    write_parquet_atomic(filled, tmp_path / "filled.parquet")
    result = rescore(tmp_path / "filled.parquet", tiny)
    assert result.summary["turns"]["comparable"] == 4  # the turn that had none now has logprobs too
    assert result.summary["delta"]["max_abs_delta"] < TOLERANCE
    assert result.summary["logprobs_source"] == "teacher-forced:tiny-qwen3"


def test_fill_logprobs_on_sessions_matches_the_sampled_logprobs(sessions, tiny):
    filled = fill_logprobs(sessions, tiny)
    assert [s.session_id for s in filled] == ["tito", "rendered"]
    for original, new in zip(sessions, filled):
        for before, after in zip(original.turns, new.turns):
            assert after.output_ids == before.output_ids
            if before.output_logprobs is not None:
                assert np.max(np.abs(np.array(after.output_logprobs) - before.output_logprobs)) < TOLERANCE
    assert sessions[0].turns[2].output_logprobs is None  # the input is left untouched


def test_results_are_dataframes_for_notebooks(sessions, tiny):
    result = rescore(sessions, tiny)
    assert isinstance(result.tokens, pd.DataFrame) and isinstance(result.sessions, pd.DataFrame)
    session_row = result.sessions.set_index("session_id").loc["tito"]
    assert session_row["turns"] == 3 and session_row["comparable_turns"] == 2
    assert session_row["tokens"] == 18
    assert result.flagged.empty


def test_quarantined_sessions_and_turns_without_logprobs_are_accounted_for(sessions, tiny, tmp_path):
    good = sessions[1]
    bad_turn = dataclasses.replace(good.turns[0], session_id="broken", output_logprobs=[-1.0])  # length mismatch
    no_logprobs = dataclasses.replace(good.turns[0], session_id="unscored", output_logprobs=None)
    path = tmp_path / "mixed.parquet"
    write_parquet_atomic(
        sessions_to_table([Session("broken", [bad_turn], good.meta), Session("unscored", [no_logprobs], good.meta)]),
        path,
    )
    result = rescore(path, tiny, out=tmp_path / "run")
    summary = result.summary
    assert summary["quarantined"] == 1 and summary["quarantined_by_reason"] == {"logprobs_length": 1}
    assert summary["turns"] == {
        **summary["turns"],
        "total": 1,
        "comparable": 0,
        "not_comparable": 1,
        "not_comparable_by_reason": {"no_logprobs": 1},
    }
    assert summary["tokens"] == 0 and summary["delta"]["max_abs_delta"] is None
    assert len(pq.read_table(tmp_path / "run" / "tokens.parquet")) == 0
    assert (tmp_path / "run" / "plots" / "rescore_delta_hist.png").exists()


def test_a_simulated_dump_with_model_logprobs_rescores_clean(tiny, tmp_path):
    from trace_tools.simulate import simulate

    path = tmp_path / "simulated.parquet"
    simulate(
        sessions=1, seed=4, template="qwen3", recording="none", out=str(path), max_turns=3, logprobs_model="tiny-qwen3"
    )
    result = rescore(path, tiny)
    turns = result.summary["turns"]
    assert turns["total"] >= 3 and turns["comparable"] == turns["total"] == turns["prompt_rendered"]
    assert result.summary["delta"]["max_abs_delta"] < TOLERANCE and turns["flagged"] == 0


def test_synthetic_logprobs_of_a_simulated_dump_are_named(tmp_path):
    """Seeded logprobs flag every turn by design; rescore says so instead of leaving the user to wonder."""
    from trace_tools.cli.main import app
    from trace_tools.simulate import simulate

    seeded, forced = tmp_path / "seeded.parquet", tmp_path / "forced.parquet"
    simulate(sessions=1, seed=4, template="qwen3", recording="none", out=str(seeded), max_turns=3)
    simulate(
        sessions=1,
        seed=4,
        template="qwen3",
        recording="none",
        out=str(forced),
        max_turns=3,
        logprobs_model="tiny-qwen3",
    )
    result = CliRunner().invoke(
        app, ["rescore", str(seeded), "--model", "tiny-qwen3", "--device", "cpu", "--out", str(tmp_path / "r1")]
    )
    assert result.exit_code == 0, result.output
    assert "logprobs are synthetic" in " ".join(result.output.split())
    summary = json.loads((tmp_path / "r1" / "summary.json").read_text())
    assert summary["logprobs_source"] == "synthetic" and summary["turns"]["flagged"] > 0
    assert rescore(forced, "tiny-qwen3", device="cpu").summary["logprobs_source"] == "teacher-forced:tiny-qwen3"
