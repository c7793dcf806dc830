"""Strategies declared once (issue 24): every view of a strategy derives from its declaration."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import typer.main
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.errors import TraceToolsError
from trace_tools.report.layout import legend
from trace_tools.report.render import counterfactual_names
from trace_tools.strategies import declarations
from trace_tools.strategies.base import Strategy
from trace_tools.strategies.builtin import CLASSES
from trace_tools.strategies.declarations import DECLARATIONS, TREE, Declaration, label, relies_on
from trace_tools.strategies.registry import REGISTRY, available_strategies, get_strategy, register


def test_each_builtin_class_carries_its_own_declaration_in_column_order():
    assert [cls.__dict__["declaration"] for cls in CLASSES] == list(DECLARATIONS)
    assert available_strategies()[: len(DECLARATIONS)] == [d.name for d in DECLARATIONS]
    for cls in CLASSES:
        declared = cls.declaration
        assert get_strategy(declared.name) is cls
        assert (cls.name, cls.params, cls.counterfactual, cls.renders_prompts, cls.upstream_system) == (
            declared.name,
            declared.params,
            declared.counterfactual,
            declared.renders_prompts,
            declared.upstream_system,
        )


def test_the_declared_facts_are_those_of_each_strategy():
    assert [d.name for d in DECLARATIONS if d.counterfactual] == [
        "echo-restore",
        "linear",
        "linear+restore",
        "chains",
        "session-v1",
        "session-v2",
        "checkpoint-tree",
        "continuation",
        "areal",
    ]
    assert [d.name for d in DECLARATIONS if not d.renders_prompts] == ["tree", "linear-chain", "message-graph"]
    assert [label(d.name) for d in DECLARATIONS] == [
        "tree",
        "restore",
        "linear",
        "lin+rst",
        "chains",
        "sess-v1",
        "sess-v2",
        "ckpt",
        "contin",
        "lchain",
        "graph",
        "areal",
    ]
    assert relies_on(["checkpoint-tree"]) == {"checkpoint-tree": ("closer_text", "closer_tool")}
    assert relies_on(["chains"])["chains"] == ("generation_prompt", "tokenizer_merges")


def test_choice_vocabularies_are_the_implementations_keys():
    from trace_tools.strategies.session_core.matchers import MATCHERS
    from trace_tools.strategies.session_core.tito import FAMILIES

    assert declarations.SESSION_MATCHERS == tuple(MATCHERS)
    assert declarations.TITO_FAMILIES == tuple(FAMILIES)


def test_report_views_read_the_declarations():
    assert legend(["tree", "echo-restore", "mine"]) == "labels: restore = echo-restore"
    summary = {"strategies": {"tree": {}, "linear": {}, "checkpoint-tree": {}, "not-built-in": {}}}
    assert counterfactual_names(summary) == ["linear", "checkpoint-tree"]


def test_replay_offers_one_flag_per_flagged_parameter_with_a_derived_help():
    command = typer.main.get_command(app).commands["replay"]
    options = {param.name: param for param in command.params}
    flagged = [p for p in declarations.builtin_params().values() if p.flag]
    assert {p.name for p in flagged} == {
        "fork_threshold",
        "realign_gate",
        "realign_from",
        "on_nonlinear",
        "matcher",
        "rollback",
        "retries",
        "echo_rules",
        "on_break",
        "areal_export",
        "harness_profile",
    }
    for param in flagged:
        assert param.name in options and "flags" not in options
        assert options[param.name].help.startswith(", ".join(declarations.owners(param.name)) + ": " + param.help)
    assert options["rollback"].opts == ["--rollback"] and options["rollback"].secondary_opts == ["--no-rollback"]
    assert all(name in options["param"].help for name in declarations.builtin_params())


def test_flag_values_reach_the_library_as_strategy_params(monkeypatch, tmp_path):
    seen = {}

    def fake_replay(dump, **kwargs):
        seen.update(kwargs["params"])
        raise TraceToolsError("stop here")

    monkeypatch.setattr("trace_tools.api.replay", fake_replay)
    args = [
        "replay",
        str(tmp_path),
        "--out",
        str(tmp_path / "run"),
        "--fork-threshold",
        "3",
        "--no-rollback",
        "--matcher",
        "loose_tool_call",
        "--param",
        "delta=false",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen == {
        "fork_threshold": 3,
        "realign_gate": None,
        "realign_from": None,
        "on_nonlinear": None,
        "rollback": False,
        "matcher": "loose_tool_call",
        "retries": None,
        "echo_rules": None,
        "harness_profile": None,
        "on_break": None,
        "delta": "false",
        "areal_export": None,
    }


def test_help_reads_declarations_without_loading_a_strategy():
    code = (
        "import sys; from typer.testing import CliRunner; from trace_tools.cli.main import app; "
        "r = CliRunner().invoke(app, ['replay', '--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m.startswith('trace_tools.strategies')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['trace_tools.strategies', 'trace_tools.strategies.declarations']"


def test_a_registered_strategy_brings_its_own_declaration():
    class Variant(Strategy):
        declaration = replace(TREE, name="test-variant", label="variant")

    class Undeclared(Variant):
        pass

    with pytest.raises(TypeError, match="no declaration of its own"):
        register(Undeclared)
    with pytest.raises(ValueError, match="built in"):
        register(type("Clash", (Strategy,), {"declaration": Declaration("tree", "t", "")}))
    register(Variant)
    try:
        assert get_strategy("test-variant") is Variant and available_strategies()[-1] == "test-variant"
        assert Variant.params == TREE.params
    finally:
        REGISTRY.pop("test-variant")


def test_declared_counters_cover_every_counter_a_strategy_counts_on_the_sample(sample_run):
    """Reports print n/a for a counter a strategy does not declare: none it actually counts may be missing."""
    for name, block in sample_run.summary["strategies"].items():
        counted = {c for c, n in block["counters"].items() if n}
        assert counted <= set(declarations.BY_NAME[name].counters), name
    assert "nonlinear" in declarations.BY_NAME["linear"].counters
    assert "rewrite_merges" not in declarations.BY_NAME["checkpoint-tree"].counters
