"""Datasets made from datasets: torchrec's `.npy` layout imported and exported
(npy_import_export.py), materialised multi-hot ids with their statistics (multihot_dataset.py,
multihot_stats.py), and the MLPerf DLRMv2 reference's arrays made from Criteo 1TB day files
(mlperf_reference.py).

May import: shardrec.tools.preprocess.parse, shardrec.tools.preprocess.parts.
"""
