"""Event-log datasets and the temporal loader: per-user time-sorted events in one Arrow file per
part (event_files.py), anchors' histories gathered causally and crosses hashed at load time
(history_kernels.py), samples in wall-clock windows in the same order at any world size
(temporal_order.py), one rank's batches and resume state (event_loader.py).

May import: shardrec.dataloader.util, shardrec.dataloader.format, shardrec.dataloader.spec.
"""
