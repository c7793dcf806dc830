"""Simulated agent sessions with known harness behaviours and ground truth (`trace-tools simulate`).

`simulate(sessions, seed, ...)` writes SWE-agent-like sessions as a trace-schema-v1 dump: each
model turn written the way the template family's model emits it and tokenized with the real
tokenizer, each later request replaying history the way the session's harness behaviours say.
Every row's `metadata` carries the ground truth an ideal manager would act on (see
docs/simulator.md):

* `behaviours`: the session's behaviour labels (sorted);
* `genuine`: an ideal manager trains this turn's tokens (False only for a generation superseded
  by its retry);
* `branch`: the distinct conversation the turn belongs to (`main`, `subagent-1`,
  `compaction-1`, `edit-1`, ...);
* `ideal_samples`: how many genuinely distinct conversations the session holds (same on every
  row), `ideal_forwarded_tokens`: their token sequences' total length, each forwarded once;
* and per turn `kind`, `echo_of`, `rewritten_echoes`, `template_rewrite`,
  `noncanonical_splits`, `superseded_by` / `retry_of`.

With `steps` (a `StepSchedule`, `simulate --steps N`) the sessions are spread over training steps
whose harness changes as the schedule says; rows carry `step` and `weight_version`, and the file
metadata `trace_tools.steps` the ground truth per step (`step_truth`).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from trace_tools.data import SIMULATED_HARNESS, DumpMeta, Session, Turn
from trace_tools.errors import TraceToolsError, UnknownName, UsageError
from trace_tools.io.write import sessions_to_table, write_parquet_atomic
from trace_tools.render.families import stamps_date
from trace_tools.render.harness_echo import HarnessEcho, load_profile
from trace_tools.render.renderer import Renderer
from trace_tools.simulate.behaviours import BEHAVIOURS, harness_echo, parse_recipes
from trace_tools.simulate.formats import FAMILIES
from trace_tools.simulate.gateway import RECORDINGS
from trace_tools.simulate.profiles import PROFILES, get_profile
from trace_tools.simulate.session import SessionBuilder, SimContext
from trace_tools.simulate.steps import StepSchedule, weight_version

__all__ = [
    "BEHAVIOURS",
    "FAMILIES",
    "PROFILES",
    "RECORDINGS",
    "StepSchedule",
    "simulate",
    "simulate_sessions",
    "step_truth",
    "summarize",
]

# The day the simulated gateway renders on; a dump whose template stamps the date into its prompts
# (gpt-oss) names it in `trace_tools.render_date`, so replay renders the same day.
RENDER_DATE = "2025-03-03"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def simulate(
    sessions: int,
    seed: int,
    template: str = "qwen3",
    behaviours: list[str] | None = None,
    recording: str = "tree",
    out: str | None = None,
    *,
    max_turns: int | None = None,
    logprobs_model: str | None = None,
    profile: str = "swe",
    chat_template: str | None = None,
    harness_profile: str | None = None,
    steps: StepSchedule | None = None,
) -> Any:
    """Simulate `sessions` sessions and return them as a schema-v1 `pyarrow.Table`.

    Args:
        sessions: how many sessions (>= 1).
        seed: everything is a function of (seed, arguments): same arguments, same rows.
        template: a model family's name (`FAMILIES`, from the records in `trace_tools.families`).
        behaviours: recipes; each entry is a behaviour name or several joined by `+` (one
            session combines them). Sessions cycle through the entries. None cycles through
            every behaviour alone and then a few mixes.
        recording: how `prompt_ids` were recorded: `tree`, `linear` or `none`.
        out: also write the table there as Parquet (atomically), with `trace_tools.*` metadata.
        max_turns: the most model turns of a main conversation (None: the profile's default, 40
            for `swe`; behaviours that need room raise the floor).
        logprobs_model: replace the seeded logprobs by a model's teacher-forced ones
            (`trace_tools.rescore.fill_logprobs`; needs torch).
        profile: session size, `swe` (short episodes) or `swe-long` (Claude-Code-sized prompts,
            25–45 turns, contexts ending at 25k–60k tokens); see `simulate/profiles.py`.
        chat_template: the template text, file or name to render with (default: the family's,
            TRL's file, else the bundled sample's copy of it); it must use the family's tool-call format.
        harness_profile: a harness profile (a profile.json from `trace-tools probe`, or a shipped
            name) that the `harness-profile` behaviour plays; alone, every session plays it.
        steps: spread the sessions over training steps whose behaviour mix changes as the
            schedule says (`simulate/steps.py`); None writes no step.
    """

    if harness_profile is not None and not behaviours:
        behaviours = ["harness-profile"]
    family, recipes = _family(template), parse_recipes(behaviours)
    size = get_profile(profile)
    max_turns = size.default_max_turns if max_turns is None else max_turns
    _check(sessions, recording, max_turns)
    session_objects, meta = simulate_sessions(
        sessions,
        seed,
        family.name,
        recipes,
        recording,
        max_turns,
        profile,
        chat_template=chat_template,
        harness_profile=harness_profile,
        steps=steps,
    )
    table = sessions_to_table(session_objects, meta)
    if logprobs_model:
        from trace_tools.rescore import fill_logprobs

        table = fill_logprobs(table, logprobs_model)
    if out:
        write_parquet_atomic(table, out, dump=True)  # row groups sized for parallel reading
    return table


def simulate_sessions(
    sessions: int,
    seed: int,
    template: str,
    recipes: list[tuple[str, ...]],
    recording: str,
    max_turns: int = 40,
    profile: str = "swe",
    *,
    chat_template: str | None = None,
    harness_profile: str | None = None,
    steps: StepSchedule | None = None,
) -> tuple[list[Any], Any]:
    """(Session objects, DumpMeta): the library form behind `simulate`, without writing anything."""

    played = playable_profile(harness_profile) if harness_profile is not None else None
    family = _family(template)
    renderer = Renderer.from_spec(
        family.tokenizer, chat_template or family.template, dump_meta=DumpMeta(extra={"render_date": RENDER_DATE})
    )
    dated = {"render_date": RENDER_DATE} if stamps_date(renderer.chat_template) else {}
    ctx = SimContext(seed, family, renderer, recording, max_turns, get_profile(profile), played)
    played_recipes = steps.recipes(recipes, sessions) if steps else [recipes[i % len(recipes)] for i in range(sessions)]
    built = []
    for index, recipe in enumerate(played_recipes):
        rows = SessionBuilder(ctx, index, recipe).build()
        if steps:
            step = steps.step_of(index, sessions)
            for row in rows:
                row.update(step=step, weight_version=weight_version(step))
        built.append(Session(rows[0]["session_id"], [_turn(row) for row in rows]))
    arguments = {
        "sessions": sessions,
        "seed": seed,
        "template": family.name,
        "recipes": ["+".join(r) for r in recipes],
        "recording": recording,
        "max_turns": max_turns,
    }
    if profile != "swe":  # the default leaves the recorded arguments (and the bundled sample) unchanged
        arguments["profile"] = profile
    harnesses = _played_harnesses(played_recipes if steps else recipes, played)
    if harnesses:
        arguments["harness_profiles"] = harnesses
    per_step: dict[str, str] = {}
    if steps:  # a dump without steps keeps its arguments and metadata (and the bundled sample) unchanged
        arguments["schedule"] = steps.arguments()
        per_step = {"steps": json.dumps(steps.truth(sessions))}
    meta = DumpMeta(
        schema_version="1",
        tokenizer=family.tokenizer,
        chat_template=renderer.chat_template,
        history_mode="linear" if recording == "linear" else "tree",
        harness=SIMULATED_HARNESS,
        extra={"simulator": json.dumps(arguments), "recording": recording, **dated, **per_step},
    )
    for session in built:
        session.meta = meta
    return built, meta


def playable_profile(spec: str) -> Any:
    """A harness profile the simulator can play (usage error naming what it cannot replay)."""

    echo = HarnessEcho(load_profile(spec))
    if echo.unsupported:
        raise UsageError(
            f"harness profile {spec} has transformations the simulator cannot replay "
            f"({'; '.join(echo.unsupported)}); only rule-like ones are played (docs/simulator.md)"
        )
    return echo


def _played_harnesses(recipes: list[tuple[str, ...]], played: Any) -> dict[str, str]:
    """{behaviour: "<harness> <version>"} for the measured harnesses the recipes play."""

    out: dict[str, str] = {}
    for recipe in recipes:
        echo = harness_echo(recipe, played)
        for name in ("claude-code", "harness-profile"):
            if echo is not None and name in recipe:
                out[name] = echo.label
    return out


def summarize(table: Any) -> list[dict[str, Any]]:
    """Per behaviour recipe (in first-seen order): sessions, turns, genuine turns, ideal totals."""
    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for text, session_id in zip(table.column("metadata").to_pylist(), table.column("session_id").to_pylist()):
        truth = json.loads(text)
        label = "+".join(truth["behaviours"])
        row = out.setdefault(
            label,
            {
                "behaviours": label,
                "sessions": 0,
                "turns": 0,
                "genuine_turns": 0,
                "ideal_samples": 0,
                "ideal_forwarded_tokens": 0,
            },
        )
        row["turns"] += 1
        row["genuine_turns"] += bool(truth["genuine"])
        if session_id not in seen:
            seen.add(session_id)
            row["sessions"] += 1
            row["ideal_samples"] += truth["ideal_samples"]
            row["ideal_forwarded_tokens"] += truth["ideal_forwarded_tokens"]
    return list(out.values())


def step_truth(table: Any) -> list[dict[str, Any]]:
    """The ground truth per step a `simulate --steps` dump carries (`trace_tools.steps`); [] without steps."""
    text = (table.schema.metadata or {}).get(b"trace_tools.steps")
    return json.loads(text) if text else []


def _turn(row: dict[str, Any]) -> Any:
    fields = dict(row)
    fields["started_at"] = _EPOCH + timedelta(microseconds=row["started_at"])
    fields["finished_at"] = _EPOCH + timedelta(microseconds=row["finished_at"])
    return Turn(**fields)


def _family(template: str) -> Any:
    if template not in FAMILIES:
        raise UnknownName("template", template, list(FAMILIES))
    return FAMILIES[template]


def _check(sessions: int, recording: str, max_turns: int) -> None:
    if recording not in RECORDINGS:
        raise UnknownName("recording mode", recording, RECORDINGS)
    if sessions < 1:
        raise TraceToolsError(f"--sessions must be at least 1 (got {sessions})")
    if max_turns < 3:
        raise TraceToolsError(f"--max-turns must be at least 3 (got {max_turns})")
