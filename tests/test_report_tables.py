"""Exact terminal output of the main tables at 80 and 120 columns, pinned in the manner of sqlite-utils.

The input is the summary.json (and the behaviour frame) of a real replay of the bundled
sample_traces/ through all eight strategies, kept in tests/data/ so that the layout is pinned
independently of later algorithm changes. Trailing spaces are stripped (rich pads lines); all
else must match character for character: no number cut, the same short strategy labels in every
table, one legend, the savings column, the footnote explaining forwarded and context.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from trace_tools.report.compare_tables import behaviour_view, gate_view
from trace_tools.report.layout import Column, fit, middle
from trace_tools.report.tables import summary_view

DATA = Path(__file__).parent / "data"
SUMMARY = json.loads((DATA / "sample_summary.json").read_text())
BEHAVIOUR = pd.read_json(DATA / "sample_behaviour.json", orient="records")


def render(renderables, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    for renderable in renderables:
        console.print(renderable)
    return "".join(line.rstrip() + "\n" for line in console.file.getvalue().splitlines())


SUMMARY_80 = """\
prompt fidelity: 330/330 turns re-render exactly

What each strategy would train (32 sessions, 330 turns)
                     per    max                                         saved vs
strategy  samples  sess.  forks  coverage  trained  forwarded  context      tree
────────────────────────────────────────────────────────────────────────────────
tree           56   1.75      2     73.1%   26,186    176,087  149,901       n/a
restore        54   1.69      2     73.8%   26,460    170,471  144,011     +3.2%
linear         58   1.81      2     85.5%   30,637    181,167  150,530     -2.9%
lin+rst        56   1.75      2     86.2%   30,911    175,551  144,640     +0.3%
chains        126   3.94     13     93.8%   33,606    362,472  328,866   -105.8%
sess-v1        32   1.00      0     24.6%    8,808    103,222   94,414   +41.4%*
sess-v2       183   5.72     14     74.0%   26,539    528,815  502,276   -200.3%
ckpt           44   1.38      1     98.6%   35,333    147,067  111,734    +16.5%
coverage = trained / generated tokens. max forks = the most samples one session
split into, minus one. forwarded = tokens of all emitted samples (what the
trainer pays for); context = forwarded - trained. saved vs tree = 1 - forwarded
/ forwarded of tree; * = saves tokens by training fewer.

Counters: merges, nonlinear requests, resets, unresolved closers
counter           tree  restore  linear  lin+rst  ckpt
──────────────────────────────────────────────────────
rewrite_merges      46       44      46       44   n/a
nonlinear          n/a      n/a      74       70   n/a
resets             n/a      n/a      74       70     0
close_unresolved   n/a      n/a       0        0     0
rewrite_merges: rewritten assistant echoes absorbed into the tree (that turn no
longer trains); nonlinear: requests that are not an append-only extension the
template renders as a prefix; resets: times the healer re-anchored on such a
request; close_unresolved: turns whose closer after the last assistant could not
be resolved. n/a = the strategy has no such step.

Coverage by tool: trained / generated tokens of the turns whose first call is
that tool
tool       turns  tree  restore  linear  lin+rst  chains  sess-v1  sess-v2  ckpt
────────────────────────────────────────────────────────────────────────────────
Bash         100   80%      80%     86%      86%     94%      19%      70%   98%
Edit          40   67%      72%     74%      79%     85%      16%      58%   94%
Glob           2  100%     100%    100%     100%    100%       0%      45%  100%
Grep          54   65%      65%     84%      84%     97%      28%      94%  100%
MultiEdit     16   37%      37%     88%      88%     87%       6%      83%  100%
Read          46   76%      76%     82%      82%     95%      26%      78%  100%
Task           4   74%      74%    100%     100%    100%      24%      72%  100%
TodoWrite     16   69%      69%     88%      88%    100%      25%      74%  100%
Write          8  100%     100%    100%     100%    100%      38%      62%  100%
text          44   95%      95%     95%      95%    100%      52%      73%  100%

Dropped turns by tool: share of turns with no trained token
tool       turns  tree  restore  linear  lin+rst  chains  sess-v1  sess-v2  ckpt
────────────────────────────────────────────────────────────────────────────────
Bash         100   20%      20%     14%      14%      6%      79%      29%    2%
Edit          40   32%      28%     25%      20%     15%      82%      40%    5%
Glob           2    0%       0%      0%       0%      0%     100%      50%    0%
Grep          54   30%      30%     15%      15%      4%      72%       7%    0%
MultiEdit     16   62%      62%     12%      12%     12%      94%      19%    0%
Read          46   24%      24%     17%      17%      4%      72%      22%    0%
Task           4   25%      25%      0%       0%      0%      75%      25%    0%
TodoWrite     16   31%      31%     12%      12%      0%      75%      25%    0%
Write          8    0%       0%      0%       0%      0%      62%      38%    0%
text          44    5%       5%      5%       5%      0%      45%      27%    0%

