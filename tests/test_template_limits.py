"""Chat templates are untrusted code (docs/run_directory.md#untrusted-input-bounded), and a renderer is keyed on every input it reads.

Every render runs under a time and an output limit, and the operations that build a value far
larger than their inputs are checked before they run; a template that breaks a limit, does not
compile, or fails on the simplest conversation stops `replay` and `validate` with exit 2 naming
it. Two recordings that differ in anything a renderer reads (a gpt-oss render date) get their own
renderer (`RenderSpec`)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trace_tools.cli.main import app
from trace_tools.data import DumpMeta
from trace_tools.render.limits import TemplateLimitHit, TemplateLimits
from trace_tools.render.renderer import Renderer
from trace_tools.render.spec import RenderSpec

HOSTILE = {  # each would hang for minutes or allocate gigabytes without the limits
    "a 10^10-step loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "exponential macro recursion": "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}"
    "{{ f(60) }}",
    "a 10 GB string": "{{ 'x' * 10**10 }}",
    "a 10 GB string never printed": "{% set y = 'x' * 10**10 %}",
    "a huge power": "{{ 2 ** 10000000000 }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "padding by filter": "{{ 'x'|center(10**10) }}",
    "padding by method": "{{ 'x'.ljust(10**10) }}",
    "padding by format": "{{ '{:>10000000000}'.format(1) }}",
    "padding by printf": "{{ '%10000000000d' % 1 }}",
    "indent": "{{ ('a\\n' * 1000)|indent(10**8) }}",
    "join": "{{ range(100000)|join('x' * 100000) }}",
    "lipsum": "{{ lipsum(10**9) }}",
    "a JSON indent": "{{ messages|tojson(indent=10**9) }}",
    "batch fill": "{{ range(3)|batch(10**9, 'x')|list|length }}",
    "many small writes": "{% for i in range(100000) %}{% for j in range(1000) %}{{ 'y' * 40 }}{% endfor %}{% endfor %}",
}


def test_every_hostile_template_stops_at_a_limit_in_time_and_memory():
    """In a child process whose address space is capped at 3 GiB: an unchecked allocation would
    fail there with MemoryError instead of the limit, and every render must stop within the
    time limit (CPU time: a loaded machine stretches the wall clock) plus slack."""
    code = textwrap.dedent(
        f"""
        import json, resource, time
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
        from trace_tools.render.limits import TemplateLimitHit, TemplateLimits
        from trace_tools.render.renderer import Renderer
        results = {{}}
        for name, text in json.loads({json.dumps(json.dumps(HOSTILE))}).items():
            renderer = Renderer("qwen3", text + "{{{{ messages[0].content }}}}", template_identity="hostile",
                                limits=TemplateLimits(seconds=2.0))
            started = time.process_time()
            try:
                renderer.render_text([{{"role": "user", "content": "hi"}}])
                outcome = "rendered"
            except TemplateLimitHit as hit:
                outcome = "limit: " + hit.what
            except BaseException as error:
                outcome = type(error).__name__
            results[name] = [outcome, time.process_time() - started]
        print(json.dumps(results))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (outcome, seconds) in results.items():
        assert outcome.startswith("limit: "), (name, outcome)
        assert seconds < 2.0 * 2 + 3, (name, seconds)  # probes render twice: ours, then no reference


def test_the_time_limit_stops_a_loop_and_the_renderer_works_again():
    renderer = Renderer(
        "qwen3",
        "{% if messages[0].content == 'loop' %}"
        + HOSTILE["a 10^10-step loop"]
        + "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
        template_identity="sometimes",
        limits=TemplateLimits(seconds=1.0),
    )
    assert renderer.render_text([{"role": "user", "content": "fine"}]) == "fine"
    started = time.thread_time()  # the limit's own clock: a loaded host's waits are not the loop's
    with pytest.raises(TemplateLimitHit, match="ran past the 1 s CPU-time limit"):
        renderer.render_text([{"role": "user", "content": "loop"}])
    assert time.thread_time() - started < 4
    assert renderer.render_text([{"role": "user", "content": "again"}]) == "again"  # nothing left pending
    time.sleep(0.2)  # a stray asynchronous exception would surface here


