"""How batches arrive: the on-disk dataset format and its readers (format.py, and torchrec's
`day_N_*.npy` layout, torchrec_npy.py), the global order and shuffle (order.py), rank slicing,
gathering and prefetch (loader.py, batch.py), loader state for resume, and the project's one
atomic file write (files.py).

Imports: nothing of shardrec (it is the lowest package; every other one may import it).
"""
