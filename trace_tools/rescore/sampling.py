"""Sample continuations with a KV cache, recording each token's logprob under the sampling distribution.

This is the "sampler" half of a positive control: a gateway that records what its engine
reports. Decoding one token at a time through a KV cache runs different kernels (query length
1) than rescoring's single teacher-forced pass, so recorded and recomputed logprobs agree only
up to floating-point noise -- which is exactly what the rescore tolerance has to absorb.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from trace_tools.errors import TraceToolsError
from trace_tools.rescore.models import ScoringModel, load_model


@dataclass
class Continuation:
    """Sampled token ids, their logprobs under the sampling distribution, and why sampling stopped."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop id was sampled, and kept) or "length"


def sample_continuation(
    model: ScoringModel | str,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    seed: int = 0,
    *,
    temperature: float = 1.0,
    stop_ids: Sequence[int] = (),
) -> Continuation:
    """Sample up to `max_new_tokens` after `prompt_ids` from a seeded generator.

    `temperature > 0` samples from softmax(logits / temperature) and records log of that
    probability (what a sampler's "logprobs" mean); `temperature == 0` is greedy and records the
    model's own logprob of the argmax. No top-k/top-p truncation, so with temperature 1 the
    recorded logprob is the model's logprob and rescoring the same model must reproduce it.
    """
    if temperature < 0 or max_new_tokens < 0:
        raise TraceToolsError("temperature and max_new_tokens must be non-negative")
    scoring_model = model if isinstance(model, ScoringModel) else load_model(model)
    if not prompt_ids:
        raise TraceToolsError("sampling needs at least one prompt token")
    generator = torch.Generator(device=scoring_model.device).manual_seed(seed)
    feed = torch.as_tensor([list(prompt_ids)], dtype=torch.long, device=scoring_model.device)
    stops, cache = set(stop_ids), None
    ids: list[int] = []
    logprobs: list[float] = []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits, cache = _next_logits(scoring_model.model, feed, cache)
            token, logprob = _pick(logits, temperature, generator)
            ids.append(token)
            logprobs.append(logprob)
            if token in stops:
                return Continuation(ids, logprobs, "stop")
            feed = torch.tensor([[token]], dtype=torch.long, device=scoring_model.device)
    return Continuation(ids, logprobs, "length")


def _next_logits(model: Any, feed: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
    """float32 logits of the next token, and the updated KV cache."""
    name = _cache_keyword(model)
    output = model(input_ids=feed, use_cache=True, logits_to_keep=1, **({name: cache} if cache is not None else {}))
    new_cache = getattr(output, "cache", None) or getattr(output, "past_key_values", None)
    return output.logits[0, -1].float(), new_cache


def _cache_keyword(model: Any) -> str:
    # transformers 5 renamed `past_key_values` to `cache`; 4.x only knows the old name.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> tuple[int, float]:
    if temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logprobs))
    else:
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
    return token, float(logprobs[token])