@pytest.mark.parametrize("pause", [0.0, 0.002], ids=["back to back", "between other work"])
def test_the_watchdog_sleeps_between_deadlines_instead_of_polling(pause):
    """Renders back to back, or spaced by other work as in a replay (where the watchdog used to
    find none armed, and the next one woke it: once per render), and then an idle second wake
    the watchdog a handful of times, not per render: a wake takes the GIL from the renders and
    costs an idle Ray driver CPU."""
    from trace_tools.render.limits import WATCHDOG

    renderer = Renderer(
        "qwen3",
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        template_identity="plain",
        limits=TemplateLimits(),
    )
    renderer.render_text([{"role": "user", "content": "warm"}])  # the watchdog thread is started
    before = WATCHDOG.wakeups
    for index in range(300):
        assert renderer.render_text([{"role": "user", "content": str(index)}]) == str(index)
        time.sleep(pause)
    time.sleep(1.0)
    assert WATCHDOG.wakeups - before <= 3


def test_output_over_the_limit_is_refused_before_it_is_joined():
    renderer = Renderer(
        "qwen3",
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        template_identity="plain",
        limits=TemplateLimits(output=1000),
    )
    assert len(renderer.render_text([{"role": "user", "content": "x" * 999}])) == 999
    with pytest.raises(TemplateLimitHit, match="wrote more than 1,000 characters"):
        renderer.render_text([{"role": "user", "content": "x" * 600}, {"role": "user", "content": "y" * 600}])


def test_real_templates_render_alike_with_and_without_the_checks():
    """The checked operations give the same text as unchecked Jinja where they stay in bounds."""
    template = (
        "{{ 'ab' * 3 }}|{{ 2 ** 10 }}|{{ '%05d' % 42 }}|{{ '{:>6}'.format('r') }}|{{ 'a' ~ 'b' }}|"
        "{{ 'x'.center(5) }}|{{ [1, 2]|join(', ') }}|{{ 'a\\nb'|indent(2) }}|{{ {'k': [1]}|tojson(indent=2) }}"
        "|{{ messages[0].content.replace('h', 'H') }}"
    )
    text = Renderer("qwen3", template, template_identity="ops").render_text([{"role": "user", "content": "hi"}])
    assert text == 'ababab|1024|00042|     r|ab|  x  |1, 2|a\n  b|{\n  "k": [\n    1\n  ]\n}|Hi'


def test_a_template_compiled_under_one_size_limit_is_compiled_again_under_another():
    """Jinja calls filters on constant arguments while compiling, so code compiled under a larger
    limit holds a constant that a smaller one refuses: the compiled code is kept per limit."""
    template = "{{ 'x'|center(5000) }}"
    message = [{"role": "user", "content": "u"}]
    larger = Renderer("qwen3", template, template_identity="folds", limits=TemplateLimits(output=10_000))
    larger.preload()  # compiles it, as before workers fork
    assert len(larger.render_text(message)) == 5000
    smaller = Renderer("qwen3", template, template_identity="folds", limits=TemplateLimits(output=1000))
    with pytest.raises(TemplateLimitHit, match="asked `center` for more than 1,000 characters"):
        smaller.render_text(message)


