"""The `shardrec` command line: the typer app (`app`), one module per command group (the `data` and
`bench` groups in their own folders, a module per command), display helpers.

Every `shardrec` command is defined here (the benchmarks' too: tools/bench exposes functions).

May import: shardrec.tools.console, shardrec.tools.synth, shardrec.tools.preprocess,
shardrec.tools.measure, shardrec.tools.bench (and every package below tools); nothing imports the
CLI.
"""
