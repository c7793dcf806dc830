"""Render the result tables of README.md and docs/ from real replays, or check that they match.

    python scripts/gen_docs.py                 # replay, then rewrite every generated table in place
    python scripts/gen_docs.py --check         # exit 1 naming each table that no longer matches
    python scripts/gen_docs.py --only sample   # some tables (names below), e.g. while editing
    python scripts/gen_docs.py --runs DIR      # keep the dumps and run directories in DIR; a second
                                               # call with the same DIR reuses the finished runs
                                               # (so only while the code does not change)

A generated table sits between `<!-- table:NAME -->` and `<!-- /table -->` in its page; everything
between the markers is replaced. The runs are seeded simulations and the bundled sample, so the
tables are a function of the code: when a change moves a number, rerun this script and commit the
pages with the change. Tables from a real harness or a benchmark are not here: their pages mark
them as measured, with the version, the date and the command (docs/development.md lists them).
Needs the `dev` extra (the other families' templates come from `trl`); about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's trace_tools, also when run from elsewhere

import pandas as pd  # noqa: E402

import trace_tools as tt  # noqa: E402
from trace_tools import families  # noqa: E402
from trace_tools.strategies.registry import available_strategies, get_strategy  # noqa: E402

FAMILIES = tuple(families.FAMILIES)  # the family records, in their order
BEHAVIOUR_SEED, BEHAVIOUR_SESSIONS = 1, 32  # the per-family behaviour × strategy runs
CLAIMS_SEED, CLAIMS_SESSIONS = 21, 6  # the slime PR #2282 configurations


class Runs:
    """The dumps and run directories the tables read, made once per invocation (or reused)."""

    def __init__(self, root: Path):
        self.root = root

    def replay(self, name: str, dump: Path | None, strategies=None, params=None) -> dict[str, Any]:
        run = self.root / "runs" / name
        if not (run / "summary.json").is_file():
            tt.replay(dump, out=run, strategies=strategies, params=params, write_samples=False, overwrite=True)
        return read_summary(run)

    def simulate(self, name: str, **kwargs: Any) -> Path:
        dump = self.root / f"{name}.parquet"
        if not dump.is_file():
            tt.simulate(out=str(dump), **kwargs)
        return dump

    def family(self, family: str, **params: Any) -> Path:
        """The run of every strategy on the family's simulated dump (`params`: strategy parameters)."""
        dump = self.simulate(family, sessions=BEHAVIOUR_SESSIONS, seed=BEHAVIOUR_SEED, template=family)
        name = family + "".join(f"-{k}={v}" for k, v in params.items())
        self.replay(name, dump, params=params or None)
        return self.root / "runs" / name


# -- formatting -----------------------------------------------------------------------------------
def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def count(n: int) -> str:
    return f"{int(n):,}"


