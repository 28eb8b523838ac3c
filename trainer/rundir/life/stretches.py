"""The stretches of a run that goes on (`shardrec train --continue-on DATA`: the next day's data
trained as a new stretch of the same run), as RUN/stretches.json records: the data each stretch
trained on (path and fingerprint), its first and last step, its progressive validation (the
model evaluated on the stretch's data before training on it) and what its id maps did.
RUN/dataset.json and config.toml are always of the current stretch. A run never continued has
no such file: it is one stretch, from step 0.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.trust import complete_checkpoints


@dataclass
class Stretch:
    """One stretch of a run: the data it trained on and what came of it."""

    index: int
    data: str
    """The data's absolute path."""
    fingerprint: str
    first_step: int
    last_step: int | None = None
    """The step it ended at (None: not finished)."""
    pv: dict[str, Any] = field(default_factory=dict)
    """Progressive validation: the model of `first_step` on this data, before training on it."""
    id_maps: dict[str, Any] = field(default_factory=dict)
    """What the managed tables' id maps did in it (admitted, evicted, shared-row share)."""


def read_stretches(run_dir: Path) -> list[Stretch]:
    """RUN/stretches.json (empty: a run never continued, or one from before stretches)."""
    path = Path(run_dir) / names.STRETCHES
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable ({e}); it lists the run's stretches") from None
    try:
        return [Stretch(**r) for r in raw["stretches"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: malformed ({e}); it lists the run's stretches") from None


def write_stretches(run_dir: Path, stretches: list[Stretch]) -> None:
    record = {"stretches": [asdict(s) for s in stretches]}
    atomic_write_bytes(
        Path(run_dir) / names.STRETCHES, (json.dumps(record, indent=2) + "\n").encode()
    )


def current_start(run_dir: Path) -> int:
    """The first step of the run's current stretch (0 for a run never continued)."""
    stretches = read_stretches(run_dir)
    return stretches[-1].first_step if stretches else 0


def kept_stretch_steps(run_dir: Path) -> int | None:
    """The steps the run's current stretch began with, as its newest complete checkpoint keeps
    them (id_maps.json): a resume of the stretch spaces the updates of managed tables without
    evict_every by their 1/50, whatever it trains now. None: no checkpoint, or one of a job
    without managed tables or from before the record (the ranks read or refuse the rest)."""
    done = complete_checkpoints(Path(run_dir) / names.CHECKPOINTS)
    if not done:
        return None
    try:
        steps = json.loads((done[-1][1] / names.ID_MAP_SCHEDULE).read_text())["stretch_steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return steps if isinstance(steps, int) and steps > 0 else None


def earlier_stretch_of(stretches: list[Stretch], step: int) -> Stretch | None:
    """The finished stretch a checkpoint of `step` was taken in, where that is not the run's
    current stretch (whose data RUN/config.toml names); None otherwise. A stretch's last
    checkpoint is its `last_step`, which is also the next stretch's `first_step`."""
    for stretch in stretches[:-1]:
        if stretch.last_step is not None and step <= stretch.last_step:
            return stretch
    return None


def unsaved_stretch(
    stretches: list[Stretch], fingerprint: str, step: int | None, older: tuple[str, ...] = ()
) -> Stretch | None:
    """The run's last stretch if it began on this data and was stopped before its first checkpoint
    (the run's newest checkpoint is still the previous stretch's last): going on with that data
    again begins the stretch again, as if it had never started. `older`: the data's fingerprint
    in the forms an earlier shardrec recorded (dataloader.format.fingerprints.older_fingerprints)."""
    last = stretches[-1] if stretches else None
    if last is None or last.fingerprint not in (fingerprint, *older) or last.last_step is not None:
        return None
    return last if step == last.first_step else None
