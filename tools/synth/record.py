"""What `shardrec synth` wrote into a folder: `.synth.json` beside its files, each file's name and
the settings that wrote it, so that synth replaces its own files only.

A file synth is about to write that exists and is not in the record is the user's: refused.
Files under other names are left alone (the README's tours: train.txt, then train.csv beside
it). The record is updated before the files are written, so a rerun of an interrupted command
finds the files it wrote in it.
"""

from __future__ import annotations

import json
from pathlib import Path

from shardrec.dataloader.util.files import atomic_write_bytes

RECORD = ".synth.json"


def synth_paths(out: Path, like: str, days: int, csv: bool, gz: bool) -> list[Path]:
    """The files `synth --like like` writes into `out` (days: drift's days, already defaulted)."""
    from shardrec.tools.synth.yambda import EVENT_FILE, MAPS

    if like == "yambda":
        suffix = ".csv" if csv else ".parquet"
        return [out / f"{name}{suffix}" for name in (EVENT_FILE, *MAPS.values())]
    if like == "drift":
        return [out / f"day_{d}" for d in range(days)]
    if like != "criteo":
        return [out / f"train.csv{'.gz' if gz else ''}"]
    suffix = (".csv" if csv else "") + (".gz" if gz else "")
    if days <= 0:
        return [out / f"train{'.csv' if csv else '.txt'}{'.gz' if gz else ''}"]
    return [out / f"day_{d}{suffix}" for d in range(days)]


def _load(out: Path) -> dict[str, dict]:
    path = out / RECORD
    if not path.is_file():
        return {}
    try:
        files = json.loads(path.read_bytes())["files"]
        if not isinstance(files, dict):
            raise ValueError("no files")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: unreadable record of what synth wrote here ({e}); remove the folder or "
            "write into another"
        ) from None
    return files


def check_and_record(out: Path, paths: list[Path], settings: dict) -> None:
    """Refuse (ValueError, one line) to write `paths` where a file synth did not write would be
    replaced; else record them with `settings` (before they are written)."""
    files = _load(out)
    for path in paths:
        if (path.exists() or path.is_symlink()) and path.name not in files:
            raise ValueError(
                f"{path}: exists and synth did not write it; write into another folder or remove it"
            )
    kept = {n: s for n, s in files.items() if (out / n).exists()}
    kept.update({p.name: settings for p in paths})
    atomic_write_bytes(out / RECORD, json.dumps({"files": kept}, indent=1).encode())