labels: restore = echo-restore, lin+rst = linear+restore, sess-v1 = session-v1,
sess-v2 = session-v2, ckpt = checkpoint-tree
"""


SUMMARY_120 = """\
prompt fidelity: 330/330 turns re-render exactly

What each strategy would train (32 sessions, 330 turns)
                     per    max                                         saved vs
strategy  samples  sess.  forks  coverage  trained  forwarded  context      tree
────────────────────────────────────────────────────────────────────────────────
tree           56   1.75      2     73.1%   26,186    176,087  149,901       n/a
restore        54   1.69      2     73.8%   26,460    170,471  144,011     +3.2%
linear         58   1.81      2     85.5%   30,637    181,167  150,530     -2.9%
lin+rst        56   1.75      2     86.2%   30,911    175,551  144,640     +0.3%
chains        126   3.94     13     93.8%   33,606    362,472  328,866   -105.8%
sess-v1        32   1.00      0     24.6%    8,808    103,222   94,414   +41.4%*
sess-v2       183   5.72     14     74.0%   26,539    528,815  502,276   -200.3%
ckpt           44   1.38      1     98.6%   35,333    147,067  111,734    +16.5%
coverage = trained / generated tokens. max forks = the most samples one session split into, minus one. forwarded =
tokens of all emitted samples (what the trainer pays for); context = forwarded - trained. saved vs tree = 1 - forwarded
/ forwarded of tree; * = saves tokens by training fewer.

Counters: merges, nonlinear requests, resets, unresolved closers
counter           tree  restore  linear  lin+rst  ckpt
──────────────────────────────────────────────────────
rewrite_merges      46       44      46       44   n/a
nonlinear          n/a      n/a      74       70   n/a
resets             n/a      n/a      74       70     0
close_unresolved   n/a      n/a       0        0     0
rewrite_merges: rewritten assistant echoes absorbed into the tree (that turn no longer trains); nonlinear: requests that
are not an append-only extension the template renders as a prefix; resets: times the healer re-anchored on such a
request; close_unresolved: turns whose closer after the last assistant could not be resolved. n/a = the strategy has no
such step.

Coverage by tool: trained / generated tokens of the turns whose first call is that tool
tool       turns  tree  restore  linear  lin+rst  chains  sess-v1  sess-v2  ckpt
────────────────────────────────────────────────────────────────────────────────
Bash         100   80%      80%     86%      86%     94%      19%      70%   98%
Edit          40   67%      72%     74%      79%     85%      16%      58%   94%
Glob           2  100%     100%    100%     100%    100%       0%      45%  100%
Grep          54   65%      65%     84%      84%     97%      28%      94%  100%
MultiEdit     16   37%      37%     88%      88%     87%       6%      83%  100%
Read          46   76%      76%     82%      82%     95%      26%      78%  100%
Task           4   74%      74%    100%     100%    100%      24%      72%  100%
TodoWrite     16   69%      69%     88%      88%    100%      25%      74%  100%
Write          8  100%     100%    100%     100%    100%      38%      62%  100%
text          44   95%      95%     95%      95%    100%      52%      73%  100%

Dropped turns by tool: share of turns with no trained token
tool       turns  tree  restore  linear  lin+rst  chains  sess-v1  sess-v2  ckpt
────────────────────────────────────────────────────────────────────────────────
Bash         100   20%      20%     14%      14%      6%      79%      29%    2%
Edit          40   32%      28%     25%      20%     15%      82%      40%    5%
Glob           2    0%       0%      0%       0%      0%     100%      50%    0%
Grep          54   30%      30%     15%      15%      4%      72%       7%    0%
MultiEdit     16   62%      62%     12%      12%     12%      94%      19%    0%
Read          46   24%      24%     17%      17%      4%      72%      22%    0%
Task           4   25%      25%      0%       0%      0%      75%      25%    0%
TodoWrite     16   31%      31%     12%      12%      0%      75%      25%    0%
Write          8    0%       0%      0%       0%      0%      62%      38%    0%
text          44    5%       5%      5%       5%      0%      45%      27%    0%

