"""What made a `data reference-npy` output, and the checks that keep a rerun from mixing runs.

The run record (OUT/reference-npy.json, written before any work and kept with the arrays) holds
the inputs (name, bytes, modification time, a sampled digest of their content: file_identity),
the dense transform and the seed. A rerun with the same record resumes or finds everything done;
one with another record is refused, naming what differs, as `shardrec preprocess` refuses (its
.work/run.json): every step skips the files already in place, so a rerun with other settings or
inputs (a day file replaced by another of the same size and time) would silently keep the old
arrays.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.tools.preprocess.text.file_identity import (
    as_recorded,
    file_identity,
    input_difference,
)

RECORD = "reference-npy.json"
WORK = ".work"
_AGAIN = "choose a new --out or remove the old one"
_DAY_NAME = re.compile(r"^day_(\d+)(\..+)?$")  # day_7, day_7.gz


def check_day_order(days: list[Path]) -> None:
    """Day files named day_N (day_N.gz, ...) must come as day_0, day_1, ... without gaps: the
    order given is the order trained on, and the last is val + test. A shell's `day_*` sorts
    day_10 before day_2; ValueError names the first file out of place."""
    found = [_DAY_NAME.match(p.name) for p in days]
    if not all(found):
        return  # other names: their order is the user's to give
    numbers = [int(m.group(1)) for m in found]
    for prev, num, path in zip(numbers, numbers[1:], days[1:]):
        if num != prev + 1:
            gap = f" (day_{prev + 1} is missing)" if prev + 1 not in numbers else ""
            hint = f"{days[0].parent / f'day_{{{min(numbers)}..{max(numbers)}}}'}"
            raise ValueError(
                f"{path}: given after day_{prev}{gap}; give the day files in order, e.g. "
                f"{hint}{found[0].group(2) or ''}"
            )


def run_record(days: list[Path], dense: str, seed: int) -> dict:
    """What fixes the arrays: the inputs in order (file_identity), the dense transform and the
    seed."""
    return {"inputs": [file_identity(path) for path in days], "dense": dense, "seed": seed}


def check_record(out: Path, record: dict) -> None:
    """Refuse an `out` holding another run's files (ValueError naming what differs); record this
    run there otherwise."""
    path = out / RECORD
    if path.is_file():
        try:
            old = json.loads(path.read_bytes())
        except ValueError as e:
            raise ValueError(f"{path}: unreadable run record ({e}); {_AGAIN}") from None
        old = old if isinstance(old, dict) else {}
        if old == record:
            return
        # An older shardrec's record (no digests) of these very inputs: rewritten with them.
        older = old == {**record, "inputs": as_recorded(old.get("inputs"), record["inputs"])}
        if not older and _depends_on_difference(out, old, record):
            raise ValueError(f"{out}: holds arrays made with {_differences(old, record)}; {_AGAIN}")
    else:
        found = sorted(out.glob("day_*.npy")) or sorted((out / WORK).glob("day_*.npy"))
        if found:
            raise ValueError(
                f"{out}: holds day files ({found[0].name}) but no record of the run that wrote "
                f"them ({RECORD}); {_AGAIN}"
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(record, indent=1).encode())


def _depends_on_difference(out: Path, old: dict, new: dict) -> bool:
    """Whether a finished file left by the run of `old` depends on what differs in `new`.

    The parsed days and their ids (OUT/.work) depend on the inputs only: a run refused for its
    dense transform (log3 of a -3) leaves them for a rerun with --dense log-min2, as its message
    says. The arrays in OUT depend on everything. Temporaries (*.tmp) are rewritten either way."""
    arrays = any(out.glob("day_*.npy"))
    parsed = arrays or any((out / WORK).glob("day_*.npy"))
    settings = any(old.get(key) != new[key] for key in ("dense", "seed"))
    return (old.get("inputs") != new["inputs"] and parsed) or (settings and arrays)


def _differences(old: dict, new: dict) -> str:
    """`another seed (0, now 1)`, `other inputs (day_0: 1,234 bytes, now 5,678)`, ..."""
    said = []
    for key in ("dense", "seed"):
        if old.get(key) != new[key]:
            said.append(f"another {key} ({old.get(key)}, now {new[key]})")
    if old.get("inputs") != new["inputs"]:
        said.append(f"other inputs ({input_difference(old.get('inputs'), new['inputs'])})")
    return ", ".join(said) or "another shardrec's settings"
