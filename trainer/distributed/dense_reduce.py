"""The dense gradients of 3+ CPU ranks summed in rank order, so that a resume is bit for bit.

DDP reduces the gradients of the dense layers (and of data-parallel tables) in buckets: its first
step's is one bucket of every parameter in their order, later steps' are rebuilt in the order
backward made them. Gloo's ring allreduce adds an element's values in an order set by where the
element sits in its bucket; of three or more values, (a + b) + c and a + (b + c) differ in the
last bits. A resumed run's first step reduced in the first-step layout, where the uninterrupted
run was in its rebuilt one, and the two ended a few ulps apart (3 ranks, 4 steps: val logloss
0.6060155834715968 against 0.6060155819222988). Two values add the same either way: one and two
ranks keep DDP's allreduce. On three or more, each bucket is gathered from every rank and summed
in rank order, the same on every rank whatever the layout: W times the bucket's bytes received
where the ring receives 2 (W - 1) / W of them. NCCL's ranks (GPUs) keep their allreduce.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def sum_in_rank_order(model: Any) -> bool:
    """Reduce the DDP-wrapped part of a torchrec DistributedModelParallel `model` in rank order
    (module doc) where it trains on 3+ gloo ranks; returns whether it does."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = getattr(model, "_dmp_wrapped_module", None)
    if not isinstance(ddp, DistributedDataParallel):
        return False
    group = ddp.process_group
    if dist.get_world_size(group) < 3 or dist.get_backend(group) != "gloo":
        return False
    ddp.register_comm_hook(group, _rank_order_sum)
    return True


# Unannotated: DDP reads a hook's annotations as objects.
def _rank_order_sum(group, bucket):
    """The mean over the ranks of a dist.GradBucket (a future of it): each rank's share divided by
    the world size, as DDP's own reduction divides, then added in rank order."""
    buf = bucket.buffer()
    world = dist.get_world_size(group)
    parts = [torch.empty_like(buf) for _ in range(world)]
    gathered = dist.all_gather(parts, buf, group=group, async_op=True).get_future()

    def mean(_: torch.futures.Future) -> torch.Tensor:
        torch.div(parts[0], world, out=buf)
        for part in parts[1:]:
            buf.add_(part.div_(world))
        return buf

    return gathered.then(mean)
