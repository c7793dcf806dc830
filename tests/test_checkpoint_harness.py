"""checkpoint-tree on echoes of measured harnesses: gateway-issued tool-call ids say which reply an
echo belongs to, harness profiles name the rewrites that keep it the same call, and a reasoning a
gateway returned as text comes back as text. Both directions: what must attach, and what must not."""

from __future__ import annotations

import copy
import json

import pytest

from checkpoint_fakes import Harness, ToyTemplate, reply, system, tool, user
from trace_tools.errors import UsageError
from trace_tools.strategies.base import ReplayContext
from trace_tools.strategies.checkpoint_tree import CheckpointTreeStrategy
from trace_tools.strategies.registry import check_params

TASK = "The kettle never stops boiling."
CWD = "/fw/kettle"
SYSTEM = system(f"You fix bugs in the kettle firmware.\nWorking directory: {CWD}")


def replay(harness: Harness, **params):
    return CheckpointTreeStrategy(ReplayContext(ToyTemplate(), params=params)).replay(harness.session())


def issued(message: dict, *ids: str) -> dict:
    """`message` with the tool-call ids a gateway issued for it."""
    out = copy.deepcopy(message)
    for call, call_id in zip(out["tool_calls"], ids, strict=True):
        call["id"] = call_id
    return out


def paths(result) -> list[list[int]]:
    return [sample.metadata["path_turns"] for sample in result.samples]


SHELL = reply("", ("Shell", {"cmd": f"cd {CWD} && make test"}), reasoning="Run the tests first.")
PATCH = reply("Fixing.", ("Patch", {"path": "fw/boil.c", "find": "a", "put": "b"}), reasoning="Off by one.")


def two_turns(first: dict, echo: dict) -> Harness:
    h = Harness()
    history = [SYSTEM, user(TASK)]
    h.call(history, first)
    history += [echo, tool("ok", call_id="call_x")]
    h.call(history, reply("Done."))
    return h


# -- gateway-issued ids ----------------------------------------------------------------------------
def twins(continued_id: str) -> Harness:
    """The same request twice (equal replies, distinct issued ids); the harness continues one."""
    h = Harness()
    history = [SYSTEM, user(TASK)]
    h.call(history, issued(PATCH, "call_first"))
    h.call(history, issued(PATCH, "call_second"))
    history += [issued(PATCH, continued_id), tool("patched", call_id=continued_id)]
    h.call(history, reply("Done."))
    return h


def test_an_echo_attaches_to_the_reply_whose_issued_ids_it_carries():
    assert [0, 2] in paths(replay(twins("call_first")))  # not the latest twin: its ids say so
    assert paths(replay(twins("call_second"))) == [[1, 2]]  # the first twin is a superseded retry


def test_ids_a_harness_regenerates_leave_the_choice_to_content():
    result = replay(twins("toolu_fresh"))  # not an id the gateway issued: ties go to the latest
    assert paths(result) == [[1, 2]] and result.turn_events == {0: "trimmed"}


def test_ids_reused_for_another_call_match_neither_reply():
    h = Harness()
    history = [SYSTEM, user(TASK)]
    h.call(history, issued(SHELL, "call_a"))
    history += [issued(SHELL, "call_a"), tool("1 failed", call_id="call_a")]
    h.call(history, issued(PATCH, "call_b"))
    # the harness sends turn 1's reply under turn 0's id: it claims to be a call it is not
    history += [issued(PATCH, "call_a"), tool("patched", call_id="call_a")]
    h.call(history, reply("Done."))
    result = replay(h)
    # turn 1's node is no candidate (the ids name turn 0) and turn 0's reply differs: a branch
    assert result.prompt_events[2] == "forked" and result.counters["unrecognized_echoes"] == 1
    assert paths(result) == [[0, 1], [0, 2]]
    assert result.counters["restored_echoes"] == 0  # the mislabelled reply was not taken for any stored one


def test_ids_a_gateway_issues_twice_identify_nothing():
    h = Harness()
    history = [SYSTEM, user(TASK)]
    h.call(history, issued(SHELL, "call_0"))
    h.call(history, issued(SHELL, "call_0"))  # a gateway numbering calls per reply: "call_0" again
    history += [issued(SHELL, "call_0"), tool("1 failed", call_id="call_0")]
    h.call(history, reply("Done."))
    assert paths(replay(h)) == [[1, 2]]


