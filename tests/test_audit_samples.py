"""`audit-samples` on the samples `replay -s tree` makes of the bundled sample: the audit's numbers
are replay's own, its run directory is one `report`, `compare` and `gate` read, broken samples are
set aside with a reason, and loss masks that break a rule are caught with an example."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trace_tools.io.sample_parts import read_samples
from trace_tools.trainer.audit import audit_samples
from trace_tools.trainer.records import TrainerSample

SAMPLE = Path(__file__).parents[1] / "sample_traces" / "qwen3.parquet"
FAMILY = {"tokenizer": "qwen3", "chat_template": "qwen3"}


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory) -> Path:
    from trace_tools.api import replay

    out = tmp_path_factory.mktemp("tree") / "run"
    replay(SAMPLE, out=out, strategies=["tree"])
    return out


@pytest.fixture(scope="module")
def tree_summary(tree_run) -> dict:
    return json.loads((tree_run / "summary.json").read_text())["strategies"]["tree"]


def trainer_samples(run: Path, steps: int = 1) -> list[TrainerSample]:
    """The tree run's samples as a trainer would hold them, sessions spread over `steps` rollout steps."""
    rows = read_samples(run).to_pylist()
    sessions = list(dict.fromkeys(row["session_id"] for row in rows))
    return [
        TrainerSample(
            source=f"samples.parquet#{i}",
            tokens=row["token_ids"],
            response_length=row["response_length"],
            loss_mask=row["loss_mask"],
            rollout_logprobs=row["logprobs"],
            session_id=row["session_id"],
            step=sessions.index(row["session_id"]) % steps,
            index=i,
        )
        for i, row in enumerate(rows)
    ]


@pytest.fixture(scope="module")
def audit_run(tree_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("audit") / "run"
    return audit_samples(trainer_samples(tree_run, steps=2), out=out, calls=SAMPLE, **FAMILY)


def test_numbers_equal_replay_tree(audit_run, tree_summary):
    trainer = audit_run.summary["strategies"]["trainer"]
    for key in ("samples", "forwarded_tokens", "trained_tokens", "generated_tokens", "coverage"):
        assert trainer[key] == tree_summary[key], key
    assert trainer["coverage_by_tool"] == tree_summary["coverage_by_tool"]
    by_tool = {tool: v["trained_tokens"] for tool, v in tree_summary["tool_turns"].items() if v["trained_tokens"]}
    assert trainer["trained_tokens_by_tool"] == by_tool
    assert audit_run.to_json()["run"]["trained_tokens_by_tool"] == by_tool


def test_without_calls_trained_by_tool_is_replays(tree_run, tree_summary):
    result = audit_samples(trainer_samples(tree_run), **FAMILY)
    run = result.to_json()["run"]
    assert (run["samples"], run["sessions"]) == (tree_summary["samples"], tree_summary["sessions"])
    assert run["trained_tokens_by_tool"] == {
        tool: v["trained_tokens"] for tool, v in tree_summary["tool_turns"].items() if v["trained_tokens"]
    }
    assert result.run_dir is None


def test_steps_add_up_to_the_run(audit_run):
    report = audit_run.to_json()
    assert set(report["steps"]) == {"0", "1"}
    for key in ("samples", "sessions", "forwarded_tokens", "trained_tokens", "reemitted_tokens"):
        assert sum(step[key] for step in report["steps"].values()) == report["run"][key], key
    assert report["run"]["one_sample_tokens"] == report["run"]["forwarded_tokens"] - report["run"]["reemitted_tokens"]


def test_samples_equal_the_strategys(audit_run):
    comparison = audit_run.to_json()["comparison"]
    assert comparison["equal"] and comparison["equal_samples"] == comparison["strategy_samples"] > 0
    assert comparison["first_difference"] is None


def test_a_changed_token_is_the_first_difference(tree_run):
    samples = trainer_samples(tree_run)
    changed = samples[3]
    changed.tokens = [*changed.tokens[:10], changed.tokens[10] + 1, *changed.tokens[11:]]
    comparison = audit_samples(samples, calls=SAMPLE, **FAMILY).to_json()["comparison"]
    assert not comparison["equal"] and comparison["differing_samples"] == 1
    assert comparison["first_difference"]["text"].startswith("samples.parquet#3: token 10:")


def test_reemitted_context_is_the_shared_prefix():
    first = TrainerSample("a#0", tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1], session_id="s")
    longer = TrainerSample("a#1", tokens=[1, 2, 3, 4, 5, 6], response_length=2, loss_mask=[1, 1], session_id="s")
    branch = TrainerSample("a#2", tokens=[1, 2, 9, 9, 9], response_length=3, loss_mask=[0, 1, 1], session_id="s")
    run = audit_samples([first, longer, branch], **FAMILY).to_json()["run"]
    assert run["reemitted_tokens"] == 4 + 2  # `longer` repeats all of `first`; `branch` shares two tokens
    assert run["one_sample_tokens"] == 6 + 3  # the longest sample, and the branch past the fork
    assert run["sessions"] == 1 and run["forwarded_tokens"] == 15


