"""`shardrec bench ...`: the group (bench_app.py) and one module per benchmark command, each
checking its flags, calling the benchmark's function in tools/bench and printing what it returns
(as a table, or as JSON with --json); the measuring is tools/bench's. options.py holds what the
commands share.

May import: shardrec.tools.cli.common (not the CLI's other command modules).
"""
