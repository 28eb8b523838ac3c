"""`shardrec bench train`: training samples/s of `shardrec train`'s path against stock torchrec
(train_bench.py), its rank program (train_ranks.py), the baseline trained as torchrec's own
examples train (stock_torchrec.py), the timing harness both share (timing.py), where a step's time
goes (breakdown.py), the DLRM reference run unmodified from a checkout and timed from outside
(reference_dlrm.py) against ours (reference_bench.py), and the reports (train_report.py); managed
tables against static ones of the same rows (managed_bench.py, `--managed`), and `shardrec bench
quality`: managed tables against hashing and an unbounded vocabulary on a drifting log trained day
by day (quality_bench.py), its arms' tables and jobs (quality_arms.py) and what its report says of
its goals (quality_report.py).

May import: shardrec.tools.bench.rounds (the harness of repeated, interleaved rounds),
shardrec.tools.bench.proctree (its ranks' launcher ended with its whole tree on a stop).
"""