def test_rules_catch_a_bad_loss_mask(tree_run):
    samples = trainer_samples(tree_run)
    everything = samples[0]
    everything.loss_mask = [1] * everything.response_length  # tool outputs and role headers trained too
    twice = dataclasses.replace(samples[1], source="copy#1")  # the same sample given twice
    rules = audit_samples([everything, samples[1], twice], **FAMILY).to_json()["rules"]
    assert rules["context_untrained"]["violations"] > 0
    assert rules["role_header_untrained"]["violations"] > 0
    assert rules["trained_once"]["violations"] == sum(samples[1].loss_mask)
    assert rules["stop_token_trained_once"]["violations"] > 0
    assert rules["trained_once"]["examples"][0].startswith("copy#1:")
    assert "'<|im_start|>" in rules["role_header_untrained"]["examples"][0]


def test_hostile_samples_are_set_aside(tree_run, tmp_path):
    good = trainer_samples(tree_run)[0]
    hostile = [
        dataclasses.replace(good, source="short-mask", loss_mask=good.loss_mask[:-1]),
        dataclasses.replace(good, source="long-response", response_length=len(good.tokens) + 1),
        dataclasses.replace(good, source="floats", tokens=[float(t) for t in good.tokens]),
        dataclasses.replace(good, source="vocab", tokens=[*good.tokens[:-1], 10**9]),
        dataclasses.replace(good, source="mask-values", loss_mask=[2] * good.response_length),
        dataclasses.replace(good, source="nan", rollout_logprobs=[float("nan")] * good.response_length),
        TrainerSample("empty", tokens=good.tokens[:50], response_length=0, loss_mask=[], session_id="e"),
    ]
    result = audit_samples(hostile, out=tmp_path / "run", **FAMILY)
    quarantine = pq.read_table(tmp_path / "run" / "quarantine.parquet").to_pylist()
    assert [(row["detail"].split(":")[0], row["reason"]) for row in quarantine] == [
        ("short-mask", "mask_length_mismatch"),
        ("long-response", "bad_response_length"),
        ("floats", "bad_tokens"),
        ("vocab", "out_of_vocab"),
        ("mask-values", "bad_loss_mask"),
    ]
    report = result.to_json()
    assert report["run"]["samples"] == 2 and report["quarantined_samples"] == 5
    assert report["notes"]["empty_responses"]["examples"] == ["empty"]
    assert report["notes"]["logprobs_mismatch"]["examples"] == ["nan"]