def markdown(header: list[str], align: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def tool_coverage(strategy: dict[str, Any], tool: str) -> str:
    share = strategy["coverage_by_tool"].get(tool)
    return "—" if share is None else pct(share, 0)


# -- the tables -----------------------------------------------------------------------------------
def sample_table(runs: Runs) -> str:
    """README: every strategy on the bundled sample_traces/."""
    summary = runs.replay("sample", None)
    savings = summary.get("token_savings") or {}
    rows = []
    for name, s in summary["strategies"].items():
        saving = savings.get(name)
        saved = "—" if saving is None else f"{100 * saving['savings']:+.1f}%"
        saved += " ⚑" if saving and saving["saves_by_training_less"] else ""
        rows.append(
            [
                f"`{name}`",
                count(s["samples"]),
                f"{s['samples'] / s['sessions']:.2f}",
                pct(s["coverage"]),
                *(tool_coverage(s, tool) for tool in ("Edit", "Write", "Bash")),
                count(s["forwarded_tokens"]),
                count(s["context_tokens"]),
                saved,
            ]
        )
    header = [
        "strategy",
        "samples",
        "per session",
        "coverage",
        "Edit",
        "Write",
        "Bash",
        "forwarded",
        "context",
        "savings vs tree",
    ]
    fidelity = summary["prompt_fidelity"]
    note = f"Prompt fidelity {fidelity['exact']}/{fidelity['turns_compared']}"
    note += ": every recorded prompt re-renders exactly." if fidelity["exact"] == fidelity["turns_compared"] else "."
    return markdown(header, ["---"] + ["---:"] * 9, rows) + "\n\n" + note


CLAIM_ROWS = (  # label, behaviour, strategy, strategy parameters
    ("byte-exact echo (ideal), tree", "byte-exact", "tree", None),
    ("claude-code echo, tree", "claude-code", "tree", None),
    ("claude-code echo, recognised but prompt not restored", "claude-code", "echo-restore", {"restore_prompt": False}),
    ("claude-code echo, restored before render (echo-restore)", "claude-code", "echo-restore", None),
    ("claude-code echo, linear+restore", "claude-code", "linear+restore", None),
    ("claude-code echo, checkpoint-tree", "claude-code", "checkpoint-tree", None),
)


def claims_table(runs: Runs) -> str:
    """docs/results.md: slime PR #2282's configurations on simulated Claude Code sessions."""
    rows = []
    for label, behaviour, strategy, params in CLAIM_ROWS:
        dump = runs.simulate(
            f"claims-{behaviour}", sessions=CLAIMS_SESSIONS, seed=CLAIMS_SEED, template="qwen3", behaviours=[behaviour]
        )
        name = f"claims-{behaviour}-{strategy}" + ("-not-restored" if params else "")
        s = runs.replay(name, dump, [strategy], params)["strategies"][strategy]
        turns = tt.open_run(runs.root / "runs" / name).turns
        trained_turns = []
        for tool in ("Edit", "Write", "Bash"):
            mine = turns[turns["tool"] == tool]
            trained_turns.append(f"{int((mine['trained_tokens'] > 0).sum())}/{len(mine)}")
        counters = s["counters"]
        rows.append(
            [
                label,
                count(s["samples"]),
                pct(s["coverage"]),
                *trained_turns,
                count(counters["rewrite_merges"]),
                count(counters["drift_realign"]),
            ]
        )
    header = ["configuration", "samples", "coverage", "Edit", "Write", "Bash", "merges", "realigns"]
    return markdown(header, [":---", "---:", ":---", ":---", ":---", ":---", "---:", "---:"], rows)


def behaviour_table(family: str) -> Callable[[Runs], str]:
    """docs/results.md: % of genuine generated tokens trained / forwarded tokens ÷ ideal, per behaviour."""

    def build(runs: Runs) -> str:
        frame = tt.compare_by_behaviour(runs.family(family))
        strategies = [s for s in available_strategies() if s in set(frame["strategy"])]
        cells = {(r.behaviour, r.strategy): r for r in frame.itertuples()}
        rows = []
        for behaviour in dict.fromkeys(frame["behaviour"]):
            rows.append([behaviour, *(behaviour_cell(cells.get((behaviour, s))) for s in strategies)])
        return markdown(["behaviour", *strategies], [":---"] + ["---"] * len(strategies), rows)

    return build


def behaviour_cell(row: Any) -> str:
    """The cell `compare --by behaviour` prints, kept here so that a change of terminal wording
    does not rewrite the docs' tables."""
    if row is None:
        return "—"
    trained = "n/a" if pd.isna(row.trained_share) else f"{100 * row.trained_share:.0f}"
    forwarded = "n/a" if pd.isna(row.forwarded_vs_ideal) else f"{row.forwarded_vs_ideal:.2f}"
    return f"{trained} / {forwarded}"


UPSTREAM_FORM = {  # what each strategy hands the template, and how (docs/upstream_families.md#1-what-each-upstream-system-hands-the-template)
    "tree": "recorded ids (slime manager only)",
    "echo-restore": "slime: dicts → served template, every request",
    "linear": "agentcore: dicts → stored history",
    "linear+restore": "agentcore, after slime's restore",
    "chains": "uni-agent: dicts → full render of a new chain",
    "session-v1": "miles: dicts → jinja (default family; no V3.2 encoder)",
    "session-v2": "miles, as v1",
    "checkpoint-tree": "ours: text for DeepSeek V3",
    "message-graph": "recorded ids (verifiers graph only)",
    "areal": "AReaL concat: its own ChatML text, no template",
}


def upstream_table(runs: Runs) -> str:
    """docs/upstream_families.md: requests that fail upstream / requests · coverage, per family."""
    summaries = {family: read_summary(runs.family(family)) for family in FAMILIES}
    lenient = read_summary(runs.family("deepseek-v3", lenient_render="true"))
    rows = []
    for name, form in UPSTREAM_FORM.items():
        cells = [upstream_cell(summaries[f]["strategies"][name], bold=f == "deepseek-v3") for f in FAMILIES]
        if "lenient_render" in {param.name for param in get_strategy(name).params}:
            s = lenient["strategies"][name]
            passed = (s.get("lenient_render") or {}).get("requests")
            cells.append(upstream_cell(s) + (f" ({passed})" if passed else ""))  # tree renders nothing
        else:
            cells.append("—")
        rows.append([f"`{name}`", form, *cells])
    header = ["strategy", "upstream form → path (§1)", *FAMILIES, "deepseek-v3, lenient"]
    return markdown(header, ["---"] * len(header), rows)


def upstream_cell(strategy: dict[str, Any], bold: bool = False) -> str:
    failures = strategy["upstream_failures"]
    cell = f"{failures['failed']}/{failures['requests']} · {pct(strategy['coverage'])}"
    return f"**{cell}**" if bold and failures["failed"] else cell


def read_summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def templates_table(runs: Runs) -> str:
    """docs/templates.md: `audit-template` verdicts on every chat template trl ships."""
    from trace_tools.report.audit_view import audit_templates, markdown_table

    return markdown_table(audit_templates("trl:all")).strip("\n")


def harnesses_table(runs: Runs) -> str:
    """docs/probe.md: the harnesses `probe` drives, from their records (no run needed)."""
    from trace_tools.probe.harnesses import HARNESSES, ROOT_HARNESS_DIR

    header = ["harness", "version", "install (as root)", "executable (or the variable naming one)", "protocol"]
    rows = [
        [
            f"`{h.name}`",
            h.version,
            f"`{h.install_command(ROOT_HARNESS_DIR)}`",
            f"`{h.executable}` (`{h.executable_variable}`)",
            h.speaks,
        ]
        for h in HARNESSES.values()
    ]
    return markdown(header, ["---"] * 5, rows)


def echo_classes_table(runs: Runs) -> str:
    """docs/probe.md: every shipped harness profile × every rewrite class (no run needed)."""
    from trace_tools.render.harness_echo import load_profile, shipped_names
    from trace_tools.report.harness_profile import REWRITE_CLASSES, rewrite_classes

    profiles = [load_profile(name) for name in shipped_names()]
    header = ["rewrite class", *(f"{p['harness']['name']} {p['harness']['version']}" for p in profiles)]
    cells = [rewrite_classes(p) for p in profiles]
    rows = [[name, *(c[name] for c in cells)] for name, _ in REWRITE_CLASSES]
    return markdown(header, ["---"] * len(header), rows)


def import_formats_table(runs: Runs) -> str:
    """docs/importers.md: the import formats, from their records (no run needed)."""
    from trace_tools.importers.formats import FORMATS

    def session(fmt: Any) -> str:
        return "`--session-key` (required)" if fmt.needs_session_key else "in the records (or `--session-key`)"

    header = ["format", "reads", "written by", "session", "files", "reader"]
    rows = [
        [
            f"`{f.name}`",
            f.reads,
            f.written_by,
            session(f),
            " ".join(f"`{x}`" for x in f.suffixes),
            f"`importers/{f.reader}.py`",
        ]
        for f in FORMATS.values()
    ]
    return markdown(header, ["---"] * 6, rows)


def import_mapping_table(runs: Runs) -> str:
    """docs/importers.md: per format, the producer and version followed, what maps to what, what is lost."""
    from trace_tools.importers.formats import FORMATS

    header = ["format", "producer and version", "a session is", "a turn is", "not carried"]
    rows = [[f"`{f.name}`", f"{f.written_by}: {f.follows}", f.session, f.turn, f.lost] for f in FORMATS.values()]
    return markdown(header, ["---"] * 5, rows)


def import_list(runs: Runs) -> str:
    """README: the import formats, one line each."""
    from trace_tools.importers.formats import FORMATS

    return "\n".join(f"- `{f.name}` — {f.written_by}: {f.reads}" for f in FORMATS.values())


@dataclass(frozen=True)
class Table:
    page: str
    build: Callable[[Runs], str]


TABLES: dict[str, Table] = {
    "sample": Table("README.md", sample_table),
    "claims": Table("docs/results.md", claims_table),
    **{f"behaviour-{f}": Table("docs/results.md", behaviour_table(f)) for f in FAMILIES if f != "qwen3.5"},
    "upstream-families": Table("docs/upstream_families.md", upstream_table),
    "templates-trl": Table("docs/templates.md", templates_table),
    "harnesses": Table("docs/probe.md", harnesses_table),
    "echo-classes": Table("docs/probe.md", echo_classes_table),
    "import-formats": Table("docs/importers.md", import_formats_table),
    "import-mapping": Table("docs/importers.md", import_mapping_table),
    "import-list": Table("README.md", import_list),
}


# -- pages ----------------------------------------------------------------------------------------
def block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- table:{re.escape(name)} -->\n)(.*?)(\n?<!-- /table -->)", re.S)


