"""`shardrec bench quality`: managed tables against hashing into the same rows and against an
unbounded vocabulary of every id, on a drifting log trained day by day, each day evaluated before
training on it (progressive validation).

The log is `shardrec synth --like drift`'s (its parameters fixed in tools/synth/drift.py, not tuned
here), each day preprocessed on its own: every table with at least MIN_DISTINCT distinct ids over
the days keeps raw ids (`--raw-ids`), the others are hashed into 4x their distinct ids (static,
the same in every arm). Three arms differ only in the kind of the raw-id tables:
- managed: rows = 1/4 of the table's distinct ids over the days; lfu (the least often seen id gives
  its slot to one seen more often), admitted after 2 sightings, updates every 1/50 of a day
  (`--managed` sets others: lfu kept the log's fading items' traffic on rows of their own better
  than lru with ids unseen for a day evicted, 0.8190 against 0.8152 PV AUC over 3 seeds);
- hashed: the same rows, row 2 + mix64(id) mod rows;
- unbounded: a row for every id (rows = its distinct ids), admitted at the first sighting.
Each arm and model seed is one run: day 0 trained, then `--continue-on` each next day (in-process,
through the job builder and the continuation checks `shardrec train` uses), whose progressive
validation is recorded in the run's stretches.json. Headline: the mean PV AUC of days 1.. per
run; per arm, its mean over seeds and spread (max - min). Also: hashing's collision rate (the
share of a day's lookups whose row holds another id seen that day, and seen any day so far) and
managed's share of lookups on the shared row, admissions and evictions per day.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.tools.console import console

MIN_DISTINCT = 1000
MIN_ROWS_PER_DAY = 1500
"""Fewest rows a day that give the drifting log (2 days, the default --max-vocab) a table of
MIN_DISTINCT ids: at 1,000 rows its largest has 879, so no table keeps raw ids and the three arms
are one static model."""
STATIC_FACTOR = 4
BUDGET_SHARE = 0.25
ARMS = ("managed", "hashed", "unbounded")
GOAL_VS_UNBOUNDED = 0.002
MIN_SEEDS_FOR_SPREAD = 2
"""Seeds a spread needs: with one, every arm's spread is 0 and "above the spread" says nothing."""
MANAGED = 'policy="lfu"'
"""The managed arm's settings beside its kind and rows (`--managed`): TOML inline-table items."""


@dataclasses.dataclass(frozen=True)
class QualityData:
    days: list[str]
    """The preprocessed days, in order."""
    raw: dict[str, int]
    """Raw-id table -> its distinct ids over every day."""


def prepare(work: Path, days: int, rows_per_day: int, seed: int, max_vocab: int) -> QualityData:
    """Write the drifting log and preprocess each day (raw ids for the large tables)."""
    from shardrec.tools.preprocess.pipeline import run_preprocess
    from shardrec.tools.preprocess.settings import PreprocessConfig
    from shardrec.tools.synth.drift import write_drift

    paths, stats = write_drift(work / "raw", rows_per_day * days, seed, days, max_vocab)
    distinct = {name: int(t["distinct_so_far"]) for name, t in stats[-1].tables.items()}
    raw = {n: d for n, d in distinct.items() if d >= MIN_DISTINCT}
    if not raw:
        raise ValueError(
            f"no table of the drifting log has {MIN_DISTINCT:,} distinct ids over {days} days of "
            f"{rows_per_day:,} rows (the most: {max(distinct.values()):,}): no raw-id table for "
            "the arms to differ in; give more --rows-per-day or --days, or a larger --max-vocab"
        )
    names = [f"C{i + 1}" for i in range(len(distinct))]
    max_ids = [max(2, STATIC_FACTOR * distinct[n]) for n in names]
    # The days preprocessed by an earlier invocation are reused only if made of the same log.
    made = {"days": days, "rows_per_day": rows_per_day, "seed": seed, "max_vocab": max_vocab}
    stamp = work / "data" / "made.json"
    if (work / "data").exists() and (not stamp.is_file() or json.loads(stamp.read_text()) != made):
        shutil.rmtree(work / "data")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(made))
    out = []
    for path in paths:
        day = work / "data" / path.name
        if not (day / "manifest.json").is_file():
            run_preprocess(
                PreprocessConfig(inputs=[path], out=day, max_ids=max_ids, raw_ids=sorted(raw))
            )
        out.append(str(day))
    return QualityData(out, raw)


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