labels: restore = echo-restore, lin+rst = linear+restore, sess-v1 = session-v1, sess-v2 = session-v2, ckpt =
checkpoint-tree
"""


BEHAVIOUR_80 = """\
Behaviour × strategy
behaviour                   sessions        tree     restore      linear
────────────────────────────────────────────────────────────────────────
byte-exact                         2  100 / 1.00  100 / 1.00  100 / 1.00
claude-code                        2   78 / 1.00  100 / 1.00   78 / 1.00
claude-code+retry                  2  100 / 2.74  100 / 1.87  100 / 2.74
compaction                         2  100 / 1.53  100 / 1.53  100 / 1.53
compaction+                        2   67 / 1.47   67 / 1.47  100 / 1.47
  json-reserialize
history-edit                       2  100 / 1.00  100 / 1.00  100 / 1.00
history-edit+                      2   12 / 0.91   12 / 0.91   12 / 0.91
  reasoning-dropped+
  truncation
json-reserialize                   2   51 / 1.00   51 / 1.00  100 / 1.00
noncanonical-tokenization          2   61 / 1.00   61 / 1.00  100 / 1.00
noncanonical-tokenization+         2   57 / 1.00   57 / 1.00  100 / 1.45
  streaming+subagent
reasoning-dropped                  2   13 / 0.93   13 / 0.93   13 / 0.93
reasoning-rekeyed                  2   18 / 0.93   18 / 0.93   18 / 0.93
retry                              2  100 / 1.94  100 / 1.94  100 / 1.94
streaming                          2  100 / 1.00  100 / 1.00  100 / 1.00
subagent                           2  100 / 1.00  100 / 1.00  100 / 1.00
truncation                         2  100 / 1.64  100 / 1.64  100 / 1.64

behaviour                   sessions     lin+rst      chains    sess-v1
───────────────────────────────────────────────────────────────────────
byte-exact                         2  100 / 1.00  100 / 1.00  52 / 0.68
claude-code                        2  100 / 1.00   78 / 1.00  34 / 0.82
claude-code+retry                  2  100 / 1.87  100 / 1.87  37 / 0.82
compaction                         2  100 / 1.53  100 / 1.00  48 / 0.52
compaction+                        2  100 / 1.47  100 / 1.00   8 / 0.46
  json-reserialize
history-edit                       2  100 / 1.00  100 / 1.00  34 / 0.34
history-edit+                      2   12 / 0.91  100 / 5.26   6 / 0.47
  reasoning-dropped+
  truncation
json-reserialize                   2  100 / 1.00  100 / 1.00   6 / 1.02
noncanonical-tokenization          2  100 / 1.00  100 / 1.00  55 / 0.75
noncanonical-tokenization+         2  100 / 1.45   48 / 2.19   5 / 0.83
  streaming+subagent
reasoning-dropped                  2   13 / 0.93  100 / 5.19  13 / 0.95
reasoning-rekeyed                  2   18 / 0.93  100 / 3.92  18 / 1.03
retry                              2  100 / 1.94  100 / 1.94  59 / 0.82
streaming                          2  100 / 1.00  100 / 9.87   6 / 1.02
subagent                           2  100 / 1.00  100 / 1.00  42 / 0.78
truncation                         2  100 / 1.64  100 / 1.00  25 / 0.61

behaviour                   sessions      sess-v2        ckpt
─────────────────────────────────────────────────────────────
byte-exact                         2    52 / 0.68  100 / 1.00
claude-code                        2    52 / 1.41  100 / 1.00
claude-code+retry                  2    55 / 1.37  100 / 1.00
compaction                         2    63 / 0.90  100 / 1.00
compaction+                        2   100 / 3.84  100 / 1.00
  json-reserialize
history-edit                       2    51 / 0.58  100 / 1.00
history-edit+                      2   100 / 5.44  100 / 1.01
  reasoning-dropped+
  truncation
json-reserialize                   2  100 / 10.81  100 / 1.00
noncanonical-tokenization          2    55 / 0.75  100 / 1.00
noncanonical-tokenization+         2   100 / 7.05  100 / 1.00
  streaming+subagent
