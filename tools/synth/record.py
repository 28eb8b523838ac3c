"""What `shardrec synth` wrote into a folder: `.synth.json` beside its files, each file's name and
the settings that wrote it, so that synth replaces its own files only, and only with the same
settings.

A file synth is about to write that exists and is not in the record is the user's: refused. One
in the record with other settings (another --rows, --days, --seed, --like ...) is refused too: a
run of 2 days over one of 6 would leave day_2 .. day_5 of the first beside day_0 and day_1 of the
second, and `raw/day_*` would mix two logs; more --days over a drifting log are refused saying
that it cannot grow (its days are drawn for its --days). Output of other settings under other names (the
README's tours: train.txt, then train.csv beside it) is left alone. The record is updated before
the files are written: files appear whole (temporary name, then rename), so a Ctrl-C leaves
files of this run's settings only, and a rerun of the same command finishes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from shardrec.dataloader.util.files import atomic_write_bytes

RECORD = ".synth.json"
_SHOWN_FILES = 3


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


def _differs(old: dict, new: dict) -> str:
    """`days 6 in the folder, 2 now`: the settings that differ (only --like where it does)."""
    keys = ["like"] if old.get("like") != new.get("like") else sorted(old.keys() | new.keys())
    return "; ".join(
        f"{k} {old.get(k, 'not given')} in the folder, {new.get(k, 'not given')} now"
        for k in keys
        if old.get(k) != new.get(k)
    )


def _listed(names: list[str]) -> str:
    more = len(names) - _SHOWN_FILES
    return ", ".join(names[:_SHOWN_FILES]) + (f" and {more} more" if more > 0 else "")


def _refuse_more_drift_days(out: Path, log: dict, settings: dict) -> None:
    """Refuse (ValueError, one line) more --days over a drifting log, saying why no later day of
    it can be written: its hidden world (ids' salt, the user x item pair) is drawn after each day's
    bias, so a log of more days is another log from day_0 on, and its extra days do not follow."""
    others = {k for k in log.keys() | settings.keys() if log.get(k) != settings.get(k)}
    if log.get("like") != "drift" or not others <= {"days", "rows"}:
        return
    days, more = int(log["days"]), int(settings["days"])
    if more <= days:
        return
    raise ValueError(
        f"{out}: holds the {days}-day drifting log of --rows {log['rows']} (day_0 .. "
        f"day_{days - 1}); --days {more} cannot add days to it: a drifting log draws every day "
        f"for its --days, so a {more}-day log is another log (other ids from day_0 on) whose "
        f"day_{days} does not follow this one; for {more} days of one log, write them at once "
        f"into another folder (--days {more} --rows {int(log['rows']) * more // days}) and train "
        "from its day_0"
    )


def check_and_record(out: Path, paths: list[Path], settings: dict) -> None:
    """Refuse (ValueError, one line) to write `paths` with `settings` where a file synth did not
    write, or synth's output of other settings, would be replaced; else record them (before they
    are written)."""
    files = _load(out)
    for path in paths:
        if (path.exists() or path.is_symlink()) and path.name not in files:
            raise ValueError(
                f"{path}: exists and synth did not write it; write into another folder or remove it"
            )
    clash = next((files[p.name] for p in paths if p.exists() and files[p.name] != settings), None)
    if clash is not None:
        _refuse_more_drift_days(out, clash, settings)
        theirs = sorted(
            (n for n, s in files.items() if s == clash and (out / n).exists()),
            key=lambda n: (len(n), n),
        )
        raise ValueError(
            f"{out}: holds synth output of other settings ({_differs(clash, settings)}): "
            f"{_listed(theirs)}; remove those files or write into another folder"
        )
    kept = {n: s for n, s in files.items() if (out / n).exists()}
    kept.update({p.name: settings for p in paths})
    atomic_write_bytes(out / RECORD, json.dumps({"files": kept}, indent=1).encode())
