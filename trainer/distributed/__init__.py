"""Distributed set-up: the process group, and the processes of a job.

Owns the one module that reads RANK / WORLD_SIZE and creates or destroys process groups
(dist.py), which device kind a job runs on and whether this machine's GPUs fit it (devices.py),
starting ranks (launch.py: torchrun for training and evaluation; local_ranks.py: a function on
local processes, for tests and benchmarks), what a failed job leaves for its launcher to read
(failures.py), the loopback rendezvous of a single-node job (rendezvous.py), ranks that die with
their launcher (lifeline.py), what every rank program does first and last (rank_process.py:
logging, warning filters, a clean exit) and fault injection for the failure tests (faults.py).

May import: nothing of shardrec.trainer (torch and the standard library only).
"""
