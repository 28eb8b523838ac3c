"""Preprocessing: raw Criteo-shaped click logs -> a shardrec dataset (input discovery, the parser
and its compiled kernels, id mapping, per-feature statistics, torchrec `.npy` interop), and the
same parsing and id mapping for raw rows scored by `shardrec predict` (raw_rows.py).

May import shardrec.dataloader (the dataset format it writes); not the CLI or the benchmarks.
"""
