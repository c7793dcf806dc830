"""uni-agent's multiple linear chains as a pure, deterministic state machine (no HTTP, no threads).

This mirrors the gateway session of verl-project/uni-agent at HEAD 6f4a7c97 as specified in
docs/upstream_chains.md#the-gateway-part-by-part: each session keeps several *linear chains*, each one
a token buffer plus the normalized message history that produced it. A request continues the
chain whose history it provably extends (cumulative prefix hashes), rolls back that chain's
latest generation when only the last assistant was rewritten, and otherwise starts a new
chain from a full render. Nothing is ever re-rendered inside a chain: the generated ids stay as
generated and only the messages appended after them are encoded ("incremental context").

Replay differs from the live gateway in one place only: there is no engine. `ChainSession.step`
commits the *recorded* output ids of a turn, with the recorded assistant message (lowered by the
same adapter normalization as requests) as the stored assistant, and reports which chain took it.
Every response token carries provenance: the dump `turn_index` that generated it, or -1 (CONTEXT)
for prompt and incremental context.

Left out on purpose (see docs/upstream_chains.md): media, weight versions, reservations and
concurrency, backend failures, abort.

Modules: `errors` (the gateway's HTTP errors), `normalize` (adapter normalization and prefix
hashes), `codec`, `state` (chains, buffers, chain selection) and `session` (`ChainSession`);
one section each in docs/upstream_chains.md#the-gateway-part-by-part.
"""
