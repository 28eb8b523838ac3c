"""The dataset on disk: the manifest and the part files preprocessing writes (manifest.py),
read-only memory maps of `.npy` files (mapping.py), checks beyond what opening costs
(integrity.py), the parts of a split mapped on first use (part_cache.py), torchrec's
`day_N_*.npy` layout (torchrec_npy.py) and opening a split whichever layout holds it (source.py).

May import: shardrec.dataloader.util.
"""
