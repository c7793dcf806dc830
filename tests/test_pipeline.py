"""The session pipeline: incremental reconstruction equals full reconstruction, streaming is
bounded, and every command reads sessions through it."""

from __future__ import annotations

import json

import pytest

from trace_tools.pipeline import Pipeline
from trace_tools.render.renderer import Renderer


@pytest.fixture(scope="module", params=["qwen3", "qwen3.5"])
def every_behaviour(request, tmp_path_factory):
    """Every simulated behaviour (and the default mixes) under one template."""
    from trace_tools.simulate import simulate

    path = tmp_path_factory.mktemp("behaviours") / f"{request.param}.parquet"
    simulate(sessions=18, seed=21, template=request.param, out=str(path), max_turns=12)
    return path


def test_incremental_reconstruction_equals_full_on_every_turn(every_behaviour):
    """Each turn's incremental render equals a full render of the whole conversation, encoded by the
    tokenizers backend, not the fast encoder (an independent path to the same ids)."""
    pipeline = Pipeline(every_behaviour, prompt_source="rendered")
    compared, behaviours = 0, set()
    for prepared in pipeline.prepared():
        renderer = prepared.renderer
        for p in prepared.turns:
            kwargs = {**renderer.template_kwargs, **p.template_kwargs}
            text = renderer._apply_template(p.messages, p.tools, True, kwargs)
            assert p.prompt_ids == renderer.tokenizer.backend.encode(text, add_special_tokens=False).ids, (
                prepared.session_id,
                p.turn.turn_index,
            )
            compared += 1
        behaviours.update(prepared.session.turns[0].metadata["behaviours"])
        assert renderer.cache_info().get("incremental", 0) > 0 or len(prepared.turns) < 3
    assert compared > 100
    assert {
        "compaction",
        "history-edit",
        "retry",
        "subagent",
        "truncation",
        "claude-code",
        "noncanonical-tokenization",
        "reasoning-dropped",
    } <= behaviours


def test_every_strategy_render_checked_against_transformers(every_behaviour, tmp_path):
    """With render_path="verify" (`--verify`) every render, encode and decode any strategy asks
    for is compared with transformers' own; on every simulated behaviour none may differ."""
    from trace_tools.api import replay

    result = replay(every_behaviour, out=tmp_path / "run", workers=1, write_samples=False, render_path="verify")
    assert result.quarantined == 0
    assert result.reconstruction["incremental_renders"] > result.reconstruction["full_renders"]
    verify = result.reconstruction["verify"]
    assert verify["checked"] > 1000 and verify["differences"] == 0, verify


def test_template_without_incremental_rules_renders_in_full():
    """A template whose generation prompt counts the whole conversation would make window renders
    wrong without any check noticing; the self-check finds that and the template is always
    rendered in full, exactly."""
    template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[turn {{ messages|length }}]{% endif %}"
    )
    renderer = Renderer("qwen3", template)
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "tool", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "tool", "content": "e"},
    ]
    for end in range(1, 6):
        full = renderer.encode(renderer._apply_template(messages[:end], None, True, {}))
        assert renderer.render(messages[:end]) == full
    assert renderer.engine.rules is None
    assert renderer.cache_info()["template_not_incremental"] == 1


def test_the_template_check_runs_once_per_template_and_is_remembered(tmp_path, monkeypatch):
    """The self-check's verdict is kept on disk per template: a second process renders with it
    directly; a damaged verdict file checks the template again."""
    from trace_tools.render.incremental import IncrementalRenderer
    from trace_tools.render.templates import resolve_template

    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path))
    template, _ = resolve_template("qwen3")
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "tool", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    checks = []
    original = IncrementalRenderer.self_check
    monkeypatch.setattr(IncrementalRenderer, "self_check", lambda self: checks.append(1) or original(self))

    def render_all(**kwargs):
        renderer = Renderer("qwen3", template, **kwargs)
        ids = [renderer.render(messages[:end]) for end in range(1, 5)]
        assert ids == [renderer.encode(renderer._apply_template(messages[:end], None, True, {})) for end in range(1, 5)]
        return renderer

    first = render_all()
    (verdict,) = (tmp_path / "render-checks").glob("rules-*.json")
    second = render_all()
    assert len(checks) == 1 and second.engine.rules == first.engine.rules is not None
    assert second.cache_info()["incremental"] == first.cache_info()["incremental"] > 0

    verdict.write_text("{not json")
    render_all()
    assert len(checks) == 2 and json.loads(verdict.read_text())["rules"] is not None


