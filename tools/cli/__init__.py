"""The `shardrec` command line: the typer app (`app`), one module per command group, display
helpers.

Every `shardrec` command is defined here (the benchmarks' too: tools/bench exposes functions).
May import every other shardrec package. Outside it, only the benchmarks import `tools.cli.common`
(its consoles, for progress and results); nothing else imports the CLI.
"""
