"""Each simulated harness behaviour shows its defining property on generated data (both templates).

One session per behaviour is simulated per template, written to Parquet and read back through the
real loader, so every check runs on what a user of the dump would see.
"""

from __future__ import annotations

import json

import pytest

from trace_tools.io.load import load
from trace_tools.render.canonical import canonicalize_messages, canonicalize_response
from trace_tools.render.renderer import Renderer
from trace_tools.simulate import BEHAVIOURS, simulate

TEMPLATES = ("qwen3", "qwen3.5")
STOP = "<|im_end|>"


@pytest.fixture(scope="module", params=TEMPLATES)
def dump(request, tmp_path_factory):
    """(renderer, {behaviour: Session}) for one template."""
    template = request.param
    path = tmp_path_factory.mktemp("sim") / f"{template}.parquet"
    simulate(len(BEHAVIOURS), seed=5, template=template, behaviours=list(BEHAVIOURS), out=str(path), max_turns=9)
    loaded = load(path)
    assert not loaded.quarantine
    sessions = {s.turns[0].metadata["behaviours"][0]: s for s in loaded.sessions}
    return Renderer.from_spec(template, template), sessions


def _echo_pairs(session):
    """(echoed message as sent, the response it echoes) for every assistant message in every request."""
    responses = {t.turn_index: t.response for t in session.turns}
    for turn in session.turns:
        assistants = [m for m in turn.messages if m["role"] == "assistant"]
        assert len(assistants) == len(turn.metadata["echo_of"])
        for message, source in zip(assistants, turn.metadata["echo_of"]):
            yield message, responses[source]


def _calls(message):
    return message.get("tool_calls") or []


def _args(call):
    arguments = call["function"]["arguments"]
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def test_byte_exact_echo_is_the_response(dump):
    _, sessions = dump
    pairs = list(_echo_pairs(sessions["byte-exact"]))
    assert pairs and all(echo == response for echo, response in pairs)


# What Claude Code 2.1.332 did to echoes, as `trace-tools probe` measured it (docs/probe.md), written
# out here independently of the profile machinery the simulator uses.
JS_TRIM_END = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def _trim_end_lines(text, path):
    if path.endswith((".md", ".mdx")):
        return text
    return "\n".join(line.rstrip(JS_TRIM_END) for line in text.split("\n"))


def _measured_claude_code(name, args, cwd):
    if name == "Bash":
        return {**args, "command": args["command"].removeprefix(f"cd {cwd} && ")}
    if name == "Edit":
        order = ("replace_all", "file_path", "old_string", "new_string")
        filled = {"replace_all": False, **args, "new_string": _trim_end_lines(args["new_string"], args["file_path"])}
        return {key: filled[key] for key in order}
    if name == "Write":
        return {**args, "content": _trim_end_lines(args["content"], args["file_path"])}
    return args


def test_claude_code_echo_is_what_the_real_client_was_measured_to_send(dump):
    _, sessions = dump
    session = sessions["claude-code"]
    cwd = session.turns[0].messages[0]["content"].rsplit("Working directory: ", 1)[1]
    seen = {"Bash-prefix": 0, "Edit": 0}
    for echo, response in _echo_pairs(session):
        # An Anthropic client: the row records arguments as objects, no stream `index`.
        assert all(isinstance(c["function"]["arguments"], dict) and "index" not in c for c in _calls(response))
        assert {**echo, "tool_calls": None} == {**response, "tool_calls": None}
        for sent, stored in zip(_calls(echo), _calls(response), strict=True):
            name, args = stored["function"]["name"], stored["function"]["arguments"]
            assert sent["id"] == stored["id"]
            expected = _measured_claude_code(name, args, cwd)
            assert list(sent["function"]["arguments"].items()) == list(expected.items())  # key order too
            seen["Bash-prefix"] += name == "Bash" and args["command"].startswith(f"cd {cwd} && ")
            seen["Edit"] += name == "Edit"
    assert all(seen.values()), seen


def test_json_reserialize_keeps_dicts_and_changes_text(dump):
    _, sessions = dump
    changed = 0
    for echo, response in _echo_pairs(sessions["json-reserialize"]):
        assert canonicalize_response(echo) == canonicalize_response(response)
        for sent, stored in zip(_calls(echo), _calls(response), strict=True):
            assert list(_args(sent)) == sorted(_args(sent))
            changed += sent["function"]["arguments"] != stored["function"]["arguments"]
    assert changed > 0


