"""Benchmarks: each compares shardrec with someone else's code (torchrec's planner, models and
loaders, polars) measured in the same run, one subpackage per command family: `preprocess`,
`loader`, `plan` (with plan-reality and hitrate), `train`, `scale` and `sequence` (HSTU's speed
and quality). At the top: the harness of repeated, interleaved rounds every ratio comes from
(rounds.py), the quick benchmarks against their recorded floors (check.py, `make bench-check`),
measuring a command's whole process tree (proctree.py) and the CUDA check (gpu_check.py, with its
pytest plugin gpu_report.py).

Each benchmark is a function that returns its figures, and one that prints them; the `shardrec
bench` commands that call them are tools/cli/bench/'s.

May import: shardrec.tools.console, shardrec.tools.synth, shardrec.tools.preprocess,
shardrec.tools.measure (and every package below tools); never the CLI.
"""