def test_the_run_directory_is_read_as_a_run(audit_run, tmp_path):
    from trace_tools.report.compare import compare
    from trace_tools.report.gate import gate
    from trace_tools.report.rerender import rerender

    run = audit_run.run_dir
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategies"]["trainer"]["loss_mask_rules"]["context_untrained"]["violations"] == 0
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rule]]\nmetric = "loss_mask_rules.context_untrained.violations"\nop = "=="\nvalue = 0\n\n'
        '[[rule]]\nmetric = "trained_tokens_by_tool.Bash"\nop = ">="\nvalue = 1\n'
    )
    assert all(result.passed for result in gate(run, rules))
    comparison = compare(run, run)
    assert comparison.sessions.empty and "trainer" in set(comparison.metrics["pair"])
    assert rerender(run)["strategies"]["trainer"]["samples"] == summary["strategies"]["trainer"]["samples"]
    report = (run / "report.md").read_text()
    assert "## Loss-mask rules" in report and "`trained_once`" in report
    assert "Trainer samples" in (run / "report.html").read_text()


def test_slime_rollout_files_of_the_sample_audit_to_replays_tree_numbers(tree_run, tree_summary, tmp_path):
    """The acceptance path end to end: tree's samples of the bundled sample written as slime
    `rollout_{id}.pt` files (two rollout steps, half the samples as tensors), read back by the
    CLI, give replay's own numbers for the run and the sum of the steps."""
    from typer.testing import CliRunner

    from trace_tools.cli.main import app
    from trainer_fixtures import as_tensors, spec, write_slime_rollout

    samples = trainer_samples(tree_run, steps=2)
    for step in (0, 1):
        rows = [
            spec(
                s.tokens,
                s.response_length,
                loss_mask=s.loss_mask,
                rollout_log_probs=s.rollout_logprobs,
                index=s.index,
                session_id=s.session_id,
            )
            for s in samples
            if s.step == step
        ]
        write_slime_rollout(
            tmp_path / "dump" / f"rollout_{step}.pt", step, [as_tensors(r) if r["index"] % 2 else r for r in rows]
        )
    result = CliRunner().invoke(app, ["audit-samples", str(tmp_path / "dump"), "--tokenizer", "qwen3", "--json"])
    report = json.loads(result.stdout)
    run = report["run"]
    for key in ("samples", "forwarded_tokens", "trained_tokens"):
        assert run[key] == tree_summary[key], key
        assert sum(step[key] for step in report["steps"].values()) == run[key], key
    assert run["trained_tokens_by_tool"] == {
        tool: v["trained_tokens"] for tool, v in tree_summary["tool_turns"].items() if v["trained_tokens"]
    }
    assert run["reemitted_tokens"] == audit_samples(samples, **FAMILY).to_json()["run"]["reemitted_tokens"] > 0
    assert set(report["steps"]) == {"0", "1"} and report["quarantined_samples"] == 0


def test_cli_reads_a_slime_dump(tree_run, tmp_path):
    import torch
    from typer.testing import CliRunner

    from trace_tools.cli.main import app

    rows = [
        {"tokens": s.tokens, "response_length": s.response_length, "loss_mask": s.loss_mask, "index": i}
        for i, s in enumerate(trainer_samples(tree_run))
    ]
    rows[2]["loss_mask"] = rows[2]["loss_mask"][:-1]  # the reader refuses it; the audit counts it
    torch.save({"rollout_id": 3, "samples": rows}, tmp_path / "rollout_3.pt")
    command = ["audit-samples", str(tmp_path / "rollout_3.pt"), "--tokenizer", "qwen3", "--json"]
    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "run")])
    report = json.loads(result.stdout)
    assert report["run"]["samples"] == len(rows) - 1 and set(report["steps"]) == {"3"}
    assert report["quarantined_samples"] == 1
    assert result.exit_code == (0 if report["ok"] else 1)
    quarantine = pq.read_table(tmp_path / "run" / "quarantine.parquet").to_pylist()
    assert [row["detail"].split(":")[0] for row in quarantine] == ["rollout_3.pt#samples[2]"]


