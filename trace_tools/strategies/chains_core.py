"""uni-agent's multiple linear chains as a pure, deterministic state machine (no HTTP, no threads).

This mirrors the gateway session of verl-project/uni-agent at HEAD 6f4a7c97 as specified in
`shared/docs/reference/miles_uniagent.md` §3: each session keeps several *linear chains*, each one
a token buffer plus the normalized message history that produced it. A request continues the
chain whose history it provably extends (cumulative prefix hashes, §3.3), rolls back that chain's
latest generation when only the last assistant was rewritten (§3.8), and otherwise starts a new
chain from a full render. Nothing is ever re-rendered inside a chain: the generated ids stay as
generated and only the messages appended after them are encoded ("incremental context").

Replay differs from the live gateway in one place only: there is no engine. `ChainSession.step`
commits the *recorded* output ids of a turn, with the recorded assistant message (lowered by the
same adapter normalization as requests) as the stored assistant, and reports which chain took it.
Every response token carries provenance: the dump `turn_index` that generated it, or -1 (CONTEXT)
for prompt and incremental context.

Left out on purpose (see docs/upstream_chains.md): media, weight versions, reservations and
concurrency, backend failures, abort.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from trace_tools.errors import ReplayError, TraceToolsError
from trace_tools.memo import IdentityMemo
from trace_tools.render.base import RendererLike
from trace_tools.render.canonical import canonicalize_messages, canonicalize_response
from trace_tools.render.upstream import render_failure_reason

CONTEXT = -1  # provenance of prompt and incremental-context tokens
MAX_TRAJECTORY_LENGTH = "max_trajectory_length"

# Our own salts (the hashes never leave the process); the equivalences are uni-agent's.
_MESSAGE_SALT = b"trace-tools-chains-message\0"
_PREFIX_SALT = b"trace-tools-chains-prefix\0"
EMPTY_PREFIX = hashlib.sha256(_PREFIX_SALT + b"empty").hexdigest()


class ChainsSetupError(TraceToolsError):
    """Invalid chains options or a chat template the chains codec cannot work with."""


class GatewayError(ReplayError):
    """What the live gateway would have answered with an HTTP error; the session is left unchanged.

    `reason`: how the failure is counted, where the message alone does not say it well."""

    status = 500

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason


class RequestRejected(GatewayError):
    """The OpenAI adapter refuses the request (HTTP 400 upstream)."""

    status = 400


class ServerError(GatewayError):
    """An exception inside prepare/commit (HTTP 500 upstream): codec, rollback or alignment failure."""


# ---------------------------------------------------------------------------------------------
# Adapter normalization (§3.2)
# ---------------------------------------------------------------------------------------------


def normalize_request(messages: Any, tools: Any) -> tuple[list[dict], list | None]:
    """Check and lower an OpenAI chat request the way uni-agent's adapter does before hashing.

    What the adapter refuses (HTTP 400 upstream) raises RequestRejected; the lowering itself is
    the shared `uniagent` canonicalization policy (trace_tools.render.canonical).
    """
    if not isinstance(messages, list) or not messages:
        raise RequestRejected("messages must be a non-empty list")
    if tools is not None and not isinstance(tools, list):
        raise RequestRejected("tools must be a list or null")
    for message in messages:
        _check_message(message)
    return canonicalize_messages(messages, policy="uniagent"), tools


class _Lowering:
    """`normalize_request` and `message_hash` once per message object. A replayed session re-sends
    its whole history every turn and the pipeline hands out the same (never mutated) message
    objects turn after turn, so lowering and hashing them again each turn would be quadratic."""

    def __init__(self) -> None:
        self._lowered: IdentityMemo[dict | None] = IdentityMemo()
        self._hashes: IdentityMemo[str] = IdentityMemo()

    def request(self, messages: Any, tools: Any) -> tuple[list[dict], list | None]:
        if not isinstance(messages, list) or not messages or (tools is not None and not isinstance(tools, list)):
            return normalize_request(messages, tools)  # the adapter's own refusal
        lowered = [self._lowered.get(message, _lower) for message in messages]
        return [m for m in lowered if m is not None], tools

    def message_hash(self, message: dict) -> str:
        return self._hashes.get(message, message_hash)


def _lower(message: Any) -> dict | None:
    """One request message as `normalize_request` lowers it (None when the adapter drops it)."""
    _check_message(message)
    kept = canonicalize_messages([message], policy="uniagent")
    return kept[0] if kept else None


def normalize_assistant(message: dict) -> dict:
    """The stored assistant: the recorded response lowered like a request message (no re-decode).

    Keeps role, content (None becomes ""), name, tool_calls (string arguments that parse as a
    JSON object become that object, ids and `index` stay), tool_call_id and reasoning_content.
    """
    stored = canonicalize_response(message, policy="uniagent")
    if stored is None:
        raise RequestRejected(f"the recorded response needs a non-empty string role, got {message.get('role')!r}")
    return stored


def _check_message(message: Any) -> None:
    if not isinstance(message, dict):
        raise RequestRejected(f"each message must be an object, got {type(message).__name__}")
    if not isinstance(message.get("role"), str) or not message["role"]:
        raise RequestRejected("each message needs a non-empty string role")
    if message.get("content") is not None and not isinstance(message["content"], (str, list, dict)):
        raise RequestRejected(
            f"message content must be a string, a list or an object, got {type(message['content']).__name__}"
        )
    if message.get("name") is not None and not isinstance(message["name"], str):
        raise RequestRejected("a message name must be a string")
    if message.get("reasoning_content") is not None and not isinstance(message["reasoning_content"], str):
        raise RequestRejected("reasoning_content must be a string or null")
    calls = message.get("tool_calls")
    if calls is not None and (
        not isinstance(calls, list)
        or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)
    ):
        raise RequestRejected("tool_calls must be a list of objects, each with a `function` object")


# ---------------------------------------------------------------------------------------------
# Canonical form and cumulative prefix hashes (§3.3)
# ---------------------------------------------------------------------------------------------


def canonical_message(message: dict) -> dict:
    """The form that is hashed: tool-call ids and `tool_call_id` removed, arguments tagged.

    Arguments become ["json", value] when they are (or parse as) JSON and ["raw", value]
    otherwise, so key order and string-vs-object spelling do not matter. Everything else —
    `index`, `type`, `name`, `reasoning_content`, `content` — takes part in the identity.
    """
    canon = {key: value for key, value in message.items() if key != "tool_call_id"}
    if isinstance(canon.get("tool_calls"), list):
        canon["tool_calls"] = [_canonical_call(call) for call in canon["tool_calls"]]
    return canon


def _canonical_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    canon = {key: value for key, value in call.items() if key != "id"}
    function = canon.get("function")
    if isinstance(function, dict) and "arguments" in function:
        canon["function"] = {**function, "arguments": _tagged_arguments(function["arguments"])}
    return canon


def _tagged_arguments(arguments: Any) -> list:
    if isinstance(arguments, (dict, list)):
        return ["json", arguments]
    if isinstance(arguments, str):
        try:
            return ["json", json.loads(arguments)]
        except ValueError:
            pass
    return ["raw", arguments]


def message_hash(message: dict) -> str:
    body = json.dumps(canonical_message(message), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(_MESSAGE_SALT + body.encode("utf-8")).hexdigest()


def extend_prefix_hash(previous: str | None, message: dict, hash_message: Callable[[dict], str] = message_hash) -> str:
    link = (previous or EMPTY_PREFIX).encode("ascii") + b"\0" + hash_message(message).encode("ascii")
    return hashlib.sha256(_PREFIX_SALT + link).hexdigest()


def prefix_hashes(messages: Sequence[dict], hash_message: Callable[[dict], str] = message_hash) -> list[str]:
    """H[i] identifies messages[:i + 1]; equal H[i] means equal canonical prefixes."""
    hashes: list[str] = []
    for message in messages:
        hashes.append(extend_prefix_hash(hashes[-1] if hashes else None, message, hash_message))
    return hashes


# ---------------------------------------------------------------------------------------------
# Codec (§3.5)
# ---------------------------------------------------------------------------------------------

_ANCHOR = ({"role": "user", "content": ""},)


class ChainCodec:
    """Token encoding the way uni-agent's MessageCodec does it, over any RendererLike.

    `generation_prompt` and `turn_separator` are probed once from the template at construction.
    `eos_token_ids` defaults to the renderer's `stop_token_ids` (or `eos_token_id`).
    """

    def __init__(
        self, renderer: RendererLike, template_kwargs: dict | None = None, eos_token_ids: Sequence[int] | None = None
    ):
        self.renderer = renderer
        self.template_kwargs = dict(template_kwargs or {})
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None else _renderer_eos_ids(renderer))
        self.generation_prompt = self._probe_generation_prompt()
        self.turn_separator = self._probe_turn_separator()
        self.separator_text = renderer.decode(self.turn_separator) if self.turn_separator else ""

    def render_text(
        self, messages: Sequence[dict], tools: Sequence[dict] | None = None, add_generation_prompt: bool = True
    ) -> str:
        """Render text; if the template refuses (e.g. no user message), render behind an empty user.

        The fallback mirrors verl's `apply_chat_template`: the empty user's own rendering is cut off
        again, so the result covers `messages` only.
        """
        try:
            return self._render(messages, tools, add_generation_prompt)
        except Exception as first_error:
            try:
                anchored = self._render([*_ANCHOR, *messages], tools, add_generation_prompt)
                anchor = self._render(list(_ANCHOR), tools, False)
            except Exception:
                raise first_error from None
            if not anchored.startswith(anchor):
                raise first_error
            return anchored[len(anchor) :]

    def encode_full(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
        """A new chain's prompt: the whole request rendered with the generation prompt.

        A template that refuses the request even behind the empty user fails it (HTTP 500)."""
        try:
            text = self.render_text(messages, tools, True)
        except ReplayError as exc:
            raise _render_failure("the chat template cannot render the request", exc) from exc
        return self.renderer.encode(text)

    def encode_incremental(self, messages: Sequence[dict]) -> list[int]:
        """Ids of `messages` appended after a generated assistant: separator + messages + GP.

        Rendered behind an anchored empty user whose own rendering (minus its trailing separator)
        must be a text prefix of the result; tools are not passed, as upstream.
        """
        if not messages:
            return []
        if any(m.get("role") == "assistant" for m in messages[1:]):
            raise ServerError("An incremental assistant message may only appear first")
        anchor_text = self.render_text(list(_ANCHOR), None, False)
        try:
            full_text = self.render_text([*_ANCHOR, *messages], None, True)
        except ReplayError as exc:  # e.g. gpt-oss refuses a tool message with no call before it: a 500 upstream
            raise _render_failure(
                "the chat template cannot render the appended messages behind the anchor", exc
            ) from exc
        if not anchor_text.endswith(self.separator_text):
            raise ServerError("The turn separator is not a suffix of the rendered anchor message")
        prefix = anchor_text[: len(anchor_text) - len(self.separator_text)]
        if not full_text.startswith(prefix):
            raise ServerError("Incremental chat template is not prefix-stable")
        return self.renderer.encode(full_text[len(prefix) :])

    def _render(self, messages: Sequence[dict], tools: Sequence[dict] | None, generation: bool) -> str:
        return self.renderer.render_text(list(messages), tools, generation, **self.template_kwargs)

    def _probe_generation_prompt(self) -> list[int]:
        without = self.renderer.encode(self.render_text(list(_ANCHOR), None, False))
        with_gp = self.renderer.encode(self.render_text(list(_ANCHOR), None, True))
        if with_gp[: len(without)] != without:
            raise ChainsSetupError(
                "the chat template's generation prompt is not a stable token suffix; "
                "the chains strategy needs a template whose prompt only appends it"
            )
        return with_gp[len(without) :]

    def _probe_turn_separator(self) -> list[int]:
        """verl's `initialize_turn_separator`: the common tail of two user turns after the last EOS."""
        for empty, filled in (("", "x"), ([{"type": "text", "text": ""}], [{"type": "text", "text": "x"}])):
            try:
                a = self.renderer.encode(self._render([{"role": "user", "content": empty}], None, False))
                b = self.renderer.encode(self._render([{"role": "user", "content": filled}], None, False))
            except Exception:
                continue
            return _separator_from_suffix(_common_suffix(a, b), self.eos_token_ids)
        return []


