"""`shardrec bench train`: training samples/s of `shardrec train`'s path against stock torchrec
(train_bench.py), its rank program (train_ranks.py), the baseline trained as torchrec's own
examples train (stock_torchrec.py) and the timing harness both share (timing.py).

May import: nothing of shardrec.tools.bench.
"""
