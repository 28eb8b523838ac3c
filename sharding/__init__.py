"""Where tables live, in subpackages by concept, each importing only those before it in this
order (each `__init__` says what it owns):

- `machine`: the machines a plan is made for (topologies, presets, calibration profiles, read,
  never measured here), the memory estimate's constants, the machine at hand;
- `plan`: plan files, their types and checks, constraints, the readable report;
- `cost`: the cost, comm and memory models, id skew, UVM cache hit rates, shard layouts;
- `search`: the planner's typed inputs and shardrec's search;
- `torchrec`: torchrec's sharders, planner and estimators, 2D parallelism.

At the top: the planner that validates, searches and writes a plan (planner.py) and table sets
for benchmarks and simulations (suites.py).

Imports: shardrec.dataloader and shardrec.embeddings only (never trainer or tools; code that
runs ranks to measure lives in tools).
"""
