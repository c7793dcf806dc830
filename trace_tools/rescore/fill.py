"""`fill_logprobs`: give a dump real sampling logprobs by teacher-forcing its outputs on a model.

The simulator writes outputs that no model sampled; filling `output_logprobs` with a model's
teacher-forced logprobs makes them what that model's sampler would have recorded for those
tokens, so `rescore` with the same model is a positive control (Δ ≈ 0) and any other model,
template or prompt a negative one.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from trace_tools.data import SIMULATED_HARNESS, DumpMeta, Session, Turn
from trace_tools.rescore import plan, require_torch


def fill_logprobs(
    table_or_sessions: Any,
    model_spec: Any = "tiny-qwen3",
    device: str = "auto",
    *,
    dtype: str = "auto",
    tokenizer: str | None = None,
    chat_template: str | None = None,
    max_batch_tokens: int | None = None,
) -> Any:
    """The input with `output_logprobs` replaced by the model's teacher-forced logprobs of `output_ids`.

    Takes a schema-v1 `pyarrow.Table` (returns a Table with the same rows, order and schema
    metadata) or a list of `Session`s (returns new Sessions). Each turn's prompt is its recorded
    `prompt_ids`, else rendered as `rescore` does. A turn that cannot be scored (no prompt can be
    had, an empty prompt, ids beyond the model's vocabulary) gets null logprobs; an empty output
    gets an empty list. `model_spec` is a model spec or a loaded `ScoringModel`.
    """
    import pyarrow as pa

    if isinstance(table_or_sessions, pa.Table):
        return _fill_table(table_or_sessions, model_spec, device, dtype, tokenizer, chat_template, max_batch_tokens)
    sessions = list(table_or_sessions)
    turns = [turn for session in sessions for turn in session.turns]
    meta = sessions[0].meta if sessions else DumpMeta()
    values = iter(teacher_forced(turns, meta, model_spec, device, dtype, tokenizer, chat_template, max_batch_tokens))
    return [
        dataclasses.replace(s, turns=[dataclasses.replace(t, output_logprobs=next(values)) for t in s.turns])
        for s in sessions
    ]


def teacher_forced(
    turns: Sequence[Turn],
    meta: DumpMeta,
    model_spec: Any,
    device: str = "auto",
    dtype: str = "auto",
    tokenizer: str | None = None,
    chat_template: str | None = None,
    max_batch_tokens: int | None = None,
) -> list[list[float] | None]:
    """Per turn, the model's logprobs of its output tokens given its prompt (None when unscorable)."""
    require_torch()
    from trace_tools.rescore.models import ScoringModel, load_model
    from trace_tools.rescore.prompts import PromptSource
    from trace_tools.rescore.scoring import score_turns

    model = model_spec if isinstance(model_spec, ScoringModel) else load_model(model_spec, device, dtype)
    prompts = PromptSource(tokenizer, chat_template, model.tokenizer, "slime")
    inputs = []
    for turn in turns:
        prompt_ids, origin, _ = prompts.prompt(turn, Session(turn.session_id, [turn], meta))
        reason = plan.sequence_problem(prompt_ids, turn.output_ids, model.vocab_size)
        inputs.append(
            plan.TurnInput(turn.session_id, turn.turn_index, list(turn.output_ids), None, prompt_ids, origin, reason)
        )
    scored = score_turns(model, inputs, max_batch_tokens=max_batch_tokens)
    return [_as_list(turn, values) for turn, values in zip(inputs, scored.recomputed)]


def _as_list(turn: plan.TurnInput, values: Any) -> list[float] | None:
    if turn.skip_reason == plan.EMPTY_OUTPUT:
        return []
    return None if values is None else [float(v) for v in values]


def _fill_table(
    table: Any,
    model_spec: Any,
    device: str,
    dtype: str,
    tokenizer: str | None,
    chat_template: str | None,
    max_batch_tokens: int | None,
) -> Any:
    import pyarrow as pa

    turns = [_row_turn(row) for row in table.select(_present(table, _ROW_COLUMNS)).to_pylist()]
    values = teacher_forced(
        turns, _table_meta(table), model_spec, device, dtype, tokenizer, chat_template, max_batch_tokens
    )
    column = pa.array(values, type=pa.list_(pa.float32()))
    if "output_logprobs" in table.column_names:
        table = table.set_column(table.column_names.index("output_logprobs"), "output_logprobs", column)
    else:
        table = table.append_column(pa.field("output_logprobs", pa.list_(pa.float32())), column)
    source = f"teacher-forced:{getattr(model_spec, 'name', model_spec)}"
    return table.replace_schema_metadata({**(table.schema.metadata or {}), LOGPROBS_KEY.encode(): source.encode()})


def logprobs_source(meta: DumpMeta) -> str:
    """`synthetic` for a simulated dump whose logprobs were seeded, not computed by a model (every turn
    of it is expected to be flagged); `teacher-forced:MODEL` when `fill_logprobs` wrote them; else `recorded`."""
    if "logprobs" in meta.extra:
        return meta.extra["logprobs"]
    return "synthetic" if meta.harness == SIMULATED_HARNESS else "recorded"


LOGPROBS_KEY = "trace_tools.logprobs"  # who computed output_logprobs, when not the recording engine
_ROW_COLUMNS = ("session_id", "turn_index", "messages", "tools", "output_ids", "prompt_ids", "chat_template_kwargs")


def _present(table: Any, names: Sequence[str]) -> list[str]:
    return [name for name in names if name in table.column_names]


def _row_turn(row: dict[str, Any]) -> Turn:
    """Just enough of a Turn to find its prompt; unparsable JSON leaves the prompt to `prompt_ids`."""
    return Turn(
        session_id=str(row.get("session_id")),
        turn_index=int(row.get("turn_index") or 0),
        messages=_json(row.get("messages")) or [],
        output_ids=list(row.get("output_ids") or []),
        tools=_json(row.get("tools")),
        prompt_ids=row.get("prompt_ids"),
        chat_template_kwargs=_json(row.get("chat_template_kwargs")),
    )


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


def _table_meta(table: Any) -> DumpMeta:
    raw = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    return DumpMeta(
        schema_version=raw.get("trace_tools.schema_version"),
        tokenizer=raw.get("trace_tools.tokenizer"),
        chat_template=raw.get("trace_tools.chat_template"),
        history_mode=raw.get("trace_tools.history_mode"),
        harness=raw.get("trace_tools.harness"),
    )
