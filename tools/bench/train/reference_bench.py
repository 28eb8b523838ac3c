"""`shardrec bench train --reference DIR`: ours against the DLRM reference itself
(facebookresearch/dlrm torchrec_dlrm, run unmodified from DIR: reference_dlrm.py), on the same
rows, model, optimizers and ranks.

The rows are written twice: as torchrec's day_N_*.npy files for the reference (23 training days,
day 23 halved into val and test) and as a shardrec dataset with the same train and val rows for
ours. Every round starts each side in its own processes (the reference's `main` owns its process
group), in an order that rotates from round to round: the reference, ours fp32 (`shardrec
train`'s job builder and step loop over the real loader) and ours bf16 where the CPU has native
bf16. Each launch trains `warmup` untimed steps from fresh weights, then the `steps` timed ones
(wall time, and CPU time of every rank), then the breakdown's profiled steps if asked, then
evaluates val: the AUCs compare the sides after the same steps. The optimizers are the
reference's `--adagrad`: Adagrad in the tables (fbgemm's EXACT_ADAGRAD, fused in backward) and on
the dense layers, one learning rate.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.tools.bench.proctree import run_to_end
from shardrec.tools.bench.rounds import Run, run_rounds
from shardrec.tools.console import err_console

DAYS = 24
DEMO_LEARNING_RATE = 0.05
VAL_BATCHES = 8


def write_reference_data(
    directory: Path, train_rows: int, val_rows: int, table_rows: int, seed: int = 0
) -> tuple[Path, Path]:
    """The same rows as torchrec's day files (directory/days) and as a shardrec dataset
    (directory/ours): train rows over days 0..22, val the first half of day 23."""
    from shardrec.dataloader.format import torchrec_npy as npy
    from shardrec.tools.bench.train.train_bench import bench_rows, save_dataset

    rng = np.random.default_rng(seed)
    days, ours = directory / "days", directory / "ours"
    days.mkdir(parents=True, exist_ok=True)
    per_day = -(-train_rows // (DAYS - 1))
    train, val = (
        bench_rows(per_day * (DAYS - 1), table_rows, rng),
        bench_rows(2 * val_rows, table_rows, rng),
    )
    for day in range(DAYS):
        rows = (
            val
            if day == DAYS - 1
            else {k: v[day * per_day : (day + 1) * per_day] for k, v in train.items()}
        )
        sparse = np.stack([rows[f"C{i + 1}"] for i in range(len(rows) - 2)], axis=1)
        np.save(npy.day_file(days, day, "dense"), rows["dense"])
        np.save(npy.day_file(days, day, "sparse"), sparse.astype(np.int64))
        np.save(npy.day_file(days, day, "labels"), rows["labels"].astype(np.int32).reshape(-1, 1))
    first_val = {k: v[:val_rows] for k, v in val.items()}
    save_dataset(ours, {"train": train, "val": first_val}, table_rows)
    return ours, days


def _launch(module: str, args: list[str], nproc: int, threads: int) -> None:
    from shardrec.trainer.distributed.launch import rank_environment, torchrun_command

    env = rank_environment(nproc) | {"OMP_NUM_THREADS": str(threads)}
    proc = run_to_end(torchrun_command(args, nproc, module=module), env)  # a stop ends the ranks
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def run_reference_bench(
    reference: Path,
    model: str,
    steps: int,
    rounds: int,
    nproc: int,
    threads: int,
    breakdown_steps: int,
    warmup: int = 8,
) -> dict[str, Any]:
    """Interleaved rounds of the reference and ours; the raw figures for summarise_reference."""
    from shardrec.tools.bench.train.reference_dlrm import (
        check_reference,
        read_reference_round,
        reference_args,
    )
    from shardrec.tools.bench.train.train_bench import LEARNING_RATES, MODELS
    from shardrec.trainer.job.precision import native_bf16

    check_reference(reference)
    table_rows, dim, dense_arch, over_arch, per_rank, _ = MODELS[model]
    lr = LEARNING_RATES.get(model, DEMO_LEARNING_RATE)  # dlrm_main takes one rate for both
    global_batch = per_rank * nproc
    train_steps = warmup + steps + breakdown_steps + 1
    seen: dict[str, Any] = {"auc": {}, "breakdown": {}}
    with tempfile.TemporaryDirectory(prefix="shardrec-bench-ref-") as tmp:
        err_console.print("writing the rows as torchrec day files and as a shardrec dataset ...")
        ours_data, days = write_reference_data(
            Path(tmp), global_batch * (train_steps + 1), global_batch * VAL_BATCHES, table_rows
        )
        ref_args = reference_args(days, per_rank_batch=per_rank, table_rows=table_rows,
                                  embedding_dim=dim, dense_arch=dense_arch, over_arch=over_arch,
                                  learning_rate=lr, train_steps=train_steps,
                                  val_batches=VAL_BATCHES)  # fmt: skip
        window = f"{warmup},{steps},{breakdown_steps}"

        def launch(name: str, module: str, args: list[str]) -> Run:
            out = Path(tmp) / f"out-{name}"
            out.mkdir(exist_ok=True)
            for old in out.glob("*.json"):
                old.unlink()
            err_console.print(f"launching {name} ({train_steps} steps, {steps} timed) ...")
            try:
                _launch(module, [*args[:1], str(out), *args[1:]], nproc, threads)
            except RuntimeError as failed:
                # The reference's ranks now and then abort in its test pass, after its timed
                # steps and val AUC ("terminate called without an active exception": 1 of 11
                # launches on 2 gloo ranks): the figures every rank wrote by then keep the round.
                if name != "reference" or len(list(out.glob("rank-*.json"))) < nproc:
                    raise
                err_console.print(
                    f"the reference failed after writing its figures (its timed steps and val "
                    f"AUC), the round is kept: {str(failed).splitlines()[0]}",
                    highlight=False,
                )
            if name == "reference":
                got = read_reference_round(out, warmup, steps, global_batch)
            else:
                got = json.loads((out / "result.json").read_text())
            seen["auc"].setdefault(name, got["auc"])
            if got.get("breakdown"):
                seen["breakdown"].setdefault(name, got["breakdown"])
            return Run(*got["run"])

        variants = {
            "reference": lambda: launch(
                "reference",
                "shardrec.tools.bench.train.reference_dlrm",
                [str(reference), window, *ref_args],
            )
        }
        precisions = ["fp32"] + (["bf16"] if native_bf16("cpu") else [])
        for precision in precisions:
            variants[f"ours_{precision}"] = lambda p=precision: launch(
                f"ours_{p}",
                "shardrec.tools.bench.train.reference_bench",
                [str(ours_data), model, window, p, str(lr)],
            )
        runs = run_rounds(variants, rounds, warmup=False)  # each launch warms up itself
    return {"runs": runs, **seen, "warmup": warmup, "global_batch": global_batch}


def ours_round_main(data: str, out: str, model: str, window: str, precision: str, lr: str) -> None:
    """One launch of ours (every rank): warm-up, timed and profiled steps from fresh weights,
    then the val AUC; rank 0 writes OUT/result.json."""

    from shardrec.tools.bench.train.breakdown import (
        gather_breakdown,
        labeled_batches,
        profile_steps,
        scope_modules,
    )
    from shardrec.tools.bench.train.timing import timed_window
    from shardrec.tools.bench.train.train_bench import job_configs
    from shardrec.tools.bench.train.train_ranks import build_ours, is_compiled, join_loader_threads
    from shardrec.trainer.distributed.dist import init_distributed, shutdown

    warmup, steps, profiled = (int(v) for v in window.split(","))
    env = init_distributed("cpu", bind_cores=True)  # as shardrec train (dist.bind_cores)
    optim = ["optim.sparse=\"adagrad\"", 'optim.dense="adagrad"', f"optim.sparse_lr={lr}",
             f"optim.dense_lr={lr}"]  # fmt: skip
    config = job_configs(model, data, env.world_size, extra=optim)[precision]
    with tempfile.TemporaryDirectory() as run_root:
        ours = build_ours(config, env, Path(run_root), warmup + steps + profiled + 1)
        batches = iter(ours.job.train_loader)
        ours.train(batches, warmup)
        samples = steps * config.train.global_batch_size
        run = timed_window(lambda: ours.train(batches, steps), samples)
        breakdown = None
        if profiled:
            scopes = [] if is_compiled(ours.job.model) else scope_modules(ours.job.model)
            mine = profile_steps(lambda n: ours.train(labeled_batches(batches), n), profiled)
            for handle in scopes:
                handle.remove()
            breakdown = gather_breakdown(mine)
        batches.close()  # type: ignore[attr-defined]
        join_loader_threads()
        auc = ours.val_auc()
        ours.reporter.close()
    if env.is_main:
        Path(out, "result.json").write_text(
            json.dumps({"run": run, "auc": auc, "breakdown": breakdown})
        )
    shutdown()


if __name__ == "__main__":
    ours_round_main(*sys.argv[1:7])
