"""`shardrec bench train`: training samples/s of `shardrec train`'s path against stock torchrec.

Ranks (torchrun; CPU: gloo, `--threads` threads each; `--device cuda`: NCCL, one GPU each) train a
DLRM on demo-style synthetic rows (Zipf-like ids, labels from a hidden linear model) written to
disk in shardrec's format:

- stock fp32: what a torchrec user writes from torchrec's examples
  (tools/bench/train/stock_torchrec.py: torchrec's DLRM, stock sharder with the fused optimizer,
  its planner, TrainPipelineSparseDist), over the same batches held in memory;
- ours fp32 / ours bf16: `shardrec train`'s job builder and step loop with the real reporter,
  reading from disk through the real loader (train.precision = fp32 / bf16; train.compile at its
  default, so the reference model's dense layers run compiled on CPU);
- ours fp32 in memory: the same loop over the in-memory batches (for the loader ratio).

Same data, optimizer kinds, learning rates and threads on both sides. Models: `reference`
(26 tables x 100k rows x 64, dense 512-256-64, over 1024-1024-512-256-1, 1024 samples per
rank: the DLRM reference's shape) or `demo` (configs/demo.toml's: 26 x 50k x 16, 64-16, 64-32-1).
Every variant trains WARMUP_STEPS untimed steps, then one window of `steps` steps per round over
interleaved rounds (tools/bench/rounds.py): each ratio is the median of the same-round ratios,
with its spread, per wall second and per CPU-second (every rank's process); a window shorter than
MIN_STEPS steps or MIN_RUN_S seconds is too small to measure. Quality: every side first trains
the same `--quality-steps` batches from fresh weights and reports validation AUC; bf16's speed
counts only if its AUC is within 0.002 of ours fp32. `--breakdown` profiles a few more steps of
stock and ours (breakdown.py); `--reference DIR` measures against the DLRM reference itself
instead (reference_bench.py).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.tools.bench.proctree import run_to_end
from shardrec.tools.bench.rounds import MIN_RUN_S, Run, load_average, ratio, summarize

NUM_TABLES, NUM_DENSE = 26, 13
AUC_TOLERANCE = 0.002
MIN_STEPS = 16
"""Fewer steps in a window measure its start and end (a loader's first gather, barriers)."""
# name: (table rows, embedding dim, dense arch, over arch, samples per rank, default steps per
# window)
MODELS: dict[str, tuple[int, int, list[int], list[int], int, int]] = {
    "reference": (100_000, 64, [512, 256, 64], [1024, 1024, 512, 256, 1], 1024, 64),
    # Its steps are ~7x shorter: longer windows keep a window's loader start-up (one gather of
    # ~64 batches before the first) as small a share as the reference's.
    "demo": (50_000, 16, [64, 16], [64, 32, 1], 1024, 256),
}
VAL_BATCHES = 8
LEARNING_RATES = {"reference": 0.005}
"""Both optimizers' rate where the demo's (0.05) does not fit the model: the reference model's
1024-wide layers take Adagrad's first step (every weight moved by the rate) as a jump of ~50 in
each activation at 0.05 (loss ~3e5 at step 2), after which runs that differ only in rounding
(compiled or eager, ours or the reference) end at AUCs apart by chance; MLPerf DLRMv2's 0.005
trains it stably."""
# (ratio, ours, baseline)
RATIOS = (
    ("ours_fp32_vs_stock_fp32", "ours_fp32", "stock_fp32"),
    ("ours_bf16_vs_stock_fp32", "ours_bf16", "stock_fp32"),
    ("ours_bf16_vs_ours_fp32", "ours_bf16", "ours_fp32"),
    ("loader_vs_in_memory", "ours_fp32", "ours_fp32_in_memory"),
)


def bench_rows(n: int, table_rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Demo-style rows: Zipf-like ids, labels from a hidden linear model (label, dense, C1..)."""
    from shardrec.dataloader.format.manifest import smallest_uint

    dtype = smallest_uint(table_rows - 1)
    dense = rng.standard_normal((n, NUM_DENSE), dtype=np.float32)
    sparse = {
        f"C{i + 1}": np.minimum(rng.zipf(1.2, n) - 1, table_rows - 1).astype(dtype)
        for i in range(NUM_TABLES)
    }
    logit = dense[:, 0] + sum(np.where(ids % 7 == 0, 0.3, -0.05) for ids in sparse.values())
    labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
    return {"labels": labels, "dense": dense, **sparse}


def save_dataset(
    directory: Path, splits: dict[str, dict[str, np.ndarray]], table_rows: int
) -> Path:
    """bench_rows' splits as a shardrec dataset (one part per split)."""
    from shardrec.dataloader.format.manifest import (
        PART_SUFFIX,
        Manifest,
        SparseFeature,
        SplitInfo,
        smallest_uint,
    )
    from shardrec.dataloader.format.part_file import file_layout, write_part

    names = [f"C{i + 1}" for i in range(NUM_TABLES)]
    dense_names = [f"I{i + 1}" for i in range(NUM_DENSE)]
    dtype = str(smallest_uint(table_rows - 1))
    features = [SparseFeature(n, table_rows, dtype) for n in names]
    layout = file_layout(dense_names, "float32", features)
    infos = {}
    for split, rows in splits.items():
        sparse = {n: rows[n] for n in names}
        path = directory / split / f"part-00000{PART_SUFFIX}"
        infos[split] = SplitInfo(
            len(rows["labels"]), [write_part(path, layout, rows["labels"], rows["dense"], sparse)]
        )
    Manifest(dense_names, features, infos).save(directory)
    return directory


def launch_ranks(module: str, args: list[str], nproc: int, threads: int) -> None:
    """A benchmark's rank program (`python -m module ARGS`) on `nproc` CPU ranks through torchrun,
    `threads` intra-op threads each; RuntimeError with the end of the ranks' stderr if they fail.
    A stop (Ctrl-C, a kill) ends the ranks too (run_to_end)."""
    from shardrec.trainer.distributed.launch import rank_environment, torchrun_command

    proc = run_to_end(
        torchrun_command(args, nproc, module=module),
        rank_environment(nproc) | {"OMP_NUM_THREADS": str(threads)},
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark ranks failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )


def write_bench_data(directory: Path, rows: dict[str, int], table_rows: int, seed: int = 0) -> Path:
    """Demo-style rows (Zipf-like ids, labels from a hidden linear model) as a shardrec dataset."""
    rng = np.random.default_rng(seed)
    return save_dataset(
        directory, {s: bench_rows(n, table_rows, rng) for s, n in rows.items()}, table_rows
    )


def job_configs(
    model: str, data: str, nproc: int, device: str = "cpu", extra: list[str] | None = None
) -> dict[str, Any]:
    """Ours' job configs (fp32 and bf16): the demo's optimizers and rates (LEARNING_RATES' where
    given), `model`'s shape; `extra` settings (`section.key=value`) last."""
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
        f'train.device="{device}"',
        # bf16 measured even where it is emulated: the bench says how slow that is.
        "train.allow_emulated_bf16=true",
    ]
    # Only the demo's [optim]: its pinned sharding types and eval/checkpoint intervals are about the
    # demo's run.
    rate = LEARNING_RATES.get(model)
    rates = [f"optim.{k}_lr={rate}" for k in ("sparse", "dense")] if rate else []
    overrides = _demo_optim(demo) + rates + (extra or [])
    return {
        p: load_job_config(None, common + [f'train.precision="{p}"'] + overrides)
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
    breakdown_steps: int = 0,
    device: str = "cpu",
) -> None:
    """One rank of the benchmark (started by torchrun); rank 0 writes the figures to `out`."""
    import torch

    from shardrec.tools.bench.train.train_ranks import bench_rank
    from shardrec.trainer.distributed.dist import init_distributed, shutdown

    torch.set_num_threads(threads)
    env = init_distributed(device, bind_cores=True)  # as shardrec train binds (both sides)
    configs = job_configs(model, data, env.world_size, device)
    with tempfile.TemporaryDirectory() as run_root:
        result = bench_rank(
            env, configs, Path(run_root), steps, rounds, quality_steps, breakdown_steps
        )
    if env.is_main:
        Path(out).write_text(json.dumps(result))
    shutdown()


def too_small(steps: int) -> str:
    return f"{steps} steps a window, under {MIN_STEPS}" if steps < MIN_STEPS else ""


def summarise(
    raw: dict[str, Any],
    model: str,
    nproc: int,
    threads: int,
    steps: int,
    rounds: int,
    device: str = "cpu",
) -> dict[str, Any]:
    runs = {k: [Run(**r) for r in v] for k, v in raw["runs"].items()}
    auc = raw["auc"]
    summaries = {k: summarize(v) for k, v in runs.items()}
    small = too_small(steps)
    bf16_ok = abs(auc["ours_bf16"] - auc["ours_fp32"]) <= AUC_TOLERANCE
    return {
        "model": model,
        "device": device,
        "ranks": nproc,
        "threads_per_rank": threads,
        "samples_per_rank": MODELS[model][4],
        "steps": steps,
        "rounds": rounds,
        "load_average": load_average(),
        "ours_compiled": raw.get("ours_compiled", False),
        "median_samples_per_s": {k: round(v.rate, 1) for k, v in summaries.items()},
        "samples_per_cpu_s": {k: round(v.cpu_rate, 1) for k, v in summaries.items()},
        "window_s": {k: round(v.run_s, 3) for k, v in summaries.items()},
        **{
            name: ratio(runs[a], runs[b], too_small=small, min_run_s=MIN_RUN_S).to_dict()
            for name, a, b in RATIOS
        },
        "val_auc": {k: round(v, 4) for k, v in auc.items()},
        "bf16_auc_within_tolerance": bf16_ok,
        "sharding_types": {
            "stock": raw["stock_sharding_types"],
            "ours": raw["ours_sharding_types"],
        },
        **({"breakdown": raw["breakdown"]} if "breakdown" in raw else {}),
    }


def run_bench(
    model: str,
    steps: int,
    rounds: int,
    quality_steps: int,
    nproc: int,
    device: str,
    threads: int,
    breakdown_steps: int = 0,
) -> dict[str, Any]:
    """Run the benchmark's ranks through torchrun on generated data; returns the summary.
    RuntimeError with the ranks' stderr when they fail."""

    global_batch = MODELS[model][4] * nproc
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            # The breakdown profiles ours after one step of the same epoch.
            "train": global_batch * max(steps, quality_steps, breakdown_steps + 1),
            "val": global_batch * VAL_BATCHES,
        }
        data = write_bench_data(Path(tmp) / "data", rows, MODELS[model][0])
        out = Path(tmp) / "result.json"
        args = [str(data), str(out), model]
        args += [str(v) for v in (steps, rounds, quality_steps, threads, breakdown_steps)]
        launch_ranks("shardrec.tools.bench.train.train_bench", [*args, device], nproc, threads)
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
        sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:9]), device=sys.argv[9]
    )
