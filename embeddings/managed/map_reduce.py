"""Every rank's id-map statistics combined, the same on every rank: per-slot hits summed and last
steps maxed by all-reduce, the missed ids of every rank all-gathered and merged by id. Several
tables go through the same four collectives. Run on a gloo group of CPU tensors, apart from the
training collectives.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from shardrec.embeddings.managed.id_map import Pending, combine, merge_sorted_lists


def combine_over_ranks(pendings: list[Pending], group: dist.ProcessGroup | None) -> list[Pending]:
    """Each table's statistics combined over the ranks of `group` (None or one rank: as they
    are). Every rank must call it with the same tables in the same order."""
    world = dist.get_world_size(group) if group is not None else 1
    if world == 1 or not pendings:
        return [combine([p]) for p in pendings]
    hits = torch.from_numpy(np.concatenate([p.hits for p in pendings]))
    lasts = torch.from_numpy(np.concatenate([p.lasts for p in pendings]))
    dist.all_reduce(hits, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(lasts, op=dist.ReduceOp.MAX, group=group)
    sizes = torch.tensor([len(p.miss_keys) for p in pendings], dtype=torch.int64)
    all_sizes = [torch.empty_like(sizes) for _ in range(world)]
    dist.all_gather(all_sizes, sizes, group=group)
    longest = max(int(s.sum()) for s in all_sizes)
    packed = torch.zeros(3, longest, dtype=torch.int64)
    mine = int(sizes.sum())
    if mine:
        packed[0, :mine] = torch.from_numpy(
            np.concatenate([p.miss_keys for p in pendings]).view(np.int64)
        )
        packed[1, :mine] = torch.from_numpy(np.concatenate([p.miss_counts for p in pendings]))
        packed[2, :mine] = torch.from_numpy(np.concatenate([p.miss_lasts for p in pendings]))
    gathered = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(gathered, packed, group=group)
    out, start = [], 0
    for t, p in enumerate(pendings):
        rows = len(p.hits)
        pieces = []
        for r in range(world):
            begin = int(all_sizes[r][:t].sum())
            end = begin + int(all_sizes[r][t])
            piece = gathered[r][:, begin:end].numpy()
            pieces.append((piece[0].view(np.uint64), piece[1], piece[2]))
        out.append(
            Pending(
                hits[start : start + rows].numpy().copy(),
                lasts[start : start + rows].numpy().copy(),
                *merge_sorted_lists(pieces),  # each rank's misses come sorted by id
            )
        )
        start += rows
    return out
