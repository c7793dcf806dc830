"""Teacher-forced token logprobs with bounded memory: length-bucketed batches and a chunked head.

The naive recipe -- `model(ids).logits` -> float32 `log_softmax` -> `gather` -- materialises
three [L, V] tensors per sequence (V = 151,936 for Qwen): at L = 32k that is 10 GB of bf16
logits plus 2 x 20 GB of float32, for a model whose weights are 1.2 GB. Here the base model runs
once per batch and yields hidden states [B, L, H] (H = 1,024 for Qwen3-0.6B, so 64 MB at 32k);
the output head then runs over at most `chunk_positions` positions at a time, and only over the
positions whose next token is scored. Per chunk, `log_softmax(..., dtype=float32)` reads the
model-dtype logits and normalises in float32 in one fused kernel, and only the target entries are
gathered, so the vocabulary-sized working set is `chunk_positions x V x (model dtype + 4) bytes`
(4,096 x 151,936 x 6 B = 3.7 GB in bf16, 1,024 x 151,936 x 4+4 B = 1.2 GB in float32),
independent of the sequence length.

Batching: sequences are sorted by length and packed greedily into batches whose padded size
(count x longest) stays within `max_batch_tokens`; a longer sequence runs alone. Padding goes on
the right and no attention mask is passed: in a causal model a real token only attends to
earlier positions, which are all real, so padding cannot change any scored logprob, and without
a mask SDPA keeps its `is_causal` flash/memory-efficient kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from trace_tools.errors import TraceToolsError
from trace_tools.rescore import plan
from trace_tools.rescore.models import ScoringModel

DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_CHUNK_POSITIONS = 1024  # the benchmark uses 4096 on a GPU, where larger matmuls pay off
_PAD_ID = 0  # any valid id: right padding is never attended to by a real token


@dataclass
class ScoreRequest:
    """One sequence to run: `ids`, and the `positions` t (1 <= t < len(ids)) whose token ids[t] is scored."""

    ids: Sequence[int]
    positions: np.ndarray


class OutputHead:
    """The model's output layer as a function of final hidden states, logit adjustments included.

    Most causal LMs end in a plain linear layer; a few scale or soft-cap the logits in their
    forward (Cohere `logit_scale`, Granite `logits_scaling`, Gemma-2 `final_logit_softcapping`),
    which a chunked head must repeat. `check_head` catches any other kind of head.
    """

    def __init__(self, model: Any):
        self.linear = model.get_output_embeddings()
        config = model.config
        self.multiply = getattr(model, "logit_scale", None) or getattr(config, "logit_scale", None)
        self.divide = getattr(config, "logits_scaling", None)
        self.softcap = getattr(config, "final_logit_softcapping", None)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.linear(hidden)
        if self.multiply:
            logits = logits * self.multiply
        if self.divide:
            logits = logits / self.divide
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def chunked_logprobs(
    head: OutputHead,
    hidden: torch.Tensor,
    rows: torch.Tensor,
    targets: torch.Tensor,
    chunk_positions: int = DEFAULT_CHUNK_POSITIONS,
) -> torch.Tensor:
    """log p(targets[i] | hidden[rows[i]]) in float32, `chunk_positions` rows of logits at a time.

    Numerically the naive recipe (`logits.float().log_softmax(-1)`, gathered) restricted to one
    chunk: `log_softmax(dtype=float32)` upcasts inside the kernel instead of writing a float32
    copy, which is also faster than `logit - logsumexp(logits)` (several passes and temporaries).
    """
    out = torch.empty(rows.shape[0], dtype=torch.float32, device=hidden.device)
    for start in range(0, rows.shape[0], chunk_positions):
        stop = start + chunk_positions
        logits = head(hidden.index_select(0, rows[start:stop]))
        logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        del logits  # the model-dtype logits are not needed past this point
        out[start:stop] = logprobs.gather(1, targets[start:stop, None]).squeeze(1)
        del logprobs  # free before the next chunk allocates, so one chunk is live at a time
    return out


def length_buckets(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices grouped longest first so that each batch's `count x longest` stays within the budget."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def score_requests(
    scoring_model: ScoringModel,
    requests: Sequence[ScoreRequest],
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    chunk_positions: int = DEFAULT_CHUNK_POSITIONS,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[np.ndarray]:
    """The float64 logprobs of each request's positions, in request order.

    `on_progress(done_tokens, total_tokens)` is called after every batch.
    """
    if max_batch_tokens < 1 or chunk_positions < 1:
        raise TraceToolsError("--max-batch-tokens and the chunk size must be positive")
    head = OutputHead(scoring_model.model)
    results: list[np.ndarray] = [np.empty(0)] * len(requests)
    lengths = [len(request.ids) for request in requests]
    done, total = 0, sum(lengths)
    with torch.inference_mode():
        for batch in length_buckets(lengths, max_batch_tokens):
            values = _score_batch(scoring_model, head, [requests[i] for i in batch], chunk_positions)
            for index, value in zip(batch, values):
                results[index] = value
            done += sum(lengths[i] for i in batch)
            if on_progress is not None:
                on_progress(done, total)
    return results


@dataclass
class ScoredTurns:
    """Per turn (in input order) the recomputed logprobs of its output, or None when it was skipped."""

    recomputed: list[np.ndarray | None]
    plans: list[plan.SequencePlan]
    seconds: float

    def throughput(self, inputs: Sequence[plan.TurnInput]) -> dict[str, Any]:
        """Forwarded tokens, what prefix sharing saved against one sequence per turn, tokens/s."""
        forwarded = sum(len(p.ids) for p in self.plans)
        separately = sum(len(t.sequence) for t in inputs if t.skip_reason is None)
        return {
            "sequences": len(self.plans),
            "forwarded_tokens": forwarded,
            "turn_sequence_tokens": separately,
            "prefix_sharing_saving": (1 - forwarded / separately) if separately else 0.0,
            "seconds": self.seconds,
            "tokens_per_s": forwarded / self.seconds if self.seconds > 0 else None,
        }


def score_turns(
    scoring_model: ScoringModel,
    inputs: Sequence[plan.TurnInput],
    *,
    share_prefix: bool = True,
    max_batch_tokens: int | None = None,
    chunk_positions: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ScoredTurns:
    """Plan (with prefix sharing), score and split back per turn: the whole scoring step of rescore."""
    plans = plan.plan_sequences(inputs, share_prefix)
    started = time.perf_counter()
    scored = score_requests(
        scoring_model,
        [ScoreRequest(p.ids, p.positions()) for p in plans],
        max_batch_tokens=max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS,
        chunk_positions=chunk_positions or DEFAULT_CHUNK_POSITIONS,
        on_progress=on_progress,
    )
    return ScoredTurns(plan.read_spans(plans, scored, len(inputs)), plans, time.perf_counter() - started)


def _score_batch(
    scoring_model: ScoringModel, head: OutputHead, requests: list[ScoreRequest], chunk_positions: int
) -> list[np.ndarray]:
    device = scoring_model.device
    if not any(len(request.positions) for request in requests):
        return [np.empty(0) for _ in requests]
    ids = _right_padded(requests).to(device)
    hidden = final_hidden_states(scoring_model.model, ids)
    width = ids.shape[1]
    rows = torch.cat([torch.as_tensor(r.positions - 1 + i * width, dtype=torch.long) for i, r in enumerate(requests)])
    flat_ids = ids.reshape(-1)
    rows = rows.to(device)
    targets = flat_ids.index_select(0, rows + 1)
    values = chunked_logprobs(head, hidden.reshape(-1, hidden.shape[-1]), rows, targets, chunk_positions)
    counts = [len(request.positions) for request in requests]
    return [part.numpy().astype(np.float64) for part in values.cpu().split(counts)]


def _right_padded(requests: list[ScoreRequest]) -> torch.Tensor:
    width = max(len(request.ids) for request in requests)
    ids = torch.full((len(requests), width), _PAD_ID, dtype=torch.long)
    for row, request in enumerate(requests):
        ids[row, : len(request.ids)] = torch.as_tensor(list(request.ids), dtype=torch.long)
    return ids


def final_hidden_states(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """The base model's last hidden states [B, L, H] (after the final norm), without a KV cache."""
    base = model.base_model
    if base is model:
        raise TraceToolsError(
            f"{type(model).__name__} exposes no base model (`base_model_prefix`); "
            "rescore needs a Hugging Face *ForCausalLM model"
        )
    return base(input_ids=ids, use_cache=False).last_hidden_state


