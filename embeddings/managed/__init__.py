"""Managed tables: tables of raw-id features whose rows an id map hands out and takes back while
training runs (admission after K sightings; LRU, LFU or age eviction), and the hashed and unbounded
kinds they are measured against.

Owns the table kinds and their settings (table_kinds.py, torch-free: the job file and the planner
read them), the id map (id_map.py, with its compiled loops in map_kernels.py and its update in
map_update.py), a job's raw-id tables and their update schedule (maps.py), every rank's statistics
combined (map_reduce.py), the memory a map holds (map_memory.py), row budgets from the data's
distinct-id curve (row_budget.py) and the reset of a reassigned row's weights and optimizer state
in any sharded layout (row_reset.py). Only map_reduce.py and row_reset.py need torch.
May import: nothing of shardrec.embeddings (shardrec.dataloader only).
"""