reasoning-dropped                  2   100 / 5.38  100 / 1.00
reasoning-rekeyed                  2   100 / 4.27  100 / 1.00
retry                              2    59 / 0.82  100 / 1.00
streaming                          2  100 / 10.15  100 / 1.00
subagent                           2    53 / 0.75  100 / 1.00
truncation                         2    25 / 0.61  100 / 1.00
each cell: % of genuine generated tokens trained / forwarded tokens ÷ ideal (the
ideal forwards each genuine branch once; simulator ground truth)
labels: restore = echo-restore, lin+rst = linear+restore, sess-v1 = session-v1,
sess-v2 = session-v2, ckpt = checkpoint-tree
"""


BEHAVIOUR_120 = """\
Behaviour × strategy
behaviour                   sessions        tree     restore      linear     lin+rst      chains    sess-v1      sess-v2
────────────────────────────────────────────────────────────────────────────────────────────────────────────────────────
byte-exact                         2  100 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  52 / 0.68    52 / 0.68
claude-code                        2   78 / 1.00  100 / 1.00   78 / 1.00  100 / 1.00   78 / 1.00  34 / 0.82    52 / 1.41
claude-code+retry                  2  100 / 2.74  100 / 1.87  100 / 2.74  100 / 1.87  100 / 1.87  37 / 0.82    55 / 1.37
compaction                         2  100 / 1.53  100 / 1.53  100 / 1.53  100 / 1.53  100 / 1.00  48 / 0.52    63 / 0.90
compaction+                        2   67 / 1.47   67 / 1.47  100 / 1.47  100 / 1.47  100 / 1.00   8 / 0.46   100 / 3.84
  json-reserialize
history-edit                       2  100 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  34 / 0.34    51 / 0.58
history-edit+                      2   12 / 0.91   12 / 0.91   12 / 0.91   12 / 0.91  100 / 5.26   6 / 0.47   100 / 5.44
  reasoning-dropped+
  truncation
json-reserialize                   2   51 / 1.00   51 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00   6 / 1.02  100 / 10.81
noncanonical-tokenization          2   61 / 1.00   61 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  55 / 0.75    55 / 0.75
noncanonical-tokenization+         2   57 / 1.00   57 / 1.00  100 / 1.45  100 / 1.45   48 / 2.19   5 / 0.83   100 / 7.05
  streaming+subagent
reasoning-dropped                  2   13 / 0.93   13 / 0.93   13 / 0.93   13 / 0.93  100 / 5.19  13 / 0.95   100 / 5.38
reasoning-rekeyed                  2   18 / 0.93   18 / 0.93   18 / 0.93   18 / 0.93  100 / 3.92  18 / 1.03   100 / 4.27
retry                              2  100 / 1.94  100 / 1.94  100 / 1.94  100 / 1.94  100 / 1.94  59 / 0.82    59 / 0.82
streaming                          2  100 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  100 / 9.87   6 / 1.02  100 / 10.15
subagent                           2  100 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  100 / 1.00  42 / 0.78    53 / 0.75
truncation                         2  100 / 1.64  100 / 1.64  100 / 1.64  100 / 1.64  100 / 1.00  25 / 0.61    25 / 0.61

behaviour                   sessions        ckpt
────────────────────────────────────────────────
byte-exact                         2  100 / 1.00
claude-code                        2  100 / 1.00
claude-code+retry                  2  100 / 1.00
compaction                         2  100 / 1.00
compaction+                        2  100 / 1.00
  json-reserialize
history-edit                       2  100 / 1.00
history-edit+                      2  100 / 1.01
  reasoning-dropped+
  truncation
json-reserialize                   2  100 / 1.00
noncanonical-tokenization          2  100 / 1.00
noncanonical-tokenization+         2  100 / 1.00
  streaming+subagent
