"""The `shardrec` command line: the typer app (`app`), one module per command group, display helpers.

May import every other shardrec package; nothing imports it but its own entry points.
"""
