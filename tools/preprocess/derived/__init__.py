"""Datasets made from datasets: torchrec's `.npy` layout imported and exported
(npy_import_export.py), materialised multi-hot ids with their statistics (multihot_dataset.py,
multihot_stats.py), the MLPerf DLRMv2 reference's arrays made from Criteo 1TB day files
(mlperf_reference.py), and datasets of the old layout (a folder of `.npy` files per part,
old_layout.py) rewritten in place as one file per part (dataset_upgrade.py).

May import: shardrec.tools.preprocess.parse, shardrec.tools.preprocess.parts,
shardrec.tools.preprocess.text (day files plain or gzip).
"""
