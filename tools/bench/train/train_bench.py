"""`shardrec bench train`: training samples/s of `shardrec train`'s path against stock torchrec.

Ranks (torchrun; CPU: gloo, `--threads` threads each; `--device cuda`: NCCL, one GPU each) train a
DLRM on demo-style synthetic rows (Zipf-like ids, labels from a hidden linear model) written to disk
in
shardrec's format:

- stock fp32: what a torchrec user writes from torchrec's examples (tools/bench/train/stock_torchrec.py:
  torchrec's DLRM, stock sharder with the fused optimizer, its planner, TrainPipelineSparseDist),
  over the same batches held in memory;
- ours fp32 / ours bf16: `shardrec train`'s job builder and step loop with the real reporter,
  reading from disk through the real loader (train.precision = fp32 / bf16);
- ours fp32 in memory: the same loop over the in-memory batches (for the loader ratio).

Same data, optimizer kinds, learning rates and threads on both sides. Models: `reference`
(26 tables x 100k rows x 64, dense 512-256-64, over 1024-1024-512-256-1, 1024 samples per
rank: the DLRM reference's shape) or `demo` (configs/demo.toml's: 26 x 50k x 16, 64-16, 64-32-1).
Each ratio is the median over rounds of the ratio of two variants timed in the same round (load
from other processes drifts over seconds). Quality: every side first trains the same
`--quality-steps` batches from fresh weights and reports validation AUC; bf16's speed counts
only if its AUC is within 0.002 of ours fp32.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.tools.console import console

NUM_TABLES, NUM_DENSE = 26, 13
AUC_TOLERANCE = 0.002
# name: (table rows, embedding dim, dense arch, over arch, samples per rank, default steps per
# window)
MODELS: dict[str, tuple[int, int, list[int], list[int], int, int]] = {
    "reference": (100_000, 64, [512, 256, 64], [1024, 1024, 512, 256, 1], 1024, 64),
    # Its steps are ~7x shorter: longer windows keep a window's loader start-up (one gather of
    # ~64 batches before the first) as small a share as the reference's.
    "demo": (50_000, 16, [64, 16], [64, 32, 1], 1024, 256),
}
VAL_BATCHES = 8


def write_bench_data(directory: Path, rows: dict[str, int], table_rows: int, seed: int = 0) -> Path:
    """Demo-style rows (Zipf-like ids, labels from a hidden linear model) as a shardrec dataset."""
    from shardrec.dataloader.format.manifest import (
        Manifest,
        SparseFeature,
        SplitInfo,
        smallest_uint,
        write_part,
    )

    rng = np.random.default_rng(seed)
    dtype = smallest_uint(table_rows - 1)
    splits = {}
    for split, n in rows.items():
        dense = rng.standard_normal((n, NUM_DENSE), dtype=np.float32)
        sparse = {
            f"C{i + 1}": np.minimum(rng.zipf(1.2, n) - 1, table_rows - 1).astype(dtype)
            for i in range(NUM_TABLES)
        }
        logit = dense[:, 0] + sum(np.where(ids % 7 == 0, 0.3, -0.05) for ids in sparse.values())
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
        splits[split] = SplitInfo(
            n, [write_part(directory / split / "part-00000", labels, dense, sparse)]
        )
    features = [SparseFeature(f"C{i + 1}", table_rows, str(dtype)) for i in range(NUM_TABLES)]
    Manifest([f"I{i + 1}" for i in range(NUM_DENSE)], features, splits).save(directory)
    return directory


def job_configs(model: str, data: str, nproc: int, device: str = "cpu") -> dict[str, Any]:
    """Ours' job configs (fp32 and bf16): the demo's optimizers and rates, `model`'s shape."""
    from shardrec.trainer.job.config import load_job_config

    _, dim, dense_arch, over_arch, per_rank, _ = MODELS[model]
    demo = Path(__file__).resolve().parents[3] / "configs" / "demo.toml"
    common = [
        f'data.path="{data}"',
        'data.eval_splits=["val"]',
        f"model.embedding_dim={dim}",
        f"model.dense_arch={dense_arch}",
        f"model.over_arch={over_arch}",
        f"train.global_batch_size={per_rank * nproc}",
    ]
    # Only the demo's [optim]: its pinned sharding types and eval/checkpoint intervals are about the
    # demo's run.
    return {
        p: load_job_config(
            None,
            common + _demo_optim(demo) + [f'train.precision="{p}"', f'train.device="{device}"'],
        )
        for p in ("fp32", "bf16")
    }


def _demo_optim(path: Path) -> list[str]:
    import tomllib

    optim = tomllib.loads(path.read_text())["optim"]
    return [f"optim.{k}={json.dumps(v)}" for k, v in optim.items()]


