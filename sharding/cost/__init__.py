"""What a placement costs: the cost model (cost_model.py: per-rank memory, lookup time and
communication time), the closed-form bytes each rank sends (comms.py), id skew over row-wise
blocks (skew.py), UVM cache hit rates from an id-frequency curve (hit_rates.py), each sharding
type's shard layouts (layouts.py) and how communication grows with the ranks, with its table
(simulate.py).

May import: shardrec.sharding.machine, shardrec.sharding.plan.
"""
