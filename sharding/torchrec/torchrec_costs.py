"""The planning problem priced by torchrec's own estimators instead of shardrec's cost model.

torchrec's enumerator lists every table's sharding options with an estimated time and
storage per shard; its planner then charges each shard to the rank holding it and rates a
plan by its slowest rank. Feeding those same figures to shardrec's search (balance.py,
shardrec_search.py) compares the two *searches* on torchrec's own objective: `shardrec bench plan`
reports it beside the comparison under shardrec's cost model.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

from shardrec.sharding.search.options import PIECE_TYPES, Option, Piece, Problem
from shardrec.sharding.search.request import SearchRequest
from shardrec.sharding.torchrec.sharders import build_sharders
from shardrec.sharding.torchrec.torchrec_planner import (
    planning_module,
    quiet_torchrec,
    to_parameter_constraints,
    to_torchrec_topology,
)


class TorchrecProblem(Problem):
    """Options and per-rank costs as torchrec estimates them (no per-type latency: torchrec has
    none)."""

    def __init__(self, request: SearchRequest) -> None:
        # torchrec's estimators do not model skew: the options are priced without curves.
        super().__init__(replace(request, curves=None))
        self.latency_per_type_s = 0.0
        configs, topo, batch, compute_kernel = (
            request.configs,
            request.topology,
            request.global_batch_size,
            request.compute_kernel,
        )
        params = to_parameter_constraints(
            configs, request.constraints, request.pooling, compute_kernel
        )
        with warnings.catch_warnings(), quiet_torchrec():
            warnings.simplefilter("ignore")
            enumerator = EmbeddingEnumerator(
                topology=to_torchrec_topology(topo),
                batch_size=max(1, batch // topo.world_size),
                constraints=params,
            )
            enumerated = enumerator.enumerate(
                planning_module(configs, request.optimizer), build_sharders()
            )
        index = {config.name: i for i, config in enumerate(configs)}
        cuda = topo.device_kind == "cuda"
        found: dict[tuple[int, Option], object] = {}
        for o in enumerated:
            # One kernel per type: the job's for sharded types, dense for data-parallel (as ours).
            want = "dense" if o.sharding_type == "data_parallel" else compute_kernel
            if o.compute_kernel != want:
                continue
            k = len(o.shards) if o.sharding_type in PIECE_TYPES else 1
            found[(index[o.name], Option(o.sharding_type, k))] = o
        for i in range(len(configs)):
            self._load(i, found, cuda)

    def _load(self, i: int, found: dict, cuda: bool) -> None:
        W, H = self.topo.world_size, self.topo.local_world_size
        keep = []
        for opt in self.options[i] + [Option("table_wise")]:
            o = found.get((i, opt))
            if o is None or opt in keep:
                continue
            perf = [s.perf.total / 1e3 for s in o.shards]  # torchrec estimates in ms
            mem = [float(s.storage.hbm if cuda else s.storage.ddr) for s in o.shards]
            if opt.sharding_type in PIECE_TYPES:
                self._piece[(i, opt.shards)] = Piece(i, max(perf), 0.0, max(mem))
            else:
                step, used = np.zeros(W), np.zeros(W)
                ranks = range(H) if opt.sharding_type == "table_row_wise" else range(W)
                for r, p, m in zip(ranks, perf, mem):
                    step[r] += p
                    used[r] += m
                self._spread[(i, opt.sharding_type)] = (step, used)
            if opt in self.options[i]:
                keep.append(opt)
        if not keep:
            raise ValueError(
                f"table {self.configs[i].name}: torchrec enumerates none of its allowed options"
            )
        self.options[i] = keep
