"""What each built-in strategy is, declared once: name, label, parameters, template facts, kind.

Every view derives from these declarations: the strategy classes (`Strategy.declaration`), the
command line (`--strategy` choices, one flag per parameter marked `flag`, `--help` texts), the
option check before a run, the template audit (which checks each strategy relies on), the
report (short labels, which strategies are counterfactual) and the column order of every
table (docs/strategies.md#the-strategies). The module imports nothing heavy, so
`trace-tools --help` can read it; the classes themselves load on first use (`strategies.builtin`).

To add a strategy: declare it here, write its class with `declaration = <the declaration>`, and
list the class in `strategies.builtin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trace_tools import families
from trace_tools.errors import UnknownName
from trace_tools.options import Param

# -- template facts (the checks of `trace-tools audit-template`, `render.audit.CHECKS`) -------------

# The tree compares each request's rendered ids with the ids served before it.
SERVED_IDS = ("generation_prompt", "prefix_stability", "last_assistant", "reasoning_history", "tokenizer_merges")
# The healer splices served ids + closer + a text-space tail; a non-prefix render resets it.
HEALING = ("prefix_stability", "last_assistant", "reasoning_history", "closer_text", "closer_tool")
# Chains and miles' TITO session servers append incrementally rendered messages to served ids.
INCREMENTAL = ("generation_prompt", "tokenizer_merges")
# The checkpoint tree glues verified closer text onto exact checkpoints and re-renders the rest.
CLOSER = ("closer_text", "closer_tool")

# -- counters (data.COUNTERS) each family of strategies fills; the others do not apply to it ------------

TREE_COUNTERS = ("drift_clean", "drift_realign", "drift_fork", "tree_branches", "rewrite_merges", "server_errors")
RESTORE_COUNTERS = ("restored_echoes", "unrecognized_echoes")
HEALER_COUNTERS = (
    "healed_turns",
    "healed_prefix_tokens",
    "nonlinear",
    "nonlinear_history",
    "nonlinear_template",
    "close_unresolved",
    "resets",
)
SERVER_COUNTERS = ("rejected_requests", "server_errors")  # HTTP 400 / 500 of a session server
ROLLBACK_COUNTERS = ("rollbacks", "rollback_dropped_tokens")

# -- parameter vocabularies (the algorithms check against the same tuples) ---------------------------

DEFAULT_FORK_THRESHOLD = 1024
REALIGN_GATES = ("output", "drift")
REALIGN_STARTS = ("response", "divergence")
ON_NONLINEAR = ("reset", "error", "passthrough")
SESSION_MATCHERS = ("strict", "loose_tool_call", "role_content_only")  # keys of session_core's MATCHERS
TITO_FAMILIES = tuple(families.TITO_FAMILIES)  # miles' `--tito-model` keys, from the family records
RETRY_POLICIES = ("supersede", "keep")

# -- parameters --------------------------------------------------------------------------------------

# Declared by every strategy that reproduces an upstream system's render (docs/upstream_families.md).
LENIENT_RENDER = Param(
    "lenient_render",
    bool,
    False,
    "pass tool-call arguments as JSON text to a template that needs text; upstream passes dicts "
    "and fails those requests (every report labels a run that sets this)",
)
TREE_PARAMS: tuple[Param, ...] = (
    Param(
        "fork_threshold",
        int,
        DEFAULT_FORK_THRESHOLD,
        "FORK / rewrite-merge threshold in tokens; <= 0 = agentcore CLEAN/FORK only",
        flag=True,
    ),
    Param(
        "realign_gate",
        str,
        "output",
        "REALIGN gate on the incoming output length (slime) or the drift size (TRL)",
        choices=REALIGN_GATES,
        flag=True,
    ),
    Param(
        "realign_from",
        str,
        "response",
        "REALIGN from the response start (slime) or the divergence point (TRL)",
        choices=REALIGN_STARTS,
        flag=True,
    ),
    Param(
        "max_sample_tokens", int, 0, "truncate each sample to this many tokens as slime does; 0 = no limit", minimum=0
    ),
    Param("safe_edges", bool, True, "guard upstream's unsafe edge cases; false reproduces them"),
    LENIENT_RENDER,
)
RESTORE_PROMPT = Param(
    "restore_prompt", bool, True, "render the restored messages; false restores for routing only (slime PR #2282)"
)
LINEAR_PARAMS: tuple[Param, ...] = (
    *TREE_PARAMS,
    Param(
        "on_nonlinear",
        str,
        "reset",
        "what a non-append-only request does: re-anchor, fail the session, or pass",
        choices=ON_NONLINEAR,
        flag=True,
    ),
    Param("delta", bool, True, "heal through the text-space delta render first (the full render gives the same ids)"),
)
CHAINS_PARAMS: tuple[Param, ...] = (
    Param("rollback", bool, True, "roll back a rewritten latest assistant instead of forking a new chain", flag=True),
    Param("prompt_length", int, None, "chain capacity: prompt tokens (enforced with response_length)", minimum=1),
    Param("response_length", int, None, "chain capacity: response tokens (enforced with prompt_length)", minimum=1),
    LENIENT_RENDER,
)
SESSION_PARAMS: tuple[Param, ...] = (
    Param(
        "matcher",
        str,
        "strict",
        "how a request's history is compared with the stored messages",
        choices=SESSION_MATCHERS,
        flag=True,
    ),
    Param(
        "tito_family", str, None, "miles TITO family (default: the one matching the template)", choices=TITO_FAMILIES
    ),
    Param("max_seq_len", int, None, "truncate each sample to this many tokens, as miles does", minimum=1),
    LENIENT_RENDER,
)


def _loadable_harness_profile(value: str) -> str:
    """A `harness_profile` value that names a profile that loads (usage error otherwise)."""
    from trace_tools.render.harness_echo import load_profile  # on use: `--help` reads only the declaration

    if value not in ("auto", "none"):
        load_profile(value)
    return value


CHECKPOINT_PARAMS: tuple[Param, ...] = (
    Param(
        "retries",
        str,
        "supersede",
        "an unanswered earlier attempt: trim it (supersede) or keep both",
        choices=RETRY_POLICIES,
        flag=True,
    ),
    Param(
        "echo_rules",
        bool,
        True,
        "look past cosmetic echo rewrites; false matches messages by equality only",
        flag=True,
    ),
    Param(
        "harness_profile",
        str,
        "auto",
        "harness profile whose echo rewrites count as the same call, besides the generic classes: "
        "auto (replay: the shipped profile of the harness and version the dump records, else every "
        "shipped one, with a note), none, a shipped name such as claude-code-2.1.332, or a profile.json "
        "from trace-tools profile / probe",
        check=_loadable_harness_profile,
        flag=True,
    ),
)


@dataclass(frozen=True)
class Declaration:
    """One strategy as every view sees it.

    `label`: the short name terminal tables show (a legend explains those that differ).
    `relies_on`: the template facts its replay assumes; the audit fails the strategy when one fails.
    `counterfactual`: replay feeds ids the engine never saw (docs/strategies.md#the-strategies);
    the report says so.
    `renders_prompts`: False when it works from recorded prompt ids without a tokenizer.
    `upstream_system`: the system whose renders it reproduces ("slime", "miles", ...), or None.
    `counters`: the run counters (`data.COUNTERS`) its replay fills; reports show the others as n/a.
    """

    name: str
    label: str
    summary: str
    params: tuple[Param, ...] = ()
    relies_on: tuple[str, ...] = ()
    counterfactual: bool = False
    renders_prompts: bool = True
    upstream_system: str | None = None
    counters: tuple[str, ...] = ()


TREE = Declaration(
    "tree",
    "tree",
    "slime TrajectoryManager: message tree, rewrite-merge, CLEAN/REALIGN/FORK, per-node dedup",
    TREE_PARAMS,
    SERVED_IDS,
    renders_prompts=False,  # with recorded prompt ids and responses it needs no tokenizer
    upstream_system="slime",
    counters=TREE_COUNTERS,
)
ECHO_RESTORE = Declaration(
    "echo-restore",
    "restore",
    "slime PR #2282: restore re-rendered assistant echoes before rendering, then the slime tree",
    (*TREE_PARAMS, RESTORE_PROMPT),
    SERVED_IDS,
    counterfactual=True,
    upstream_system="slime",
    counters=(*TREE_COUNTERS, *RESTORE_COUNTERS),
)
LINEAR = Declaration(
    "linear",
    "linear",
    "agentcore LinearHealer: feed the served prefix + closer + new tail, then the slime tree",
    LINEAR_PARAMS,
    HEALING,
    counterfactual=True,
    upstream_system="agentcore",
    counters=(*TREE_COUNTERS, *HEALER_COUNTERS),
)
LINEAR_RESTORE = Declaration(
    "linear+restore",
    "lin+rst",
    "restore re-rendered echoes (slime PR #2282), then heal them linearly (agentcore)",
    LINEAR_PARAMS,
    HEALING,
    counterfactual=True,
    upstream_system="agentcore",
    counters=(*TREE_COUNTERS, *RESTORE_COUNTERS, *HEALER_COUNTERS),
)
CHAINS = Declaration(
    "chains",
    "chains",
    "uni-agent multiple linear chains: prefix-hash chain selection, last-assistant rollback",
    CHAINS_PARAMS,
    INCREMENTAL,
    counterfactual=True,  # the chains codec renders prompts itself
    upstream_system="uni-agent",
    counters=("chains_created", *ROLLBACK_COUNTERS, *SERVER_COUNTERS),
)
SESSION_V1 = Declaration(
    "session-v1",
    "sess-v1",
    "miles v1 session server: linear TITO trajectory, one-step rollback, one merged sample",
    SESSION_PARAMS,
    INCREMENTAL,
    counterfactual=True,  # the TITO prompt (checkpoint + suffix render) is not what the gateway fed
    upstream_system="miles",
    counters=(*ROLLBACK_COUNTERS, *SERVER_COUNTERS),
)
SESSION_V2 = Declaration(
    "session-v2",
    "sess-v2",
    "miles v2 session server: trajectory forest, retry trimming, exactly-once masking",
    SESSION_PARAMS,
    INCREMENTAL,
    counterfactual=True,
    upstream_system="miles",
    counters=("tree_branches", "trimmed_leaves", *SERVER_COUNTERS),
)
CHECKPOINT_TREE = Declaration(
    "checkpoint-tree",
    "ckpt",
    "token-checkpoint tree: deepest echo-equivalent checkpoint, delta render, exactly-once masks",
    CHECKPOINT_PARAMS,
    CLOSER,
    counterfactual=True,  # prompts are assembled from checkpoints, not the recorded prompt ids
    counters=(
        "tree_branches",
        *RESTORE_COUNTERS,
        "trimmed_leaves",
        "resets",
        "close_unresolved",
        "healed_turns",
        "healed_prefix_tokens",
    ),
)

# -- issue 36: the cumulative-token family and TRL's message mode -------------------------------------

ON_BREAK = ("raise", "reset", "fork")
CONTINUATION = Declaration(
    "continuation",
    "contin",
    "cumulative tokens (slime PR #2287, verl Continuous Token, rLLM): served ids + rendered new messages",
    (
        Param(
            "on_break",
            str,
            "raise",
            "a request that does not append to the served history: fail it (slime, verl), start "
            "afresh from its own prompt (rLLM), or continue from the latest turn it does extend",
            choices=ON_BREAK,
            flag=True,
        ),
        LENIENT_RENDER,
    ),
    SERVED_IDS,  # the suffix is cut where render(history) ends in render(history + new)
    counterfactual=True,  # continued prompts are served ids + suffix renders, not what the gateway fed
    upstream_system="slime",
    counters=(
        "healed_turns",
        "healed_prefix_tokens",
        "nonlinear",
        "nonlinear_history",
        "nonlinear_template",
        "resets",
        "restored_echoes",
        "server_errors",
    ),
)
LINEAR_CHAIN = Declaration(
    "linear-chain",
    "lchain",
    "TRL AsyncGRPO message mode: CLEAN/REALIGN/FORK on one chain of turns in arrival order, no routing",
    (
        {p.name: p for p in TREE_PARAMS}["fork_threshold"],  # TRL's fork_threshold_tokens, also 1024
        Param("strict", bool, False, "CLEAN/FORK only: any drift forks (fork_threshold_tokens=0 upstream)"),
        LENIENT_RENDER,
    ),
    SERVED_IDS,
    renders_prompts=False,  # it reconciles the recorded prompt ids, as TRL re-tokenizes every turn
    upstream_system="trl",
    counters=("drift_clean", "drift_realign", "drift_fork", "server_errors"),
)

# -- issue 36: verifiers' message graph and AReaL's interaction cache ----------------------------------

AREAL_EXPORTS = ("concat", "individual")  # AReaL's export_interactions styles
MESSAGE_GRAPH = Declaration(
    "message-graph",
    "graph",
    "verifiers v1 message graph as prime-rl trains it: a node per distinct message, a sample per branch",
    renders_prompts=False,  # recorded prompt ids, split at the graph's nodes
    upstream_system="verifiers",
    counters=("tree_branches",),
)
AREAL = Declaration(
    "areal",
    "areal",
    "AReaL InteractionCache: parent = longest strict message prefix plus text reply; one sample per leaf",
    (
        Param(
            "areal_export",
            str,
            "concat",
            "AReaL's export style: concat (prompts concatenated onto the parent's ids, one sample per "
            "leaf) or individual (the chat template's prompt, one sample per call)",
            choices=AREAL_EXPORTS,
            flag=True,
        ),
    ),
    counterfactual=True,  # concat feeds the parent's ids plus AReaL's own ChatML text, not the recorded prompt
    upstream_system="areal",
    counters=("tree_branches", "server_errors"),
)

# The column order of every table (docs/strategies.md#the-strategies).
DECLARATIONS: tuple[Declaration, ...] = (
    TREE,
    ECHO_RESTORE,
    LINEAR,
    LINEAR_RESTORE,
    CHAINS,
    SESSION_V1,
    SESSION_V2,
    CHECKPOINT_TREE,
    CONTINUATION,
    LINEAR_CHAIN,
    MESSAGE_GRAPH,
    AREAL,
)
BY_NAME = {declaration.name: declaration for declaration in DECLARATIONS}
NAMES = tuple(BY_NAME)
BY_LABEL = {declaration.label: declaration.name for declaration in DECLARATIONS}


def label(name: str) -> str:
    """A strategy's short label; a name without a declaration stands for itself."""
    declaration = BY_NAME.get(name)
    return declaration.label if declaration else name


def full_name(name: str) -> str:
    """The strategy a name or short label (as terminal tables print it) stands for; others unchanged."""
    return name if name in BY_NAME else BY_LABEL.get(name, name)


def in_column_order(names: Iterable[str]) -> list[str]:
    """`names` in column order (docs/strategies.md#the-strategies); names without a
    declaration last, alphabetically."""
    position = {name: n for n, name in enumerate(NAMES)}
    return sorted(names, key=lambda name: (position.get(name, len(position)), name))


def counter_applies(name: str, counter: str, value: int = 0) -> bool:
    """Whether a strategy fills a counter (one without a declaration, or a count it did make: yes)."""
    declaration = BY_NAME.get(name)
    return declaration is None or counter in declaration.counters or bool(value)


def owners(param: str) -> list[str]:
    """The built-in strategies that declare a parameter, in column order."""
    return [d.name for d in DECLARATIONS if any(p.name == param for p in d.params)]


def builtin_params() -> dict[str, Param]:
    """Every parameter a built-in strategy declares, by name (shared parameters are one declaration)."""
    return {param.name: param for declaration in DECLARATIONS for param in declaration.params}


def relies_on(names: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
    """The template facts each named strategy (default: every built-in) relies on; an unknown name
    is an `UnknownName` listing the built-ins."""
    for name in names or ():
        if name not in BY_NAME:
            raise UnknownName("strategy", name, list(NAMES))
    return {name: BY_NAME[name].relies_on for name in (names or NAMES)}
