"""bench quality's three arms (quality_bench.py runs them): the kind and rows each gives the
raw-id tables of the prepared log (QualityData), the job of one arm, seed and day, and the run
directory each arm and seed trains in."""

from __future__ import annotations

import dataclasses
import hashlib

BUDGET_SHARE = 0.25
"""The managed and hashed arms' rows of a raw-id table: this share of its distinct ids."""
ARMS = ("managed", "hashed", "unbounded")
MANAGED = 'policy="lfu", decay=3'
"""The managed arm's settings beside its kind and rows (`--managed`): TOML inline-table items."""


@dataclasses.dataclass(frozen=True)
class QualityData:
    days: list[str]
    """The preprocessed days, in order."""
    raw: dict[str, int]
    """Raw-id table -> its distinct ids over every day."""


def arm_tables(arm: str, raw: dict[str, int], managed: str = MANAGED) -> list[str]:
    """The --set items of an arm's raw-id tables (`managed`: the managed arm's other settings)."""
    items = []
    for name, distinct in raw.items():
        budget = max(1, int(distinct * BUDGET_SHARE))
        if arm == "managed":
            table = f'{{kind="managed", rows={budget}{", " if managed else ""}{managed}}}'
        elif arm == "hashed":
            table = f'{{kind="hashed", rows={budget}}}'
        else:
            table = f'{{kind="unbounded", rows={distinct}}}'
        items.append(f"tables.{name}={table}")
    return items


def job_config(
    data: str, arm: str, raw: dict[str, int], seed: int, batch: int, managed: str = MANAGED
):
    from shardrec.trainer.job.config import load_job_config

    return load_job_config(
        None,
        [
            f'data.path="{data}"',
            "data.eval_splits=[]",
            'train.device="cpu"',
            f"train.global_batch_size={batch}",
            f"train.seed={seed}",
            "train.log_interval=1000",
            "model.embedding_dim=16",
            "model.dense_arch=[64, 16]",
            "model.over_arch=[64, 32, 1]",
            *arm_tables(arm, raw, managed),
        ],
    )


def run_name(arm: str, seed: int, managed: str) -> str:
    """A run's directory under --work: the managed arm's names its settings' digest, so that a
    rerun with other `--managed` settings trains anew instead of reusing the earlier runs."""
    if arm != "managed":
        return f"{arm}-seed{seed}"
    return f"{arm}-{hashlib.sha256(managed.encode()).hexdigest()[:8]}-seed{seed}"