reasoning-dropped                  2  100 / 1.00
reasoning-rekeyed                  2  100 / 1.00
retry                              2  100 / 1.00
streaming                          2  100 / 1.00
subagent                           2  100 / 1.00
truncation                         2  100 / 1.00
each cell: % of genuine generated tokens trained / forwarded tokens ÷ ideal (the ideal forwards each genuine branch
once; simulator ground truth)
labels: restore = echo-restore, lin+rst = linear+restore, sess-v1 = session-v1, sess-v2 = session-v2, ckpt =
checkpoint-tree
"""


@pytest.mark.parametrize("width, expected", [(80, SUMMARY_80), (120, SUMMARY_120)])
def test_replay_tables_are_pinned(width, expected):
    assert render(summary_view(SUMMARY, width), width) == expected


@pytest.mark.parametrize("width, expected", [(80, BEHAVIOUR_80), (120, BEHAVIOUR_120)])
def test_behaviour_matrix_is_pinned(width, expected):
    assert render(behaviour_view(BEHAVIOUR, width), width) == expected


@pytest.mark.parametrize("width", [60, 80, 100, 120, 200])
def test_every_number_is_whole_at_any_width(width):
    """Every value of the summary shows in full; no line is wider than the console."""
    text = render([*summary_view(SUMMARY, width), *behaviour_view(BEHAVIOUR, width)], width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    for name, block in SUMMARY["strategies"].items():
        for key in ("trained_tokens", "forwarded_tokens", "context_tokens"):
            assert f"{block[key]:,}" in text, (name, key)


def test_stacking_repeats_the_key_and_keeps_every_column():
    key = [Column("id", ["a", "b"], justify="left")]
    values = [Column(f"metric {n}", [f"{n}{n}{n}", f"{n}"]) for n in range(6)]
    text = render(fit(key, values, 30), 30)
    assert text.count("id ") == 3 and all(f"metric {n}" in text for n in range(6))


def test_ids_are_shortened_from_the_middle():
    """A common prefix (run, date) must not hide the part that tells sessions apart: their ends."""
    ids = [f"rollout-2025-03-01T09:30:00Z-worker-07-session-{n:06d}" for n in (41, 42)]
    short = [middle(i, 24) for i in ids]
    assert short == ["rollout-2025…sion-000041", "rollout-2025…sion-000042"]
    assert middle("sim-qwen3-s7-0003") == "sim-qwen3-s7-0003"  # short ids stay whole


def test_gate_rows_keep_rules_apart():
    """Two rules on different strategies must not render as the same truncated text."""
    from types import SimpleNamespace

    def result(strategy, metric, passed):
        rule = SimpleNamespace(name=None, metric=metric)
        return SimpleNamespace(rule=rule, strategy=strategy, actual=0.5, expected=">= 0.95", passed=passed, message="")

    results = [
        result("linear+restore", "coverage_by_tool.Edit", False),
        result("linear+restore", "coverage_by_tool.Write", True),
    ]
    text = render(gate_view(results, 80), 80)
    assert "FAIL  lin+rst.coverage_by_tool.Edit" in text and "PASS  lin+rst.coverage_by_tool.Write" in text
    assert "labels: lin+rst = linear+restore" in text


def _one_strategy(name: str, sessions: int = 1) -> dict:
    """SUMMARY cut to one strategy (no tree baseline, no savings) and `sessions` sessions."""
    summary = json.loads(json.dumps(SUMMARY))
    summary["strategies"] = {name: summary["strategies"][name]}
    summary["token_savings"], summary["sessions_total"], summary["sessions_replayed"] = {}, sessions, sessions
    return summary


def test_wording_singular_no_negative_zero_and_footnotes_only_for_what_shows():
    from trace_tools.report.layout import count, signed_pct

    assert (count(1, "session"), count(2, "session"), count(1234, "turn")) == ("1 session", "2 sessions", "1,234 turns")
    assert [signed_pct(x) for x in (-0.0004, 0.0, 0.0004, -0.029, 0.032, -1e-9)] == [
        "-0.04%",
        "0.0%",
        "+0.04%",
        "-2.9%",
        "+3.2%",
        "-<0.001%",
    ]
    text = render(summary_view(_one_strategy("linear"), 80), 80)
    assert "(1 session, " in text and "1 sessions" not in text
    assert "saved vs" not in text and "* =" not in text  # no tree in the run: no savings column, no footnote for it
    assert "max forks = " in text  # the column is shown, so it is explained
    counters = text.split("Counters:")[1].split("Coverage by tool")[0]
    assert "nonlinear" in counters and "resets" in counters and "close_unresolved" in counters
    assert "rewrite_merges 46" in " ".join(counters.split())  # linear is built on the tree: it merges rewrites too
    assert " - " not in text.replace(" - trained", "").replace("1 - ", "")  # absent is n/a, never a bare minus


def test_counters_table_shows_na_where_a_strategy_has_no_such_step_and_is_left_out_when_none_apply():
    text = render(summary_view(SUMMARY, 120), 120)
    row = next(line for line in text.splitlines() if line.startswith("nonlinear "))
    assert row.split() == ["nonlinear", "n/a", "n/a", "74", "70", "n/a"]  # tree, restore, linear, lin+rst, ckpt
    assert "Counters:" not in render(summary_view(_one_strategy("chains"), 80), 80)


def test_report_md_names_every_counter_it_does_not_tabulate():
    from trace_tools.report.render import markdown_report

    text = markdown_report(SUMMARY)
    section = text.split("## Counters")[1].split("\n## ")[0]
    assert all(f"| {c} |" in section or f"`{c}`" in section for c in SUMMARY["strategies"]["tree"]["counters"])
    assert "Zero in every strategy: " in section
    assert "| nonlinear | n/a | n/a | 74 | 70 | n/a | n/a | n/a | n/a |" in section
