"""The rank program of `shardrec bench train`: shardrec's training path next to the stock-torchrec
baseline, in one process group.

Ours is what `shardrec train` runs on a rank: `build_job` (shardrec's planner, sharding, optimizers,
the real loader over the dataset on disk) and `train_segment` reporting to the real TrainReporter
(metrics.jsonl on rank 0). The baseline is tools/bench/train/stock_torchrec.py, fed the same batches
(the first ones of ours' shuffled stream, materialised before any timing).

Phases, every rank together:
1. Quality: fresh models train the same first `quality_steps` batches (ours fp32, ours bf16,
   stock fp32), then each is evaluated on the same validation batches (AUC).
2. Speed: interleaved rounds, the variant order rotating per round, `steps` steps per timed
   window: stock fp32 (in-memory batches), ours fp32 and ours bf16 (each window a fresh loader
   iterator from disk, closed and its prefetch thread joined before the next variant starts),
   ours fp32 over the in-memory batches (for the loader ratio).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shardrec.tools.bench.rounds import Run, run_rounds
from shardrec.tools.bench.train.breakdown import (
    gather_breakdown,
    labeled_batches,
    profile_steps,
    scope_modules,
)
from shardrec.tools.bench.train.stock_torchrec import StockModel, StockOptim, StockTrainer
from shardrec.tools.bench.train.timing import timed_window
from shardrec.trainer.distributed import faults
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.loop.metrics import binary_metrics
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.steps import evaluate_batches
from shardrec.trainer.loop.train_job import Job, build_job
from shardrec.trainer.loop.train_loop import train_segment
from shardrec.trainer.rundir.metrics_log import MetricsWriter

LOADER_THREAD_PREFIX = "shardrec-loader"  # dataloader/prefetch.py's thread names
WARMUP_STEPS = 3
"""Untimed steps of every variant before the rounds (compiled layers compile in the first two)."""


@dataclass
class Ours:
    """One shardrec job and its real reporter; `step` counts the steps it trained."""

    job: Job
    reporter: TrainReporter
    step: int = 0

    def train(self, batches: Iterator[Any], steps: int) -> int:
        """Steps exactly as `shardrec train` runs a segment (fault hooks, reports every
        log_interval)."""
        env, cfg = self.job.env, self.job.config

        def on_step(step: int) -> None:
            faults.maybe_kill("kill", step, env.rank)
            faults.maybe_poison(self.job.model, step, env.rank)

        self.reporter.start_segment()
        managed = self.job.managed
        if managed is not None:  # raw ids through the id maps, as `shardrec train` runs them
            batches = managed.train_batches(batches, self.step)
        done = train_segment(
            self.job.runner,
            batches,
            num_steps=steps,
            first_step=self.step,
            report_every=cfg.train.log_interval,
            on_step=on_step,
            on_report=lambda stats: self.reporter.on_report(stats, 0),
            before_step=managed.before_step if managed is not None else None,
        )
        self.step += done
        return done

    def train_from_disk(self, steps: int) -> int:
        """Through a fresh loader iterator (its start-up counts), closed at the end; its prefetch
        thread may still finish a gather: join_loader_threads() before anything else runs."""
        batches = iter(self.job.train_loader)
        try:
            return self.train(batches, steps)
        finally:
            batches.close()  # type: ignore[attr-defined]

    def val_auc(self) -> float:
        model = self.job.runner.eval_mode()
        batches = iter(self.job.eval_loaders["val"])
        try:
            return float(evaluate_batches(model, batches, self.job.env.device)["auc"])
        finally:
            close_loader(batches)


def close_loader(batches: Iterator[Any]) -> None:
    """Stop a loader iterator and wait for its prefetch threads to end."""
    batches.close()  # type: ignore[attr-defined]
    join_loader_threads()


def join_loader_threads() -> None:
    """Wait for every loader prefetch thread to end, so that no loader work runs in the
    background of the next timed variant."""
    for thread in threading.enumerate():
        if thread.name.startswith(LOADER_THREAD_PREFIX):
            thread.join()


def build_ours(config: JobConfig, env: DistEnv, run_dir: Path, total_steps: int) -> Ours:
    job = build_job(config, env, run_dir, None)
    writer = MetricsWriter(run_dir) if env.is_main else None
    reporter = TrainReporter(
        writer,
        total_steps=total_steps,
        first_step=0,
        log_interval=config.train.log_interval,
        lr=lambda: job.runner.optimizer.stepped_lr,
    )
    return Ours(job, reporter)


def stock_spec(
    config: JobConfig, feature_rows: list[tuple[str, int]], num_dense: int
) -> tuple[StockModel, StockOptim]:
    """The baseline's model and optimizers, taken from ours' config: same shape, kinds and rates."""
    m, o = config.model, config.optim
    spec = StockModel(
        m.arch,
        num_dense,
        tuple(feature_rows),
        m.embedding_dim,
        tuple(m.dense_arch),
        tuple(m.over_arch),
        m.dcn_layers,
        m.dcn_low_rank,
    )
    return spec, StockOptim(o.sparse, o.sparse_lr, o.dense, o.dense_lr, o.eps)


def gathered_auc(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """AUC over every rank's predictions, with the metric ours' evaluation uses."""
    local = torch.stack([logits, labels])
    if dist.get_world_size() > 1:
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        local = torch.cat(parts, dim=1)
    return float(binary_metrics(local[0], local[1])["auc"])


def from_disk(side: Ours, steps: int, samples: int) -> Run:
    """One window read from disk. A gather the prefetch thread started ahead of the window's end
    runs on inside it (as it would in training); it is joined after the clock stops (that
    look-ahead is only wasted because the window ends)."""
    run = Run(*timed_window(lambda: side.train_from_disk(steps), samples))
    join_loader_threads()
    return run


def bench_rank(
    env: DistEnv,
    configs: dict[str, JobConfig],
    run_root: Path,
    steps: int,
    rounds: int,
    quality_steps: int,
    breakdown_steps: int = 0,
) -> dict[str, Any]:
    """Both phases on this rank (and the breakdown's profiled steps); returns the figures (every
    rank gets the same)."""
    from shardrec.dataloader.format.manifest import Manifest

    total = quality_steps + (rounds + 1) * steps * 2 + breakdown_steps + WARMUP_STEPS + 1
    ours = {name: build_ours(cfg, env, run_root / name, total) for name, cfg in configs.items()}
    fp32 = ours["fp32"]
    manifest = Manifest.load(Path(configs["fp32"].data.path))
    spec, optim = stock_spec(
        configs["fp32"],
        [(f.name, f.cardinality) for f in manifest.sparse_features],
        len(manifest.dense_features),
    )
    local_batch = configs["fp32"].train.global_batch_size // env.world_size
    stock = StockTrainer(
        spec,
        optim,
        local_batch,
        env.local_world_size,
        seed=fp32.job.config.train.seed,  # as the job resolved it
        device=env.device,
    )
    # The same data for the baseline: ours' stream, materialised (no timing runs meanwhile).
    stream = iter(fp32.job.train_loader)
    batches = list(itertools.islice(stream, max(quality_steps, steps, breakdown_steps)))
    close_loader(stream)
    val_stream = iter(fp32.job.eval_loaders["val"])
    val_batches = list(val_stream)
    close_loader(val_stream)

    auc: dict[str, float] = {}
    for name, side in ours.items():
        side.train_from_disk(quality_steps)
        join_loader_threads()
        auc[f"ours_{name}"] = side.val_auc()
    stock.train(batches, quality_steps)
    auc["stock_fp32"] = gathered_auc(*stock.predict(iter(val_batches)))

    samples = steps * configs["fp32"].train.global_batch_size
    memory = batches[:steps]
    variants: dict[str, Callable[[], Run]] = {
        "stock_fp32": lambda: Run(*stock.timed(memory, steps)),
        "ours_fp32": lambda: from_disk(fp32, steps, samples),
        "ours_fp32_in_memory": lambda: Run(
            *timed_window(lambda: fp32.train(iter(memory), steps), samples)
        ),
    }
    if "bf16" in ours:
        variants["ours_bf16"] = lambda: from_disk(ours["bf16"], steps, samples)
    # Warm-up, untimed: first-step allocations, and the compile of compiled dense layers (its
    # first steps compile the forward and backward graphs).
    for side in ours.values():
        side.train_from_disk(WARMUP_STEPS)
        join_loader_threads()
    stock.train(memory, WARMUP_STEPS)
    start = time.perf_counter()
    runs = run_rounds(variants, rounds, warmup=False)
    result: dict[str, Any] = {
        "runs": {name: [asdict(r) for r in side_runs] for name, side_runs in runs.items()},
        "auc": auc,
        "seconds": round(time.perf_counter() - start, 1),
        "stock_sharding_types": sorted(set(stock.sharding_types().values())),
        "ours_sharding_types": sorted({t.sharding_type for t in fp32.job.plan.tables}),
        "ours_compiled": is_compiled(fp32.job.model),
    }
    if breakdown_steps:
        result["breakdown"] = breakdown(stock, ours, batches[:breakdown_steps], breakdown_steps)
    for side in ours.values():
        side.reporter.close()
    return result


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether ours' dense layers run compiled (train.compile)."""
    return any(getattr(m, "compiled", False) is True for m in model.modules())


