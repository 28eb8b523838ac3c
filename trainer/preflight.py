"""Checks run before any rank starts, so that bad input ends with one clear line, not N tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shardrec.dataloader.format import Manifest
from shardrec.trainer.config import JobConfig, load_job_config


def entry_overrides(data: Path | None, plan: Path | None, steps: int | None) -> list[str]:
    """The --set items that the --data/--plan/--steps flags stand for (flags win over --set)."""
    out = []
    if data is not None:
        out.append(f"data.path={json.dumps(str(data))}")
    if plan is not None:
        out.append(f"sharding.plan={json.dumps(str(plan))}")
    if steps is not None:
        out.append(f"train.steps={steps}")
    return out


def device_kind(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def preflight(
    config: Path | None, data: Path | None, plan: Path | None, steps: int | None,
    overrides: list[str], world_size: int,
) -> JobConfig:
    """Resolve the job and check it against the dataset and the plan; ValueError says what is wrong."""
    job = load_job_config(config, overrides + entry_overrides(data, plan, steps))
    if not job.data.path:
        raise ValueError("no dataset: pass --data DIR or set data.path in the job file")
    if job.train.global_batch_size % world_size:
        raise ValueError(f"train.global_batch_size = {job.train.global_batch_size} does not divide by {world_size} ranks")
    kind = device_kind(job.train.device)
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device = 'cuda' but CUDA is not available here")
    manifest = Manifest.load(job.data.path)
    if job.data.train_split not in manifest.splits:
        raise ValueError(f"{job.data.path}: no split {job.data.train_split!r} to train on (has {', '.join(manifest.splits)})")
    unknown = sorted(set(job.model.dims) - set(manifest.feature_names))
    if unknown:
        raise ValueError(f"model.dims names features the dataset {job.data.path} does not have: {', '.join(unknown)}")
    if job.sharding.plan:
        # Imported here: torchrec takes seconds to import, and only the plan check needs it.
        from shardrec.embeddings.tables import build_table_configs
        from shardrec.sharding.plan_io import check_plan, load_plan, plan_fingerprint

        tables = build_table_configs(manifest, job.model.embedding_dim, job.model.dims)
        plan_file = load_plan(job.sharding.plan)
        try:
            check_plan(plan_file, plan_fingerprint(tables, world_size, job.train.global_batch_size, kind))
        except ValueError as e:
            raise ValueError(f"{job.sharding.plan}: {e}") from None
    return job