def test_reasoning_dropped_and_rekeyed(dump):
    _, sessions = dump
    for echo, response in _echo_pairs(sessions["reasoning-dropped"]):
        assert "reasoning_content" not in echo
        assert echo == {k: v for k, v in response.items() if k != "reasoning_content"}
    rekeyed = list(_echo_pairs(sessions["reasoning-rekeyed"]))
    assert rekeyed
    for echo, response in rekeyed:
        assert echo["reasoning"] == response["reasoning_content"] and "reasoning_content" not in echo
        assert {k: v for k, v in echo.items() if k != "reasoning"} == {
            k: v for k, v in response.items() if k != "reasoning_content"
        }


def test_streaming_echo_differs_only_in_index_and_ids(dump):
    _, sessions = dump
    session = sessions["streaming"]
    for echo, response in _echo_pairs(session):
        strip = lambda m: [{k: v for k, v in c.items() if k not in ("index", "id")} for c in _calls(m)]  # noqa: E731
        assert strip(echo) == strip(response)
        assert {k: v for k, v in echo.items() if k != "tool_calls"} == {
            k: v for k, v in response.items() if k != "tool_calls"
        }
        for position, (sent, stored) in enumerate(zip(_calls(echo), _calls(response))):
            assert sent["id"] != stored["id"]
            assert sent.get("index", position) == position  # dropped, or renumbered 0..n-1
    # the tool results answer the regenerated ids
    last = session.turns[-1].messages
    sent_ids = {c["id"] for m in last if m["role"] == "assistant" for c in _calls(m)}
    assert {m["tool_call_id"] for m in last if m["role"] == "tool"} <= sent_ids


def test_retry_reissues_the_same_request_and_supersedes_the_first(dump):
    _, sessions = dump
    turns = sessions["retry"].turns
    first = [t for t in turns if not t.metadata["genuine"]]
    assert len(first) == 1 and first[0].metadata["kind"] == "superseded"
    retry = turns[first[0].metadata["superseded_by"]]
    assert retry.metadata["retry_of"] == first[0].turn_index and retry.turn_index == first[0].turn_index + 1
    assert retry.messages == first[0].messages and retry.prompt_ids == first[0].prompt_ids
    assert retry.output_ids != first[0].output_ids
    assert retry.started_at < first[0].finished_at  # the client gave up before the first call finished
    assert all(first[0].turn_index not in t.metadata["echo_of"] for t in turns)  # never echoed
    assert turns[0].metadata["ideal_samples"] == 1


def test_subagent_is_an_interleaved_conversation_with_its_own_system_prompt(dump):
    _, sessions = dump
    turns = sessions["subagent"].turns
    sub = [t for t in turns if t.metadata["branch"] == "subagent-1"]
    main = [t for t in turns if t.metadata["branch"] == "main"]
    assert sub and main and turns[0].metadata["ideal_samples"] == 2
    assert sub[0].messages[0]["content"] != main[0].messages[0]["content"]
    assert {t["function"]["name"] for t in sub[0].tools} < {t["function"]["name"] for t in main[0].tools}
    first, last = sub[0].turn_index, sub[-1].turn_index
    assert [t.turn_index for t in sub] == list(range(first, last + 1))
    assert main[0].turn_index < first and main[-1].turn_index > last  # interleaved inside main
    after = turns[last + 1].messages
    answer = sub[-1].response["content"]
    assert after[-1] == {"role": "tool", "tool_call_id": after[-2]["tool_calls"][0]["id"], "content": answer}


def test_compaction_replaces_history_by_the_summary(dump):
    _, sessions = dump
    turns = sessions["compaction"].turns
    summary = next(t for t in turns if t.metadata["kind"] == "summary")
    assert summary.messages[-1]["role"] == "user" and summary.finish_reason == "stop"
    after = turns[summary.turn_index + 1]
    assert after.metadata["branch"] == "compaction-1" and len(after.messages) == 2
    assert summary.response["content"] in after.messages[1]["content"]
    assert turns[0].metadata["ideal_samples"] == 2


