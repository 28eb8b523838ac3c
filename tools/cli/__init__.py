"""The `shardrec` command line: the typer app (`app`), one module per command group, display helpers.

May import every other shardrec package. Outside it, only the benchmarks' command registrations
import `tools.cli.common` (one way to fail and to print JSON); nothing else imports the CLI.
"""
