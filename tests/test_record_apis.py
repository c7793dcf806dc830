"""`trace-tools record` speaking the OpenAI Responses API (Codex CLI) and Google's Gemini API
(Gemini CLI), driven by the official `openai` and `google-genai` client libraries: JSON and
streamed replies carry the tool calls, the rows are faithful (prompt ids are the render of the
recorded messages), a multi-turn tool loop echoes back into the recorded history, and malformed
bodies are 4xx in the API's own error shape."""

from __future__ import annotations

import json

import httpx  # the raw requests (the test extra has it)
import openai  # the official clients (the test extra has them)
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from test_record import EDIT_ARGS, OPENAI_TOOLS, SCRIPT, _wait_rows
from trace_tools.record import make_renderer, open_recorder
from trace_tools.record.script import Script, ScriptBook, ScriptCall, ScriptTurn
from trace_tools.render.canonical import canonicalize_messages

BASH_ARGS = {"command": "cd /repo && ls", "description": "List"}
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in OPENAI_TOOLS]
GEMINI_TOOLS = [{"functionDeclarations": [tool["function"] for tool in OPENAI_TOOLS]}]


@pytest.fixture(scope="module")
def renderer():
    return make_renderer("qwen3")


@pytest.fixture()
def recorder(tmp_path):
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": SCRIPT})) as running:
        yield running


def _faithful(row, renderer) -> None:
    assert row.prompt_ids == renderer.render(canonicalize_messages(row.messages), row.tools, True)


# -- the Responses API ------------------------------------------------------------------------------
def _responses(recorder, session: str):
    return openai.OpenAI(base_url=f"{recorder.url}/s/{session}/v1", api_key="dummy", max_retries=0).responses


def test_responses_json_reply_carries_reasoning_text_and_function_calls(recorder, renderer, tmp_path):
    reply = _responses(recorder, "r1").create(
        model="m", instructions="You edit code.", input="fix it", tools=RESPONSES_TOOLS, store=False
    )
    assert [item.type for item in reply.output] == ["reasoning", "message", "function_call", "function_call"]
    assert reply.output[0].content[0].text == "Look, then edit." and reply.output[0].encrypted_content
    assert reply.output_text == "Editing a.py." and reply.status == "completed"
    edit, bash = reply.output[2], reply.output[3]
    assert (edit.name, json.loads(edit.arguments)) == ("Edit", EDIT_ARGS) and list(json.loads(edit.arguments)) == list(
        EDIT_ARGS
    )
    assert (bash.name, json.loads(bash.arguments)) == ("Bash", BASH_ARGS)
    (row,) = _wait_rows(tmp_path / "rec", 1)
    _faithful(row, renderer)
    assert row.messages == [{"role": "system", "content": "You edit code."}, {"role": "user", "content": "fix it"}]
    assert row.tools == OPENAI_TOOLS
    assert [call["id"] for call in row.response["tool_calls"]] == [edit.call_id, bash.call_id]
    assert row.finish_reason == "tool_calls" and row.metadata["protocol"] == "responses"
    assert reply.usage.input_tokens == len(row.prompt_ids) and reply.usage.output_tokens == len(row.output_ids)


