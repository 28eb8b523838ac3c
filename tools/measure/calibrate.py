"""Measure this machine's figures for the cost model: lookup bandwidth and collective bandwidth.

- Lookup: fbgemm's fused table-batched embedding kernel (what torchrec trains with) over a
  table larger than the caches, timed forward and forward + backward with the fused row-wise
  Adagrad update; bytes read per second and the backward/forward ratio.
- Collectives: `world_size` local processes on gloo (nccl on CUDA) time an all-to-all of a
  large and a tiny message; bandwidth from the large one, start-up latency from the tiny one.
  All ranks here share one host, so the inter-host figure is the preset's unless measured
  elsewhere.

The profile is JSON: `{"format": "shardrec-calibration", "measured": {...}, "details": {...}}`;
`shardrec plan --profile FILE` reads `measured` into the topology.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.distributed.local_ranks import RankFailed, run_local_ranks

logger = logging.getLogger(__name__)

PROFILE_FORMAT = "shardrec-calibration"


def _best_of(fn: Callable[[], None], repeats: int) -> float:
    """Fastest of `repeats` timed calls after a warm-up: on a machine shared with other jobs the
    fastest run is the one least disturbed, and the most reproducible."""
    fn()  # warm-up: allocations, first-touch page faults
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_lookup(
    device: str = "cpu",
    *,
    rows: int = 400_000,
    dim: int = 64,
    batch: int = 4096,
    pooling: int = 8,
    repeats: int = 15,
    seed: int = 0,
) -> dict[str, float]:
    """Bytes of embedding rows read per second by fbgemm's fused kernel (the one training uses),
    and the cost of its backward + row-wise Adagrad update relative to the forward."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    cuda = device.startswith("cuda")
    spec = (
        rows,
        dim,
        EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST,
        ComputeDevice.CUDA if cuda else ComputeDevice.CPU,
    )
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [spec], optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01
    )
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, rows, (batch * pooling,), generator=g).to(device)
    offsets = (torch.arange(batch + 1) * pooling).to(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def forward():
        with torch.no_grad():
            tbe(ids, offsets)
        sync()

    def train_step():
        tbe(ids, offsets).sum().backward()  # the optimizer update is fused into backward
        sync()

    forward()
    train_step()
    fwds, ratios = [], []
    for _ in range(repeats):
        # Alternate the two so that both see the same load from other jobs; the ratio of each
        # pair is then far steadier than the ratio of two separately taken minima.
        fwd = _timed(forward)
        step = _timed(train_step)
        fwds.append(fwd)
        ratios.append((step - fwd) / fwd)
    fwd = min(fwds)
    read = batch * pooling * dim * 4
    ratio = sorted(ratios)[len(ratios) // 2]
    return {
        "lookup_bw": read / fwd,
        "bwd_compute_multiplier": max(0.5, ratio),
        "lookup_fwd_s": fwd,
        "lookup_bytes": read,
    }


def _collective_worker(env: DistEnv, big: int, repeats: int) -> tuple[float, float]:
    """One rank: the best times of a large and of a tiny all-to-all."""
    import torch.distributed as dist

    def a2a(numel: int) -> Callable[[], None]:
        x = torch.ones(numel, device=env.device)
        y = torch.empty_like(x)

        def run() -> None:
            dist.all_to_all_single(y, x)
            if env.device.type == "cuda":
                torch.cuda.synchronize()

        return run

    big_s = _best_of(a2a(big * env.world_size), repeats)
    small_s = _best_of(a2a(env.world_size), repeats * 4)
    return big_s, small_s


def measure_collectives(
    world_size: int = 2, device_kind: str = "cpu", mib_per_peer: int = 8, repeats: int = 5
) -> dict[str, float]:
    """Per-rank send bandwidth of an all-to-all between local processes, and its start-up
    latency."""
    big = mib_per_peer * 2**20 // 4
    try:
        results = run_local_ranks(
            _collective_worker, world_size, big, repeats, device_kind=device_kind
        )
    except RankFailed as e:
        raise RuntimeError(f"collective calibration failed: {e.reason}") from e
    big_s = max(r[0] for r in results)
    small_s = max(r[1] for r in results)
    sent = big * 4 * (world_size - 1)  # bytes each rank sends to the others
    return {
        "intra_host_bw": sent / max(big_s - small_s, 1e-9),
        "collective_latency_s": small_s,
        "a2a_big_s": big_s,
        "a2a_small_s": small_s,
        "a2a_bytes_per_rank": sent,
    }


def calibrate(device_kind: str = "cpu", world_size: int = 2) -> dict[str, Any]:
    """Run both measurements; returns the profile (see the module docstring)."""
    lookup = measure_lookup("cuda" if device_kind == "cuda" else "cpu")
    comms = measure_collectives(world_size, device_kind)
    measured = {k: lookup[k] for k in ("lookup_bw", "bwd_compute_multiplier")}
    measured.update({k: comms[k] for k in ("intra_host_bw", "collective_latency_s")})
    return {
        "format": PROFILE_FORMAT,
        "device_kind": device_kind,
        "world_size": world_size,
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "measured": measured,
        "details": {**lookup, **comms},
    }


def save_profile(profile: dict[str, Any], path: str | Path) -> None:
    import json

    from shardrec.dataloader.util.files import atomic_write_bytes

    atomic_write_bytes(Path(path), (json.dumps(profile, indent=2, sort_keys=True) + "\n").encode())
