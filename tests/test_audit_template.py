"""`trace-tools audit-template`: template facts the strategies rely on, checked on real templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.errors import TemplateNotFound
from trace_tools.render import audit as audit_module
from trace_tools.render.renderer import Renderer
from trace_tools.render.templates import trl_template_dir
from trace_tools.report.audit_view import audit_templates as run_audit
from trace_tools.report.audit_view import markdown_table
from trace_tools.strategies.declarations import DECLARATIONS

SAMPLE = Path(__file__).parents[1] / "sample_traces" / "qwen3.parquet"
DOCS = Path(__file__).parents[1] / "docs" / "templates.md"


@pytest.fixture(scope="module")
def qwen3():
    [audit] = run_audit("qwen3")
    return audit


def test_qwen3_strips_earlier_reasoning_after_a_new_user_message_only(qwen3):
    check = qwen3.check("reasoning_history")
    assert check.status == "fail" and check.detail == "earlier reasoning stripped after a new user message"
    assert 0 < check.passed < check.total  # reasoning survives tool results (same user query)


def test_qwen3_last_assistant_gets_an_empty_think_block(qwen3):
    from trace_tools.render.renderer import Renderer

    renderer = Renderer.from_spec("qwen3", "qwen3")
    reply = {"role": "assistant", "content": "4"}
    last = renderer.render_text([{"role": "user", "content": "2+2?"}, reply], None, False)
    followed = renderer.render_text(
        [{"role": "user", "content": "2+2?"}, reply, {"role": "tool", "content": "ok"}], None, False
    )
    assert "<think>\n\n</think>" in last and "<think>" not in followed
    check = qwen3.check("last_assistant")
    assert check.status == "fail" and "a last text assistant renders differently" in check.detail
    assert "<think>\\n\\n</think>" in check.detail


def test_qwen3_failures_reach_exactly_the_strategies_that_rely_on_them(qwen3):
    assert {c.name for c in qwen3.checks if c.status == "fail"} >= {"prefix_stability", "reasoning_history"}
    assert qwen3.check("closer_text").detail == "closer '<|im_end|>\\n'"
    assert qwen3.failing["linear"] == ["prefix_stability", "last_assistant", "reasoning_history"]
    assert qwen3.failing["checkpoint-tree"] == [] and not qwen3.ok


def test_trl_prefix_preserving_patch_passes_what_qwen3_fails():
    [patched] = run_audit("trl:qwen3_training")
    for name in ("prefix_stability", "last_assistant", "reasoning_history", "generation_prompt"):
        assert patched.check(name).status == "pass", name
    assert patched.failing["linear"] == []


def test_qwen35_think_prompt_and_output_merge_newlines():
    [audit] = run_audit("qwen3.5")
    check = audit.check("tokenizer_merges")
    assert check.status == "fail" and "<think>\\n" in check.detail  # "<think>\n" + "\n</think>" encodes "\n\n" as one


def test_stand_in_tokenizer_is_said_and_skips_the_token_check():
    [audit] = run_audit("trl:llama3_1")
    assert audit.tokenizer == "qwen3" and "stands in" in audit.tokenizer_note
    assert audit.check("tokenizer_merges").status == "n/a"
    assert audit.check("closer_text").detail == "closer '<|eot_id|>'"


def test_every_strategy_relies_on_real_checks_and_the_docs_say_which(qwen3):
    assert list(qwen3.relies_on) == [d.name for d in DECLARATIONS]  # judged by default: every strategy
    docs = {}
    section = DOCS.read_text().split("## The checks")[1].split("\n## ")[0]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[2] != "relied on by":
            for check in cells[0].replace("`", "").split(", "):
                docs[check] = [] if cells[2] == "(informational)" else cells[2].split(", ")
    assert set(docs) == set(audit_module.CHECKS)
    for check, names in docs.items():
        assert names == [d.name for d in DECLARATIONS if check in d.relies_on], f"docs/templates.md row {check}"


def test_the_render_layer_judges_only_the_strategies_it_is_given():
    renderer = Renderer.from_spec("qwen3", "qwen3")
    audit = audit_module.audit_template(renderer, relies_on={"mine": ("closer_text",), "other": ("prefix_stability",)})
    assert audit.failing == {"mine": [], "other": ["prefix_stability"]} and not audit.ok
    with pytest.raises(ValueError, match="no such audit check: closers"):
        audit_module.audit_template(renderer, relies_on={"mine": ("closers",)})


def test_dump_embedded_template_works_without_trl(monkeypatch):
    monkeypatch.setattr("trace_tools.render.templates.trl_template_dir", lambda: None)
    [audit] = run_audit(str(SAMPLE))
    assert audit.tokenizer == "qwen3" and audit.template.startswith("dump:")
    assert audit.check("reasoning_history").status == "fail"
    with pytest.raises(TemplateNotFound, match="trl"):
        run_audit("trl:all")


@pytest.mark.parametrize("strategy,code", [("checkpoint-tree", 0), ("linear", 1)])
def test_exit_code_follows_the_chosen_strategies(strategy, code):
    result = CliRunner().invoke(app, ["audit-template", "--chat-template", str(SAMPLE), "-s", strategy])
    assert result.exit_code == code, result.output
    assert "prefix_stability" in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    # The last line says why the exit code is what it is, naming what failed (issue 40).
    last = " ".join(result.output.split()).rsplit("relies on: ", 1)[1]
    if code:
        assert "exit 1: a check a chosen strategy relies on fails (linear relies on prefix_stability" in last
    else:
        assert "exit 0: " in last and "prefix_stability" in last and "no chosen strategy relies on them" in last


def test_a_short_label_chooses_the_strategy_it_labels():
    result = CliRunner().invoke(app, ["audit-template", "--chat-template", str(SAMPLE), "-s", "ckpt"])
    assert result.exit_code == 0 and "checkpoint-tree" in result.output


def test_json_output_and_usage_errors():
    runner = CliRunner()
    result = runner.invoke(app, ["audit-template", "--chat-template", "qwen3", "--json", "-s", "chains"])
    data = json.loads(result.output)
    assert result.exit_code == 0 and data["ok"] is True
    assert {c["name"] for c in data["audits"][0]["checks"]} == set(audit_module.CHECKS)
    assert runner.invoke(app, ["audit-template", "--chat-template", "qwen3", "-s", "nope"]).exit_code == 2
    assert runner.invoke(app, ["audit-template"]).exit_code == 2
    assert runner.invoke(app, ["audit-template", "--chat-template", "no/such.jinja"]).exit_code == 2


@pytest.mark.slow
def test_every_trl_template_is_audited_and_docs_show_the_verdicts():
    audits = run_audit("trl:all")
    shipped = sorted(p.stem for p in trl_template_dir().glob("*.jinja"))
    assert [a.template.split()[0].removeprefix("trl:").removesuffix(".jinja") for a in audits] == shipped
    assert all(any(c.total for c in a.checks) for a in audits)  # every template rendered something
    assert markdown_table(audits) in DOCS.read_text()


def test_the_short_check_codes_are_explained_where_they_are_shown():
    from typer.testing import CliRunner

    from trace_tools.cli.main import app
    from trace_tools.report.audit_view import SHORT

    text = " ".join(CliRunner().invoke(app, ["audit-template", "--chat-template", "qwen3"]).output.split())
    relies = text.split("relies on: ", 1)[1]
    for name in ("generation_prompt", "prefix_stability", "closer_text", "tokenizer_merges"):
        assert f"{SHORT[name]} = {name}" in relies