def test_usage_errors_stop_before_any_work(tree_run, tmp_path):
    from trace_tools.errors import UnknownName, UnusableInput, UsageError

    samples = trainer_samples(tree_run)[:2]
    with pytest.raises(UnknownName, match="strategy"):
        audit_samples(samples, calls=SAMPLE, strategy="tre", **FAMILY)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        audit_samples(samples, out=tmp_path / "file", **FAMILY)
    audit_samples(samples, out=tmp_path / "run", **FAMILY)
    with pytest.raises(UsageError, match="--overwrite"):
        audit_samples(samples, out=tmp_path / "run", **FAMILY)
    with pytest.raises(UnusableInput, match="no samples"):
        audit_samples([], **FAMILY)


def test_numpy_lengths_and_boolean_masks_are_samples(tree_run):
    import numpy as np

    sample = trainer_samples(tree_run)[0]
    sample.response_length = np.int64(sample.response_length)
    sample.loss_mask = [bool(v) for v in sample.loss_mask]
    report = audit_samples([sample], **FAMILY).to_json()
    assert report["quarantined_samples"] == 0 and report["run"]["trained_tokens"] == int(np.sum(sample.loss_mask))


def test_a_trained_empty_reasoning_block_is_caught():
    from trace_tools.render.renderer import Renderer

    renderer = Renderer.from_spec("qwen3", "qwen3")
    prompt = renderer.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    stop = renderer.stop_token_ids

    def sample(source: str, output: str, trained_from: int = 0) -> TrainerSample:
        response = renderer.encode(output) + [stop[-1]]
        mask = [0] * trained_from + [1] * (len(response) - trained_from)
        return TrainerSample(source, [*prompt, *response], len(response), mask, session_id=source)

    empty = renderer.encode("<think>\n\n</think>\n\n")
    samples = [
        sample("inserted-trained", "<think>\n\n</think>\n\nHello"),
        sample("inserted-masked", "<think>\n\n</think>\n\nHello", trained_from=len(empty)),
        sample("reasoned", "<think>\nsay hello\n</think>\n\nHello"),
    ]
    rules = audit_samples(samples, **FAMILY).to_json()["rules"]
    assert rules["empty_reasoning_untrained"] == {
        "checked": 2,
        "violations": 1,
        "what": rules["empty_reasoning_untrained"]["what"],
        "examples": [f"inserted-trained: turn at {len(prompt)}"],
    }
    assert rules["stop_token_trained_once"]["violations"] == 0 and rules["spans_parse"]["checked"] == 3


def test_samples_without_session_ids_say_why_they_match_nothing(tree_run):
    samples = [dataclasses.replace(s, session_id=None) for s in trainer_samples(tree_run)]
    comparison = audit_samples(samples, calls=SAMPLE, **FAMILY).to_json()["comparison"]
    assert not comparison["equal"] and comparison["equal_samples"] == 0
    assert "matched by session id" in comparison["first_difference"]["text"]


@pytest.mark.parametrize("family", ["qwen3.5", "glm4.5", "deepseek-v3", "gpt-oss", "llama3.1"])
def test_every_family_reads_its_own_tree_samples(family, tmp_path):
    """The family's turn openers, stop tokens and parser, read off its renderer: tree's samples of a
    simulated dump break no rule, and the tools are replay's."""
    from trace_tools.api import replay
    from trace_tools.simulate import simulate

    dump = tmp_path / "dump.parquet"
    simulate(4, seed=3, template=family, out=str(dump))
    replay(dump, out=tmp_path / "run", strategies=["tree"])
    tree = json.loads((tmp_path / "run" / "summary.json").read_text())["strategies"]["tree"]
    report = audit_samples(trainer_samples(tmp_path / "run"), calls=dump).to_json()
    assert report["comparison"]["equal"]
    assert report["run"]["trained_tokens_by_tool"] == {
        tool: v["trained_tokens"] for tool, v in tree["tool_turns"].items() if v["trained_tokens"]
    }
    broken = {name: rule["examples"] for name, rule in report["rules"].items() if rule["violations"]}
    assert broken == {} and report["rules"]["stop_token_trained_once"]["checked"] > 0