def test_a_genuine_edit_under_the_issued_id_is_not_attached():
    edited = issued(SHELL, "call_a")
    edited["tool_calls"][0]["function"]["arguments"] = json.dumps({"cmd": "make test TIMEOUT=5"})  # a hook
    result = replay(two_turns(issued(SHELL, "call_a"), edited), harness_profile="auto")
    assert result.prompt_events[1] == "new_root" and len(result.samples) == 2


# -- harness profiles ------------------------------------------------------------------------------
def profile_file(tmp_path, pattern: str = "cd {cwd} && ") -> str:
    profile = {
        "format": "trace-tools-harness-profile",
        "version": 1,
        "harness": {"name": "toy-harness", "version": "1.0", "protocol": "openai"},
        "transformations": [
            {"kind": "strip_prefix", "tool": "Shell", "argument": "cmd", "pattern": pattern, "count": 1, "of": 2},
        ],
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return str(path)


def without_prefix(message: dict, prefix: str) -> dict:
    out = copy.deepcopy(message)
    function = out["tool_calls"][0]["function"]
    function["arguments"] = json.dumps({"cmd": json.loads(function["arguments"])["cmd"].removeprefix(prefix)})
    return out


def test_a_prefix_the_profile_names_is_the_same_call(tmp_path):
    timed = reply("", ("Shell", {"cmd": "time make test"}), reasoning="Run the tests first.")
    h = two_turns(timed, without_prefix(timed, "time "))
    result = replay(h, harness_profile=profile_file(tmp_path, "time "))
    assert paths(result) == [[0, 1]] and result.prompt_events[1] == "restored"
    assert paths(replay(h, harness_profile="none")) == [[0], [1]]  # generic rules alone: a branch


def test_cd_into_the_announced_working_directory_is_a_generic_class():
    h = two_turns(SHELL, without_prefix(SHELL, f"cd {CWD} && "))
    assert paths(replay(h, harness_profile="none")) == [[0, 1]]


def test_the_prefix_rule_needs_the_announced_working_directory(tmp_path):
    elsewhere = reply("", ("Shell", {"cmd": "cd /fw/other && make test"}), reasoning="Run the tests first.")
    h = two_turns(elsewhere, without_prefix(elsewhere, "cd /fw/other && "))  # not a no-op: another directory
    assert len(replay(h, harness_profile=profile_file(tmp_path)).samples) == 2


def test_the_shipped_claude_code_profile_is_on_by_default():
    bash = reply("", ("Bash", {"command": f"cd {CWD} && make test"}), reasoning="Run the tests first.")
    echo = copy.deepcopy(bash)
    echo["tool_calls"][0]["function"]["arguments"] = {"command": "make test"}  # Anthropic: an object
    h = two_turns(bash, echo)
    assert paths(replay(h)) == [[0, 1]]
    assert paths(replay(h, harness_profile="none")) == [[0, 1]]  # `cd <cwd> && ` is a generic class
    other = copy.deepcopy(echo)
    other["tool_calls"][0]["function"]["arguments"] = {"command": "make test TIMEOUT=5"}
    assert len(replay(two_turns(bash, other)).samples) == 2


def test_a_profile_that_does_not_load_is_a_usage_error_before_any_work(tmp_path):
    with pytest.raises(UsageError, match="no harness profile"):
        check_params(["checkpoint-tree"], {"harness_profile": str(tmp_path / "missing.json")})
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(UsageError, match="not a trace-tools harness profile"):
        check_params(["checkpoint-tree"], {"harness_profile": str(tmp_path / "other.json")})
    assert check_params(["checkpoint-tree"], {"harness_profile": "claude-code-2.1.332"})


# -- reasoning a gateway returned as text ------------------------------------------------------------
def as_text(message: dict, separator: str = "") -> dict:
    out = {k: v for k, v in copy.deepcopy(message).items() if k != "reasoning_content"}
    out["content"] = message["reasoning_content"] + separator + message["content"]
    return out


@pytest.mark.parametrize("separator", ["", "\n\n"])
def test_reasoning_sent_back_as_text_is_the_same_reply(separator):
    result = replay(two_turns(PATCH, as_text(PATCH, separator)))
    assert paths(result) == [[0, 1]] and result.prompt_events[1] == "restored"


def test_text_that_only_starts_like_the_reasoning_is_not():
    changed = as_text(PATCH)
    changed["content"] = PATCH["reasoning_content"] + " Fixing it differently."
    assert len(replay(two_turns(PATCH, changed)).samples) == 2
