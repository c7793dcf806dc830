"""Template limits count the template's own work, on every render path (`render.limits`).

The time limit is CPU time of the rendering thread: a replay stopped by SIGSTOP (what a
throttled container does to it) or slowed by loading transformers is not the template's doing.
The size checks hold on the fast path, under `--reference` and for a template only transformers
can render; and a render may write only so much more than its input, so a short conversation
cannot render megabytes a turn for minutes. Every refusal is exit 2 naming the limit it hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from io_support import measured, run_contents

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "qwen3.parquet"
TWO_SESSIONS = ["sim-qwen3-s7-0001", "sim-qwen3-s7-0004"]  # 5 and 6 turns, up to 12 messages
LONGER = "{% if messages|length > 9 %}"  # met by the sessions, not by any probe conversation
BOMBS = {
    "repeat": ("{{ 'x' * 300000000 }}", "repeated a value past 16,777,216 items"),
    "printf": ("{{ '%0999999999d' % 1 }}", "padded past 16,777,216 characters"),
    "doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "built a value of more than 16,777,216 items",
    ),
}
# lipsum makes every render differ, so neither of our runners reproduces transformers on the
# probes and transformers' own rendering is used for every render
FALLBACK = "<!-- {{ lipsum(1, html=False) }} -->"


def _dump(tmp_path: Path, prefix: str = "") -> Path:
    """Two sessions of the bundled sample, their template prefixed with `prefix`."""
    table = pq.read_table(SAMPLE)
    table = table.filter(pc.is_in(table.column("session_id"), pa.array(TWO_SESSIONS)))
    metadata = dict(table.schema.metadata)
    metadata[b"trace_tools.chat_template"] = prefix.encode() + metadata[b"trace_tools.chat_template"]
    path = tmp_path / "dump.parquet"
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return path


def _trace_tools(*args: str, seconds: str = "20", timeout: float = 300, pauses: int = 0) -> tuple[int, str, int]:
    """Run the CLI in its own process group; its exit code, stderr and peak RSS (KiB, its own:
    `wait4`). With `pauses`, the whole group is stopped (SIGSTOP) for 4 s that many times, the
    first after 3 s."""
    env = {**os.environ, "TRACE_TOOLS_TEMPLATE_SECONDS": seconds, "COLUMNS": "400"}
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as outcome:
        process = subprocess.Popen(
            measured([sys.executable, "-m", "trace_tools.cli.main", *args]),
            stdout=outcome,
            stderr=errors,
            env=env,
            cwd=tempfile.gettempdir(),  # `python -m` imports from the working directory first: $PYTHONPATH decides
            start_new_session=True,
        )
        deadline, paused = time.monotonic() + timeout, 0
        for pause in range(pauses):
            time.sleep(1 if pause else 3)
            if process.poll() is not None:
                break
            paused += 1
            os.killpg(process.pid, signal.SIGSTOP)
            time.sleep(4)
            os.killpg(process.pid, signal.SIGCONT)
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"trace-tools {' '.join(args)} still ran after {timeout:.0f} s")
        errors.seek(0)
        error = errors.read().decode()
        outcome.seek(0)
        code, peak_kib = outcome.read().split()
    assert paused == pauses, f"the command ended after {paused} of {pauses} pauses: {error}"
    return int(code), " ".join(error.split()), int(peak_kib)


def test_a_replay_paused_longer_than_the_time_limit_gives_the_tables_of_an_unpaused_one(tmp_path):
    """Three SIGSTOPs of 4 s each against a 3 s limit, while a trusted template that takes a
    fifth of a second or more a render renders most of the time: CPU time does not pass while
    stopped. The paused run goes first, with no verdicts on the template cached yet (a nonce in
    it makes its cache key new): it then renders the render checks' probes too, 20 s and more
    here, so the pauses fall inside it on a fast machine as well; the cached verdicts leave the
    unpaused run only its sessions' renders, 4-5 s."""
    nonce = f"{{# {uuid.uuid4().hex} #}}"
    dump = _dump(tmp_path, nonce + "{% for i in range(2000) %}{% for j in range(2500) %}{% endfor %}{% endfor %}")
    args = [str(dump), "-s", "tree", "--workers", "1"]
    code, error, _ = _trace_tools("replay", *args, "--out", str(tmp_path / "paused"), seconds="3", pauses=3)
    assert code == 0, error
    code, error, _ = _trace_tools("replay", *args, "--out", str(tmp_path / "plain"), seconds="3")
    assert code == 0, error
    plain, paused = run_contents(tmp_path / "plain"), run_contents(tmp_path / "paused")
    for timing in ("elapsed_s", "wall_s", "seconds"):
        plain["summary"].pop(timing, None), paused["summary"].pop(timing, None)
    assert paused == plain


