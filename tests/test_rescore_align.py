"""Trainer logprobs from a trainer's own files, aligned to a run's samples by token identity
(`trace_tools.rescore.align`): placement by absolute position, and every reason a trainer sample
aligns to nothing. The end-to-end check against scoring on a model is in test_rescore_samples.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trace_tools.rescore.align import AMBIGUOUS, LENGTH_MISMATCH, NO_SAMPLE, NO_TRAINER_LOGPROBS, read_and_align
from trainer_fixtures import prime_rl_record, spec, write_prime_rl_exports, write_slime_rollout


def _run_samples() -> pd.DataFrame:
    """Four run samples: two strategies emitting [1..5] with other response regions, two others."""
    rows = [
        ("tree", [1, 2, 3, 4, 5], 2),
        ("linear", [1, 2, 3, 4, 5], 4),
        ("tree", [1, 2, 9, 9], 2),
        ("tree", [7, 7, 7], 1),
    ]
    return pd.DataFrame(
        {
            "strategy": [r[0] for r in rows],
            "token_ids": [np.asarray(r[1]) for r in rows],
            "response_length": [r[2] for r in rows],
        }
    )


def _record(tokens, trained_from, trainer):
    mask = [i >= trained_from for i in range(len(tokens))]
    return prime_rl_record(tokens, mask, trainer_logprobs=trainer)


def test_prime_rl_exports_align_by_tokens_and_name_each_refusal(tmp_path):
    records = [
        _record([1, 2, 3, 4, 5], 2, [0.0, 0.0, -0.1, -0.2, -0.3]),
        _record([1, 2, 3, 4, 5], 2, [0.0, 0.0, -0.1, -0.2, -0.3]),  # trained twice, same logprobs: aligns
        _record([1, 2, 9], 2, [0.0, 0.0, -0.4]),  # a prefix of a run sample (truncated)
        _record([5, 5, 5, 5], 1, [0.0, -0.1, -0.1, -0.1]),  # no run sample starts like it
        _record([7, 7, 7], 2, [0.0, 0.0, -0.5]),  # two trainer samples, other logprobs: ambiguous
        _record([7, 7, 7], 2, [0.0, 0.0, -0.9]),
    ]
    write_prime_rl_exports(tmp_path, 3, records)
    result = read_and_align(_run_samples(), [tmp_path / "token_exports"])
    # the trainer's response starts at token 2; each run sample takes its own response region
    np.testing.assert_allclose(result.logprobs[0], [-0.2, -0.3])
    np.testing.assert_allclose(result.logprobs[1], [np.nan, -0.1, -0.2, -0.3])
    assert np.isnan(result.logprobs[2]).all() and np.isnan(result.logprobs[3]).all()
    report = result.as_dict()
    assert (report["trainer_samples"], report["aligned"], report["not_aligned"]) == (6, 2, 4)
    assert report["by_reason"] == {LENGTH_MISMATCH: 1, NO_SAMPLE: 1, AMBIGUOUS: 2}
    assert report["run_samples_with_trainer_logprobs"] == 2
    details = {e["reason"]: e["detail"] for e in report["examples"]}
    assert details[LENGTH_MISMATCH] == "3 tokens, a run sample has 4 with the same start"
    assert details[NO_SAMPLE] == "the nearest run sample first differs at token 0 of 4"
    assert details[AMBIGUOUS] == "2 trainer samples have these tokens, with other logprobs"


def test_a_rollout_file_without_train_data_has_no_trainer_logprobs(tmp_path):
    write_slime_rollout(tmp_path / "rollout_data" / "1.pt", 1, [spec([1, 2, 3, 4, 5], 2)])
    result = read_and_align(_run_samples(), [tmp_path])
    assert result.as_dict()["by_reason"] == {NO_TRAINER_LOGPROBS: 1} and result.aligned == 0
    assert all(np.isnan(v).all() for v in result.logprobs)


def test_an_unreadable_path_is_one_clear_error(tmp_path):
    from trace_tools.errors import UnusableInput

    with pytest.raises(UnusableInput, match="no such file or directory"):
        read_and_align(_run_samples(), [tmp_path / "missing"])
