"""The bundled sample dump (see README.md beside this file)."""