def current(name: str) -> str:
    page = ROOT / TABLES[name].page
    found = block(name).search(page.read_text())
    if not found:
        raise SystemExit(f"{TABLES[name].page} has no <!-- table:{name} --> ... <!-- /table --> block")
    return found.group(2).strip("\n")


def write(name: str, table: str) -> None:
    page = ROOT / TABLES[name].page
    text = block(name).sub(lambda m: m.group(1) + table + "\n" + m.group(3).lstrip("\n"), page.read_text())
    page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming the tables that differ")
    parser.add_argument("--only", nargs="+", choices=sorted(TABLES), help="these tables only")
    parser.add_argument("--runs", type=Path, help="keep (and reuse) the dumps and runs here")
    args = parser.parse_args(argv)
    names = args.only or list(TABLES)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gen-docs-") as scratch:
        runs = Runs(args.runs or Path(scratch))
        rendered = {name: TABLES[name].build(runs) for name in names}
    stale = [name for name in names if rendered[name] != current(name)]
    took = f"{time.monotonic() - began:.0f} s"
    if args.check:
        for name in stale:
            print(f"{TABLES[name].page}: table {name!r} no longer matches its runs", file=sys.stderr)
        if stale:
            print("rerun `python scripts/gen_docs.py` and commit the pages", file=sys.stderr)
            return 1
        print(f"{len(names)} generated tables match their runs ({took})")
        return 0
    for name in stale:
        write(name, rendered[name])
    print(f"{len(names)} tables rendered, {len(stale)} changed: {', '.join(stale) or 'none'} ({took})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
