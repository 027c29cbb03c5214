"""The `inferplane` command line: wiring only, each command in its own module."""