def test_a_window_two_conversations_share_is_rendered_once(tmp_path, monkeypatch):
    """Strategies build their own histories: conversations that differ only before the window an
    extension renders (the last assistant message on) share that window's render. Both texts are
    still exactly the full renders."""
    from trace_tools.render.templates import resolve_template

    monkeypatch.setenv("TRACE_TOOLS_CACHE", str(tmp_path))
    template, _ = resolve_template("qwen3")
    renderer = Renderer("qwen3", template)

    def conversation(first_answer: str) -> list[dict]:
        return [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": first_answer},
            {"role": "tool", "content": "ran"},
            {"role": "assistant", "content": "now edit"},
            {"role": "tool", "content": "edited"},
        ]

    for messages in (conversation("look first"), conversation("read the file")):
        renderer.render(messages[:4])
    renders: list[list[dict]] = []
    real = renderer.engine._apply
    monkeypatch.setattr(renderer.engine, "_apply", lambda m, *rest: renders.append(list(m)) or real(m, *rest))
    texts = [renderer.render_text(conversation(answer)) for answer in ("look first", "read the file")]
    windows = [[m["content"] for m in window] for window in renders]
    assert windows.count(["fix it", "now edit", "edited"]) == 1  # the window the two extensions share
    assert texts == [real(conversation(answer), None, True, {}) for answer in ("look first", "read the file")]


def test_reconstruct_renders_each_file_with_its_own_template():
    from trace_tools.reconstruct import reconstruct
    from trace_tools.replay.engine import default_dump

    result = reconstruct(default_dump())
    assert (result.summary["exact"], result.summary["turns_compared"]) == (330, 330)


