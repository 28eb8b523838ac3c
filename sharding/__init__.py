"""Where tables live: sharders, topologies and calibration profiles (read, never measured
here) and the CUDA devices of the machine at hand (devices.py), cost, comm and memory models,
UVM cache hit rates and the choice of cached tables (cache.py, caching.py), the planner and
its searches (request.py holds their typed inputs, including the one manifest ->
planner-inputs conversion), and plan files.

Imports: shardrec.dataloader and shardrec.embeddings only (never trainer or tools; code that
runs ranks to measure lives with the benchmarks, tools/bench).
"""