def rank_main(
    data: str,
    out: str,
    model: str,
    steps: int,
    rounds: int,
    quality_steps: int,
    threads: int,
    device: str = "cpu",
) -> None:
    """One rank of the benchmark (started by torchrun); rank 0 writes the figures to `out`."""
    import torch

    from shardrec.tools.bench.train.train_ranks import bench_rank
    from shardrec.trainer.distributed.dist import init_distributed, shutdown

    torch.set_num_threads(threads)
    env = init_distributed(device)
    configs = job_configs(model, data, env.world_size, device)
    with tempfile.TemporaryDirectory() as run_root:
        result = bench_rank(env, configs, Path(run_root), steps, rounds, quality_steps)
    if env.is_main:
        Path(out).write_text(json.dumps(result))
    shutdown()


def summarise(
    raw: dict[str, Any],
    model: str,
    nproc: int,
    threads: int,
    steps: int,
    rounds: int,
    device: str = "cpu",
) -> dict[str, Any]:
    rates, auc = raw["rates"], raw["auc"]

    def paired(a: str, b: str) -> float:
        # Median over rounds of the ratio within a round: both sides ran back to back.
        return round(float(np.median([x / y for x, y in zip(rates[a], rates[b])])), 3)

    bf16_ok = abs(auc["ours_bf16"] - auc["ours_fp32"]) <= AUC_TOLERANCE
    return {
        "model": model,
        "device": device,
        "ranks": nproc,
        "threads_per_rank": threads,
        "samples_per_rank": MODELS[model][4],
        "steps": steps,
        "rounds": rounds,
        "median_samples_per_s": {k: round(float(np.median(v)), 1) for k, v in rates.items()},
        "ours_fp32_vs_stock_fp32": paired("ours_fp32", "stock_fp32"),
        "ours_bf16_vs_stock_fp32": paired("ours_bf16", "stock_fp32"),
        "ours_bf16_vs_ours_fp32": paired("ours_bf16", "ours_fp32"),
        "loader_vs_in_memory": paired("ours_fp32", "ours_fp32_in_memory"),
        "val_auc": {k: round(v, 4) for k, v in auc.items()},
        "bf16_auc_within_tolerance": bf16_ok,
        "sharding_types": {
            "stock": raw["stock_sharding_types"],
            "ours": raw["ours_sharding_types"],
        },
    }


def print_result(result: dict[str, Any]) -> None:
    console.print(
        f"{result['ranks']} {result['device'].upper()} ranks x {result['threads_per_rank']} thread(s), "
        f"{result['model']} DLRM, {result['samples_per_rank']} samples per rank, "
        f"{result['rounds']} interleaved rounds x {result['steps']} steps; "
        "ratios: median over rounds of same-round ratios"
    )
    for name, rate in result["median_samples_per_s"].items():
        console.print(f"  {name:20s} {rate:>10,.0f} samples/s")
    console.print(
        f"ours fp32 / stock torchrec fp32: {result['ours_fp32_vs_stock_fp32']:.3f}x (target >= 1.0)"
    )
    verdict = (
        "counts"
        if result["bf16_auc_within_tolerance"]
        else f"does NOT count: AUC differs by more than {AUC_TOLERANCE}"
    )
    console.print(
        f"ours bf16 / stock torchrec fp32: {result['ours_bf16_vs_stock_fp32']:.3f}x (target >= 1.5); {verdict}"
    )
    console.print(
        f"real loader / in-memory batches: {result['loader_vs_in_memory']:.3f}x (target >= 0.97)"
    )
    auc = result["val_auc"]
    console.print(
        f"val AUC after the same steps: stock fp32 {auc['stock_fp32']:.4f}, ours fp32 {auc['ours_fp32']:.4f}, "
        f"ours bf16 {auc['ours_bf16']:.4f}"
    )
    console.print(
        f"sharding types: stock {', '.join(result['sharding_types']['stock'])}; "
        f"ours {', '.join(result['sharding_types']['ours'])}"
    )


def run_bench(
    model: str, steps: int, rounds: int, quality_steps: int, nproc: int, device: str, threads: int
) -> dict[str, Any]:
    """Run the benchmark's ranks through torchrun on generated data; returns the summary.
    RuntimeError with the ranks' stderr when they fail."""
    from shardrec.trainer.distributed.launch import rank_environment, torchrun_command

    global_batch = MODELS[model][4] * nproc
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "train": global_batch * max(steps, quality_steps),
            "val": global_batch * VAL_BATCHES,
        }
        data = write_bench_data(Path(tmp) / "data", rows, MODELS[model][0])
        out = Path(tmp) / "result.json"
        args = [
            str(data),
            str(out),
            model,
            str(steps),
            str(rounds),
            str(quality_steps),
            str(threads),
            device,
        ]
        env = rank_environment(nproc) | {"OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(
            torchrun_command(args, nproc, module="shardrec.tools.bench.train.train_bench"),
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"benchmark ranks failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        return summarise(json.loads(out.read_text()), model, nproc, threads, steps, rounds, device)


def check_device(device: str, nproc: int) -> None:
    """ValueError (one line) unless `nproc` ranks can run on `device`."""
    import torch

    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r} is not one of cpu, cuda")
    if device == "cuda":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if nproc > gpus:
            raise ValueError(
                f"--device cuda --nproc {nproc}: this machine has {gpus} CUDA device(s); one rank per GPU"
            )


if __name__ == "__main__":
    rank_main(
        sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:8]), device=sys.argv[8]
    )
