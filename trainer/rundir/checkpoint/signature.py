"""What must match for a checkpoint to load: its signature (the model, its tables, the optimizers'
kinds, the dataset's fingerprint; not the plan), and the one line naming what differs."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardrec.trainer.job.sections import ModelConfig, OptimConfig

# Optimizer settings that decide what state a checkpoint holds: a change would drop or misread it.
OPTIMIZER_KEYS = ("sparse", "dense")
OTHER_JOB = "checkpoint of another model, optimizer or dataset"
"""How a signature's refusal reads: `shardrec train` tells a refused newest checkpoint by it."""


def checkpoint_signature(
    model: ModelConfig,
    optim: OptimConfig,
    tables: list[tuple[str, int, int]],
    dataset: str = "",
    older_datasets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """What must match for a checkpoint to load: the model, its tables (name, rows, dim), the
    optimizers' kinds and the dataset's fingerprint (dataloader.format.fingerprints; "" skips
    that check), not the plan. `older_datasets`: the dataset's fingerprint as runs recorded it before
    (fingerprints.older_fingerprints), which their checkpoints hold."""
    signature = {
        "model": asdict(model),
        "optim": {k: getattr(optim, k) for k in OPTIMIZER_KEYS},
        "tables": [
            {"name": name, "rows": int(rows), "dim": int(dim)} for name, rows, dim in tables
        ],
        "dataset": dataset,
    }
    if dataset and older_datasets:  # a click log's signature stays as it was
        signature["older_datasets"] = list(older_datasets)
    return signature


def check_signature(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """ValueError (one line) unless the checkpoint at `path`, whose train_state.pt holds the
    signature `saved`, is of the job whose signature is `current`: what every reader of a
    checkpoint's weights checks (a resume, `eval`, `export`)."""
    mismatch = describe_mismatch(saved, current)
    if mismatch:
        raise ValueError(f"{path}: {OTHER_JOB}: {mismatch}")


def describe_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """What differs between a checkpoint's signature and the job's ("" when nothing does)."""
    diffs = []
    for section in ("model", "optim"):
        for key, value in saved.get(section, {}).items():
            if current[section].get(key) != value:
                diffs.append(
                    f"{section}.{key}: checkpoint {value!r}, job {current[section].get(key)!r}"
                )
    # A checkpoint from before dataset fingerprints, or a job that gives none, skips this check; a
    # run that goes on loads the last checkpoint of its previous stretch's data.
    if (
        saved.get("dataset")
        and current.get("dataset")
        and saved["dataset"]
        not in (
            current["dataset"],
            current.get("continues_from"),
            *current.get("older_datasets", ()),
        )
    ):
        diffs.append(
            f"dataset: checkpoint trained on fingerprint {saved['dataset'][:12]}, "
            f"job's data is {current['dataset'][:12]}"
        )
    old = {t["name"]: (t["rows"], t["dim"]) for t in saved["tables"]}
    new = {t["name"]: (t["rows"], t["dim"]) for t in current["tables"]}
    if set(old) != set(new):
        diffs.append(
            f"tables: checkpoint has {len(old)} ({', '.join(sorted(set(old) - set(new))[:3]) or '-'} not in the job), "
            f"job has {len(new)} ({', '.join(sorted(set(new) - set(old))[:3]) or '-'} not in the checkpoint)"
        )
    else:
        diffs += [
            f"table {n} [rows, dim]: checkpoint {list(old[n])}, job {list(new[n])}"
            for n in sorted(old)
            if old[n] != new[n]
        ]
    return "; ".join(diffs)
