"""`shardrec bench loader`: rows/s delivered as torchrec Batches against same-run baselines
(loader_bench.py), multi-hot ids made on the fly (multihot_bench.py) and the loader over
Criteo-1TB's real part count (parts_bench.py).

May import: shardrec.tools.bench.rounds (the harness of repeated, interleaved rounds).
"""
