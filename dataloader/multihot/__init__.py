"""Multi-hot ids made from one-hot ids as MLPerf DLRMv2's reference makes them: the index tables
and the option that asks for them (multihot_tables.py) and the compiled expansion that writes each
sample's ids straight into a batch (multihot_kernel.py).

May import: shardrec.dataloader.util, shardrec.dataloader.format.
"""
