"""Sharded checkpoints: save, keep and load them (manager.py), what one holds (parts.py), what
must match for one to load (signature.py), its files as torch reads and writes them
(dcp_files.py), a save that failed (failure.py: one line on every rank), why one may be loaded
(trust.py), the folders renamed, copied or moved by hand that a command must not pass over
(folders.py) and the step a folder holds, read without torch (held_step.py).

May import: shardrec.trainer.rundir.names.
"""
