"""Plans: where every table lives and what it was planned for (plan_file.py: the types, the
file and its checks against the job at hand), the per-table constraints of a job file
(constraints.py) and the readable report of a plan (report.py).

May import: shardrec.sharding.machine.
"""
