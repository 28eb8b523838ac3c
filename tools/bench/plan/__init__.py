"""`shardrec bench plan`, `plan-reality` and `hitrate`: shardrec's search against torchrec's
planner (plan_bench.py, scoring any placement with torchrec's estimators in torchrec_score.py),
plans trained for real against both cost models (reality_bench.py, reality.py, the spread of
plans in reality_plans.py), and predicted UVM cache hit rates against exact caches
(hitrate_bench.py, cache_sim.py).

May import: shardrec.tools.bench.rounds (the harness of repeated, interleaved rounds).
"""
