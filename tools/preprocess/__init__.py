"""Preprocessing: raw Criteo-shaped click logs -> a shardrec dataset (input discovery, the parser
and its compiled kernels, id mapping, per-feature statistics), the same parsing and id mapping for
raw rows scored by `shardrec predict` (raw_rows.py), and datasets made from datasets: import from
and export to torchrec's `.npy` layout (npy_import_export.py; the layout itself is
dataloader/format/torchrec_npy.py's) and materialised multi-hot ids (multihot_dataset.py; the index
tables are dataloader/multihot/multihot_tables.py's).

May import shardrec.dataloader (the dataset format it writes); not the CLI or the benchmarks.
"""
