"""`python -m shardrec.tools.cli`: the same command as the `shardrec` entry point."""

from shardrec.tools.cli.entry import main

main()
