"""The names of a run directory's files, spelled once (the on-disk layout; renaming any of them
strands every run written before):

    RUN/config.toml      the resolved settings of the last invocation (data.path, sharding.plan
                         absolute)
    RUN/plan.json        the plan it ran with
    RUN/dataset.json     the dataset's path, fingerprint and schema (of the current stretch's data)
    RUN/stretches.json   a run that goes on (`shardrec train --continue-on DATA`): which data each
                         stretch trained on, its steps, its progressive validation
    RUN/metrics.jsonl    one JSON record per line; RUN/tensorboard/ the same as TensorBoard events
    RUN/mllog.jsonl      MLPerf's `:::MLLOG {json}` events of the last invocation (train.mlperf_log)
    RUN/mllog.N.jsonl    the earlier invocations' (N = 1, 2, ... in order; a resumed run's parts)
    RUN/summary.json     the final results: the run is complete when they are of the newest checkpoint
    RUN/.lock            the one-job-at-a-time flock (lock.py)
    RUN/.seen-by-ranks-* rank 0's marker while the ranks check that they share the run directory
                         (life/node_agreement.py), removed at once
    RUN/run_id           the run's identity, written with its first files (a checkpoint holds it:
                         one copied in from another run is refused)
    RUN/initial_weights.json  the device kind and seed that drew the tables' initial weights, of
                         the job that drew what the run trains from (life/initial_weights.py)
    RUN/checkpoints/step-NNNNNNNN/   a complete checkpoint (checkpoint.py): train_state.pt,
                         <part>-<rank>.pt, DCP's files, id_maps.json (a job of managed tables:
                         their update schedule, for the checks before any rank starts), and
                         digests.json, written last
"""

from __future__ import annotations

import re
from pathlib import Path

CONFIG = "config.toml"
PLAN = "plan.json"
DATASET_RECORD = "dataset.json"
STRETCHES = "stretches.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
SUMMARY = "summary.json"
MLLOG = "mllog.jsonl"
LOCK = ".lock"
NODE_MARKER = ".seen-by-ranks-"
RUN_ID = "run_id"
INITIAL_WEIGHTS = "initial_weights.json"
CHECKPOINTS = "checkpoints"
TRAIN_STATE = "train_state.pt"
ID_MAP_SCHEDULE = "id_maps.json"
DIGESTS = "digests.json"
DCP_METADATA = ".metadata"
"""DCP's file of what a checkpoint holds and where (a pickle: read only once the digests were
checked)."""
CHECKPOINT_RE = re.compile(r"^step-(\d{8}|[1-9]\d{8,})$")
"""checkpoint_name's names: eight digits, more from step 100,000,000 on (no leading zero then)."""


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint of `step` (CHECKPOINT_RE reads it back)."""
    return f"step-{step:08d}"


def no_run_file(run_dir: Path, name: str) -> str:
    """The refusal of a run directory that lacks file `name`: one that does not exist says so."""
    if not Path(run_dir).exists():
        return f"{run_dir}: does not exist"
    return f"{run_dir}: no {name} (not a shardrec run directory?)"
