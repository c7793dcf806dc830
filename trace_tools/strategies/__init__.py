"""One module per trajectory-management strategy: `declarations` says what each is, `base` holds
the interface and registry, `builtin` lists the classes."""