def profile_from_disk(side: Ours, steps: int) -> dict[str, float]:
    """`steps` profiled steps of `side` through the real loader, after one unprofiled step of the
    same loader iterator. Its start-up (opening the files, the first gathers) runs once an epoch
    in `shardrec train`, and took one rank 170-340 ms longer than the other: profiled, the
    other rank's wait for it in the first step's input dist read as 20-40 ms a step over 8."""
    batches = iter(side.job.train_loader)
    try:
        side.train(batches, 1)
        return profile_steps(lambda n: side.train(labeled_batches(batches), n), steps)
    finally:
        close_loader(batches)


def breakdown(
    stock: StockTrainer, ours: dict[str, Ours], memory: list[Any], steps: int
) -> dict[str, Any]:
    """Where a step's time goes, stock torchrec's (in-memory batches) beside each precision of
    ours (the real loader, its iterator started), each rank's profile averaged over the ranks."""
    stock_scopes = scope_modules(stock.model)
    ours_scopes = [
        handle
        for side in ours.values()
        if not is_compiled(side.job.model)
        for handle in scope_modules(side.job.model)
    ]
    try:
        profiles = {
            "stock_fp32": profile_steps(lambda n: stock.train(labeled_batches(memory), n), steps)
        }
        for name, side in ours.items():
            profiles[f"ours_{name}"] = profile_from_disk(side, steps)
    finally:
        for handle in stock_scopes + ours_scopes:
            handle.remove()
    join_loader_threads()
    return {name: gather_breakdown(ms) for name, ms in profiles.items()}
