"""Preprocessing: raw Criteo-shaped click logs -> a shardrec dataset (input discovery, the parser
and its compiled kernels, id mapping, per-feature statistics, torchrec `.npy` interop).

May import shardrec.dataloader (the dataset format it writes); not the CLI or the benchmarks.
"""
