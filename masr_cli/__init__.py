"""The `masr` command line: thin Typer wrappers over library functions in `masr`."""
