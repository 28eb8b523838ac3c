"""`shardrec bench scale`: a Criteo-1TB-shaped dataset at a fraction, end to end on this machine.

Stages, each a child process measured as a whole (wall, CPU of the whole tree, peak PSS and RSS
summed over every process of the tree: proctree.py), in one run:
1. synth: 24 gzip days of fraction x 4,373,472,329 rows (Criteo 1TB's count); categorical
   feature f has max(min(R_f, 4), round(R_f x fraction)) distinct values, R_f being MLPerf
   DLRMv2's rows for table f (sharding/suites.py): the 1TB per-feature shape, scaled with the rows;
2. preprocess in hashing mode (max ids = those counts) and in vocabulary mode (--min-count 2),
   on `workers` processes (every core by default);
3. stream: the hashing dataset's train split through the loader, every part, on `ranks` rank
   processes at once (TRAIN_RANKS by default) with the training's global batch, against
   `bench loader`'s one warm part in the same processes (scale_stream.py), with CPU-bound and
   waiting time and page faults (the first pass), then interleaved rounds of both for the ratio;
4. train a few hundred steps on `ranks` ranks, then resume from the last checkpoint (deep in
   the stream: the resumed run skips every batch the first one took) and train as many again.

Each stage reports MB/s and rows/s, on the wall clock and per CPU-second; scale_report.py
projects them to the full 1TB and prints the result."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import shutil
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardrec.tools.bench.proctree import interrupted_by_ctrl_c, run_measured
from shardrec.tools.bench.scale.scale_report import project
from shardrec.tools.preprocess.pool import workers_starting

CRITEO_1TB_ROWS = 4_373_472_329
DAYS = 24
TRAIN_RANKS = 2
"""What the projection assumes the 16-core machine's disks read and write together (NVMe-class)."""
TRAIN_JOB = ["--set", "model.embedding_dim=16", "--set", "model.dense_arch=[32, 16]",
             "--set", "model.over_arch=[32, 1]", "--set", 'data.eval_splits=["val"]',
             "--set", "eval.max_batches=4"]  # fmt: skip


def feature_counts(fraction: float) -> list[int]:
    """Distinct values per categorical at `fraction` of Criteo 1TB (DLRMv2's rows scaled)."""
    from shardrec.sharding.suites import DLRMV2_ROWS

    return [max(min(r, 4), round(r * fraction)) for r in DLRMV2_ROWS]


def _write_day(args: tuple[Path, int, list[int], int]) -> int:
    from shardrec.tools.synth.criteo import SynthSpec, write_file

    path, rows, counts, day = args
    return write_file(
        path, rows, SynthSpec.from_seed(11, vocab=counts), stream_seed=day, gzip_level=1
    )


WORK_MARKER = ".shardrec-bench-scale"
STAGE_DIRS = ("raw", "hash", "vocab", "baseline", "run")
"""What a run writes into its work directory, one folder per stage."""


def prepare_work_dir(work: Path) -> None:
    """Make `work` this run's: the folders a previous run left (its marker says the directory is a
    bench scale's) are removed, since synth writes new inputs that they would not match; a new or
    empty directory gets the marker; any other is refused (ValueError), before anything is written,
    for the bench neither mixes its folders with what it did not make nor deletes them."""
    work.mkdir(parents=True, exist_ok=True)
    marker = work / WORK_MARKER
    if marker.is_file():
        for name in STAGE_DIRS:
            shutil.rmtree(work / name, ignore_errors=True)
    elif any(work.iterdir()):
        raise ValueError(
            f"--work-dir {work}: not empty and not a bench scale's work directory (no {WORK_MARKER}); "
            "give a new or empty directory"
        )
    marker.write_text(
        "a shardrec bench scale work directory: its stage folders are replaced by the next run\n"
    )


