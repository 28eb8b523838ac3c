"""The machines a plan is made for: topologies with their presets and calibration profiles
(topology.py, read, never measured here), what the per-rank memory estimate counts besides the
tables per device kind (memory.py), the machine at hand (hardware.py) and the strict reading of
the planner's JSON files, profiles and plans (json_checks.py).

May import: nothing of shardrec.sharding.
"""
