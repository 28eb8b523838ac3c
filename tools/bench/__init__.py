"""Benchmarks and the measurements behind them: each compares shardrec with someone else's code
(torchrec's planner, models and loaders, pandas) measured in the same run. Also the rank
programs that measure this machine (calibration, plan reality, torchrec scoring).

Each benchmark is a function that returns its figures, and one that prints them; the `shardrec
bench` commands that call them are tools/cli/bench.py's. May import every shardrec package; of
the CLI only its display helpers (tools.cli.common's consoles, for progress and printing).
"""
