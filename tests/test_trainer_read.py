"""`trainer.read_samples` on dumps in each upstream shape (tests/trainer_fixtures.py), sound and hostile."""

from __future__ import annotations

import math
import sys

import pytest
import torch  # noqa: F401 - the .pt readers (the test extra has it)
import typer

from trace_tools.errors import UnknownName, UnusableInput
from trace_tools.trainer.pt_files import TorchMissing
from trace_tools.trainer.read import ReadReport, read_samples
from trainer_fixtures import (
    as_tensors,
    prime_rl_record,
    spec,
    write_miles_dump,
    write_miles_train,
    write_pickled_class_pt,
    write_prime_rl_exports,
    write_slime_rollout,
    write_slime_train,
)


def _read(*paths, **options):
    report = ReadReport()
    samples = list(read_samples(list(paths), report=report, **options))
    return samples, report


def _two_samples():
    return [
        spec([10, 11, 12, 13, 14], 3, index=40, group_index=5, rollout_id=40, loss_mask=[1, 0, 1], reward=0.5),
        spec([10, 11, 20, 21], 2, index=41, group_index=5, session_id="run-b", rollout_log_probs=None),
    ]


# -- slime / miles .pt ------------------------------------------------------------------------------


def test_slime_rollout_joined_to_train_logprobs(tmp_path):
    samples = _two_samples()
    write_slime_rollout(tmp_path / "dump" / "rollout_data" / "7.pt", 7, samples)
    write_slime_train(tmp_path / "dump" / "train_data" / "7.pt", 7, samples, [[-0.25, -0.5, -1.0], [-2.0, -0.125]])
    read, report = _read(tmp_path / "dump")
    assert report.to_dict() | {"examples": []} == {
        "files": 2,
        "formats": ["slime"],
        "samples": 2,
        "quarantined": 0,
        "by_reason": {},
        "examples": [],
        "notes": [],
    }
    first, second = read
    assert (first.tokens, first.response_length, first.loss_mask) == ([10, 11, 12, 13, 14], 3, [1, 0, 1])
    assert (first.step, first.group_index, first.index, first.reward, first.status) == (7, 5, 40, 0.5, "completed")
    assert first.rollout_logprobs == [-0.5, -0.5, -0.5]
    assert first.trainer_logprobs == [-0.25, -0.5, -1.0]
    assert first.prompt_length == 2 and first.source == "7.pt#samples[0]"
    # the environment rollout: Sample.rollout_id, else Sample.session_id
    assert (first.session_id, second.session_id) == ("40", "run-b")
    assert second.rollout_logprobs is None and second.trainer_logprobs == [-2.0, -0.125]


def test_tensors_and_a_null_loss_mask_are_accepted(tmp_path):
    sample = as_tensors(spec([3, 4, 5, 6], 2, loss_mask=None))
    write_slime_rollout(tmp_path / "rollout_3.pt", 3, [sample])  # --save-debug-rollout-data rollout_{id}.pt
    (read,), _ = _read(tmp_path / "rollout_3.pt")
    assert read.tokens == [3, 4, 5, 6] and read.loss_mask == [1, 1] and read.rollout_logprobs == [-0.5, -0.5]
    assert all(type(t) is int for t in read.tokens) and read.step == 3


def test_miles_dump_details_reads_pt_and_joins_rank_files(tmp_path):

    samples = _two_samples()
    write_miles_dump(tmp_path, 2, samples, log_probs=[[-0.1, -0.2, -0.3], [-0.4, -0.5]])
    (tmp_path / "policy_loss_debug").mkdir()  # miles' loss debug dumps: `samples` too, but not rollout samples
    torch.save({"rank": 0, "call": 0, "samples": [{"index": 0}]}, tmp_path / "policy_loss_debug" / "rank_0_call_0.pt")
    read, report = _read(tmp_path)
    assert report.formats == ["slime"] and report.files == 2  # the .pt files; the parquet mirrors are not read twice
    assert [s.trainer_logprobs is not None for s in read] == [True, True]
    assert read[1].trainer_logprobs == pytest.approx([-0.4, -0.5])


