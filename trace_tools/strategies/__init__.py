"""One module per trajectory-management strategy (see `base` for the interface and registry)."""

# The built-in strategies in the DESIGN §3 column order; kept here, import-free, for `--help` texts.
BUILTIN_STRATEGIES = (
    "tree",
    "echo-restore",
    "linear",
    "linear+restore",
    "chains",
    "session-v1",
    "session-v2",
    "checkpoint-tree",
)
