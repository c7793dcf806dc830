"""miles' session server replayed offline: matchers, TITO tokenizer, v1 trajectory, v2 forest, assembly.

One module per part of the server: `errors` (its HTTP answers), `matchers`, `tito`
(request preparation, families and the TITO tokenizer), `records` (requests, generations, what
serving one request shares), `v1`, `assembly` (the samples op), `v2` and `recording` (a recorded
session in, a `ReplayResult` out). The strategies are `strategies.session_v1` and
`strategies.session_v2`.

The algorithms are miles' (HEAD 31f1ca96), one section each in
docs/upstream_session.md#the-server-part-by-part. Everything here
is pure and deterministic: no HTTP, no clocks. Where the live server answers a request with a
non-200 status, this package raises the matching exception and stores nothing:

* `RequestRejected` — a 400 (append-only violation, disallowed role, rollback deeper than one
  generation, conflicting fixed template kwarg) or, as `TruncatedExtension`, the v2 409;
* `ServerError` — a 500 (prefix check at commit, template failure, unparsable tool-call
  arguments, suffix render that is not a prefix extension, v2 node cap, matcher contract);
* `AssemblyError` — a 422 from the samples op.

Replay differs from the server in one place only: instead of calling the engine, a request
commits the generation that was recorded for it (`Generation`). The prompt the TITO tokenizer
builds may differ from the recorded prompt ids; the strategies report that (counterfactual
replay, docs/strategies.md#the-strategies).
"""
