"""`export-metrics`: a run's per-step series, written for TensorBoard, W&B (offline) and as JSON
lines, each read back with the tracker's own reader and compared with the summary it came from."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from step_runs import STEP_GAP, stepped_run
from trace_tools.cli.main import app
from trace_tools.errors import UnknownName
from trace_tools.report.trackers import FRAMEWORK_NAMES, export_metrics, step_metrics

runner = CliRunner()


@pytest.fixture(scope="module")
def run(sample_run) -> Path:
    return sample_run.run_dir


@pytest.fixture(scope="module")
def stepped(tmp_path_factory) -> Path:
    return stepped_run(tmp_path_factory.mktemp("stepped") / "run")


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _invoke(*argv) -> object:
    result = runner.invoke(app, ["export-metrics", *map(str, argv)])
    assert "Traceback" not in result.output
    return result


# ---- the series ----


def test_each_step_is_a_point_of_every_strategy_metric(stepped):
    summary = _summary(stepped)
    series = step_metrics(summary)
    assert [step for step, _ in series] == [STEP_GAP * i for i in range(len(summary["by_step"]))]
    for (step, values), block in zip(series, summary["by_step"]):
        assert values["trace_tools/sessions_replayed"] == block["sessions_replayed"]
        for name, s in block["strategies"].items():
            at = f"trace_tools/{name}/"
            assert values[at + "coverage"] == s["coverage"]
            assert values[at + "samples_per_session"] == pytest.approx(s["samples"] / s["sessions"])
            assert values[at + "forks/max"] == s["forks"]["max"]
            assert values[at + "forwarded_tokens"] == s["forwarded_tokens"]
            for tool, coverage in s["coverage_by_tool"].items():
                assert values[f"{at}coverage_by_tool/{tool}"] == coverage
            for counter, count in s["counters"].items():
                assert values[f"{at}counters/{counter}"] == count
            for cause, cell in block["drift_causes"].get(name, {}).items():
                assert values[f"{at}drift_causes/{cause}/tokens_lost"] == cell["tokens_lost"]
            saving = block["token_savings"].get(name)
            assert (at + "token_savings/savings" in values) == (saving is not None)
            assert not any(key.endswith(("/vs", "/headline", "/saves_by_training_less")) for key in values)


def test_the_steps_partition_the_run(stepped):
    """Trained tokens summed over the step points equal the whole run's (no session counted twice or lost)."""
    summary = _summary(stepped)
    series = step_metrics(summary)
    for name, s in summary["strategies"].items():
        assert sum(values[f"trace_tools/{name}/trained_tokens"] for _, values in series) == s["trained_tokens"]


def test_a_run_without_steps_is_one_point_at_step_0(run):
    summary = _summary(run)
    assert "by_step" not in summary
    [(step, values)] = step_metrics(summary)
    assert step == 0
    assert values["trace_tools/tree/coverage"] == summary["strategies"]["tree"]["coverage"]
    assert values["trace_tools/turns_replayed"] == summary["turns_replayed"]


def test_mismatch_metrics_also_carry_verl_and_slime_names():
    mismatch = {
        "k3_kl": 0.02,
        "k1_kl": -0.01,
        "log_ppl_abs_diff": 0.3,
        "chi2_token": 0.5,
        "max_abs_diff": 4.0,
        "mean_abs_diff": 0.07,
        "undefined": float("nan"),
        "by_tool": {"Edit": {"k3_kl": 0.2}},
    }
    summary = {"strategies": {"tree": {"sessions": 2, "samples": 3, "mismatch": mismatch}}}
    [(_, values)] = step_metrics(summary)
    assert values["trace_tools/tree/rollout_corr/k3_kl"] == values["trace_tools/tree/train/mismatch_k3_kl"] == 0.02
    assert values["trace_tools/tree/rollout_corr/kl"] == values["trace_tools/tree/train/mismatch_kl"] == -0.01
    assert values["trace_tools/tree/rollout_corr/chi2_token"] == 0.5
    assert values["trace_tools/tree/train/train_rollout_logprob_abs_diff"] == 0.07
    assert values["trace_tools/tree/mismatch/max_abs_diff"] == 4.0
    assert values["trace_tools/tree/mismatch/by_tool/Edit/k3_kl"] == 0.2
    assert not any("undefined" in key for key in values)  # NaN is no point on a curve
    assert not any(verl is None and slime is None for verl, slime in FRAMEWORK_NAMES.values())
    assert not any(key.startswith(("rollout_corr/", "train/")) for key in values)
    [(_, trained)] = step_metrics(summary, trained_with="tree")
    assert trained["rollout_corr/k3_kl"] == trained["train/mismatch_k3_kl"] == 0.02
    assert set(trained) - set(values) == {
        name for pair in FRAMEWORK_NAMES.values() for name in pair if name and f"trace_tools/tree/{name}" in values
    }
    with pytest.raises(UnknownName, match="did you mean 'tree'"):
        step_metrics(summary, trained_with="tre")


# ---- the files, read back by each tracker's own reader ----


