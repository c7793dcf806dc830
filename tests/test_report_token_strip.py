"""report.html's token strips (`report/html/token_strip.py`): after `rescore RUN --samples`, one
strip per strategy shows its worst turn token by token -- Δ colour, loss mask dimmed, context
provenance, the corrections that would mask each token -- bounded in size, and fitting 800 px."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trace_tools.report.html.chromium import Chromium
from trace_tools.report.html.token_strip import MASKED, MAX_TOKENS, SEQUENCE_MODES, token_strips

MOVED = 2.0  # nats the trainer's logprob is lowered by, at one token of session-v1


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory):
    """A replayed simulated run, its samples given trainer logprobs equal to the rollout's except
    one token of session-v1 (Δ = +2 nats): no model needed."""
    from trace_tools.api import replay
    from trace_tools.io.rundir import load_summary
    from trace_tools.io.write import write_parquet_atomic
    from trace_tools.rescore.samples import load_samples, rescore_samples
    from trace_tools.simulate import simulate

    root = tmp_path_factory.mktemp("strip")
    table = simulate(sessions=3, seed=7, template="qwen3", behaviours=["byte-exact", "history-edit"], max_turns=4)
    write_parquet_atomic(table, root / "sim.parquet")
    replay(root / "sim.parquet", out=root / "run", strategies=["tree", "session-v1"], workers=1)
    before = (root / "run" / "report.html").read_text()
    samples = load_samples(root / "run")
    given = [np.array(row.logprobs, dtype=np.float64) for row in samples.itertuples()]
    row = int(np.flatnonzero(samples["strategy"] == "session-v1")[-1])
    trained = np.flatnonzero(np.asarray(samples.at[row, "loss_mask"]) == 1)
    moved_at = int(trained[len(trained) // 2])
    given[row][moved_at] -= MOVED
    result = rescore_samples(root / "run", trainer_logprobs=given)
    start = len(samples.at[row, "token_ids"]) - int(samples.at[row, "response_length"])
    moved = {"row": samples.loc[row], "position": start + moved_at}
    return root / "run", before, result, load_summary(root / "run"), moved


def test_one_strip_per_strategy_worst_turn_with_the_moved_token(scored_run):
    run, _, result, summary, moved = scored_run
    strips = {s["strategy"]: s for s in token_strips(run, summary)}
    assert set(strips) == {"tree", "session-v1"}
    strip = strips["session-v1"]
    sample = moved["row"]
    assert (strip["session_id"], strip["sample_index"]) == (sample["session_id"], int(sample["sample_index"]))
    assert strip["max_abs_diff"] == pytest.approx(MOVED, abs=1e-6)
    begin, end = strip["shown"]
    assert begin <= moved["position"] < end and len(strip["cells"]) == end - begin <= MAX_TOKENS
    cell = strip["cells"][moved["position"] - begin]
    # ρ = e^-2 ≈ 0.135 is under both bands' 0.5: token_mis and icepop mask it, and the strip boxes it
    assert cell["trained"] and cell["sign"] == "up" and cell["strength"] == 1.0 and cell["masked"]
    assert "Δ +2 (rollout" in cell["title"] and "context re-rendered" in cell["title"]
    masked_by = cell["title"].split("masked by ")[1].split(" · ")[0].split(", ")
    assert {"token_mis", "icepop", "seq_mis"} <= set(masked_by) and "token_tis" not in masked_by
    # Π ρ = e^-2 over the sample: seq_mis masks all of it, said once
    tokens = result.tokens
    in_sample = tokens[(tokens["strategy"] == "session-v1") & (tokens["session_id"] == sample["session_id"])]
    in_sample = in_sample[in_sample["sample_index"] == sample["sample_index"]]
    assert "seq_mis" in strip["whole_sample"]
    assert strip["whole_sample"] == [m for m in SEQUENCE_MODES if (in_sample[m] == MASKED).all()]
    # every other trained token agrees exactly: uncoloured, not boxed
    others = [c for i, c in enumerate(strip["cells"]) if c["trained"] and i != moved["position"] - begin]
    assert others and all(c["strength"] == 0.0 and not c["masked"] for c in others)
    # dimmed = loss mask 0, exactly where the sample's mask is 0
    start = len(sample["token_ids"]) - int(sample["response_length"])
    mask = np.asarray(sample["loss_mask"])
    for offset, c in enumerate(strip["cells"]):
        position = begin + offset
        assert c["trained"] == bool(position >= start and mask[position - start] == 1)
    mine = in_sample[in_sample["position"] == moved["position"]]
    assert len(mine) == 1 and mine["token_mis"].iloc[0] == MASKED and mine["token_tis"].iloc[0] == 0


def test_rescore_samples_re_renders_the_page(scored_run):
    run, before, _, _, _ = scored_run
    page = (run / "report.html").read_text()
    assert 'id="token-strips"' not in before and 'id="token-strip-session-v1"' in page
    assert page.count('class="ts-strip"') == 2


def test_a_run_never_rescored_has_no_strip(tmp_path):
    assert token_strips(tmp_path, {"strategies": {"tree": {"samples": 3}}}) == []


@pytest.fixture(scope="module", params=[1400, 800])
def sized_browser(chromium_binary, request):
    with Chromium(chromium_binary, width=request.param, height=900) as chromium:
        yield chromium


def test_the_strip_fits_the_window_and_marks_the_moved_token(sized_browser, scored_run, tmp_path):
    browser = sized_browser
    run = scored_run[0]
    browser.open(Path(run / "report.html").as_uri(), ready="window.reportReady")
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    right = browser.evaluate(
        "Math.max(...[...document.querySelectorAll('.ts-strip .ts-t')].map(t => t.getBoundingClientRect().right))"
    )
    strip_right = browser.evaluate(
        "document.querySelector('#token-strip-session-v1 .ts-tokens').getBoundingClientRect().right"
    )
    assert right <= strip_right + 1
    boxed = browser.evaluate(
        "[...document.querySelectorAll('#token-strip-session-v1 .ts-masked')].map(t => getComputedStyle(t).outlineStyle)"
    )
    assert boxed == ["solid"]
    dimmed = browser.evaluate("getComputedStyle(document.querySelector('.ts-ctx')).color")
    assert dimmed == "rgb(154, 163, 174)"
    shot = browser.screenshot(tmp_path / f"strip-{browser.width}.png", element="#token-strip-session-v1")
    from PIL import Image

    assert len(Image.open(shot).convert("RGB").getcolors(1 << 20) or []) > 50
    assert browser.console_errors() == []


def test_the_strip_reads_rescores_outcome_codes_and_sequence_modes():
    from trace_tools.report.html import token_strip
    from trace_tools.rescore import corrections

    assert (token_strip.KEPT, token_strip.CLIPPED, token_strip.MASKED) == (
        corrections.KEPT,
        corrections.CLIPPED,
        corrections.MASKED,
    )
    # a sequence-level mode gives every token of a sample the same outcome
    outcomes = corrections.token_outcomes(
        np.array([0.0, -3.0, 0.1]), np.array([0, 0, 0]), corrections.CorrectionOptions()
    )
    for mode in corrections.MODES:
        assert (len(set(outcomes[mode])) == 1) or mode not in SEQUENCE_MODES
    assert set(SEQUENCE_MODES) <= set(corrections.MODES)