def _start_synth_worker() -> None:
    """A synth worker is ended by the run (synth_days), not by the stop itself: Ctrl-C, which
    reaches it too, would print its KeyboardInterrupt, as would the SIGTERM handler it got with
    the fork (sigterm_as_ctrl_c's)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def synth_days(raw: Path, fraction: float, workers: int) -> tuple[int, int]:
    """Write day_0.gz .. day_23.gz; returns (rows, text bytes)."""
    rows = max(DAYS * 8, round(CRITEO_1TB_ROWS * fraction))
    per_day = [rows // DAYS + (d < rows % DAYS) for d in range(DAYS)]
    counts = feature_counts(fraction)
    jobs = [(raw / f"day_{d}.gz", n, counts, d) for d, n in enumerate(per_day)]
    with ProcessPoolExecutor(workers, initializer=_start_synth_worker) as pool:
        try:  # the first submit starts the workers
            # Not pool.map: on the way out it cancels the days not started, which the pool,
            # broken by the kill below, then fails to fail (InvalidStateError, printed by its
            # thread).
            with workers_starting():  # a stop as they start is held until they have
                days = [pool.submit(_write_day, job) for job in jobs]
            text = sum(day.result() for day in days)
        except BaseException:
            # The pool's shutdown would wait for the days being written: a stop (Ctrl-C, a kill)
            # or a failed day ends them now (their files are of no use). This process's only
            # multiprocessing children are the pool's workers.
            for worker in multiprocessing.active_children():
                worker.kill()
            raise
    return rows, text


def _synth(raw: Path, fraction: float, workers: int) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), _cpu()
    rows, text = synth_days(raw, fraction, workers)
    synth = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "rows": rows, "text_bytes": text,
             "gzip_bytes": sum(p.stat().st_size for p in raw.iterdir())}  # fmt: skip
    synth["mb_per_s_wall"] = text / 1e6 / max(synth["wall_s"], 1e-9)
    synth["mb_per_cpu_s"] = text / 1e6 / max(synth["cpu_s"], 1e-9)
    _add_row_rates(synth, rows, synth["wall_s"], synth["cpu_s"])
    return synth


@dataclass
class Progress:
    """A run's stages as they are measured, for the line a stopped run ends with."""

    stages: dict[str, Any] = field(default_factory=dict)
    """The figures of each stage measured, in order."""
    running: str = ""
    """The stage under way ("" between stages)."""

    def measure(self, name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Stage `name`: run() measures it; returns its figures."""
        self.running = name
        self.stages[name] = run()
        self.running = ""
        return self.stages[name]


def _stage(cmd: list[str], what: str, nbytes: int) -> dict[str, Any]:
    res = run_measured(cmd)
    if interrupted_by_ctrl_c(res["returncode"], res["stderr"]):
        raise KeyboardInterrupt  # the child heard Ctrl-C first: no error of its own
    if res["returncode"] != 0:
        raise RuntimeError(f"{what} failed: {res['stderr'].strip()[-1500:]}")
    out = {k: res[k] for k in ("wall_s", "cpu_s", "peak_rss_mb", "peak_pss_mb")}
    out["mb_per_s_wall"] = nbytes / 1e6 / max(res["wall_s"], 1e-9)
    out["mb_per_cpu_s"] = nbytes / 1e6 / max(res["cpu_s"], 1e-9)
    out["stdout"] = res["stdout"]
    return out


def _add_row_rates(st: dict[str, Any], rows: int, wall_s: float, cpu_s: float) -> None:
    st["rows_per_s_wall"] = rows / max(wall_s, 1e-9)
    st["rows_per_cpu_s"] = rows / max(cpu_s, 1e-9)


def _cli(*args: str) -> list[str]:
    """The `shardrec ...` command line of a stage, run by this interpreter."""
    return [sys.executable, "-P", "-m", "shardrec.tools.cli", *args]


def _preprocess(
    raw: Path, out: Path, workers: int, text_bytes: int, mode: list[str]
) -> dict[str, Any]:
    cmd = _cli(
        "preprocess", str(raw), "--out", str(out), "--workers", str(workers), "--json", *mode
    )
    st = _stage(cmd, f"preprocess {' '.join(mode)}", text_bytes)
    summary = json.loads(st.pop("stdout"))
    manifest = json.loads((out / "manifest.json").read_text())
    st["lines"] = summary["lines"]
    st["rows_kept"] = summary["rows_kept"]
    st["parts"] = sum(len(s["parts"]) for s in manifest["splits"].values())
    _add_row_rates(st, summary["lines"], st["wall_s"], st["cpu_s"])
    written = [p for p in out.rglob("*") if p.is_file() and ".work" not in p.parts]
    st["output_bytes"] = sum(p.stat().st_size for p in written)
    # What a listing of the dataset meets (metadata round trips on a shared file system): the
    # goal is one file per part and the manifest.
    st["files"] = len(written)
    st["files_goal_met"] = len(written) == st["parts"] + 1
    return st


def _stream(
    data: Path, work: Path, batch: int, ranks: int, dataset_bytes: int, train_rows: int
) -> dict[str, Any]:
    """Every train part on `ranks` rank processes, then bench loader's one warm part
    (scale_stream.py)."""
    from shardrec.tools.bench.scale.scale_stream import BASELINE_ROWS, stream_ratio, write_baseline

    baseline = write_baseline(work / "baseline", min(BASELINE_ROWS, max(train_rows, 2 * batch)))
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.bench.scale.scale_bench",
        "stream",
        str(data),
        str(baseline),
        str(batch),
    ]
    st = _stage([*cmd, str(ranks)], "stream", dataset_bytes)
    measured = json.loads(st.pop("stdout"))
    stream = measured["first"]  # the first pass over the real parts: the stage's figures
    st.update(stream)
    # The baseline's round of median rate, for its printed rate and ms per batch.
    by_rate = sorted(measured["one_part"], key=lambda r: r["rows_per_s"])
    st.update(ranks=ranks, global_batch=batch, one_part=by_rate[(len(by_rate) - 1) // 2])
    # The loop alone: the children's start (imports, opening every part) and the baseline are in
    # wall_s.
    st["rows_per_s_wall"] = stream["rows_per_s"]
    st["mb_per_s_wall"] = dataset_bytes / 1e6 / max(stream["loop_s"], 1e-9)
    st["mb_per_cpu_s"] = dataset_bytes / 1e6 / max(stream["cpu_s"], 1e-9)
    # Per CPU-second too: on a loaded machine the wall ratio also measures who got the cores.
    vs = stream_ratio(measured).to_dict()
    st["ratio_vs_one_part"] = vs
    st["vs_one_part"] = vs.get("median")
    st["vs_one_part_per_cpu_s"] = vs["per_cpu_s"]["median"] if "per_cpu_s" in vs else None
    st["load_average"] = [round(v, 2) for v in os.getloadavg()]
    return st


def stream_child(data: Path, baseline: Path, batch: int, ranks: int) -> None:
    """In a child: the rank processes of the stream stage; prints their figures as JSON."""
    from shardrec.tools.bench.scale.scale_stream import run_ranks

    print(json.dumps(run_ranks(data, baseline, batch, ranks)))


def _train(
    data: Path, run: Path, ranks: int, steps: int, batch: int, interval: int, resume: bool
) -> dict[str, Any]:
    cmd = _cli("train", "--data", str(data), "--out-dir", str(run), "--nproc-per-node", str(ranks),
               "--steps", str(steps),
               "--json", *TRAIN_JOB, "--set", f"train.global_batch_size={batch}",
               "--set", f"checkpoint.interval_steps={interval}")  # fmt: skip
    if resume:
        cmd += ["--allow-change", "train.steps"]
    st = _stage(cmd, "train" + (" (resume)" if resume else ""), 0)
    summary = json.loads(st.pop("stdout"))
    st.pop("mb_per_s_wall"), st.pop("mb_per_cpu_s")
    st["summary"] = {
        k: summary[k] for k in ("steps", "resumed_from_step", "train_samples_per_s") if k in summary
    }
    return st


def run_scale(
    fraction: float,
    work: Path,
    steps: int,
    batch: int,
    train: bool = True,
    workers: int | None = None,
    ranks: int = TRAIN_RANKS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every stage in order at `fraction`; `workers` synthesise and preprocess (default: every
    core), `ranks` rank processes stream and train; `progress`, the caller's, records how far the
    run got."""
    workers = workers or os.cpu_count() or 1
    progress = progress or Progress()
    measure = progress.measure
    raw, hash_dir = work / "raw", work / "hash"
    synth = measure("synth", lambda: _synth(raw, fraction, workers))
    text = synth["text_bytes"]
    max_ids = ["--max-ids", ",".join(map(str, feature_counts(fraction)))]
    hashed = measure("preprocess_hash", lambda: _preprocess(raw, hash_dir, workers, text, max_ids))
    measure(
        "preprocess_vocab",
        lambda: _preprocess(raw, work / "vocab", workers, text, ["--min-count", "2"]),
    )
    train_rows = hashed["rows_kept"]["train"]
    measure(
        "stream",
        lambda: _stream(hash_dir, work, batch, ranks, hashed["output_bytes"], train_rows),
    )
    if train:
        measure(
            "train",
            lambda: _train(hash_dir, work / "run", ranks, steps, batch, steps, resume=False),
        )
        measure(
            "train_resume",
            lambda: _train(hash_dir, work / "run", ranks, 2 * steps, batch, steps, resume=True),
        )
    stages = progress.stages
    return {
        "fraction": fraction,
        "workers": workers,
        "rows": synth["rows"],
        "stages": stages,
        "projection": project(stages, fraction, workers),
    }


def _cpu() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__" and sys.argv[1:2] == ["stream"]:
    stream_child(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