def test_jsonl_holds_one_object_per_step(stepped, tmp_path):
    out = tmp_path / "metrics.jsonl"
    result = _invoke(stepped, "--to", "jsonl", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = step_metrics(_summary(stepped))
    assert [row.pop("step") for row in rows] == report["steps"] == [step for step, _ in expected]
    assert rows == [values for _, values in expected]
    assert report["series"] == len({key for row in rows for key in row})
    again = _invoke(stepped, "--to", "jsonl", "--out", out)
    assert again.exit_code == 2 and "--overwrite" in again.output


@pytest.mark.trackers
def test_tensorboard_reads_back_the_same_values(stepped, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    result = _invoke(stepped, "--to", "tensorboard", "--out", tmp_path / "tb", "--name", "nightly")
    assert result.exit_code == 0, result.output
    accumulator = EventAccumulator(str(tmp_path / "tb" / "nightly"), size_guidance={SCALARS: 0})
    accumulator.Reload()
    expected = _by_series(step_metrics(_summary(stepped)))
    assert sorted(accumulator.Tags()["scalars"]) == sorted(expected)
    for tag, points in expected.items():
        read = [(event.step, event.value) for event in accumulator.Scalars(tag)]
        assert [step for step, _ in read] == [step for step, _ in points], tag
        assert [value for _, value in read] == pytest.approx([value for _, value in points], rel=1e-6), tag
    again = _invoke(stepped, "--to", "tensorboard", "--out", tmp_path / "tb", "--name", "nightly")
    assert again.exit_code == 2 and "--overwrite" in again.output


@pytest.mark.trackers
def test_wandb_offline_run_history_holds_the_same_values(stepped, tmp_path, monkeypatch):
    # Any attempt to reach a server would go to a closed local port and be logged: there must be none.
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(proxy, "http://127.0.0.1:9")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    report = export_metrics(stepped, "wandb", tmp_path, name="nightly", project="tt-test")
    assert report.out.parent == tmp_path / "wandb" and report.out.name.startswith("offline-run-")
    assert "WANDB_MODE" not in os.environ  # the offline switches are set for the export only
    [log] = report.out.glob("run-*.wandb")
    assert log.stat().st_size > WANDB_BLOCK  # records span blocks: the reader below handles their seams
    records = list(_wandb_records(log))
    kinds = [record.WhichOneof("record_type") for record in records]
    assert kinds.count("run") == kinds.count("exit") == 1
    history = [_history_row(record) for record in records if record.WhichOneof("record_type") == "history"]
    expected = step_metrics(_summary(stepped))
    assert [row.pop("_step") for row in history] == [step for step, _ in expected]
    for row, (_, values) in zip(history, expected):
        assert {key: row[key] for key in values} == pytest.approx(values)
    [run_record] = [record.run for record in records if record.WhichOneof("record_type") == "run"]
    assert run_record.display_name == "nightly" and run_record.project == "tt-test"
    logs = " ".join(path.read_text(errors="replace") for path in report.out.parent.rglob("*.log"))
    assert "127.0.0.1:9" not in logs


@pytest.mark.trackers
def test_a_wandb_run_the_caller_has_open_stays_open(stepped, tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    training = wandb.init(project="training", dir=str(tmp_path / "training"))
    try:
        export_metrics(stepped, "wandb", tmp_path / "export", name="beside")
        training.log({"loss": 0.5}, step=3)  # still open: an ended run refuses to log
    finally:
        training.finish()
        wandb.teardown()  # finish() returns before wandb's service has written the last records
    [log] = (tmp_path / "training" / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [_history_row(r) for r in _wandb_records(log) if r.WhichOneof("record_type") == "history"]
    assert rows == [{"_step": 3, "loss": 0.5}]


def test_a_missing_extra_is_one_line_naming_it(stepped, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    result = _invoke(stepped, "--to", "wandb", "--out", tmp_path)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[0].startswith("Error: --to wandb needs the wandb package")
    assert 'pip install ".[wandb]"' in result.output


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--to", "tensor", "--out", "x"], "did you mean 'tensorboard'"),
        (["--to", "jsonl"], "--to jsonl needs --out"),
    ],
)
def test_unusable_options_name_the_fix(stepped, argv, message):
    result = _invoke(stepped, *argv)
    assert result.exit_code == 2 and message in " ".join(result.output.split())


def test_a_directory_that_is_not_a_run_names_the_fix(tmp_path):
    result = _invoke(tmp_path, "--to", "jsonl", "--out", tmp_path / "m.jsonl")
    assert result.exit_code == 2 and "trace-tools replay" in result.output


# ---- helpers ----


def _by_series(series: list[tuple[int, dict[str, float]]]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for step, values in series:
        for name, value in values.items():
            out.setdefault(name, []).append((step, value))
    return out


WANDB_BLOCK, WANDB_HEADER = 32768, 7  # the .wandb file: a 7-byte header, then LevelDB-log records


def _wandb_records(path: Path):
    """The records of a W&B transaction log, parsed with wandb's own protobuf schema. The framing
    is LevelDB's log format (32 KiB blocks; a record's 7-byte header: checksum, length, kind:
    1 whole, 2 first, 3 middle, 4 last piece)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pieces = WANDB_HEADER, b""
    while pos + 7 <= len(data):
        room = WANDB_BLOCK - pos % WANDB_BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if room < 7 or (kind == 0 and length == 0):  # a block's zero-filled tail
            pos += room
            continue
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _history_row(record) -> dict:
    row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
    return {key: value for key, value in row.items() if key not in ("_runtime", "_timestamp")}