def test_responses_stream_sends_the_real_event_sequence(recorder, tmp_path):
    with _responses(recorder, "r2").stream(model="m", input="go", tools=RESPONSES_TOOLS) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for kind in (
        "response.reasoning_text.delta",
        "response.content_part.added",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ):
        assert kind in kinds
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    assert final.output_text == "Editing a.py."
    calls = [item for item in final.output if item.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [EDIT_ARGS, BASH_ARGS]
    (row,) = _wait_rows(tmp_path / "rec", 1)
    assert row.metadata["stream"] is True and row.response["content"] == "Editing a.py."


def test_responses_tool_loop_echoes_codex_style_full_input(recorder, renderer, tmp_path):
    """Codex CLI sends the whole conversation each turn with store: false: developer messages, the
    reasoning item (here as a client that keeps only its summary and encrypted_content sends it),
    the calls as function_call items, the results as function_call_output items."""
    client = _responses(recorder, "loop")
    history: list = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
    ]
    first = client.create(model="m", instructions="You edit code.", input=history, tools=RESPONSES_TOOLS, store=False)
    for item in first.output:
        echoed = item.model_dump(exclude_none=True)
        if item.type == "reasoning":
            echoed.pop("content")  # the reasoning must come back through the sealed encrypted_content
        history.append(echoed)
    history += [
        {"type": "function_call_output", "call_id": item.call_id, "output": "ok"}
        for item in first.output
        if item.type == "function_call"
    ]
    second = client.create(model="m", instructions="You edit code.", input=history, tools=RESPONSES_TOOLS, store=False)
    assert second.output_text == "All done."
    first_row, second_row = _wait_rows(tmp_path / "rec", 2)
    _faithful(second_row, renderer)
    assert [m["role"] for m in second_row.messages] == ["system", "developer", "user", "assistant", "tool", "tool"]
    echo = second_row.messages[3]
    assert echo["reasoning_content"] == "Look, then edit." and echo["content"] == "Editing a.py."
    assert [c["id"] for c in echo["tool_calls"]] == [c["id"] for c in first_row.response["tool_calls"]]
    assert [json.loads(c["function"]["arguments"]) for c in echo["tool_calls"]] == [EDIT_ARGS, BASH_ARGS]
    assert second_row.metadata["script_turn"] == 1
    # The echo renders as the turn that was served: the first prompt plus the served output is a prefix.
    assert second_row.prompt_ids[: len(first_row.prompt_ids)] == first_row.prompt_ids


CODEX_SHELL = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command in a PTY.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}}},
    }
]


def test_a_codex_style_responses_session_yields_one_echo_per_served_reply(tmp_path, renderer):
    """Codex CLI's shape: calls alone (no message item), echoed back as the items it received. The
    profile pairs every echo by call id and reports no rewrite the client did not make."""
    from trace_tools.probe.profile import detect_from_dump

    cmds = ["cat calc/stats.py", "python3 -m unittest -q\t"]
    turns = [ScriptTurn(f"Step {i}.", "", (ScriptCall("exec_command", {"cmd": cmd}),)) for i, cmd in enumerate(cmds)]
    script = Script("codex-like", turns, ScriptTurn("", "Done."))
    with open_recorder(tmp_path / "rec", script=ScriptBook({"*": script})) as running:
        client, history = _responses(running, "cx"), [{"role": "user", "content": "fix it"}]
        for _ in range(len(cmds) + 1):
            reply = client.create(model="m", instructions="Codex.", input=history, tools=CODEX_SHELL, store=False)
            history += [item.model_dump(exclude_none=True) for item in reply.output]
            history += [
                {"type": "function_call_output", "call_id": item.call_id, "output": "ok"}
                for item in reply.output
                if item.type == "function_call"
            ]
    assert reply.output_text == "Done."
    rows = _wait_rows(tmp_path / "rec", len(cmds) + 1)
    echo = rows[1].messages[2]
    assert echo["content"] is None and echo["tool_calls"][0]["id"] == rows[0].response["tool_calls"][0]["id"]
    assert rows[1].prompt_ids[: len(rows[0].prompt_ids)] == rows[0].prompt_ids
    profile = detect_from_dump(tmp_path / "rec" / "dump", harness="codex", version="t", protocol="openai-responses")
    assert profile["measured"]["echoes"] == len(cmds) and profile["measured"]["calls"] == {"exec_command": len(cmds)}
    kinds = {t["what"] for t in profile["transformations"] if t["kind"] == "message"}
    assert "call_ids.kept" in kinds and "text.empty_representation_changed" not in kinds
    assert profile["tools"]["exec_command"]["arguments"]["cmd"]["unchanged"]["count"] == len(cmds)