def test_truncation_stops_without_a_stop_token_and_the_harness_continues(dump):
    renderer, sessions = dump
    turns = sessions["truncation"].turns
    cut = [t for t in turns if t.finish_reason == "length"]
    assert len(cut) == 1 and cut[0].metadata["genuine"]
    stop = renderer.tokenizer.token_to_id(STOP)
    assert cut[0].output_ids[-1] != stop
    assert all(t.output_ids[-1] == stop for t in turns if t is not cut[0])
    follow = turns[cut[0].turn_index + 1].messages
    assert follow[-2] == cut[0].response and follow[-1]["role"] == "user"


def test_history_edit_changes_earlier_messages(dump):
    _, sessions = dump
    turns = sessions["history-edit"].turns
    edited = next(t for t in turns if t.metadata["branch"] == "edit-1")
    before = turns[edited.turn_index - 1]
    prefix = len(before.messages)
    assert edited.messages[:prefix] != before.messages  # not an append: earlier content changed
    changed = [i for i, (a, b) in enumerate(zip(edited.messages, before.messages)) if a != b]
    assert changed and all(before.messages[i]["role"] == "tool" for i in changed)
    assert turns[0].metadata["ideal_samples"] == 2


def test_noncanonical_tokenization_changes_ids_not_text(dump):
    renderer, sessions = dump
    split = [t for t in sessions["noncanonical-tokenization"].turns if t.metadata["noncanonical_splits"]]
    assert split
    newline, double = renderer.encode("\n"), renderer.encode("\n\n")
    assert len(newline) == 1 and len(double) == 1
    for turn in split:
        text = renderer.decode(turn.output_ids)
        assert renderer.encode(text) != turn.output_ids  # the tokenizer would merge what the model split
        assert len(renderer.encode(text)) == len(turn.output_ids) - turn.metadata["noncanonical_splits"]
        parsed = renderer.parse_response(turn.output_ids, turn.tools).message
        assert parsed == canonicalize_response(turn.response)
    pairs = [t.output_ids[i : i + 2] for t in split for i in range(len(t.output_ids) - 1)]
    assert newline * 2 in pairs


def test_served_output_parses_to_the_recorded_response(dump):
    renderer, sessions = dump
    for session in sessions.values():
        for turn in session.turns:
            parsed = renderer.parse_response(turn.output_ids, turn.tools)
            assert parsed.message == canonicalize_response(turn.response)
            assert parsed.ill_formed == (turn.finish_reason == "length" and "<tool_call>" in parsed.message["content"])


def test_tree_prompts_are_the_render_of_the_canonical_request(dump):
    renderer, sessions = dump
    for session in sessions.values():
        for turn in session.turns:
            assert turn.prompt_ids == renderer.render(canonicalize_messages(turn.messages), turn.tools)


def _extends(previous, turn):
    served = previous.prompt_ids + previous.output_ids
    return turn.prompt_ids[: len(served)] == served


def _drifts(session):
    """Per genuine turn after the first of its branch: does its prompt extend the branch's served ids?"""
    last_by_branch, out = {}, []
    for turn in session.turns:
        previous = last_by_branch.get(turn.metadata["branch"])
        if previous is not None:
            out.append((turn, _extends(previous, turn)))
        if turn.metadata["genuine"]:
            last_by_branch[turn.metadata["branch"]] = turn
    return out


@pytest.mark.parametrize(
    "behaviour", ["byte-exact", "streaming", "retry", "subagent", "compaction", "truncation", "history-edit"]
)
def test_byte_exact_echoes_reproduce_the_served_tokens(dump, behaviour):
    """Without an echo rewrite, every prompt extends the served ids, except where the template
    itself re-renders earlier turns (a new user message makes Qwen drop earlier reasoning)."""
    _, sessions = dump
    checked = _drifts(sessions[behaviour])
    assert checked
    for turn, extends in checked:
        assert extends != turn.metadata["template_rewrite"], turn.turn_index
        if turn.metadata["template_rewrite"]:
            assert turn.messages[-1]["role"] == "user"


@pytest.mark.parametrize("behaviour", ["claude-code", "reasoning-dropped", "noncanonical-tokenization"])
def test_rewriting_behaviours_drift(dump, behaviour):
    _, sessions = dump
    assert any(not extends for _, extends in _drifts(sessions[behaviour]))


