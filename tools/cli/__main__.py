"""`python -m shardrec.tools.cli`: the same command as the `shardrec` entry point."""

from shardrec.tools.cli.app import main

main()