def test_responses_refuses_previous_response_id_and_malformed_input(recorder, tmp_path):
    client = _responses(recorder, "bad")
    with pytest.raises(openai.BadRequestError, match="send the whole conversation") as refused:
        client.create(model="m", input="go", previous_response_id="resp_123")
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]: has type \"image_generation_call\""):
        client.create(model="m", input=[{"type": "image_generation_call", "id": "x"}])
    reply = httpx.post(
        f"{recorder.url}/v1/responses", json={"model": "m", "input": [{"role": "wizard", "content": "x"}]}
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "input[0].role" and "wizard" in reply.json()["error"]["message"]
    assert httpx.get(f"{recorder.url}/v1/responses").status_code == 404  # no WebSocket transport (docs/probe.md)
    reply = httpx.post(f"{recorder.url}/v1/responses", content=b"{not json")
    assert reply.status_code == 400 and "not UTF-8 JSON" in reply.json()["error"]["message"]
    assert not list((tmp_path / "rec" / "dump").rglob("*.parquet"))


def test_responses_non_function_tools_are_named_not_rendered(recorder, renderer, tmp_path):
    tools = [*RESPONSES_TOOLS, {"type": "local_shell"}, {"type": "custom", "name": "apply_patch", "description": "p"}]
    _responses(recorder, "tools").create(model="m", input="go", tools=tools)
    (row,) = _wait_rows(tmp_path / "rec", 1)
    assert row.tools == OPENAI_TOOLS and row.metadata["unrendered_tools"] == ["local_shell", "custom:apply_patch"]
    _faithful(row, renderer)


# -- the Gemini API -------------------------------------------------------------------------------------
def _gemini(recorder, session: str):
    options = genai_types.HttpOptions(base_url=f"{recorder.url}/s/{session}", api_version="v1beta")
    return genai.Client(api_key="dummy", http_options=options)  # keep it: a collected Client closes its connection


def _config(**extra):
    return genai_types.GenerateContentConfig(
        system_instruction="You edit code.",
        tools=[genai_types.Tool(function_declarations=GEMINI_TOOLS[0]["functionDeclarations"])],
        automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True),
        **extra,
    )


def test_gemini_json_reply_carries_thought_text_and_function_calls(recorder, renderer, tmp_path):
    client = _gemini(recorder, "g1")
    reply = client.models.generate_content(model="gemini-2.5-pro", contents="fix it", config=_config())
    parts = reply.candidates[0].content.parts
    assert parts[0].thought and parts[0].text == "Look, then edit." and parts[1].text == "Editing a.py."
    calls = reply.function_calls
    assert [(c.name, c.args) for c in calls] == [("Edit", EDIT_ARGS), ("Bash", BASH_ARGS)] and list(
        calls[0].args
    ) == list(EDIT_ARGS)
    assert reply.candidates[0].finish_reason == genai_types.FinishReason.STOP
    (row,) = _wait_rows(tmp_path / "rec", 1)
    _faithful(row, renderer)
    assert row.messages == [{"role": "system", "content": "You edit code."}, {"role": "user", "content": "fix it"}]
    assert [t["function"]["name"] for t in row.tools] == ["Edit", "Bash"]
    assert row.tools[0]["function"]["parameters"]["properties"]["file_path"] == {"type": "string"}
    assert row.metadata["protocol"] == "gemini" and row.metadata["model"] == "gemini-2.5-pro"
    assert row.response["tool_calls"][0]["function"]["arguments"] == EDIT_ARGS and row.finish_reason == "tool_calls"
    usage = reply.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count) == (len(row.prompt_ids), len(row.output_ids))


