"""Run plans for real and compare with the cost models: step time and each rank's memory.

Each plan trains the same model on local gloo ranks as `shardrec train` does on CPU: a DLRM
whose tables are sharded by the plan with DistributedModelParallel (the sparse optimizer fused
into the fused-kernel tables' backward, data-parallel tables and dense layers stepped after
backward by the trainer's optimizer), plain forward + backward + step on random one-hot
batches. A few steps are timed after a warm-up.

Measured memory per rank is the growth of the rank process's peak resident set (VmHWM) over
building, sharding and stepping the plan: before each plan the rank frees what it can
(gc, malloc_trim), resets its peak (/proc/self/clear_refs) and reads its resident set, so
the figure is what the plan made the process hold at its worst, not a sum of tensor sizes.
The peak is also read at the end of each phase (built, first step, all steps), and the bytes
of the weights and optimizer state (what the state dicts hold) are kept beside it.
"""

from __future__ import annotations

import ctypes
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

# Imported here, not where a plan is built: a rank imports them when it starts, outside any plan's
# peak window (in a fresh virtual environment, compiling them read as +150 MiB on the first plan).
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.embeddings.tables import build_ebc
from shardrec.sharding.plan.plan_types import PlanFile
from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.distributed.local_ranks import RankFailed, run_local_ranks
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.sections import OptimConfig
from shardrec.trainer.model.build import build_optimizer, shard_model
from shardrec.trainer.model.models import build_model
from shardrec.trainer.model.objective import TRAIN_EBC_PATH, TrainModule

PHASES = ("built", "first_step", "steps")
"""Where the peak is read: after sharding and building the optimizer, after the first step
(the optimizers' lazy state exists), after every step."""
NUM_DENSE = 13


@dataclass(frozen=True)
class RealityModel:
    """The model every plan trains: DLRM's dense and over arch around the tables (DCNv2 for tables
    of several widths)."""

    dense_arch: tuple[int, ...] = (64,)
    """Hidden widths of the dense arch (its last layer is the embedding width)."""
    over_arch: tuple[int, ...] = (64, 32, 1)
    sparse_optimizer: str = "rowwise_adagrad"
    dense_optimizer: str = "adagrad"


@dataclass
class Measured:
    step_s: float
    """Mean step time of the slowest rank."""
    memory_bytes: list[int]
    """Per rank: growth of the process's peak resident set while the plan was built, sharded and
    stepped."""
    held_bytes: list[int]
    """Per rank: bytes of local weights and optimizer state (the state dicts' tensors)."""
    phase_bytes: list[dict[str, int]] = field(default_factory=list)
    """Per rank: the peak growth at the end of each of PHASES."""
    round_step_s: list[float] = field(default_factory=list)
    """Per round, in round order: the slowest rank's mean step time (step_s is the lowest)."""


def _status_bytes(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"/proc/self/status has no {name} line")


def start_peak_window() -> int:
    """Free what the process holds and can give back, restart its peak; returns the resident bytes
    now."""
    gc.collect()
    try:  # glibc keeps freed heap pages; hand them back so the next plan cannot reuse them unseen
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text(
            "5"
        )  # "5": reset the peak RSS to the current RSS (Linux >= 4.0)
    except OSError as e:
        raise RuntimeError(
            f"cannot reset the peak resident set through /proc/self/clear_refs: {e}"
        ) from e
    return _status_bytes("VmRSS")


def peak_growth(start_rss: int) -> int:
    """Peak resident bytes since `start_peak_window` beyond what the process held when it was
    called."""
    return max(0, _status_bytes("VmHWM") - start_rss)


def _batches(
    tables: list[EmbeddingBagConfig],
    local_batch: int,
    count: int,
    seed: int,
    pooling: dict[str, float] | None,
) -> list:
    """Random batches with `pooling` ids per sample of each table (rounded, at least 1; none:
    one-hot)."""

    g = torch.Generator().manual_seed(seed)
    per_sample = [max(1, round((pooling or {}).get(t.name, 1.0))) for t in tables]
    out = []
    for _ in range(count):
        values = torch.cat(
            [
                torch.randint(0, t.num_embeddings, (local_batch * k,), generator=g)
                for t, k in zip(tables, per_sample)
            ]
        )
        lengths = torch.tensor(
            [k for k in per_sample for _ in range(local_batch)], dtype=torch.int32
        )
        sparse = KeyedJaggedTensor.from_lengths_sync(
            [t.feature_names[0] for t in tables], values, lengths
        )
        dense = torch.rand(local_batch, NUM_DENSE, generator=g)
        labels = (torch.rand(local_batch, generator=g) < 0.25).float()
        out.append(Batch(dense_features=dense, sparse_features=sparse, labels=labels))
    return out


