"""Run a few plans for real and compare with the cost model: step-time order and memory.

Each plan shards the same EmbeddingBagCollection with DistributedModelParallel on local
gloo ranks (the fused row-wise Adagrad applied in backward, as training does); a few
forward + backward steps on random one-hot batches are timed after a warm-up.

Measured memory per rank is the growth of the rank process's peak resident set (VmHWM) over
building, sharding and stepping the plan: before each plan the rank frees what it can
(gc, malloc_trim), resets its peak (/proc/self/clear_refs) and reads its resident set, so
the figure is what the plan made the process hold at its worst, not a sum of tensor sizes.
The bytes of its shards' weights and optimizer state (what the state dict holds) are kept
beside it.
"""

from __future__ import annotations

import ctypes
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.distributed.launch import RankFailed, run_local_ranks


@dataclass
class Measured:
    step_s: float
    """Mean step time of the slowest rank."""
    memory_bytes: list[int]
    """Per rank: growth of the process's peak resident set while the plan was built, sharded and stepped."""
    held_bytes: list[int]
    """Per rank: bytes of local weights and optimizer state (the state dicts' tensors)."""


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"/proc/self/status has no {field} line")


def start_peak_window() -> int:
    """Free what the process holds and can give back, restart its peak; returns the resident bytes now."""
    gc.collect()
    try:  # glibc keeps freed heap pages; hand them back so the next plan cannot reuse them unseen
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")  # "5": reset the peak RSS to the current RSS (Linux >= 4.0)
    except OSError as e:
        raise RuntimeError(f"cannot reset the peak resident set through /proc/self/clear_refs: {e}") from e
    return _status_bytes("VmRSS")


def peak_growth(start_rss: int) -> int:
    """Peak resident bytes since `start_peak_window` beyond what the process held when it was called."""
    return max(0, _status_bytes("VmHWM") - start_rss)


def _batches(tables: list[EmbeddingBagConfig], local_batch: int, count: int, seed: int):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        values = torch.cat([torch.randint(0, t.num_embeddings, (local_batch,), generator=g) for t in tables])
        lengths = torch.ones(local_batch * len(tables), dtype=torch.int32)
        out.append(KeyedJaggedTensor.from_lengths_sync([t.feature_names[0] for t in tables], values, lengths))
    return out


def _local_bytes(obj: Any) -> int:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(obj, ShardedTensor):
        return sum(s.tensor.numel() * s.tensor.element_size() for s in obj.local_shards())
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_local_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_local_bytes(v) for v in obj)
    return 0


def _run_plan(
    env: DistEnv, tables: list[EmbeddingBagConfig], plan_json: str, *, local_batch: int, steps: int, seed: int
) -> tuple[float, int, int]:
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardrec.embeddings.optim import attach_fused_optimizer
    from shardrec.sharding.plan_io import PlanFile, to_sharding_plan
    from shardrec.sharding.sharders import build_sharders

    plan = PlanFile.from_json(plan_json)
    dist.barrier()  # the previous plan's model is gone on every rank before any rank starts counting
    start_rss = start_peak_window()
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    fused = [name for name in ebc.embedding_bags if plan.table(name).compute_kernel == "fused"]
    attach_fused_optimizer(ebc, fused, optimizer="rowwise_adagrad", lr=0.01, eps=1e-8)
    model = DistributedModelParallel(
        ebc,
        device=torch.device("cpu"),
        sharders=build_sharders(),
        plan=to_sharding_plan(plan, tables, "", env.world_size, env.local_world_size, "cpu"),
    )
    batches = _batches(tables, local_batch, 4, seed + env.rank)

    def step(i: int) -> None:
        out = model(batches[i % len(batches)])
        out = out.wait() if hasattr(out, "wait") else out
        out.values().sum().backward()

    for i in range(2):  # warm-up: allocations, first collectives
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    elapsed = (time.perf_counter() - start) / steps
    grown = peak_growth(start_rss)
    held = _local_bytes(model.state_dict()) + _local_bytes(model.fused_optimizer.state_dict().get("state", {}))
    return elapsed, grown, held


def _worker(
    env: DistEnv, tables: list[EmbeddingBagConfig], plans: list[str], local_batch: int, steps: int, seed: int
) -> list[tuple[float, int, int]]:
    # Two rounds over all plans, keeping each plan's lower time and lower peak: the first plan of a
    # fresh process otherwise pays one-off costs (kernel selection, thread pools, gloo buffers).
    rounds = [
        [_run_plan(env, tables, p, local_batch=local_batch, steps=steps, seed=seed) for p in plans] for _ in range(2)
    ]
    return [(min(a[0], b[0]), min(a[1], b[1]), a[2]) for a, b in zip(*rounds)]


def measure_plans(
    tables: list[EmbeddingBagConfig],
    plans: list[str],
    *,
    world_size: int,
    local_batch: int,
    steps: int = 8,
    seed: int = 0,
) -> list[Measured]:
    """Time `steps` training steps of each plan (JSON texts) on `world_size` local gloo ranks."""
    try:
        results = run_local_ranks(
            _worker, world_size, tables, plans, local_batch, steps, seed, timeout_s=1800, collective_timeout_s=300
        )
    except RankFailed as e:
        raise RuntimeError(f"rank {e.rank} failed while timing plans: {e.reason}") from e
    return [
        Measured(
            max(results[r][i][0] for r in range(world_size)),
            [results[r][i][1] for r in range(world_size)],
            [results[r][i][2] for r in range(world_size)],
        )
        for i in range(len(plans))
    ]


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Rank agreement of two orderings: 1 same order, -1 reversed."""
    n, score = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            score += 1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 if (a[i] - a[j]) * (b[i] - b[j]) < 0 else 0
    pairs = n * (n - 1) / 2
    return score / pairs if pairs else 1.0