def test_sessions_stream_in_bounded_memory(tmp_path, monkeypatch):
    """Rows of sessions recorded concurrently interleave; a session is handed on as soon as its last
    row is read, so the buffer never holds more than the sessions open at once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trace_tools.io.load import iter_sessions
    from trace_tools.simulate import simulate

    table = simulate(sessions=12, seed=4, template="qwen3", max_turns=6)
    rows = table.to_pylist()
    by_session: dict[str, list] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], []).append(row)
    ids = list(by_session)
    # Three sessions at a time, their rows interleaved, as a gateway with concurrency 3 records them.
    ordered = []
    for start in range(0, len(ids), 3):
        group = [list(by_session[i]) for i in ids[start : start + 3]]
        while any(group):
            for rows_left in group:
                if rows_left:
                    ordered.append(rows_left.pop(0))
    path = tmp_path / "interleaved.parquet"
    pq.write_table(pa.Table.from_pylist(ordered, schema=table.schema), path, row_group_size=8)
    import sys

    monkeypatch.setattr(sys.modules["trace_tools.io.load"], "ROW_BATCH_ROWS", 4)  # sessions finish after each batch
    stream = iter_sessions(path)
    most_open = 0
    original = stream._take_row

    def spy(record, where, buffers, *args):
        nonlocal most_open
        original(record, where, buffers, *args)
        most_open = max(most_open, len(buffers))

    stream._take_row = spy
    sessions = [s for s in stream]
    assert len(sessions) == 12
    assert most_open <= 3 + 2  # the open group, plus the next group's first rows within one batch


def test_history_is_parsed_once_and_shared_between_turns(simulated_dump):
    pipeline = Pipeline(simulated_dump)
    session = next(iter(pipeline))
    first, later = session.turns[0].messages, session.turns[-1].messages
    assert later[0] is first[0]  # the later row's history reuses the earlier row's parsed objects
    prepared = pipeline.prepare(session)
    assert prepared.turns[-1].messages[0] is prepared.turns[0].messages[0]  # canonicalized once


def test_only_the_columns_a_command_needs_are_read(simulated_dump):
    from trace_tools.reconstruct import RECONSTRUCT_COLUMNS

    pipeline = Pipeline(simulated_dump, columns=RECONSTRUCT_COLUMNS)
    session = next(iter(pipeline))
    assert session.turns[0].output_logprobs is None and session.turns[0].response is None
    assert session.turns[0].prompt_ids is not None


def test_report_never_replays(sample_run):
    """The run directory carries what reports need: drift windows and fidelity come from replay."""
    import pandas as pd

    drift = pd.read_parquet(sample_run.run_dir / "drift.parquet")
    assert {"served_tokens", "rendered_tokens", "shared_tokens", "cause", "message_diff"} <= set(drift.columns)
    drifted = drift[drift["token_drift"]]
    assert len(drifted) and (drifted["served_ids"].map(len) > 0).all()
    fidelity = pd.read_parquet(sample_run.run_dir / "fidelity.parquet")
    assert fidelity["exact"].all() and len(fidelity) == 330
    assert json.loads((sample_run.run_dir / "run.json").read_text())["reconstruction"]["incremental_renders"] > 0


def test_last_boundary_and_its_index_match_the_plain_search():
    """`_Boundaries.last` and `_nth_from_end` against their plain definitions (every token's
    `rfind`, a step-by-step walk back), on texts dense with tokens, with near-miss `<`, and
    without any token, over every window a replay may search; `_nth_from_end` also on ids that
    are the start of a longer list (a text whose list a later text took over)."""
    import random

    from trace_tools.render.incremental import _Boundaries, _independent, _nth_from_end

    tokens = _independent({"<|im_start|>": 1, "<|im_end|>": 2, "<tool_call>": 3, "</tool_call>": 4, "[gMASK]": 5})
    boundaries = _Boundaries(tokens)
    pieces = [*tokens, "<", "<|im", "a <b> c", "[", "x" * 40, "\n"]
    rng = random.Random(7)
    for _ in range(300):
        parts = [rng.choice(pieces) for _ in range(rng.randrange(0, 60))]
        text = "".join(parts)
        ids = [tokens.get(part, 0) for part in parts]  # one id per piece: tokens keep their ids
        for _ in range(5):
            start = rng.randrange(0, len(text) + 1)
            limit = rng.randrange(start, len(text) + 1)
            plain = max(((text.rfind(token, start, limit), token) for token in tokens), default=(-1, ""))
            assert boundaries.last(text, start, limit) == (None if plain[0] < 0 else plain)
        for token, token_id in tokens.items():
            for nth in range(1, ids.count(token_id) + 1):
                index, left = len(ids), nth
                while left:
                    index -= 1
                    left -= ids[index] == token_id
                assert _nth_from_end(ids, len(ids), token_id, nth) == index
                assert _nth_from_end(ids + [token_id, 0, token_id], len(ids), token_id, nth) == index
    long_ids = [9] * 5000 + [2] + [9] * 3000 + [2, 2] + [9] * 700  # windows double past several sizes
    assert [_nth_from_end(long_ids, len(long_ids), 2, n) for n in (1, 2, 3)] == [8002, 8001, 5000]


def test_recorded_prompts_are_compared_as_arrays_and_become_their_render_where_equal():
    """A recorded prompt read as an int32 array is compared with its render without becoming a
    list first. Where the two are equal it becomes the render's own list; elsewhere a list of its
    own ids. Either way the turn and the prepared turn that feeds it hold the list, and the
    common prefix is what a plain list comparison finds, turn after turn of a session."""
    import numpy as np

    from trace_tools.data import Turn
    from trace_tools.ids import common_prefix_len
    from trace_tools.pipeline.prepared import PreparedTurn
    from trace_tools.pipeline.recorded import RecordedPrompts

    history = list(range(1000, 6000))
    renders = [history + [7], history + [7, 8, 9], history + [7, 8, 9, 10, 11], history + [7, 8, 9, 10, 11, 12]]
    served = [renders[0], renders[1], renders[2][:-1] + [99], renders[2][:-1] + [99, 12]]  # drifts at turn 2
    prepared = []
    for index, ids in enumerate(served):
        turn = Turn("s", index, [], [1], prompt_ids=np.array(ids, dtype=np.int32))
        origin = "recorded" if index != 1 else "rendered"
        prepared.append(PreparedTurn(turn, [], None, None, turn.prompt_ids if index != 1 else renders[1], origin))
    recorded = RecordedPrompts()
    found = [recorded.compare(p, rendered) for p, rendered in zip(prepared, renders)]

    assert found == [common_prefix_len(ids, rendered) for ids, rendered in zip(served, renders)]
    assert found[2] == found[3] == len(renders[2]) - 1
    assert [p.turn.prompt_ids for p in prepared] == served
    assert all(type(p.turn.prompt_ids) is list for p in prepared)
    assert prepared[0].turn.prompt_ids is renders[0] and prepared[0].prompt_ids is renders[0]
    assert prepared[1].turn.prompt_ids is renders[1] and prepared[1].prompt_ids is renders[1]  # rendered origin kept
    assert prepared[2].prompt_ids is prepared[2].turn.prompt_ids is not renders[2]
    left = PreparedTurn(
        Turn("s", 4, [], [1], prompt_ids=np.array(served[3], dtype=np.int32)), [], None, None, None, "recorded"
    )
    left.prompt_ids = left.turn.prompt_ids
    recorded.materialize([left])  # not compared (no renderer): a list of its own ids all the same
    assert (
        type(left.turn.prompt_ids) is list
        and left.turn.prompt_ids == served[3]
        and left.prompt_ids is left.turn.prompt_ids
    )
