"""`rescore --samples` end to end on CPU: a dump simulated with tiny-qwen3's own logprobs, replayed,
its samples scored on the same model. Where a strategy trains a turn in the context the model was
served, the mismatch is float32 noise; where the context differs, it is not -- and the simulator's
ground truth (behaviours, rewritten echoes in each turn's metadata) agrees with the attribution."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from trace_tools.errors import TraceToolsError
from trace_tools.io.rundir import MISMATCH_METRICS, MISMATCH_TABLES
from trace_tools.io.write import write_parquet_atomic
from trace_tools.rescore import fill_logprobs, load_model
from trace_tools.rescore.mismatch import HEADLINE_KEYS
from trace_tools.rescore.samples import NOT_ALIGNED, load_samples, rescore_samples, score_samples
from trainer_fixtures import spec, write_slime_train

NOISE = 1e-4  # float32 teacher forcing, same model, same context: observed ≤ 2e-6 (docs/rescore.md)
BEHAVIOURS = ["byte-exact", "json-reserialize", "reasoning-dropped", "history-edit"]
STRATEGIES = ["tree", "checkpoint-tree", "linear", "session-v1"]
KEEP_SERVED_IDS = ["tree", "checkpoint-tree", "linear"]  # strategies that train in served ids where they can


@pytest.fixture(scope="module")
def tiny():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("tiny-qwen3", device="cpu")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def scored(tiny, tmp_path_factory):
    from trace_tools.api import replay
    from trace_tools.simulate import simulate

    root = tmp_path_factory.mktemp("mismatch")
    dump = root / "sim.parquet"
    # `simulate --logprobs-model tiny-qwen3`, with the CPU float32 model the samples are scored on
    # (on a GPU machine the option would fill in bf16, whose rounding is not the noise tested here).
    table = fill_logprobs(simulate(sessions=4, seed=7, template="qwen3", behaviours=BEHAVIOURS, max_turns=4), tiny)
    write_parquet_atomic(_with_steps(table), dump)
    replay(dump, out=root / "run", strategies=STRATEGIES, workers=1)
    result = rescore_samples(root / "run", tiny)
    return dump, root / "run", result


def _with_steps(table):
    """Two rollout steps: the first two sessions at step 0, the others at step 1."""
    order = sorted(set(table.column("session_id").to_pylist()))
    steps = [order.index(s) // 2 for s in table.column("session_id").to_pylist()]
    at = table.schema.get_field_index("step")
    return table.set_column(at, table.schema.field(at), pa.array(steps, type=table.schema.field(at).type))


def _truth(dump) -> pd.DataFrame:
    """The simulator's ground truth per turn: its session's behaviours and whether its served prompt
    carries an echo the harness rewrote (or a template rewrite)."""
    rows = pd.read_parquet(dump, columns=["session_id", "turn_index", "metadata"])
    meta = rows["metadata"].map(json.loads)
    return rows.assign(
        behaviour=meta.map(lambda m: "+".join(m["behaviours"])),
        drifted_prompt=meta.map(lambda m: bool(m.get("rewritten_echoes")) or bool(m.get("template_rewrite"))),
    ).set_index(["session_id", "turn_index"])


def _segments(tokens: pd.DataFrame) -> pd.DataFrame:
    """One row per turn inside a sample: served or not, its largest |Δ|."""
    keys = ["strategy", "session_id", "sample_index", "turn_index"]
    return (
        tokens.groupby(keys)
        .agg(served=("context_served", "first"), max_abs=("delta", lambda d: float(np.abs(d).max())))
        .reset_index()
    )


def test_tokens_trained_in_the_served_context_match_at_numeric_noise(scored):
    _, _, result = scored
    tokens = result.tokens
    assert set(tokens["strategy"]) == set(STRATEGIES) and tokens["compared"].all()
    served = tokens[tokens["context_served"] == True]  # noqa: E712 (None: not checkable)
    assert len(served) > 0.5 * len(tokens)
    assert float(served["delta"].abs().max()) < NOISE


def test_the_mismatch_is_in_exactly_the_tokens_of_other_contexts(scored):
    _, _, result = scored
    segments = _segments(result.tokens)
    assert segments["served"].notna().all()  # the simulated dump records prompt ids: every turn is checked
    other = segments[segments["served"] == False]  # noqa: E712
    assert set(other["strategy"]) >= {"session-v1", "checkpoint-tree"}
    assert (other["max_abs"] > 1e-3).all(), other  # each one moved by far more than the noise
    assert (segments.loc[segments["served"] == True, "max_abs"] < NOISE).all()  # noqa: E712


def test_checkpoint_tree_on_byte_exact_sessions_is_noise(scored):
    dump, _, result = scored
    truth = _truth(dump)
    tokens = result.tokens[result.tokens["strategy"] == "checkpoint-tree"]
    behaviour = [truth.loc[(s, t), "behaviour"] for s, t in zip(tokens["session_id"], tokens["turn_index"])]
    exact = tokens[np.array(behaviour) == "byte-exact"]
    assert len(exact) and exact["context_served"].all() and float(exact["delta"].abs().max()) < NOISE
    by_behaviour = result.strategies["checkpoint-tree"]["by_behaviour"]
    assert by_behaviour["byte-exact"]["max_abs_diff"] < NOISE
    assert max(m["max_abs_diff"] for m in by_behaviour.values()) > 1e-3  # a drifting behaviour shows


def test_attribution_agrees_with_the_simulators_ground_truth(scored):
    dump, _, result = scored
    truth = _truth(dump)
    tokens = result.tokens
    keys = list(zip(tokens["session_id"], tokens["turn_index"]))
    assert tokens["behaviour"].tolist() == [truth.loc[k, "behaviour"] for k in keys]
    # A strategy that keeps the served ids leaves a turn's context only where the simulator
    # rewrote an echo in that turn's served prompt.
    keep = tokens[tokens["strategy"].isin(KEEP_SERVED_IDS) & (tokens["context_served"] == False)]  # noqa: E712
    assert len(keep) and all(truth.loc[k, "drifted_prompt"] for k in zip(keep["session_id"], keep["turn_index"]))
    assert set(keep["context_origin"]) <= {"restored_echo", "healed_splice", "realigned", "unreported"}
    assert (keep["cause"] != "none").all()  # a drift cause is named for every one of them
    session_v1 = tokens[tokens["strategy"] == "session-v1"]
    assert set(session_v1["context_origin"]) & {"re-rendered", "rolled_back"}


def test_summary_json_and_tables_carry_every_metric(scored):
    _, run, result = scored
    summary = json.loads((run / "summary.json").read_text())
    for name in STRATEGIES:
        block = summary["strategies"][name]["mismatch"]
        assert block == json.loads(json.dumps(result.strategies[name]))
        assert {"k1_kl", "k3_kl", "log_ppl_abs_diff", "max_abs_diff", "chi2_seq", "ppl_ratio"} <= set(block)
        assert set(block["by_behaviour"]) == set(BEHAVIOURS)
        assert {"by_tool", "by_drift_cause", "by_context", "corrections"} <= set(block)
        for mode in ("token_tis", "seq_tis", "token_mis", "seq_mis", "icepop", "k3_rs"):
            for group in ("by_tool", "by_drift_cause"):
                assert set(block["corrections"][mode][group]) == set(block[group])
    assert summary["mismatch"]["model"]["model"] == "tiny-qwen3"
    assert summary["mismatch"]["throughput"]["prefix_sharing_saving"] > 0.3
    for name in MISMATCH_TABLES:
        assert len(pd.read_parquet(run / name)) > 0
    turns = pd.read_parquet(run / "mismatch_turns.parquet")
    assert len(turns) == len(_segments(result.tokens))


def test_the_per_step_curve_where_the_dump_has_steps(scored):
    _, _, result = scored
    for name in STRATEGIES:
        entry = result.strategies[name]
        assert set(entry["by_step"]) == {"0", "1"}
        assert sum(m["tokens"] for m in entry["by_step"].values()) == entry["tokens"]
    tree = result.tokens[result.tokens["strategy"] == "tree"]
    first = tree[tree["step"] == 0]
    assert result.strategies["tree"]["by_step"]["0"]["tokens"] == len(first) > 0


def test_trainer_logprobs_given_instead_of_scored(scored, tmp_path):
    """The entry point for a trainer's own logprobs: arrays over each sample's response region."""
    _, run, result = scored
    samples = load_samples(run)
    given = [np.asarray(r.logprobs, dtype=np.float64) for r in samples.itertuples()]  # = the rollout's
    same = rescore_samples(run, trainer_logprobs=given, write=False)
    assert all(same.strategies[n]["max_abs_diff"] == 0 for n in STRATEGIES)
    shifted = [v.copy() for v in given]
    first = int(np.flatnonzero(np.asarray(samples.loc[0, "loss_mask"]) == 1)[0])
    shifted[0][first] -= 0.5
    moved = rescore_samples(run, trainer_logprobs=shifted, write=False)
    assert moved.strategies[samples.loc[0, "strategy"]]["max_abs_diff"] == pytest.approx(0.5)
    with pytest.raises(TraceToolsError, match="align them to the sample first"):
        rescore_samples(run, trainer_logprobs=[v[:-1] for v in given], write=False)


def test_trainer_logprobs_from_a_slime_train_file_give_the_same_metrics(scored, tiny, tmp_path):
    _, run, result = scored
    samples = load_samples(run)
    # what a trainer computes: every response token's logprob on the same model, in the sample's context
    everything = samples.assign(loss_mask=[np.ones(int(n), dtype=np.int8) for n in samples["response_length"]])
    values, _ = score_samples(tiny, everything)
    sequences: dict[tuple[int, ...], tuple] = {}  # strategies that emit the same sequence train it once
    for row, logprobs in zip(samples.itertuples(), values):
        sequences.setdefault(tuple(int(i) for i in row.token_ids), (row, logprobs))
    specs = [
        spec(list(ids), int(row.response_length), loss_mask=[int(m) for m in row.loss_mask], index=i)
        for i, (ids, (row, _)) in enumerate(sequences.items())
    ]
    write_slime_train(tmp_path / "train_data" / "3.pt", 3, specs, [list(v) for _, v in sequences.values()])
    # a sample no run sample has (its last token changed) is counted, not aligned
    other = spec([*specs[0]["tokens"][:-1], specs[0]["tokens"][-1] + 1], specs[0]["response_length"], index=99)
    write_slime_train(tmp_path / "train_data" / "4.pt", 4, [other], [[-0.5] * other["response_length"]])

    aligned = rescore_samples(run, trainer_dump=[tmp_path / "train_data"], write=False)

    report = aligned.run["alignment"]
    assert (report["trainer_samples"], report["aligned"]) == (len(sequences) + 1, len(sequences))
    assert report["by_reason"] == {"no_sample_with_these_tokens": 1}
    assert report["run_samples_with_trainer_logprobs"] == len(samples)
    for name, entry in result.strategies.items():
        assert aligned.strategies[name]["not_compared"]["tokens"] == 0
        for key in MISMATCH_METRICS:
            assert aligned.strategies[name][key] == pytest.approx(entry[key], abs=1e-4), (name, key)
    partial = rescore_samples(run, trainer_dump=[tmp_path / "train_data" / "4.pt"], write=False)
    assert all(e["not_compared"]["by_reason"].keys() == {NOT_ALIGNED} for e in partial.strategies.values())

    from trace_tools.cli.main import app

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    args = ["rescore", str(copy), "--samples", "--trainer-logprobs", str(tmp_path / "train_data")]
    cli = CliRunner().invoke(app, args)
    assert cli.exit_code == 0, cli.output
    assert f"{len(sequences)} of {len(sequences) + 1} trainer samples aligned" in " ".join(cli.output.split())
    written = json.loads((copy / "summary.json").read_text())
    assert written["strategies"]["tree"]["mismatch"]["k3_kl"] == pytest.approx(
        result.strategies["tree"]["k3_kl"], abs=1e-4
    )
    neither = CliRunner().invoke(app, ["rescore", str(copy), "--samples"])
    assert neither.exit_code == 2 and "--samples takes one of --model M" in neither.output


def test_cli_json_prints_the_headline_per_strategy_and_behaviour(scored):
    from trace_tools.cli.main import app

    _, run, _ = scored
    out = CliRunner().invoke(
        app, ["rescore", str(run), "--samples", "-s", "tree", "--model", "tiny-qwen3", "--device", "cpu", "--json"]
    )
    assert out.exit_code == 0, out.output
    printed = json.loads(out.stdout)
    assert list(printed) == ["tree"]
    assert set(printed["tree"]) == {*HEADLINE_KEYS, "by_behaviour"}
    assert set(printed["tree"]["by_behaviour"]) == set(BEHAVIOURS)
    assert printed["tree"]["max_abs_diff"] < NOISE


def test_cli_refuses_an_unknown_strategy_and_a_missing_out(scored):
    from trace_tools.cli.main import app

    dump, run, _ = scored
    unknown = CliRunner().invoke(app, ["rescore", str(run), "--samples", "-s", "nope", "--model", "tiny-qwen3"])
    assert unknown.exit_code == 2 and "unknown strategy 'nope'" in unknown.output
    both = CliRunner().invoke(app, ["rescore", str(run), "--samples", "--model", "tiny-qwen3", "--out", str(run)])
    assert both.exit_code == 2 and "drop --out" in both.output
    no_out = CliRunner().invoke(app, ["rescore", str(dump), "--model", "tiny-qwen3"])
    assert no_out.exit_code == 2 and "--out" in no_out.output


def test_a_real_dump_has_no_behaviour_breakdown(tmp_path):
    """The bundled sample has no simulator ground truth: no `by_behaviour`, in summary.json or --json."""
    from trace_tools.api import replay

    dump, run = tmp_path / "real.parquet", tmp_path / "run"
    table = pq.read_table("sample_traces/qwen3.parquet")
    at = table.schema.get_field_index("metadata")
    write_parquet_atomic(table.set_column(at, table.schema.field(at), pa.nulls(len(table), pa.string())), dump)
    replay(dump, out=run, strategies=["tree"], workers=1)
    samples = load_samples(run)
    given = [np.asarray(r.logprobs, dtype=np.float64) for r in samples.itertuples()]
    result = rescore_samples(run, trainer_logprobs=given)
    assert "by_behaviour" not in result.strategies["tree"] and "by_behaviour" not in result.headlines()["tree"]
    assert result.strategies["tree"]["tokens"] > 0 and result.strategies["tree"]["max_abs_diff"] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategies"]["tree"]["mismatch"]["k3_kl"] == 0
    assert summary["mismatch"]["model"] == {"model": "trainer logprobs (given)"}


def test_gate_bounds_the_mismatch_by_its_summary_names(scored, tmp_path):
    from trace_tools.report import gate as gates
    from trace_tools.rescore.corrections import MODES

    _, run, result = scored
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rule]]\nmetric = "mismatch.by_context.served.max_abs_diff"\nstrategy = "checkpoint-tree"\n'
        'op = "<="\nvalue = 1e-4\n\n'
        '[[rule]]\nmetric = "mismatch.k3_kl"\nstrategy = "session-v1"\nop = "<="\nvalue = 1e-6\n\n'
        f'[[rule]]\nmetric = "mismatch.corrections.{MODES[-1]}.masked_fraction"\nop = "<="\nvalue = 1.0\n'
    )
    results = gates.gate(run, rules)
    passed = {(r.rule.metric, r.strategy): r.passed for r in results}
    assert passed[("mismatch.by_context.served.max_abs_diff", "checkpoint-tree")]
    assert not passed[("mismatch.k3_kl", "session-v1")]  # re-rendered contexts: far above 1e-6
    assert all(passed[(f"mismatch.corrections.{MODES[-1]}.masked_fraction", name)] for name in STRATEGIES)
    assert result.strategies["session-v1"]["k3_kl"] > 1e-6