def test_gemini_stream_and_tool_loop_echo(recorder, renderer, tmp_path):
    """gemini-cli's loop: stream a turn (alt=sse), run the calls, send the model content back with
    one functionResponse part per call."""
    client = _gemini(recorder, "g2")
    models = client.models
    contents = [genai_types.Content(role="user", parts=[genai_types.Part(text="fix it")])]
    chunks = list(models.generate_content_stream(model="gemini-2.5-pro", contents=contents, config=_config()))
    assert len(chunks) == 4 and chunks[-1].candidates[0].finish_reason == genai_types.FinishReason.STOP
    assert chunks[-1].usage_metadata.total_token_count > 0
    parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts]
    calls = [part.function_call for part in parts if part.function_call]
    assert [(c.name, c.args) for c in calls] == [("Edit", EDIT_ARGS), ("Bash", BASH_ARGS)]
    contents.append(genai_types.Content(role="model", parts=parts))
    answers = [
        genai_types.Part(
            function_response=genai_types.FunctionResponse(id=c.id, name=c.name, response={"output": "ok"})
        )
        for c in calls
    ]
    contents.append(genai_types.Content(role="user", parts=answers))
    final = models.generate_content(model="gemini-2.5-pro", contents=contents, config=_config())
    assert final.text == "All done."
    first_row, second_row = _wait_rows(tmp_path / "rec", 2)
    assert first_row.metadata["stream"] is True
    _faithful(second_row, renderer)
    assert [m["role"] for m in second_row.messages] == ["system", "user", "assistant", "tool", "tool"]
    echo = second_row.messages[2]
    assert echo["reasoning_content"] == "Look, then edit." and echo["content"] == "Editing a.py."
    assert [c["id"] for c in echo["tool_calls"]] == [c["id"] for c in first_row.response["tool_calls"]]
    assert second_row.messages[3] == {
        "role": "tool",
        "tool_call_id": calls[0].id,
        "name": "Edit",
        "content": '{"output": "ok"}',
    }
    assert second_row.prompt_ids[: len(first_row.prompt_ids)] == first_row.prompt_ids


def test_gemini_openapi_schema_types_are_lowered(recorder, renderer, tmp_path):
    declaration = genai_types.FunctionDeclaration(
        name="Bash",
        description="Run a command",
        parameters=genai_types.Schema(type="OBJECT", properties={"command": genai_types.Schema(type="STRING")}),
    )
    client = _gemini(recorder, "schema")
    config = genai_types.GenerateContentConfig(tools=[genai_types.Tool(function_declarations=[declaration])])
    client.models.generate_content(model="gemini-2.5-pro", contents="go", config=config)
    (row,) = _wait_rows(tmp_path / "rec", 1)
    assert row.tools == [BASH_SCHEMA]
    _faithful(row, renderer)


BASH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


def test_gemini_count_tokens_counts_the_rendered_prompt(recorder, renderer):
    client = _gemini(recorder, "c")
    counted = client.models.count_tokens(model="gemini-2.5-pro", contents="go")
    assert counted.total_tokens == len(renderer.render([{"role": "user", "content": "go"}], None, True))
    wrapped = {
        "contents": [{"role": "user", "parts": [{"text": "go"}]}],
        "tools": [{"functionDeclarations": [BASH_SCHEMA["function"]]}],
    }
    reply = httpx.post(f"{recorder.url}/v1beta/models/m:countTokens", json={"generateContentRequest": wrapped})
    assert reply.json() == {
        "totalTokens": len(renderer.render([{"role": "user", "content": "go"}], [BASH_SCHEMA], True))
    }


