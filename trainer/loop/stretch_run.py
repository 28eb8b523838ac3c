"""A new stretch of a run that goes on (`shardrec train --continue-on DATA`), on every rank: the
step counts on from the run's last checkpoint, the epochs of the new data from zero, the id maps
begin a stretch (their first update comes before its first batch); before training, the model is
evaluated on the new data with the maps as they are (progressive validation: how production
teams measure, on data the model has not seen), and RUN/stretches.json says which data each
stretch trained on.
"""

from __future__ import annotations

import time
from typing import Any

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.loader import NO_SHUFFLE, build_loader
from shardrec.trainer.job import data_options
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.steps import evaluate_batches
from shardrec.trainer.loop.train_job import Job
from shardrec.trainer.rundir.life import resume_settings
from shardrec.trainer.rundir.life.stretches import (
    Stretch,
    read_stretches,
    unsaved_stretch,
    write_stretches,
)
from shardrec.trainer.rundir.metrics_log import auc_text


def begin_stretch(job: Job) -> None:
    """Turn the loaded progress (the previous stretch's end) into the new stretch's start."""
    p = job.progress
    p.stretch, p.stretch_start, p.epoch = p.stretch + 1, p.step, 0
    if job.managed is not None:
        steps = job.config.train.total_steps(len(job.train_loader))
        job.managed.maps.begin_stretch(p.step, steps)
        job.managed.counts.clear()


def progressive_validation(job: Job) -> dict[str, Any]:
    """The model as the previous stretch left it, evaluated on the new data's training split (read
    only: the id maps count nothing), before any step on it."""
    cfg = job.config
    loader = build_loader(
        cfg.data.path,
        cfg.data.train_split,
        global_batch_size=cfg.eval.batch_size or cfg.train.global_batch_size,
        rank=job.env.rank,
        world_size=job.env.world_size,
        shuffle=NO_SHUFFLE,
        tail="pad",
        delivery=data_options.delivery(cfg.data, job.env.device.type),
        multihot=data_options.multihot_option(cfg.data),
    )
    model = job.runner.eval_mode()
    batches = iter(loader)
    if job.managed is not None:
        batches = job.managed.eval_batches(batches)
    start = time.perf_counter()
    metrics = evaluate_batches(model, batches, job.env.device, cfg.eval.max_batches)
    metrics["seconds"] = round(time.perf_counter() - start, 3)
    return metrics


def start_stretch_records(
    job: Job, reporter: TrainReporter, previous: dict[str, Any] | None
) -> None:
    """Progressive validation, then the new stretch in RUN/stretches.json and metrics.jsonl (rank
    0 writes). `previous`: the run's dataset record before this job (the last stretch's data)."""
    p, cfg = job.progress, job.config
    pv = progressive_validation(job)
    reporter.write(
        {"kind": "pv", "stretch": p.stretch, "step": p.step, "split": cfg.data.train_split, **pv}
    )
    reporter.say(
        "stretch %d (%s) before training on it: auc %s logloss %.4f ne %.4f",
        p.stretch,
        cfg.data.path,
        auc_text(pv),
        pv["logloss"],
        pv["ne"],
    )
    reporter.write(
        {"kind": "stretch", "stretch": p.stretch, "step": p.step, "data": str(cfg.data.path)}
    )
    if not job.env.is_main:
        return
    assert job.manifest is not None
    fingerprint, older = dataset_fingerprint(job.manifest), older_fingerprints(job.manifest)
    stretches = read_stretches(job.run_dir)
    if unsaved_stretch(stretches, fingerprint, p.step, older) is not None:
        stretches.pop()  # begun before, stopped before its first checkpoint: listed once, anew
    if not stretches:  # the run's first continuation: its first stretch, from its dataset record
        prev = previous or {}
        stretches = [Stretch(0, prev.get("path", ""), prev.get("fingerprint", ""), 0)]
    if stretches[-1].last_step is None:
        stretches[-1].last_step = p.step
    stretches.append(
        Stretch(
            p.stretch,
            str(resume_settings.with_absolute_paths(cfg).data.path),
            fingerprint,
            p.step,
            pv=pv,
        )
    )
    write_stretches(job.run_dir, stretches)


def end_stretch_records(job: Job, id_maps: dict[str, Any]) -> None:
    """The stretch's last step, and what its id maps did, in RUN/stretches.json (rank 0; a run that
    never went on and has no managed tables keeps no such file)."""
    if not job.env.is_main:
        return
    stretches = read_stretches(job.run_dir)
    if not stretches:
        if job.managed is None:
            return
        assert job.manifest is not None
        path = resume_settings.with_absolute_paths(job.config).data.path
        stretches = [Stretch(0, str(path), dataset_fingerprint(job.manifest), 0)]
    stretches[-1].last_step = job.progress.step
    stretches[-1].id_maps = id_maps
    write_stretches(job.run_dir, stretches)
