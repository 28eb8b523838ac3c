"""The run directory: its files, checkpoints and their trust, and its life between invocations.

Owns the names of the run directory's files (names.py, spelled nowhere else), sharded checkpoints
(checkpoint/: manager.py, save, keep, load; what one holds, parts.py; what must match for one to
load, signature.py; its files as torch reads and writes them, dcp_files.py; a save that failed,
failure.py, one line on every rank; why one may be loaded, trust.py; folders renamed, copied
or moved by hand that a command must not pass over, folders.py; the step a folder holds,
held_step.py), the sparse optimizer state
as a checkpoint part
(optim_state.py), the managed tables' id maps as one (id_map_state.py), the run's life between
invocations (life/: new / resumed / complete runs, what may change between them, the data a run
trained on, its stretches), the one-job-at-a-time lock (lock.py) and the run's metrics.jsonl
(metrics_log.py).

May import: shardrec.trainer.distributed, shardrec.trainer.job, shardrec.trainer.model.
"""