def rank_main(spec_file: str, out: str) -> None:
    """Every run, day by day, on this rank (started by torchrun); rank 0 writes the PV AUCs."""
    import torch

    from shardrec.trainer.distributed.dist import init_distributed, shutdown
    from shardrec.trainer.loop.train_job import build_job
    from shardrec.trainer.loop.train_loop import run_job
    from shardrec.trainer.rundir.life import lifecycle
    from shardrec.trainer.rundir.life.continuation import check_continuing_job
    from shardrec.trainer.rundir.life.stretches import read_stretches

    spec = json.loads(Path(spec_file).read_text())
    torch.set_num_threads(1)
    env = init_distributed("cpu")
    results: dict[str, Any] = {}
    for arm in spec["arms"]:
        for seed in spec["seeds"]:
            run_dir = Path(spec["work"]) / "runs" / run_name(arm, seed, spec["managed"])
            configs = [
                job_config(data, arm, spec["raw"], seed, spec["batch"], spec["managed"])
                for data in spec["days"]
            ]
            # Every rank decides before rank 0 removes anything.
            reuse = finished_run(run_dir, spec["days"], configs[-1])
            torch.distributed.barrier()
            if not reuse:
                # Anything else under the run's name (another batch or data, a run cut short) is
                # trained anew: bench quality has no --restart to ask for.
                if env.is_main and run_dir.exists():
                    shutil.rmtree(run_dir)
                torch.distributed.barrier()
                for d, config in enumerate(configs):
                    continuing = False
                    if d == 0:
                        lifecycle.check_job(run_dir, config, [])
                    else:
                        _, continuing = check_continuing_job(run_dir, config, [])
                    run_job(build_job(config, env, run_dir, None, continuing=continuing))
                    # Rank 0 writes the run's records last: every rank reads them for the next day.
                    torch.distributed.barrier()
            if env.is_main:
                results[f"{arm}-seed{seed}"] = [
                    dataclasses.asdict(s) for s in read_stretches(run_dir)
                ]
    if env.is_main:
        Path(out).write_text(json.dumps(results))
    shutdown()


def finished_run(run_dir: Path, days: list[str], last: Any) -> bool:
    """Whether an earlier invocation left `run_dir` trained on every one of `days`, in order and as
    they are now, with the job of the last day (`last`, a JobConfig): its figures are read back."""
    from shardrec.dataloader.format.fingerprints import dataset_fingerprint
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.trainer.rundir.life.continuation import check_continuing_job
    from shardrec.trainer.rundir.life.stretches import read_stretches

    try:
        stretches = read_stretches(run_dir)
        if [s.data for s in stretches] != days or any(s.last_step is None for s in stretches):
            return False
        made = [dataset_fingerprint(Manifest.load(day)) for day in days]
        if [s.fingerprint for s in stretches] != made:
            return False
        done, _ = check_continuing_job(run_dir, last, [])
    except ValueError:  # other settings or data: not this job's run
        return False
    return done is not None


def run_name(arm: str, seed: int, managed: str) -> str:
    """A run's directory under --work: the managed arm's names its settings' digest, so that a
    rerun with other `--managed` settings trains anew instead of reusing the earlier runs."""
    if arm != "managed":
        return f"{arm}-seed{seed}"
    return f"{arm}-{hashlib.sha256(managed.encode()).hexdigest()[:8]}-seed{seed}"


def check_managed(managed: str) -> None:
    """ValueError in one line for `--managed` settings a managed table would refuse."""
    from shardrec.trainer.job.config import load_job_config

    item = arm_tables("managed", {"C1": 4 * MIN_DISTINCT}, managed)[0]
    try:
        load_job_config(None, [item])
    except ValueError as e:
        raise ValueError(f"--managed {managed!r}: {e}") from None


