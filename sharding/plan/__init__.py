"""Plans: where every table lives and what it was planned for (plan_types.py), plan files written
and read strictly and checked against the job at hand (plan_file.py), the per-table constraints
of a job file (constraints.py), the readable report of a plan (report.py) and the check at start
that a plan fits each rank's device (device_fit.py).

May import: shardrec.sharding.machine.
"""
