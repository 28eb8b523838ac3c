"""Rows to batches: global row indices turned into a torchrec `Batch` (batch.py) by compiled
gathers (gather_kernels.py), over many parts in one in-order pass (many_parts.py, with the parts'
column addresses in addresses.py) or part by part (row_groups.py), into recycled memory
(batch_memory.py), the ids made KeyedJaggedTensors by kjts.py.

May import: shardrec.dataloader.util, shardrec.dataloader.format, shardrec.dataloader.multihot.
"""