def test_gemini_malformed_requests_are_400_in_gemini_shape(recorder, tmp_path):
    url = f"{recorder.url}/v1beta/models/gemini-2.5-pro:generateContent"
    bad_part = {"contents": [{"role": "user", "parts": [{"functionCall": "Edit"}]}]}
    reply = httpx.post(url, json=bad_part)
    assert reply.status_code == 400
    assert reply.json()["error"] == {
        "code": 400,
        "message": 'contents[0].parts[0].functionCall: must be an object, not a string "Edit"',
        "status": "INVALID_ARGUMENT",
    }
    client = _gemini(recorder, "bad")
    robot = genai_types.Content(role="robot", parts=[genai_types.Part(text="x")])
    with pytest.raises(
        genai_errors.ClientError, match=r"contents\[0\]\.role: must be one of user, model, function"
    ) as refused:
        client.models.generate_content(model="gemini-2.5-pro", contents=[robot])
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
    reply = httpx.post(url, json={"contents": []})
    assert reply.status_code == 400 and "contents: must be a non-empty array" in reply.json()["error"]["message"]
    assert httpx.post(f"{recorder.url}/v1beta/models/m:explode", json={}).status_code == 404
    assert not list((tmp_path / "rec" / "dump").rglob("*.parquet"))
    null_text = {
        "contents": [{"role": "model", "parts": [{"text": None}]}, {"parts": [{"text": None}, {"text": "go"}]}]
    }
    assert httpx.post(url, json=null_text).status_code == 200  # a null text is no text, not a 500


def test_side_requests_are_answered_in_each_api_logged_with_their_kind_and_never_a_turn(recorder, tmp_path):
    """`record` answers the clients' own side requests (opencode's title over Chat Completions, a
    Qwen Code memory pass over Responses, Gemini CLI's next-speaker check) and records only the turn."""
    from trace_tools.record.side_requests import side_request_counts

    chat = openai.OpenAI(base_url=f"{recorder.url}/s/side/v1", api_key="dummy", max_retries=0).chat.completions
    title = chat.create(
        model="m",
        messages=[
            {"role": "system", "content": "You are a title generator. Output ONLY a title."},
            {"role": "user", "content": "fix"},
        ],
    )
    assert title.choices[0].message.content == "Scripted session"
    memory = _responses(recorder, "side").create(
        model="m", instructions="You are now acting as the managed memory extraction subagent.", input="go"
    )
    assert memory.output_text == "Nothing to add." and memory.status == "completed"
    check = "Analyze the response above. Based strictly on that response, determine who should logically speak next."
    gemini_client = _gemini(recorder, "side")
    speaker = gemini_client.models.generate_content(model="gemini-2.5-pro", contents=check)
    assert json.loads(speaker.text)["next_speaker"] == "user"
    turn = chat.create(model="m", messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS)
    assert turn.choices[0].message.tool_calls  # the script starts at the session's first real turn
    (row,) = _wait_rows(tmp_path / "rec", 1)
    assert row.metadata["script_turn"] == 0 and recorder.recorder.stats.side_requests == 3
    log = tmp_path / "rec" / "requests.jsonl"
    assert side_request_counts(log) == {"memory_extraction": 1, "next_speaker": 1, "title": 1}


def test_conversions_keep_the_order_and_the_reasoning_a_client_sends():
    """Gemini: a text part after the tool results stays after them (a user message between an
    assistant's calls and their results would break the chat template's tool turn). Responses: a
    reasoning item another server issued tells its summary; one the recorder sealed, its text."""
    from trace_tools.record import gemini, responses

    contents = [
        {"role": "model", "parts": [{"functionCall": {"name": "Bash", "args": {"command": "ls"}}}]},
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "Bash", "response": {"output": "a.py"}}}, {"text": "go on"}],
        },
    ]
    assert [m["role"] for m in gemini.request_messages({"contents": contents})] == ["assistant", "tool", "user"]
    foreign = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}], "encrypted_content": "gAAA"}
    sealed = {"type": "reasoning", "summary": [], "encrypted_content": responses.seal("Look, then edit.")}
    call = {"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": '{"command": "ls"}'}
    for item, reasoning in ((foreign, "Plan."), (sealed, "Look, then edit.")):
        (assistant,) = responses.request_messages({"input": [item, call]})
        assert assistant["reasoning_content"] == reasoning and assistant["tool_calls"][0]["id"] == "c1"