def test_ground_truth_is_consistent(dump):
    renderer, sessions = dump
    stop = renderer.tokenizer.token_to_id(STOP)
    for session in sessions.values():
        turns = session.turns
        truth = [t.metadata for t in turns]
        assert len({(m["ideal_samples"], m["ideal_forwarded_tokens"], tuple(m["behaviours"])) for m in truth}) == 1
        assert truth[0]["ideal_samples"] == len({m["branch"] for m in truth if m["genuine"]})
        assert all(m["genuine"] == (m["kind"] != "superseded") for m in truth)
        assert [t.reward is not None for t in turns] == [False] * (len(turns) - 1) + [True]
        assert all(t.started_at <= u.started_at for t, u in zip(turns, turns[1:]))
        for turn in turns:
            assert len(turn.output_logprobs) == len(turn.output_ids) and max(turn.output_logprobs) <= 0
            expected = (
                "length" if turn.output_ids[-1] != stop else "tool_calls" if turn.response.get("tool_calls") else "stop"
            )
            assert turn.finish_reason == expected


def test_ideal_forwarded_tokens_of_a_linear_session_is_its_last_sequence(dump):
    _, sessions = dump
    last = sessions["byte-exact"].turns[-1]
    assert last.metadata["ideal_forwarded_tokens"] == len(last.prompt_ids) + len(last.output_ids)


def test_ideal_forwarded_tokens_keep_served_ids_across_a_template_rewrite(dump):
    """Compaction: the main branch ends with the summary turn, whose recorded prompt lost the earlier
    reasoning; the ideal sequence keeps the served ids and appends only the new messages (the last
    tool results and the summary request)."""
    renderer, sessions = dump
    turns = sessions["compaction"].turns
    summary = next(t for t in turns if t.metadata["kind"] == "summary")
    served = turns[summary.turn_index - 1]
    assert summary.metadata["template_rewrite"]
    text = renderer.render_text(canonicalize_messages(summary.messages), summary.tools)
    tail = text[text.rindex("<|im_start|>user\n<tool_response>") :]
    main = len(served.prompt_ids) + len(served.output_ids) + len(renderer.encode("\n")) + len(renderer.encode(tail))
    main += len(summary.output_ids)
    assert main > len(summary.prompt_ids) + len(summary.output_ids)  # the recorded prompt is shorter
    last = turns[-1]
    assert last.metadata["branch"] == "compaction-1"
    assert summary.metadata["ideal_forwarded_tokens"] == main + len(last.prompt_ids) + len(last.output_ids)


def test_harness_profile_file_plays_like_the_builtin_claude_code_behaviour(tmp_path):
    """`--harness-profile FILE` plays any measured profile; the shipped Claude Code one gives exactly
    the `claude-code` behaviour's rows, and the dump records which profile was played."""
    from typer.testing import CliRunner

    from trace_tools.cli.main import app
    from trace_tools.render.harness_echo import SHIPPED

    shipped = SHIPPED / "claude-code-2.1.332.json"
    builtin = simulate(2, seed=9, behaviours=["claude-code"], max_turns=6)
    played = simulate(2, seed=9, harness_profile=str(shipped), max_turns=6)
    for a, b in zip(builtin.to_pylist(), played.to_pylist(), strict=True):
        assert a["messages"] == b["messages"] and a["response"] == b["response"]
    meta = json.loads(played.schema.metadata[b"trace_tools.simulator"])
    assert meta["harness_profiles"] == {"harness-profile": "claude-code 2.1.332"}
    assert json.loads(builtin.schema.metadata[b"trace_tools.simulator"])["harness_profiles"] == {
        "claude-code": "claude-code 2.1.332"
    }
    missing = CliRunner().invoke(
        app,
        [
            "simulate",
            "--sessions",
            "1",
            "--seed",
            "1",
            "--out",
            str(tmp_path / "x.parquet"),
            "--harness-profile",
            str(tmp_path / "none.json"),
        ],
    )
    assert missing.exit_code == 2 and "no harness profile" in missing.output
    unplayable = CliRunner().invoke(
        app,
        [
            "simulate",
            "--sessions",
            "1",
            "--seed",
            "1",
            "--out",
            str(tmp_path / "x.parquet"),
            "--behaviour",
            "harness-profile",
        ],
    )
    assert unplayable.exit_code == 2 and "--harness-profile" in unplayable.output
