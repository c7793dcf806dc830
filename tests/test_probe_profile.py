"""The harness-profile detector on hand-built echo pairs whose transformations are known."""

from __future__ import annotations

import json

import pytest

from trace_tools.data import Session, Turn
from trace_tools.probe.differences import character_class
from trace_tools.probe.profile import EchoPair, detect, echo_pairs, read_profile, write_profile
from trace_tools.report.harness_profile import profile_rows, profile_table

CWD = "/work/repo"
EDIT_SCHEMA = [
    {
        "type": "function",
        "function": {
            "name": "Edit",
            "parameters": {"properties": {"file_path": {}, "old_string": {}, "new_string": {}, "replace_all": {}}},
        },
    }
]


def call(name, arguments, call_id="c1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply(*calls, content="", reasoning=None):
    message = {"role": "assistant", "content": content, "tool_calls": list(calls)}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def by_kind(profile, kind, **match):
    found = [
        t for t in profile["transformations"] if t["kind"] == kind and all(t.get(k) == v for k, v in match.items())
    ]
    assert len(found) == 1, (kind, match, [t["kind"] for t in profile["transformations"]])
    return found[0]


def claude_like_echo(served_args: dict) -> dict:
    """What the measured client does to an Edit: default first, new_string right-stripped (JS trimEnd)."""
    echoed = {"replace_all": served_args.get("replace_all", False)}
    for key in ("file_path", "old_string", "new_string"):
        echoed[key] = served_args[key]
    if not served_args["file_path"].endswith(".md"):
        echoed["new_string"] = "\n".join(
            line.rstrip(" \t\u00a0\u3000") for line in served_args["new_string"].split("\n")
        )
    return echoed


def test_edit_echo_names_the_default_the_order_the_stripped_characters_and_the_markdown_exception():
    served = [
        {"file_path": f"{CWD}/a.py", "old_string": "x = 1  \ny = 2", "new_string": "x = 3\u00a0\ny = 4\t"},
        {
            "file_path": f"{CWD}/b.py",
            "new_string": "z = 5\u3000\u200b\nw = 1 ",
            "old_string": "z = 6  ",
            "replace_all": False,
        },
        {"file_path": f"{CWD}/README.md", "old_string": "Title", "new_string": "Title  \nmore  "},
    ]
    pairs = [
        EchoPair(
            reply(call("Edit", s, f"c{i}")), reply(call("Edit", claude_like_echo(s), f"c{i}")), "s", i, CWD, EDIT_SCHEMA
        )
        for i, s in enumerate(served)
    ]
    profile = detect(pairs, {"name": "fake", "version": "1"})
    added = by_kind(profile, "add_key", tool="Edit", key="replace_all")
    assert (added["value"], added["count"], added["of"]) == (False, 2, 3) and added["values_constant"]
    order = by_kind(profile, "key_order", tool="Edit")
    assert order["rules"] == ["fixed_order"]
    assert order["fixed_orders"] == {
        "file_path,new_string,old_string,replace_all": ["replace_all", "file_path", "old_string", "new_string"]
    }
    strip = by_kind(profile, "rstrip_lines", tool="Edit", argument="new_string")
    assert strip["count"] == 2 and strip["of"] == 3
    assert strip["characters"] == ['U+0009 "\\t"', 'U+0020 " "', 'U+00A0 "\\u00a0"']
    assert strip["kept_characters"] == ['U+200B "\\u200b"']  # the zero-width space stopped the strip
    assert strip["except_file_types"] == [".md"] and strip["character_class"] == "javascript-trimEnd"
    assert strip["example"]["served"] == served[0]["new_string"] and strip["example"]["echoed"] == "x = 3\ny = 4"
    verbatim = by_kind(profile, "kept_verbatim", tool="Edit", argument="old_string")
    assert verbatim["count"] == 2  # old_string carried trailing blanks twice and was never touched
    assert not [t for t in profile["transformations"] if t.get("argument") == "file_path"]


def test_cd_prefix_into_the_working_directory_is_named_as_a_pattern_other_directories_apart():
    pairs = [
        EchoPair(
            reply(call("Bash", {"command": f"cd {CWD} && pytest -q"})),
            reply(call("Bash", {"command": "pytest -q"})),
            "s",
            0,
            CWD,
        ),
        EchoPair(
            reply(call("Bash", {"command": f"cd {CWD}/sub && ls"})), reply(call("Bash", {"command": "ls"})), "s", 1, CWD
        ),
        EchoPair(
            reply(call("Bash", {"command": "git status"})), reply(call("Bash", {"command": "git status"})), "s", 2, CWD
        ),
    ]
    profile = detect(pairs)
    own = by_kind(profile, "strip_prefix", tool="Bash", pattern="cd {cwd} && ")
    other = by_kind(profile, "strip_prefix", tool="Bash", pattern="cd {other directory} && ")
    assert (own["count"], own["of"], other["count"]) == (1, 3, 1)
    assert own["example"]["prefix"] == f"cd {CWD} && "


def test_rewrites_that_are_not_whitespace_or_prefixes_are_shown_as_a_diff():
    served, echoed = (
        reply(call("Write", {"file_path": "/a.txt", "content": "one\ntwo\n"})),
        reply(call("Write", {"file_path": "/a.txt", "content": "one\nTWO\n"})),
    )
    profile = detect([EchoPair(served, echoed)])
    rewrite = by_kind(profile, "rewritten", tool="Write", argument="content")
    assert "-two\n+TWO\n" in rewrite["example"]["diff"]


def test_reasoning_dropped_text_rewritten_ids_rewritten_and_keys_removed():
    served = reply(call("Read", {"file_path": "/a", "limit": 5}, "toolu_1"), content="Reading.", reasoning="think")
    echoed = {"role": "assistant", "content": "Reading it.", "tool_calls": [call("Read", {"file_path": "/a"}, "other")]}
    profile = detect([EchoPair(served, echoed, "s", 0)])
    kinds = {t.get("what") for t in profile["transformations"] if t["kind"] == "message"}
    assert {"reasoning.dropped", "text.rewritten", "call_ids.rewritten"} <= kinds
    removed = by_kind(profile, "remove_key", tool="Read", key="limit")
    assert removed["example"]["value"] == 5


def test_openai_argument_text_reserialized_and_message_keys_added():
    served = {"role": "assistant", "content": None, "tool_calls": [call("bash", '{"command": "ls"}')]}
    echoed = {
        "role": "assistant",
        "content": None,
        "function_call": None,
        "tool_calls": [call("bash", '{"command":"ls"}')],
    }
    profile = detect([EchoPair(served, echoed)])
    assert by_kind(profile, "arguments_reserialized", tool="bash")["example"]["echoed"] == '{"command":"ls"}'
    assert by_kind(profile, "message", what="message_key_added.function_call")["count"] == 1
    assert not [t for t in profile["transformations"] if t.get("argument") == "command"]


def test_character_class_tells_javascript_trim_from_python_rstrip():
    assert character_class({" ", "\u00a0", "\ufeff"}, {"\u0085", "\u200b"}) == "javascript-trimEnd"
    assert character_class({" ", "\u0085"}, {"\u200b"}) == "python-rstrip"
    assert character_class({" "}, {"\t"}) == "custom"


def test_echo_pairs_pair_each_reply_with_its_first_echo_by_id_else_by_position():
    first = reply(call("Bash", {"command": "ls  "}, "toolu_a"), reasoning="r")
    final = {"role": "assistant", "content": "done"}
    turns = [
        Turn("s", 0, [{"role": "user", "content": "go"}], [1], response=first),
        Turn(
            "s",
            1,
            [
                {"role": "user", "content": "go"},
                reply(call("Bash", {"command": "ls"}, "toolu_a"), reasoning="r"),
                {"role": "tool", "content": "x"},
            ],
            [2],
            response=final,
        ),
        Turn(
            "s",
            2,
            [
                {"role": "user", "content": "go"},
                reply(call("Bash", {"command": "ls"}, "toolu_a"), reasoning="r"),
                {"role": "tool", "content": "x"},
                {"role": "assistant", "content": "done!"},
                {"role": "user", "content": "more"},
            ],
            [3],
        ),
    ]
    pairs = list(echo_pairs([Session("s", turns)], {"s": CWD}))
    assert [(p.turn, p.echoed.get("content")) for p in pairs] == [(0, ""), (1, "done!")]
    profile = detect(pairs)
    assert by_kind(profile, "rstrip_lines", tool="Bash", argument="command")["count"] == 1
    assert by_kind(profile, "message", what="text.rewritten")["count"] == 1


def test_profile_file_round_trips_and_renders_as_a_table(tmp_path):
    pairs = [
        EchoPair(
            reply(call("Bash", {"command": f"cd {CWD} && ls"})), reply(call("Bash", {"command": "ls"})), "s", 0, CWD
        )
    ]
    profile = detect(pairs, {"name": "fake", "version": "1.0", "protocol": "openai"}, {"sessions": 1})
    path = write_profile(profile, tmp_path / "profile.json")
    assert read_profile(path) == json.loads(path.read_text())
    rows = profile_rows(profile)
    assert any(r["what"] == "prefix removed: 'cd {cwd} && '" and (r["count"], r["of"]) == (1, 1) for r in rows)
    from rich.console import Console

    console = Console(width=80, record=True)
    console.print(profile_table(profile))
    assert all(len(line) <= 80 for line in console.export_text().splitlines())
    path.write_text(json.dumps({**profile, "version": 99}))
    with pytest.raises(Exception, match="version 99"):
        read_profile(path)


def test_report_html_shows_a_run_directorys_harness_profile(sample_run, tmp_path):
    import shutil

    from trace_tools.report.html import render_html

    run = tmp_path / "run"
    shutil.copytree(sample_run.run_dir, run)
    assert 'id="harness-profile"' not in render_html(run)
    served = {"file_path": f"{CWD}/a.py", "content": "x = 1\u00a0\n"}
    pairs = [
        EchoPair(reply(call("Write", served)), reply(call("Write", {**served, "content": "x = 1\n"})), "s", 3, CWD)
    ]
    write_profile(detect(pairs, {"name": "fake", "version": "9.9"}, {"sessions": 1}), run / "profile.json")
    page = render_html(run)
    assert 'id="harness-profile"' in page and "harness profile: fake 9.9" in page
    assert "trailing whitespace stripped per line: U+00A0" in page
    assert "x = 1\\u00a0" in page  # the served example, its invisible character made visible


def test_reasoning_sent_back_as_text_is_one_finding_with_its_separator():
    served = reply(call("Read", {"file_path": "/a"}, "toolu_1"), content="Reading.", reasoning="Look first.")
    echoed = reply(call("Read", {"file_path": "/a"}, "toolu_1"), content="Look first.Reading.")
    only_calls = reply(call("Read", {"file_path": "/b"}, "toolu_2"), reasoning="Then b.")
    echoed_calls = reply(call("Read", {"file_path": "/b"}, "toolu_2"), content="Then b.")
    profile = detect([EchoPair(served, echoed, "s", 0), EchoPair(only_calls, echoed_calls, "s", 1)])
    moved = by_kind(profile, "message", what="reasoning.moved_to_text")
    assert (moved["count"], moved["of"], moved["separator"]) == (2, 2, "")
    kinds = {t.get("what") for t in profile["transformations"] if t["kind"] == "message"}
    assert not kinds & {"reasoning.dropped", "text.rewritten", "text.added"}


def test_a_measured_profile_replays_the_echoes_it_was_measured_on():
    """The detector's output, applied by the simulator's machinery, gives back every echo exactly."""
    from trace_tools.render.harness_echo import HarnessEcho

    served = [
        {"file_path": f"{CWD}/a.py", "old_string": "x = 1  ", "new_string": "x = 3\u00a0 \ny = 4\t"},
        {"file_path": f"{CWD}/README.md", "old_string": "Title", "new_string": "Title  \nmore  "},
    ]
    pairs = [
        EchoPair(
            reply(call("Edit", s, f"c{i}")), reply(call("Edit", claude_like_echo(s), f"c{i}")), "s", i, CWD, EDIT_SCHEMA
        )
        for i, s in enumerate(served)
    ]
    bash = reply(call("Bash", {"command": f"cd {CWD} && ls"}, "c9"))
    pairs.append(EchoPair(bash, reply(call("Bash", {"command": "ls"}, "c9")), "s", 9, CWD))
    harness = HarnessEcho(detect(pairs, {"name": "fake", "version": "1", "protocol": "anthropic"}))
    assert not harness.unsupported
    for pair in pairs:
        assert json.dumps(harness.echo(pair.served, CWD)) == json.dumps(pair.echoed)  # key order included
    assert harness.echo(pairs[-1].served, "/elsewhere") == pairs[-1].served  # the prefix is only cd {cwd}


def test_a_profile_with_free_rewrites_cannot_be_simulated(tmp_path):
    from trace_tools.errors import UsageError
    from trace_tools.simulate import playable_profile

    served, echoed = (
        reply(call("Write", {"file_path": "/a.txt", "content": "one\ntwo\n"})),
        reply(call("Write", {"file_path": "/a.txt", "content": "one\nTWO\n"})),
    )
    path = write_profile(detect([EchoPair(served, echoed)], {"name": "fake", "version": "1"}), tmp_path / "p.json")
    with pytest.raises(UsageError, match="Write.content: rewritten"):
        playable_profile(str(path))