def _local_bytes(obj: Any) -> int:

    if isinstance(obj, ShardedTensor):
        return sum(s.tensor.numel() * s.tensor.element_size() for s in obj.local_shards())
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_local_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_local_bytes(v) for v in obj)
    return 0


def _build(
    env: DistEnv, tables: list[EmbeddingBagConfig], plan_json: str, model: RealityModel, batch: int
):
    """The sharded DLRM of the plan and its after-backward optimizer, built as the trainer builds
    them."""

    dim = tables[0].embedding_dim
    # DLRM's dot interaction needs one width; tables of several widths get DCNv2's cross layers.
    arch = "dlrm" if len({t.embedding_dim for t in tables}) == 1 else "dcnv2"
    model_config = ModelConfig(
        arch=arch,
        embedding_dim=dim,
        dense_arch=[*model.dense_arch, dim],
        over_arch=list(model.over_arch),
    )
    optim = OptimConfig(sparse=model.sparse_optimizer, dense=model.dense_optimizer)
    names = [t.feature_names[0] for t in tables]
    torch.manual_seed(0)
    dlrm = build_model(model_config, build_ebc(tables, "meta"), names, NUM_DENSE)
    module = TrainModule(dlrm, batch, env.world_size)
    plan = PlanFile.from_json(plan_json)
    sharding_plan = to_sharding_plan(
        plan, tables, TRAIN_EBC_PATH, env.world_size, env.local_world_size, "cpu"
    )
    sharded = shard_model(module, sharding_plan, env, optim, qcomm=None)
    return sharded, build_optimizer(sharded, tables, optim)


def _held_bytes(model, optimizer) -> int:
    held = _local_bytes(model.state_dict()) + _local_bytes(
        model.fused_optimizer.state_dict().get("state", {})
    )
    return held + sum(_local_bytes(o.state_dict().get("state", {})) for o in optimizer.optimizers)


