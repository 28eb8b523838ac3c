"""Benchmarks and the measurements behind them: each compares shardrec with someone else's code
(torchrec's planner, models and loaders, pandas) measured in the same run. Also the rank
programs that measure this machine (calibration, plan reality, torchrec scoring).

May import every shardrec package; of the CLI only its display helpers (tools.cli.common:
console, fail, print_json), since each module also registers its `shardrec bench` command.
"""
