"""What must match for a checkpoint to load: its signature (the model, its tables, the optimizers'
kinds, the dataset's fingerprint; not the plan), and the one line naming what differs."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.sections import OptimConfig
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.folders import other_step_message
from shardrec.trainer.rundir.checkpoint.trust import REFUSED, UntrustedCheckpoint

# Optimizer settings that decide what state a checkpoint holds: a change would drop or misread it.
OPTIMIZER_KEYS = ("sparse", "dense")
OTHER_JOB = "checkpoint of another model, optimizer or dataset"
"""How a signature's refusal reads: `shardrec train` tells a refused newest checkpoint by it."""
OTHER_RUN = "checkpoint of another run"
"""How the refusal of a checkpoint that another run directory saved begins (it ends as a refusal
of a checkpoint's files does, trust.REFUSED, which `shardrec train` tells it by)."""


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


def read_run_id(run_dir: Path) -> str:
    """RUN/run_id ("" where there is none: a new run, or one from before run ids)."""
    try:
        return (Path(run_dir) / names.RUN_ID).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def ensure_run_id(run_dir: Path) -> str:
    """RUN/run_id, written first where there is none (rank 0, with the run's first files)."""
    found = read_run_id(run_dir)
    if not found:
        found = uuid.uuid4().hex
        atomic_write_bytes(Path(run_dir) / names.RUN_ID, (found + "\n").encode())
    return found


def check_signature(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """ValueError (one line) unless the checkpoint at `path`, whose train_state.pt holds the
    signature `saved`, is of the job whose signature is `current`: what every reader of a
    checkpoint's weights checks (a resume, `eval`, `export`). A resume's signature holds its run's
    id (`run`): a checkpoint that another run saved (copied in) is refused, one saved before run
    ids or read by eval and export is not checked so."""
    mismatch = describe_mismatch(saved, current)
    if mismatch:
        raise ValueError(f"{path}: {OTHER_JOB}: {mismatch}")
    line = other_run_refusal(path, saved.get("run"), current.get("run"))
    if line is not None:
        raise ValueError(line)


def other_run_refusal(path: Path, theirs: object, ours: object) -> str | None:
    """The refusal of the checkpoint at `path` that run `theirs` saved, to resume run `ours`
    from (None: the same run, or either unknown): the ranks' (check_signature) and, before any
    rank starts, `shardrec train`'s, which reads the id torch-free (saved_run_id)."""
    if not ours or not theirs or ours == theirs:
        return None
    return (
        f"{path}: {OTHER_RUN} (run {str(theirs)[:12]}; this run directory is run {str(ours)[:12]}): "
        f"resuming from it would go on from that run's weights and state; {REFUSED}"
    )


def check_step(path: Path, step: int) -> None:
    """UntrustedCheckpoint unless the checkpoint at `path` holds the step its folder is named by:
    a folder of step 12 holding step 8's files (a copy, or an overwrite cut short) would resume at
    step 8, or be evaluated or exported as step 12, without a word. The launchers refuse such a
    folder before any rank starts (folders.misnamed_refusal), in the same words."""
    match = names.CHECKPOINT_RE.match(path.name)
    if match and int(match.group(1)) != step:
        raise UntrustedCheckpoint(f"{other_step_message(path, step)}; {REFUSED}")


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