def _managed_ids(env, tables, model, optimizer, managed: dict[str, TableSettings], seed: int):
    """The managed tables' id maps of a plan, as a long run leaves them: every slot held and hit,
    the waiting ids at their capacity (a day of ids seen once fills it), so the steps that follow,
    each bringing new ids, grow its misses and updates from there."""
    import numpy as np

    from shardrec.trainer.loop.managed_ids import build_managed_ids

    ids = build_managed_ids(
        managed, tables, model, optimizer, ebc_path=TRAIN_EBC_PATH, seed=seed,
        stretch_steps=0, timeout_s=600,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    for table in ids.maps.mapped:
        m, capacity = table.idmap, table.rule.capacity
        m.slot_key[:] = np.unique(rng.integers(2**62, 2**63, m.rows + 64).astype(np.uint64))[
            : m.rows
        ]
        m.slot_count[:], m.slot_last[:], m.slot_born[:] = 1, 0, 0
        m.hits[:], m.lasts[:] = 0, -1  # written: their pages are resident, as after a day of hits
        m.rebuild_index()
        m.cand_key = np.unique(rng.integers(1, 2**62, capacity).astype(np.uint64))
        m.cand_count = np.ones(len(m.cand_key), np.int64)
        m.cand_last = np.zeros(len(m.cand_key), np.int64)
    return ids


def _fresh_raw_ids(batch: Batch, managed: set[str], salt: int) -> Batch:
    """The batch with its managed features' ids made raw ids never seen before (a new salt per
    step): every lookup a miss, the maps' worst case."""
    from shardrec.dataloader.util.splitmix import mix64

    kjt = batch.sparse_features
    values = kjt.values().numpy().astype(np.uint64)
    offsets = kjt.offset_per_key()
    for i, key in enumerate(kjt.keys()):
        if key in managed:
            lo, hi = offsets[i], offsets[i + 1]
            values[lo:hi] = mix64(values[lo:hi] + np.uint64(salt << 32))
    raw = KeyedJaggedTensor(
        keys=kjt.keys(),
        values=torch.from_numpy(values.view(np.int64)),
        lengths=kjt.lengths(),
        offset_per_key=offsets,
        length_per_key=kjt.length_per_key(),
    )
    return Batch(dense_features=batch.dense_features, sparse_features=raw, labels=batch.labels)


def _run_plan(
    env: DistEnv,
    tables: list[EmbeddingBagConfig],
    plan_json: str,
    model_spec: RealityModel,
    *,
    local_batch: int,
    steps: int,
    seed: int,
    pooling: dict[str, float] | None,
    managed: dict[str, TableSettings] | None = None,
) -> tuple[float, int, int, dict[str, int]]:
    import torch.distributed as dist

    # the previous plan's model is gone on every rank before any rank starts counting
    dist.barrier()
    start_rss = start_peak_window()
    model, optimizer = _build(env, tables, plan_json, model_spec, local_batch * env.world_size)
    ids = _managed_ids(env, tables, model, optimizer, managed, seed) if managed else None
    phases = {"built": peak_growth(start_rss)}
    batches = _batches(tables, local_batch, 4, seed + env.rank, pooling)

    def step(i: int) -> None:
        batch = batches[i % len(batches)]
        if ids is not None:
            batch = next(ids.train_batches(iter([_fresh_raw_ids(batch, set(managed), i)]), i))
            ids.before_step(i)
        optimizer.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        optimizer.step()

    step(0)
    phases["first_step"] = peak_growth(start_rss)
    step(1)  # warm-up: allocations, first collectives
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    elapsed = (time.perf_counter() - start) / steps
    phases["steps"] = grown = peak_growth(start_rss)
    held = _held_bytes(model, optimizer)
    return elapsed, grown, held, phases


def _worker(
    env: DistEnv,
    tables: list[EmbeddingBagConfig],
    plans: list[str],
    model_spec: RealityModel,
    local_batch: int,
    steps: int,
    seed: int,
    rounds: int,
    pooling: dict[str, float] | None,
    managed: dict[str, TableSettings] | None = None,
) -> list[tuple[float, int, int, dict[str, int]]]:
    # Rounds over all plans, keeping each plan's lowest time and lowest peak: the first plan of a
    # fresh process otherwise pays one-off costs (kernel selection, thread pools, gloo buffers).
    # The order rotates from round to round, so that no plan always runs first.
    runs: list[list[Any]] = [[] for _ in plans]
    for r in range(rounds):
        for i in [*range(r % len(plans), len(plans)), *range(r % len(plans))]:
            runs[i].append(
                _run_plan(
                    env,
                    tables,
                    plans[i],
                    model_spec,
                    local_batch=local_batch,
                    steps=steps,
                    seed=seed,
                    pooling=pooling,
                    managed=managed,
                )
            )
    out = []
    for per_round in runs:
        best = min(per_round, key=lambda run: run[1])
        times = [run[0] for run in per_round]
        out.append((min(times), best[1], best[2], best[3], times))
    return out


def measure_plans(
    tables: list[EmbeddingBagConfig],
    plans: list[str],
    *,
    world_size: int,
    local_batch: int,
    steps: int = 8,
    seed: int = 0,
    rounds: int = 2,
    model: RealityModel = RealityModel(),
    pooling: dict[str, float] | None = None,
    managed: dict[str, TableSettings] | None = None,
) -> list[Measured]:
    """Train `steps` steps of each plan (JSON texts) on `world_size` local gloo ranks, `rounds`
    times, on random batches of `pooling` ids per sample per table (none: one-hot); `managed`
    features' tables run their id maps on new raw ids every step (_managed_ids)."""
    try:
        results = run_local_ranks(
            _worker,
            world_size,
            tables,
            plans,
            model,
            local_batch,
            steps,
            seed,
            rounds,
            pooling,
            managed,
            timeout_s=3600,
            collective_timeout_s=600,
        )
    except RankFailed as e:
        raise RuntimeError(f"rank {e.rank} failed while timing plans: {e.reason}") from e
    return [
        Measured(
            max(results[r][i][0] for r in range(world_size)),
            [results[r][i][1] for r in range(world_size)],
            [results[r][i][2] for r in range(world_size)],
            [results[r][i][3] for r in range(world_size)],
            [max(results[r][i][4][k] for r in range(world_size)) for k in range(rounds)],
        )
        for i in range(len(plans))
    ]


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Rank agreement of two orderings: 1 same order, -1 reversed."""
    n, score = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            score += (
                1
                if (a[i] - a[j]) * (b[i] - b[j]) > 0
                else -1
                if (a[i] - a[j]) * (b[i] - b[j]) < 0
                else 0
            )
    pairs = n * (n - 1) / 2
    return score / pairs if pairs else 1.0