def naive_logprobs(scoring_model: ScoringModel, ids: Sequence[int]) -> np.ndarray:
    """The reference recipe: full logits, float32 log-softmax, gather; logprob of ids[t] for t = 1..L-1.

    Memory grows as L x V; use it as ground truth on short inputs and as the benchmark baseline.
    """
    tensor = torch.as_tensor([list(ids)], dtype=torch.long, device=scoring_model.device)
    with torch.inference_mode():
        logits = scoring_model.model(input_ids=tensor, use_cache=False).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        picked = logprobs.gather(1, tensor[0, 1:, None]).squeeze(1)
    return picked.cpu().numpy().astype(np.float64)


def check_head(scoring_model: ScoringModel, probe_length: int = 16) -> float:
    """Compare the chunked head with the model's own forward on a short probe; raise if they disagree.

    Returns the max |difference|. Tolerances: 1e-3 in float32 (observed ~1e-6), 0.1 in 16-bit
    types (a bf16 logit near 10 has a rounding step of 0.06; a missed soft-cap or scale moves
    logprobs by far more).
    """
    vocab = scoring_model.vocab_size
    ids = [(7919 * (i + 1)) % vocab for i in range(probe_length)]
    request = ScoreRequest(ids, np.arange(1, probe_length))
    ours = score_requests(scoring_model, [request])[0]
    reference = naive_logprobs(scoring_model, ids)
    difference = float(np.max(np.abs(ours - reference)))
    tolerance = 1e-3 if scoring_model.dtype == torch.float32 else 0.1
    if not difference <= tolerance:
        raise TraceToolsError(
            f"model {scoring_model.name!r}: the chunked output head disagrees with the model's own forward "
            f"(max |diff| {difference:.3g} > {tolerance}); its head does something this tool does not repeat"
        )
    return difference