def hashed_collisions(days: list[str], raw: dict[str, int]) -> list[dict[str, float]]:
    """Per day, over the raw-id tables: the share of the day's lookups whose hashed row holds
    another id seen that day, and seen any day so far."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.dataloader.format.part_file import open_split
    from shardrec.dataloader.format.raw_ids import MISSING_KEY
    from shardrec.dataloader.util.splitmix import mix64

    seen: dict[str, np.ndarray] = {n: np.zeros(0, np.uint64) for n in raw}
    out = []
    for day in days:
        manifest = Manifest.load(day)
        parts = open_split(day, "train", manifest)
        lookups = same_day = ever = 0
        for name, distinct in raw.items():
            budget = np.uint64(max(1, int(distinct * BUDGET_SHARE)))
            keys = np.concatenate([np.asarray(p.sparse[name]) for p in parts])
            keys = keys[keys != np.uint64(MISSING_KEY)]
            ids, counts = np.unique(keys, return_counts=True)
            seen[name] = np.union1d(seen[name], ids)
            rows_today = mix64(ids) % budget
            rows_ever = mix64(seen[name]) % budget
            lookups += int(counts.sum())
            same_day += int(counts[np.bincount(rows_today.astype(np.int64))[rows_today] > 1].sum())
            shared = np.bincount(rows_ever.astype(np.int64), minlength=int(budget))
            ever += int(counts[shared[rows_today.astype(np.int64)] > 1].sum())
        out.append(
            {
                "same_day": round(same_day / lookups, 4) if lookups else 0.0,
                "any_day_so_far": round(ever / lookups, 4) if lookups else 0.0,
            }
        )
    return out


def run_quality(
    work: Path | None,
    days: int,
    rows_per_day: int,
    seeds: list[int],
    nproc: int,
    batch: int,
    max_vocab: int,
    data_seed: int = 0,
    managed: str = MANAGED,
) -> dict[str, Any]:
    """Prepare the data, run every arm and seed through torchrun, summarise."""
    from shardrec.tools.bench.train.train_bench import launch_ranks

    check_managed(managed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(work) if work is not None else Path(tmp)
        data = prepare(root, days, rows_per_day, data_seed, max_vocab)
        spec = {
            "work": str(root),
            "days": data.days,
            "raw": data.raw,
            "arms": list(ARMS),
            "seeds": seeds,
            "batch": batch,
            "managed": managed,
        }
        spec_file, out = root / "quality.json", root / "quality-result.json"
        spec_file.write_text(json.dumps(spec))
        module = "shardrec.tools.bench.train.quality_bench"
        launch_ranks(module, [str(spec_file), str(out)], nproc, 1)
        runs = json.loads(out.read_text())
        collisions = hashed_collisions(data.days, data.raw)
    return summarise(runs, collisions, data, rows_per_day, seeds, nproc, settings=managed)


def summarise(
    runs, collisions, data: QualityData, rows_per_day: int, seeds, nproc, settings: str = MANAGED
) -> dict:
    per_run = {name: [s["pv"]["auc"] for s in stretches[1:]] for name, stretches in runs.items()}
    arms = {}
    for arm in ARMS:
        means = [float(np.mean(per_run[f"{arm}-seed{s}"])) for s in seeds]
        arms[arm] = {
            "mean_pv_auc": round(float(np.mean(means)), 5),
            "spread": round(max(means) - min(means), 5),
            "per_seed": [round(m, 5) for m in means],
            "per_day": [
                round(float(np.mean([per_run[f"{arm}-seed{s}"][d] for s in seeds])), 5)
                for d in range(len(data.days) - 1)
            ],
        }
    managed = [runs[f"managed-seed{s}"] for s in seeds]
    maps = [
        {
            k: float(np.mean([m[d]["id_maps"].get(k, 0) for m in managed]))
            for k in ("shared_row_share", "admitted", "evicted")
        }
        for d in range(len(data.days))
    ]
    spread = max(a["spread"] for a in arms.values())
    spread_measured = len(seeds) >= MIN_SEEDS_FOR_SPREAD
    vs_hashed = arms["managed"]["mean_pv_auc"] - arms["hashed"]["mean_pv_auc"]
    vs_unbounded = arms["unbounded"]["mean_pv_auc"] - arms["managed"]["mean_pv_auc"]
    return {
        "days": len(data.days),
        "rows_per_day": rows_per_day,
        "seeds": seeds,
        "ranks": nproc,
        "raw_tables": data.raw,
        "managed_settings": settings,
        "arms": arms,
        "managed_minus_hashed": round(vs_hashed, 5),
        "unbounded_minus_managed": round(vs_unbounded, 5),
        "largest_spread": round(spread, 5),
        # None: not measured (one seed has no spread to beat); print_quality says why.
        "managed_beats_hashed": vs_hashed > spread if spread_measured else None,
        # None: not decided (the goal lies within the spread of the gap); see near_unbounded.
        "managed_near_unbounded": near_unbounded(vs_unbounded, spread, spread_measured),
        "near_unbounded_judged": "spread" if spread_measured else "one seed",
        "hashed_collisions": collisions,
        "managed_maps_per_day": maps,
    }


def near_unbounded(gap: float, spread: float, spread_measured: bool) -> bool | None:
    """Whether unbounded - managed (`gap`, of the arms' means) is within GOAL_VS_UNBOUNDED, judged
    as managed - hashed is, against the run-to-run spread: met where the gap plus the largest
    spread is within the goal, NOT met where the gap less it is still above, None (not decided)
    where the goal lies within the spread of the gap. One seed has no spread: the gap alone."""
    if not spread_measured:
        return gap <= GOAL_VS_UNBOUNDED
    if gap + spread <= GOAL_VS_UNBOUNDED:
        return True
    return False if gap - spread > GOAL_VS_UNBOUNDED else None


def _near_unbounded_text(result: dict[str, Any]) -> str:
    """The goal's verdict and how it was judged: against the spread, or on one seed."""
    near, spread = result["managed_near_unbounded"], f"{result['largest_spread']:.4f}"
    if result["near_unbounded_judged"] == "one seed":
        return f"{'met' if near else 'NOT met'} on one seed, no spread to judge it against"
    if near is None:
        return f"not decided, the goal is within the largest spread, {spread}, of the gap"
    if near:
        return f"met, with the largest spread, {spread}, added"
    return f"NOT met, with the largest spread, {spread}, taken off"


def print_quality(result: dict[str, Any]) -> None:
    raw = result["raw_tables"]
    console.print(
        f"{result['days']} days x {result['rows_per_day']:,} rows of a drifting log; "
        f"{len(raw)} raw-id tables ({min(raw.values()):,}-{max(raw.values()):,} distinct ids), "
        f"budget 1/4 of them; {result['ranks']} ranks; model seeds {result['seeds']}; "
        "PV: each day evaluated before training on it"
    )
    console.print(f"managed: {result['managed_settings'] or 'the defaults'}")
    for arm, a in result["arms"].items():
        days = " ".join(f"{x:.4f}" for x in a["per_day"])
        console.print(
            f"  {arm:10s} mean PV AUC {a['mean_pv_auc']:.4f} (spread {a['spread']:.4f}); "
            f"by day: {days}"
        )
    beats = result["managed_beats_hashed"]
    if beats is None:
        vs_spread = f"not measured (needs >= {MIN_SEEDS_FOR_SPREAD} seeds)"
    else:
        vs_spread = f"{result['largest_spread']:.4f}: {'met' if beats else 'NOT met'}"
    console.print(
        f"managed - hashed: {result['managed_minus_hashed']:+.4f} (goal: above the largest spread"
        f"{': ' if beats is None else ', '}{vs_spread}); "
        f"unbounded - managed: {result['unbounded_minus_managed']:+.4f} (goal <= "
        f"{GOAL_VS_UNBOUNDED}: {_near_unbounded_text(result)})"
    )
    same = " ".join(f"{c['same_day']:.1%}" for c in result["hashed_collisions"])
    ever = " ".join(f"{c['any_day_so_far']:.1%}" for c in result["hashed_collisions"])
    console.print(f"hashing's collisions by day: with an id of the same day {same}; "
                  f"with an id of any day so far {ever}")  # fmt: skip
    shared = " ".join(f"{m['shared_row_share']:.1%}" for m in result["managed_maps_per_day"])
    console.print(f"managed: lookups on the shared row by day {shared}")


if __name__ == "__main__":
    import sys

    rank_main(sys.argv[1], sys.argv[2])