def test_a_reference_replay_at_a_2_s_limit_renders_its_first_conversation(tmp_path):
    """Loading transformers' tokenizer and compiling the template are not the template's time."""
    dump = _dump(tmp_path)
    code, error, _ = _trace_tools(
        "replay", str(dump), "-s", "tree", "--workers", "1", "--reference", "--out", str(tmp_path / "run"), seconds="2"
    )
    assert code == 0, error


@pytest.mark.parametrize("path", ["fast", "reference", "fallback"])
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_each_template_bomb_stops_at_the_limit_it_hits_on_every_render_path(bomb, path, tmp_path):
    """Each bomb waits for a conversation no probe has, so it goes off inside a session's
    render: on the fast path, under `--reference` (transformers end to end), and where
    transformers' own rendering stands in for a template our runner cannot reproduce."""
    template, limit = BOMBS[bomb]
    prefix = (FALLBACK if path == "fallback" else "") + LONGER + template + "{% endif %}"
    reference = ["--reference"] if path == "reference" else []
    started = time.monotonic()
    code, error, peak_kib = _trace_tools(
        "replay", str(_dump(tmp_path, prefix)), "-s", "tree", "--workers", "1", *reference,
        "--out", str(tmp_path / "run"), timeout=90,
    )  # fmt: skip
    assert code == 2, error
    assert limit in error and "$TRACE_TOOLS_TEMPLATE_OUTPUT" in error, error
    assert "one-message" not in error and "Traceback" not in error
    assert peak_kib < 2**20, f"peak RSS {peak_kib / 2**10:.0f} MiB"
    assert time.monotonic() - started < 90


def test_a_short_conversation_cannot_render_megabytes_a_turn(tmp_path):
    """6.9M characters a render is under the output limit, but not from a conversation of a
    few kilobytes: the growth limit stops it at once instead of a replay of minutes."""
    dump = _dump(tmp_path, "{{ range(100000)|join('x' * 69) }}")
    started = time.monotonic()
    code, error, _ = _trace_tools(
        "replay", str(dump), "-s", "tree", "--workers", "1", "--out", str(tmp_path / "run"), timeout=90
    )
    assert code == 2, error
    assert "the growth limit: 8 × input + 262,144" in error and "$TRACE_TOOLS_TEMPLATE_GROWTH" in error, error
    assert time.monotonic() - started < 60


def test_work_that_is_not_the_templates_is_not_counted_and_a_render_inside_it_keeps_its_own_limit():
    """Building a runner inside a render (imports, compilation, probe renders) adds nothing to
    the render's CPU time; the probe renders it arms keep their own limit, and the outer render
    is limited again once they are done."""
    from trace_tools.render.limits import TemplateLimitHit, TemplateLimits, limited, not_counted

    def spin(seconds: float) -> None:
        started = time.thread_time()
        while time.thread_time() - started < seconds:
            pass

    limits = TemplateLimits(seconds=0.5)
    probe = limited(lambda *call: "probe", limits, "probe")

    def render(*call):
        with not_counted():
            spin(0.8)  # over the limit, but not the template's work
            assert probe([], None, False, {}) == "probe"
        spin(3)  # the template's own work: stopped at 0.5 s
        return "rendered"

    started = time.thread_time()
    with pytest.raises(TemplateLimitHit, match="ran past the 0.5 s CPU-time limit"):
        limited(render, limits, "outer")([], None, False, {})
    assert 1.3 <= time.thread_time() - started < 2.5
