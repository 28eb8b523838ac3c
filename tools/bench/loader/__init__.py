"""`shardrec bench loader`: rows/s delivered as torchrec Batches against same-run baselines
(loader_bench.py), multi-hot ids made on the fly (multihot_bench.py) and the loader over
Criteo-1TB's real part count (parts_bench.py); the Criteo-shaped rows they read (criteo_rows.py)
and their runs, sized and interleaved (stream_runs.py).

May import: shardrec.tools.bench.rounds (the harness of repeated, interleaved rounds).
"""