def _render_failure(what: str, exc: BaseException) -> ServerError:
    """The 500 of a render that raised (`render_failure_reason` says how it is counted)."""
    return ServerError(f"{what}: {exc}", render_failure_reason(what, exc))


def _renderer_eos_ids(renderer: RendererLike) -> list[int]:
    stops = getattr(renderer, "stop_token_ids", None)
    if stops:
        return list(stops)
    eos = getattr(renderer, "eos_token_id", None)
    return [eos] if eos is not None else []


def _common_suffix(a: list[int], b: list[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n :]


def _separator_from_suffix(suffix: list[int], eos_ids: frozenset[int]) -> list[int]:
    eos_positions = [i for i, token in enumerate(suffix) if token in eos_ids]
    if eos_positions:
        return suffix[eos_positions[-1] + 1 :]
    return suffix[1:]


# ---------------------------------------------------------------------------------------------
# Session state (§3.4)
# ---------------------------------------------------------------------------------------------


@dataclass
class TokenBuffer:
    """A chain's tokens: the first full prompt, then generated and context ids with their masks."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    response_source: list[int] = field(default_factory=list)

    def copy(self) -> "TokenBuffer":
        return TokenBuffer(
            list(self.prompt_ids),
            list(self.response_ids),
            list(self.response_mask),
            list(self.response_logprobs),
            list(self.response_source),
        )

    def append(self, ids: Sequence[int], trained: bool, source: int, logprobs: Sequence[float] | None) -> None:
        self.response_ids += ids
        self.response_mask += [1 if trained else 0] * len(ids)
        self.response_source += [source] * len(ids)
        if logprobs is not None:
            self.response_logprobs += logprobs

    def truncate(self, length: int) -> None:
        del self.response_ids[length:], self.response_mask[length:], self.response_source[length:]
        del self.response_logprobs[length:]

    def check_logprob_alignment(self) -> None:
        if len(self.response_logprobs) not in (0, len(self.response_ids)):
            raise ServerError("response_logprobs must be empty or aligned with response_ids")

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class LastAssistantStart:
    """Where a chain's latest generation began: response length then, and its request's tip."""

    response_ids_len: int
    message_history_len: int
    tip_hash: str


@dataclass
class Chain:
    chain_id: int
    message_history: list[dict]
    message_tip_hash: str | None
    tools: list | None
    buffer: TokenBuffer
    last_assistant_start: LastAssistantStart | None
    updated_seq: int


@dataclass
class Trajectory:
    """One materialized chain (uni-agent's Trajectory plus provenance)."""

    chain_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    response_source: list[int]
    num_turns: int
    order_seq: int
    reward_info: dict = field(default_factory=dict)
    extra_fields: dict = field(default_factory=dict)


@dataclass
class Preparation:
    """The working copy `prepare` builds; nothing in the session changes until commit or close."""

    buffer: TokenBuffer
    messages: list[dict]
    tools: list | None
    hashes: list[str]
    chain_id: int | None
    rollback: bool = False
    dropped_tokens: int = 0
    dropped_turns: tuple[int, ...] = ()
    rollback_history_len: int = 0
    capacity_exhausted: bool = False
    max_tokens: int | None = None
    new_last_assistant_start: LastAssistantStart | None = None
    created_chain: bool = False
    prompt_tokens: int = 0

    @property
    def context_ids(self) -> list[int]:
        return self.buffer.prompt_ids + self.buffer.response_ids


@dataclass(frozen=True)
class StepOutcome:
    """What one replayed request did: `kind` is "committed" or "length" (capacity exhausted)."""

    kind: str
    chain_id: int | None
    new_chain: bool
    rollback: bool
    dropped_tokens: int
    rolled_back_turns: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int | None


@dataclass(frozen=True)
class _Candidate:
    chain: Chain
    service: int
    exact: bool

    def rank(self) -> tuple:
        return self.service, self.exact, self.chain.updated_seq, self.chain.chain_id


# ---------------------------------------------------------------------------------------------
# Chain selection (§3.7, HEAD)
# ---------------------------------------------------------------------------------------------


def is_exact_prefix(chain: Chain, hashes: Sequence[str]) -> bool:
    """The chain's whole history is a prefix of the request (an empty history prefixes anything)."""
    n = len(chain.message_history)
    return n <= len(hashes) and (n == 0 or chain.message_tip_hash == hashes[n - 1])


def select_chain(
    chains: Sequence[Chain], tools: list | None, hashes: Sequence[str], rollback_enabled: bool
) -> tuple[Chain, bool] | None:
    """(chain, rollback?) to continue, or None for a new chain.

    Candidates share the whole prompt of their latest generation with the request. Exact ones
    (the request extends the full history) are valued by history length, rollback ones (only the
    latest assistant differs) by that prompt's length; two equally deep rollback candidates deeper
    than every exact one are ambiguous and start a new chain.
    """
    ranked: list[_Candidate] = []
    deep: list[Chain] = []
    deep_len = -1
    for chain in chains:
        start = chain.last_assistant_start
        if chain.tools != tools or start is None:
            continue
        boundary = start.message_history_len
        if boundary >= len(hashes) or hashes[boundary - 1] != start.tip_hash:
            continue  # a resend of (or edit within) the latest prompt is a sibling, never a rewrite
        if is_exact_prefix(chain, hashes):
            ranked.append(_Candidate(chain, len(chain.message_history), True))
        elif rollback_enabled and start.response_ids_len > 0:
            if boundary > deep_len:
                deep, deep_len = [chain], boundary
            elif boundary == deep_len:
                deep.append(chain)
    if len(deep) == 1:
        ranked.append(_Candidate(deep[0], deep_len, False))
    elif len(deep) > 1 and deep_len > max((c.service for c in ranked), default=-1):
        return None
    if not ranked:
        return None
    best = max(ranked, key=_Candidate.rank)
    return best.chain, not best.exact


# ---------------------------------------------------------------------------------------------
# The session (§3.6 – §3.11)
# ---------------------------------------------------------------------------------------------


class ChainSession:
    """One gateway session's chains, driven by recorded turns instead of an engine.

    `prompt_length` + `response_length` is the total trajectory capacity; it is enforced only when
    both are set. With `enable_last_assistant_rollback` a request that rewrites only the latest
    assistant of a chain rolls that generation back instead of starting a new chain.
    """

    def __init__(
        self,
        codec: ChainCodec,
        prompt_length: int | None = None,
        response_length: int | None = None,
        enable_last_assistant_rollback: bool = True,
    ):
        _require_positive("response_length", response_length)
        _require_positive("prompt_length", prompt_length)
        self.codec = codec
        self.capacity = prompt_length + response_length if prompt_length and response_length else None
        self.enable_last_assistant_rollback = enable_last_assistant_rollback
        self.active_chains: list[Chain] = []
        self.materialized: list[Trajectory] = []
        self.reward_info: dict = {}
        self.finalized = False
        self._next_chain_id = 1
        self._order_seq = 0
        self.rollback_count = 0
        self.rollback_dropped_tokens = 0
        self.chains_created = 0
        self.chain_forks = 0
        self.capacity_exhausted = 0
        self._lowering = _Lowering()

    # -- the request path ---------------------------------------------------------------------
    def step(
        self,
        messages: Any,
        tools: Any,
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        assistant_message: dict,
        *,
        turn_index: int = CONTEXT,
        request_logprobs: bool | None = None,
    ) -> StepOutcome:
        """Replay one request whose engine output is known: prepare, then commit the recorded output.

        `request_logprobs` is the request's `logprobs` flag (default: whether `logprobs` is given);
        logprobs are collected only when it is set. `assistant_message` is the recorded response;
        it is normalized like a request message and stored as the chain's new tip. Raises
        RequestRejected / ServerError where the gateway would answer 400 / 500; the session is then
        unchanged.
        """
        self._require_active()
        messages, tools = self._lowering.request(messages, tools)
        stored = normalize_assistant(assistant_message)
        wants_logprobs = logprobs is not None if request_logprobs is None else request_logprobs
        prep = self.prepare(messages, tools, wants_logprobs)
        if prep.capacity_exhausted:
            self.capacity_exhausted += 1
            if prep.chain_id is not None:
                self.close_chain_for_length(prep)
            return self._outcome("length", prep, completion_tokens=0)
        _check_backend_logprobs(wants_logprobs, logprobs, len(output_ids))
        output_ids, logprobs = _respect_max_tokens(prep.max_tokens, list(output_ids), logprobs)
        prep.buffer.append(output_ids, True, turn_index, logprobs if wants_logprobs else None)
        prep.buffer.check_logprob_alignment()
        self.commit(prep, stored)
        return self._outcome("committed", prep, completion_tokens=len(output_ids))

    def prepare(self, messages: list[dict], tools: list | None, wants_logprobs: bool) -> Preparation:
        """Pick a chain (or none) and build the context ids on a copy (§3.8)."""
        hashes = prefix_hashes(messages, self._lowering.message_hash)
        selected = select_chain(self.active_chains, tools, hashes, self.enable_last_assistant_rollback)
        if selected is None:
            prep = self._prepare_new_chain(messages, tools, hashes)
        else:
            prep = self._prepare_continuation(*selected, messages, tools, hashes, wants_logprobs)
        prep.prompt_tokens = len(prep.context_ids)
        if prep.capacity_exhausted:
            return prep
        if self.capacity:
            prep.max_tokens = self.capacity - len(prep.context_ids)
        prep.new_last_assistant_start = LastAssistantStart(len(prep.buffer.response_ids), len(messages), hashes[-1])
        return prep

    def _prepare_new_chain(self, messages: list[dict], tools: list | None, hashes: list[str]) -> Preparation:
        prompt = self.codec.encode_full(messages, tools)
        exhausted = self._reaches_capacity(len(prompt))
        return Preparation(TokenBuffer(prompt), messages, tools, hashes, None, capacity_exhausted=exhausted)

    def _prepare_continuation(
        self,
        chain: Chain,
        rollback: bool,
        messages: list[dict],
        tools: list | None,
        hashes: list[str],
        wants_logprobs: bool,
    ) -> Preparation:
        prep = Preparation(chain.buffer.copy(), messages, tools, hashes, chain.chain_id)
        prep.buffer.check_logprob_alignment()
        start = len(chain.message_history)
        if rollback:
            start = self._roll_back(chain, prep)
        current = prep.buffer.length
        exhausted = self._reaches_capacity(current)
        incremental: list[int] = []
        if messages[start:] and not exhausted:
            incremental = self.codec.encode_incremental(messages[start:])
            exhausted = self._reaches_capacity(current + len(incremental))
        if not exhausted:
            prep.buffer.append(incremental, False, CONTEXT, [0.0] * len(incremental) if wants_logprobs else None)
            prep.buffer.check_logprob_alignment()
        prep.capacity_exhausted = exhausted
        return prep

    def _reaches_capacity(self, tokens: int) -> bool:
        """Whether `tokens` context tokens leave no room to generate (never without a capacity)."""
        return tokens >= self.capacity if self.capacity else False

    def _roll_back(self, chain: Chain, prep: Preparation) -> int:
        """Cut the latest generation and the GP + separator before it; return where new messages start."""
        start = chain.last_assistant_start
        assert start is not None, "select_chain rolls back only a chain with a latest generation"
        buffer = prep.buffer
        abandoned = range(start.response_ids_len, len(buffer.response_ids))
        prep.rollback = True
        prep.dropped_tokens = sum(buffer.response_mask[i] for i in abandoned)
        prep.dropped_turns = tuple(sorted({buffer.response_source[i] for i in abandoned if buffer.response_mask[i]}))
        prep.rollback_history_len = start.message_history_len
        gp = self.codec.generation_prompt
        cut = start.response_ids_len - len(gp)
        if cut < 0 or buffer.response_ids[cut : start.response_ids_len] != gp:
            raise ServerError("Stored response does not end its assistant prefix with the generation prompt")
        # The separator is not checked: the incremental encoding starts with it again.
        buffer.truncate(cut - len(self.codec.turn_separator))
        buffer.check_logprob_alignment()
        return start.message_history_len

    # -- mutations ----------------------------------------------------------------------------
    def commit(self, prep: Preparation, assistant: dict) -> None:
        """The single mutation point: store the chain (new, or replaced in place) with its new tip."""
        history = [*prep.messages, assistant]
        tip = extend_prefix_hash(prep.hashes[-1], assistant)
        start = prep.new_last_assistant_start
        self._record_rollback(prep)
        seq = self._next_order_seq()
        if prep.chain_id is None:
            chain = Chain(self._next_chain_id, history, tip, prep.tools, prep.buffer, start, seq)
            self._next_chain_id += 1
            self.chain_forks += self.chains_created > 0
            self.chains_created += 1
            self.active_chains.append(chain)
            prep.chain_id, prep.created_chain = chain.chain_id, True
        else:
            index = self._active_index(prep.chain_id)
            old = self.active_chains[index]
            self.active_chains[index] = replace(
                old,
                message_history=history,
                message_tip_hash=tip,
                tools=prep.tools,
                buffer=prep.buffer,
                last_assistant_start=start,
                updated_seq=seq,
            )

    def close_chain_for_length(self, prep: Preparation) -> None:
        """Materialize only the selected chain, without the incremental context that was not sent."""
        index = self._active_index(prep.chain_id)
        chain = self.active_chains.pop(index)
        if prep.rollback:
            boundary = prep.rollback_history_len
            chain = replace(
                chain,
                message_history=prep.messages[:boundary],
                message_tip_hash=prep.hashes[boundary - 1],
                buffer=prep.buffer,
            )
        self._record_rollback(prep)
        extra = {"materialization_reason": MAX_TRAJECTORY_LENGTH}
        self.materialized.append(_materialize(chain, self._next_order_seq(), extra))

    def set_reward_info(self, reward_info: dict) -> None:
        self._require_active()
        self.reward_info = dict(reward_info)

    def finalize(self) -> list[Trajectory]:
        """Every chain as a trajectory, ordered by its last accepted outcome, reward copied in."""
        self._require_active()
        for chain in self.active_chains:
            self.materialized.append(_materialize(chain, chain.updated_seq, {}))
        self.active_chains = []
        self.finalized = True
        ordered = sorted(self.materialized, key=lambda t: t.order_seq)
        return [replace(t, reward_info=dict(self.reward_info)) for t in ordered]

    # -- helpers ------------------------------------------------------------------------------
    def _record_rollback(self, prep: Preparation) -> None:
        if prep.rollback:
            self.rollback_count += 1
            self.rollback_dropped_tokens += prep.dropped_tokens

    def _next_order_seq(self) -> int:
        self._order_seq += 1
        return self._order_seq

    def _active_index(self, chain_id: int | None) -> int:
        return next(i for i, chain in enumerate(self.active_chains) if chain.chain_id == chain_id)

    def _require_active(self) -> None:
        if self.finalized:
            raise ServerError("the session is finalized")

    @staticmethod
    def _outcome(kind: str, prep: Preparation, completion_tokens: int) -> StepOutcome:
        return StepOutcome(
            kind,
            prep.chain_id,
            prep.created_chain,
            prep.rollback,
            prep.dropped_tokens,
            prep.dropped_turns,
            prep.prompt_tokens,
            completion_tokens,
            prep.max_tokens,
        )


def _materialize(chain: Chain, order_seq: int, extra_fields: dict) -> Trajectory:
    buffer = chain.buffer
    buffer.check_logprob_alignment()
    turns = sum(1 for m in chain.message_history if m.get("role") in ("user", "assistant")) + 1
    return Trajectory(
        chain.chain_id,
        list(buffer.prompt_ids),
        list(buffer.response_ids),
        list(buffer.response_mask),
        list(buffer.response_logprobs) or None,
        list(buffer.response_source),
        turns,
        order_seq,
        extra_fields=dict(extra_fields),
    )


def _require_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ChainsSetupError(
            f"chains option {name} must be a positive integer (got {value!r}); omit it to disable the capacity check"
        )


def _respect_max_tokens(
    max_tokens: int | None, output_ids: list[int], logprobs: Sequence[float] | None
) -> tuple[list[int], list[float] | None]:
    """The engine would have stopped at `max_tokens`; replay cuts the recorded output there."""
    if max_tokens is None or len(output_ids) <= max_tokens:
        return output_ids, None if logprobs is None else list(logprobs)
    return output_ids[:max_tokens], None if logprobs is None else list(logprobs)[:max_tokens]


def _check_backend_logprobs(wanted: bool, logprobs: Sequence[float] | None, n: int) -> None:
    if not wanted:
        return
    if logprobs is None:
        raise ServerError("logprobs were requested but the generation returned none")
    if len(logprobs) != n:
        raise ServerError(f"logprobs were requested but {len(logprobs)} came back for {n} generated tokens")