def test_the_loop_and_namespaces_read_as_jinjas_own_sandbox_reads_them():
    """`loop.*` and `ns.*` are read directly for plain values (a shortcut past the sandbox's
    checks); what they read is what Jinja's own sandbox reads, a `str.format` kept on a namespace
    is still size-checked, and underscore names are still refused."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = (
        "{% set ns = namespace(n=0, s='a', none=None, items=[1, 2], f='{}!'.format) %}"
        "{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
        "{{ loop.revindex }}{{ loop.previtem }}{{ loop.cycle('x', 'y') }}{{ loop.changed(m.role) }}"
        "{% set ns.n = ns.n + loop.index %}{% set ns.s = ns.s ~ m.role %}|{% endfor %}"
        "{{ ns.n }}{{ ns.s }}{{ ns.none }}{{ ns.items }}{{ ns.f(3) }}"
    )
    messages = [{"role": role, "content": ""} for role in ("user", "assistant", "assistant")]
    expected = ImmutableSandboxedEnvironment().from_string(template).render(messages=messages)
    assert Renderer("qwen3", template, template_identity="state").render_text(messages) == expected
    assert expected.endswith("6auserassistantassistantNone[1, 2]3!")

    padded = "{% set ns = namespace(f='{:>10000000000}'.format) %}{{ ns.f(1) }}"
    with pytest.raises(TemplateLimitHit):
        Renderer("qwen3", padded, template_identity="padded").render_text(messages)
    # `loop._length` holds a plain int once `loop.length` is read: still refused (undefined).
    private = "{% for m in messages %}{{ loop.length }}{{ loop._length }}{% endfor %}"
    sandbox = importlib.import_module("trace_tools.render.template_runner")._CheapSandbox()
    sandbox.configure_limits(1000)
    assert sandbox.from_string(private).render(messages=messages) == "333"
    assert ImmutableSandboxedEnvironment().from_string(private).render(messages=messages) == "333"


def test_limits_are_configurable_and_a_bad_setting_is_a_usage_error(monkeypatch, simulated_dump):
    monkeypatch.setenv("TRACE_TOOLS_TEMPLATE_SECONDS", "0.5")
    monkeypatch.setenv("TRACE_TOOLS_TEMPLATE_OUTPUT", "2000")
    assert TemplateLimits.from_env() == TemplateLimits(0.5, 2000)
    monkeypatch.setenv("TRACE_TOOLS_TEMPLATE_SECONDS", "soon")
    result = CliRunner().invoke(app, ["reconstruct", str(simulated_dump)])
    assert result.exit_code == 2 and "$TRACE_TOOLS_TEMPLATE_SECONDS is 'soon'; set a positive number" in result.output


# -- a template that breaks a limit, raises or does not parse: exit 2 naming it --------------------
def _with_template(source, path, template: str):
    table = pq.read_table(source)
    metadata = {**table.schema.metadata, b"trace_tools.chat_template": template.encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return path


BROKEN = {
    "raises": ("{{ raise_exception('this template refuses everything') }}", "this template refuses everything"),
    "does not parse": ("{% for m in messages %}{{ m.content }}", "Unexpected end of template"),
    "loops": (HOSTILE["a 10^10-step loop"], "ran past the 2 s CPU-time limit in one render"),
    "allocates": (HOSTILE["a 10 GB string"], "repeated a value past"),
    "folds a huge constant": ("{{ 'x'|center(10**10) }}", "asked `center` for more than"),  # at compile time
}


@pytest.mark.parametrize("kind", list(BROKEN))
@pytest.mark.parametrize("command", ["replay", "validate"])
def test_a_broken_template_stops_the_command_with_exit_2_naming_it(kind, command, simulated_dump, tmp_path):
    template, message = BROKEN[kind]
    dump = _with_template(simulated_dump, tmp_path / "d.parquet", template)
    # Two workers: the replay compiles its template before they fork (`Renderer.preload`) too.
    args = [command, str(dump)] + (
        ["-s", "tree", "--workers", "2", "--out", str(tmp_path / "run")] if command == "replay" else []
    )
    env = {**os.environ, "TRACE_TOOLS_TEMPLATE_SECONDS": "2", "COLUMNS": "400"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trace_tools.cli.main", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 2, done.stdout + done.stderr
    error = " ".join(done.stderr.split())
    assert "chat template dump sha256=" in error and message in error
    assert "Traceback" not in done.stderr and "quarantined" not in done.stdout
    assert time.monotonic() - started < 60


def test_a_template_over_a_limit_in_one_session_stops_the_replay(simulated_dump, tmp_path, monkeypatch):
    """A template that renders the probe but loops on a longer conversation: the session does
    not become a quarantine entry, the run stops (exit 2)."""
    template = (
        "{% if messages|length > 3 %}"
        + HOSTILE["a 10^10-step loop"]
        + "{% endif %}"
        + pq.read_table(simulated_dump).schema.metadata[b"trace_tools.chat_template"].decode()
    )
    dump = _with_template(simulated_dump, tmp_path / "d.parquet", template)
    monkeypatch.setenv("TRACE_TOOLS_TEMPLATE_SECONDS", "1")
    result = CliRunner().invoke(app, ["replay", str(dump), "-s", "tree", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "ran past the 1 s CPU-time limit in one render" in " ".join(result.output.split())
    assert not (tmp_path / "run" / "summary.json").exists()


# -- RenderSpec: the pool keys on every input a renderer reads -----------------------------------------
def test_two_gpt_oss_recordings_of_different_dates_each_render_with_their_own(tmp_path, monkeypatch):
    simulate = importlib.import_module("trace_tools.simulate")  # the package attribute is the API function
    from trace_tools.reconstruct import reconstruct

    simulate.simulate(sessions=3, seed=1, template="gpt-oss", out=str(tmp_path / "a.parquet"))
    monkeypatch.setattr(simulate, "RENDER_DATE", "2024-02-29")
    simulate.simulate(sessions=3, seed=2, template="gpt-oss", out=str(tmp_path / "b.parquet"))
    summary = reconstruct(tmp_path).summary
    assert summary["exact"] == summary["turns"] > 0  # one shared renderer gets the later file wrong


def test_a_render_spec_holds_every_input_and_is_the_identity():
    meta = DumpMeta(tokenizer="gpt-oss", chat_template=None, extra={"render_date": "2025-06-01"})
    spec = RenderSpec.resolve(None, "gpt-oss", meta)
    other_day = RenderSpec.resolve(None, "gpt-oss", DumpMeta(tokenizer="gpt-oss", extra={"render_date": "2024-02-29"}))
    assert spec != other_day and spec == RenderSpec.resolve(None, "gpt-oss", meta)
    assert len({spec, other_day, RenderSpec.resolve(None, "gpt-oss", meta)}) == 2
    renderer = Renderer.from_render_spec(spec)
    assert renderer.spec == spec and renderer.identity == spec.identity()
    assert spec.identity()["render_date"] == "2025-06-01" and spec.identity()["tool_format"] == "harmony"
    with pytest.raises(Exception, match="render_date 'yesterday' is not a date"):
        RenderSpec.resolve(None, "gpt-oss", DumpMeta(tokenizer="gpt-oss", extra={"render_date": "yesterday"}))


def test_run_json_names_each_renderer_by_its_spec(tmp_path, monkeypatch):
    simulate = importlib.import_module("trace_tools.simulate")  # the package attribute is the API function
    from trace_tools.api import replay

    first_day = simulate.RENDER_DATE
    simulate.simulate(sessions=2, seed=1, template="gpt-oss", out=str(tmp_path / "dump" / "a.parquet"))
    monkeypatch.setattr(simulate, "RENDER_DATE", "2024-02-29")
    simulate.simulate(sessions=2, seed=2, template="gpt-oss", out=str(tmp_path / "dump" / "b.parquet"))
    result = replay(tmp_path / "dump", out=tmp_path / "run", strategies=["tree"], workers=1)
    renderers = json.loads((tmp_path / "run" / "run.json").read_text())["renderers"]
    assert sorted(r["render_date"] for r in renderers) == sorted(["2024-02-29", first_day])
    assert result.summary["prompt_fidelity"]["rate"] == 1.0


def test_a_process_forked_after_a_render_renders_under_a_watchdog_of_its_own():
    """The child of a fork inherits neither the parent's watchdog thread nor a usable CPU clock
    (the cached one names the parent's thread): it renders, and its time limit still stops a loop."""
    script = textwrap.dedent(
        f"""
        import os
        import signal
        from trace_tools.render.limits import TemplateLimitHit, TemplateLimits
        from trace_tools.render.renderer import Renderer
        template = "{{% if messages[0].content == 'loop' %}}" + {HOSTILE["a 10^10-step loop"]!r} + (
            "{{% endif %}}{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}"
        )
        renderer = Renderer("qwen3", template, template_identity="sometimes", limits=TemplateLimits(seconds=1.0))
        assert renderer.render_text([{{"role": "user", "content": "fine"}}]) == "fine"  # the parent arms first
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a child without a watchdog would loop for hours
            code = 1
            try:
                assert renderer.render_text([{{"role": "user", "content": "child"}}]) == "child"
                try:
                    renderer.render_text([{{"role": "user", "content": "loop"}}])
                    code = 2
                except TemplateLimitHit:
                    code = 0
            finally:
                os._exit(code)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