def test_files_of_the_users_own_naming_are_told_apart_by_content(tmp_path):
    samples = _two_samples()  # --save-debug-rollout-data rd_{rollout_id}.pt --save-debug-train-data td_{rollout_id}.pt
    write_slime_train(tmp_path / "td_9.pt", 9, samples, [[-0.75] * 3, [-0.5] * 2])
    write_slime_rollout(tmp_path / "rd_9.pt", 9, samples)
    read, report = _read(tmp_path)
    assert [s.trainer_logprobs for s in read] == [[-0.75] * 3, [-0.5] * 2] and report.notes == []


def test_context_parallel_train_slices_are_not_joined(tmp_path):
    samples = _two_samples()
    write_slime_rollout(tmp_path / "rollout_data" / "1.pt", 1, samples, miles=True)
    write_miles_train(tmp_path / "train_data" / "1_0.pt", 1, samples, [[-0.1], [-0.2]], cp_size=2)
    read, report = _read(tmp_path)
    assert [s.trainer_logprobs for s in read] == [None, None] and report.clean


def test_eval_files_and_orphan_train_files_are_noted(tmp_path):
    samples = _two_samples()
    write_slime_rollout(tmp_path / "rollout_data" / "eval_1.pt", 1, samples)
    write_slime_train(tmp_path / "train_data" / "2.pt", 2, samples, [[-0.1] * 3, [-0.1] * 2])
    read, report = _read(tmp_path)
    assert report.notes == [
        "eval_1.pt holds evaluation samples, which are not trained: passed over",
        "train data 2.pt (rollout 2) has no rollout-data file: its samples are read from the train data alone "
        "(no rollout logprobs)",
    ]
    # the train data alone still carries each sample's tokens, mask and the trainer's logprobs
    assert [(s.tokens, s.loss_mask, s.trainer_logprobs, s.rollout_logprobs) for s in read] == [
        (samples[0]["tokens"], [1, 0, 1], pytest.approx([-0.1] * 3), None),
        (samples[1]["tokens"], [1, 1], pytest.approx([-0.1] * 2), None),
    ]
    assert [(s.step, s.index, s.source) for s in read] == [(2, 40, "2.pt#samples[0]"), (2, 41, "2.pt#samples[1]")]


def test_a_miles_train_file_alone_is_read_by_rank_columns(tmp_path):
    samples = _two_samples()
    write_miles_train(tmp_path / "train_data" / "5_0.pt", 5, samples, [[-0.2] * 3, [-0.4] * 2])
    read, report = _read(tmp_path)
    assert [(s.tokens, s.loss_mask, s.index, s.step) for s in read] == [
        (samples[0]["tokens"], [1, 0, 1], 40, 5),
        (samples[1]["tokens"], [1, 1], 41, 5),
    ]
    assert [s.trainer_logprobs for s in read] == [pytest.approx([-0.2] * 3), pytest.approx([-0.4] * 2)]
    assert report.clean and len(report.notes) == 1


def test_train_data_with_other_tokens_is_quarantined(tmp_path):
    samples = _two_samples()
    write_slime_rollout(tmp_path / "rollout_data" / "4.pt", 4, samples)
    other = [dict(samples[0], tokens=[1, 2, 3, 4, 5]), samples[1]]
    write_slime_train(tmp_path / "train_data" / "4.pt", 4, other, [[-0.1] * 3, [-0.1] * 2])
    read, report = _read(tmp_path)
    assert [s.index for s in read] == [41]
    assert report.by_reason == {"train_mismatch": 1} and report.examples[0].source == "4.pt#samples[0]"


HOSTILE = [
    ("tokens as strings", dict(tokens=["a", "b", "c"]), "wrong_type", "tokens[0] is 'a' (str), not a token id"),
    ("length not an int", dict(response_length="2"), "wrong_type", "response_length is '2' (str), expected an integer"),
    ("response past the tokens", dict(response_length=9), "length_mismatch", "response_length 9 is outside"),
    (
        "mask vs response_length",
        dict(loss_mask=[1, 1, 1]),
        "length_mismatch",
        "loss_mask has 3 values for response_length 2",
    ),
    ("mask of 2s", dict(loss_mask=[1, 2]), "bad_mask", "loss_mask[1] is 2 (int), not 0 or 1"),
    ("logprobs vs response", dict(rollout_log_probs=[-0.1]), "logprobs_length", "rollout logprobs has 1 values"),
    ("NaN logprob", dict(rollout_log_probs=[-0.1, math.nan]), "bad_logprob", "rollout logprobs[1] = nan"),
    ("logprob as text", dict(rollout_log_probs=["-0.1", -0.1]), "wrong_type", "rollout logprobs[0] is '-0.1' (str)"),
    ("positive logprob", dict(rollout_log_probs=[0.5, -0.1]), "bad_logprob", "rollout logprobs[0] = 0.5"),
    ("id past the vocabulary", dict(tokens=[1, 2, 3, 700]), "out_of_vocab", "tokens[3] = 700 is outside [0, 500)"),
    ("no tokens", dict(tokens=None), "missing_field", "tokens is missing"),
    ("reward as text", dict(reward="high"), "wrong_type", "reward is a str"),
]


