"""torchrec's side of planning: a plan as torchrec's ShardingPlan and back (torchrec_plans.py),
sharders that offer every sharding type on every device (sharders.py), torchrec's default
planner run under them (torchrec_planner.py), a planning problem priced by torchrec's own
estimators (torchrec_costs.py) and 2D sparse parallelism (twod.py, torchrec's DMPCollection).

May import: shardrec.sharding.machine, shardrec.sharding.plan, shardrec.sharding.cost,
shardrec.sharding.search.
"""
