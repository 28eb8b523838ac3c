"""shardrec's search for a placement: the planner's typed inputs (request.py, with the one
manifest -> planner-inputs conversion), a planning problem's options and their costs
(options.py), which tables go to host memory behind a cache (cached_tables.py), balancing
pieces over ranks (balance.py) and the search itself (shardrec_search.py).

May import: shardrec.sharding.machine, shardrec.sharding.plan, shardrec.sharding.cost.
"""