@pytest.mark.parametrize("change, reason, detail", [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_hostile_slime_samples_are_quarantined_with_one_line(tmp_path, change, reason, detail):
    sound = spec([1, 2, 3, 4], 2, index=1)
    write_slime_rollout(tmp_path / "rollout_0.pt", 0, [spec([5, 6, 7], 1, index=0), dict(sound, **change)])
    read, report = _read(tmp_path / "rollout_0.pt", vocab_size=500)
    assert [s.index for s in read] == [0]
    assert report.by_reason == {reason: 1}
    (entry,) = report.examples
    assert entry.source == "rollout_0.pt#samples[1]" and detail in entry.detail and "\n" not in entry.detail


def test_vocabulary_from_a_tokenizer_name(tmp_path):
    write_slime_rollout(tmp_path / "rollout_0.pt", 0, [spec([1, 2, 10**6], 1)])
    _, report = _read(tmp_path / "rollout_0.pt", tokenizer="qwen3")
    assert report.by_reason == {"out_of_vocab": 1} and "vocabulary size" in report.examples[0].detail


# -- files that are refused whole -------------------------------------------------------------------


def _exit_code(paths) -> int:
    """The exit code the CLI gives a read of `paths` (its one line goes to stderr)."""
    from trace_tools.cli.main import _guard

    try:
        _guard(lambda: list(read_samples(paths)))()
    except typer.Exit as stop:
        return stop.exit_code
    return 0


def test_a_pickled_class_is_refused_and_not_run(tmp_path, capsys):
    path = write_pickled_class_pt(tmp_path / "rollout_data" / "0.pt")
    with pytest.raises(UnusableInput) as refused:
        list(read_samples([tmp_path]))
    message = str(refused.value)
    assert "pickled Python objects (trainer_fixtures.CustomThing)" in message
    assert "weights_only=True" in message and "re-save" in message and "\n" not in message
    assert _exit_code([path]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_missing_torch_names_the_install(tmp_path, monkeypatch):
    write_slime_rollout(tmp_path / "rollout_0.pt", 0, [spec([1, 2], 1)])
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(TorchMissing, match=r"needs torch: pip install torch") as missing:
        list(read_samples([tmp_path / "rollout_0.pt"]))
    assert missing.value.exit_code == 2


def test_a_file_over_the_pickle_bound_is_refused_before_loading(tmp_path):
    write_slime_rollout(tmp_path / "rollout_0.pt", 0, [spec(list(range(5000)), 100)])
    with pytest.raises(UnusableInput, match=r"over the 0 MiB one file may hold .* split the dump"):
        list(read_samples([tmp_path / "rollout_0.pt"], max_pickle_bytes=1000))


def test_not_a_rollout_dump_and_a_truncated_file(tmp_path):

    torch.save({"weights": torch.zeros(2)}, tmp_path / "rollout_1.pt")
    with pytest.raises(UnusableInput, match=r"not a slime/miles rollout dump"):
        list(read_samples([tmp_path / "rollout_1.pt"]))
    (tmp_path / "rollout_2.pt").write_bytes((tmp_path / "rollout_1.pt").read_bytes()[:50])
    with pytest.raises(UnusableInput, match=r"rollout_2.pt is not a readable torch file"):
        list(read_samples([tmp_path / "rollout_2.pt"]))


def test_paths_and_format_are_checked_before_reading(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnusableInput, match=r"no sample dump under .*empty: expected rollout_data/\*.pt"):
        read_samples([tmp_path / "empty"])
    with pytest.raises(UnusableInput, match=r"no such file or directory"):
        read_samples([tmp_path / "nowhere"])
    with pytest.raises(UnknownName, match=r"did you mean 'prime-rl'"):
        read_samples([tmp_path], fmt="prime_rl")
    write_miles_dump(tmp_path / "m", 0, [spec([1, 2], 1)], with_pt=False)
    with pytest.raises(UnusableInput, match=r"holds no token ids; pass the --dump-details folder"):
        read_samples([tmp_path / "m" / "trajectory" / "0.jsonl"])


# -- miles dashboard mirrors ------------------------------------------------------------------------


def test_miles_dashboard_columns_joined_to_trajectory(tmp_path):
    write_miles_dump(tmp_path, 5, _two_samples()[:1] + [spec([7, 8, 9], 1, index=41, reward=0.0)], with_pt=False)
    read, report = _read(tmp_path)
    assert report.formats == ["miles-dashboard"] and report.clean
    first, second = read
    assert (first.tokens, first.loss_mask, first.step, first.index, first.group_index) == (
        [10, 11, 12, 13, 14],
        [1, 0, 1],
        5,
        40,
        5,
    )
    assert first.rollout_logprobs == [-0.5] * 3 and (first.reward, second.reward) == (0.5, 0.0)
    assert first.metadata["messages"][1] == {"role": "assistant", "content": "done"}


def test_miles_dashboard_without_trajectory_and_with_nan(tmp_path):
    samples = [spec([1, 2, 3], 2, index=0), spec([1, 2, 3], 2, index=1, rollout_log_probs=[-0.1, math.nan])]
    write_miles_dump(tmp_path, 0, samples, with_pt=False, messages=False)
    read, report = _read(tmp_path / "dashboard_columns" / "rollout_0.parquet")
    assert [(s.index, s.group_index, s.reward) for s in read] == [(0, None, None)]
    assert report.by_reason == {"bad_logprob": 1}


# -- prime-rl token exports -------------------------------------------------------------------------


def test_prime_rl_exports_cut_at_the_first_trained_token(tmp_path):
    record = prime_rl_record([5, 6, 7, 8, 9, 10], [False, False, True, True, False, True])
    write_prime_rl_exports(tmp_path, 12, [record])
    write_prime_rl_exports(tmp_path, 13, [prime_rl_record([1, 2, 3], [False, True, True])], rank=1)
    read, report = _read(tmp_path / "token_exports")
    assert report.formats == ["prime-rl"] and report.files == 2
    first, second = read
    assert (first.tokens, first.response_length, first.loss_mask, first.step) == (
        [5, 6, 7, 8, 9, 10],
        4,
        [1, 1, 0, 1],
        12,
    )
    assert first.rollout_logprobs == [-0.25, -0.25, 0.0, -0.25]
    assert first.trainer_logprobs == [-0.3, -0.3, -1.0, -0.3]
    assert first.columns["importance_ratio"] == [1.0] * 4 and first.columns["is_masked"] == [False] * 4
    assert "rl_weights" not in first.columns  # all null: prime-rl's default weights
    assert first.session_id is None and first.metadata["env_name"] == "swe"
    assert (second.step, second.metadata["rank"]) == (13, 1)


def test_hostile_prime_rl_lines(tmp_path):
    tokens, mask = [1, 2, 3], [False, True, True]
    records = [
        prime_rl_record(tokens, mask),
        "{not json",
        prime_rl_record(tokens, mask, trainer_logprobs=[-1.0, None, -0.2]),  # the writer's null for a NaN
        prime_rl_record(tokens, [False, True]),
        prime_rl_record(["x", 2, 3], mask),
        prime_rl_record(tokens, mask, inference_logprobs=[0.0, -0.1]),
    ]
    write_prime_rl_exports(tmp_path, 0, records)
    read, report = _read(tmp_path)
    assert len(read) == 1
    assert report.by_reason == {
        "bad_json": 1,
        "bad_logprob": 1,
        "length_mismatch": 1,
        "wrong_type": 1,
        "logprobs_length": 1,
    }
    assert [e.source for e in report.examples] == [f"step_0/rank_0.jsonl:{n}" for n in (2, 3, 4, 5, 6)]
