"""One module per trajectory-management strategy: `declarations` says what each is, `base` holds
the interface, `registry` finds one by name, `builtin` lists the classes, `helpers` what they share."""
