"""`shardrec bench scale`: a Criteo-1TB-shaped dataset at a fraction, end to end on this machine.

Stages, each a child process measured as a whole (wall, CPU of the whole tree, peak RSS summed
over every process of the tree: proctree.py), in one run:
1. synth: 24 gzip days of fraction x 4,373,472,329 rows (Criteo 1TB's count); categorical
   feature f has max(min(R_f, 4), round(R_f x fraction)) distinct values, R_f being MLPerf
   DLRMv2's rows for table f (sharding/suites.py): the 1TB per-feature shape, scaled with the rows;
2. preprocess in hashing mode (max ids = those counts) and in vocabulary mode (--min-count 2),
   all workers;
3. stream: the hashing dataset's train split through the loader, every part, one rank;
4. train a few hundred steps on 2 ranks, then resume from the last checkpoint (deep in the
   stream: the resumed run skips every batch the first one took) and train as many again.
The projection for the full 1TB divides its text by the measured MB per CPU-second and by the
cores: a projection that assumes the rate holds per core, not a measurement.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from shardrec.tools.bench.proctree import run_measured
from shardrec.tools.cli.common import console

CRITEO_1TB_ROWS = 4_373_472_329
DAYS = 24
TRAIN_JOB = ["--set", "model.embedding_dim=16", "--set", "model.dense_arch=[32, 16]",
             "--set", "model.over_arch=[32, 1]", "--set", 'data.eval_splits=["val"]',
             "--set", "eval.max_batches=4"]  # fmt: skip


def feature_counts(fraction: float) -> list[int]:
    """Distinct values per categorical at `fraction` of Criteo 1TB (DLRMv2's rows scaled)."""
    from shardrec.sharding.suites import DLRMV2_ROWS

    return [max(min(r, 4), round(r * fraction)) for r in DLRMV2_ROWS]


def _write_day(args: tuple[Path, int, list[int], int]) -> int:
    from shardrec.tools.synth import SynthSpec, write_file

    path, rows, counts, day = args
    return write_file(path, rows, SynthSpec.from_seed(11, vocab=counts), stream_seed=day, gzip_level=1)


def synth_days(raw: Path, fraction: float, workers: int) -> tuple[int, int]:
    """Write day_0.gz .. day_23.gz; returns (rows, text bytes)."""
    rows = max(DAYS * 8, round(CRITEO_1TB_ROWS * fraction))
    per_day = [rows // DAYS + (d < rows % DAYS) for d in range(DAYS)]
    counts = feature_counts(fraction)
    jobs = [(raw / f"day_{d}.gz", n, counts, d) for d, n in enumerate(per_day)]
    with ProcessPoolExecutor(workers) as pool:
        text = sum(pool.map(_write_day, jobs))
    return rows, text


def _stage(cmd: list[str], what: str, nbytes: int) -> dict[str, Any]:
    res = run_measured(cmd)
    if res["returncode"] != 0:
        raise RuntimeError(f"{what} failed: {res['stderr'].strip()[-1500:]}")
    out = {k: res[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")}
    out["mb_per_s_wall"] = nbytes / 1e6 / max(res["wall_s"], 1e-9)
    out["mb_per_cpu_s"] = nbytes / 1e6 / max(res["cpu_s"], 1e-9)
    out["stdout"] = res["stdout"]
    return out


def _cli(*args: str) -> list[str]:
    """The `shardrec ...` command line of a stage, run by this interpreter."""
    return [sys.executable, "-m", "shardrec.tools.cli", *args]


def _preprocess(raw: Path, out: Path, workers: int, text_bytes: int, mode: list[str]) -> dict[str, Any]:
    cmd = _cli("preprocess", str(raw), "--out", str(out), "--workers", str(workers), "--json", *mode)
    st = _stage(cmd, f"preprocess {' '.join(mode)}", text_bytes)
    summary = json.loads(st.pop("stdout"))
    manifest = json.loads((out / "manifest.json").read_text())
    st["lines"] = summary["lines"]
    st["rows_kept"] = summary["rows_kept"]
    st["parts"] = sum(len(s["parts"]) for s in manifest["splits"].values())
    st["output_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and ".work" not in p.parts)
    return st


def _stream(data: Path, batch: int, dataset_bytes: int) -> dict[str, Any]:
    st = _stage(
        [sys.executable, "-m", "shardrec.tools.bench.scale", "stream", str(data), str(batch)], "stream", dataset_bytes
    )
    st.update(json.loads(st.pop("stdout")))
    # The loop alone: the child's start (imports, opening every part) is in wall_s.
    st["rows_per_s"] = st["rows"] / max(st["loop_s"], 1e-9)
    st["mb_per_s_wall"] = dataset_bytes / 1e6 / max(st["loop_s"], 1e-9)
    return st


def stream_child(data: Path, batch: int) -> None:
    """In a child: every train batch of `data` through the loader on one rank; prints rows and seconds."""
    from shardrec.dataloader.loader import ShuffleSpec, build_loader

    loader = build_loader(
        data, "train", global_batch_size=batch, rank=0, world_size=1, shuffle=ShuffleSpec(enabled=True, seed=0)
    )
    rows, t0 = 0, time.perf_counter()
    for b in loader:
        rows += int(b.labels.numel())
    print(json.dumps({"rows": rows, "loop_s": time.perf_counter() - t0, "batches": len(loader)}))


def _train(data: Path, run: Path, steps: int, batch: int, interval: int, resume: bool) -> dict[str, Any]:
    cmd = _cli("train", "--data", str(data), "--out-dir", str(run), "--nproc-per-node", "2", "--steps", str(steps),
               "--json", *TRAIN_JOB, "--set", f"train.global_batch_size={batch}",
               "--set", f"checkpoint.interval_steps={interval}")  # fmt: skip
    if resume:
        cmd += ["--allow-change", "train.steps"]
    st = _stage(cmd, "train" + (" (resume)" if resume else ""), 0)
    summary = json.loads(st.pop("stdout"))
    st.pop("mb_per_s_wall"), st.pop("mb_per_cpu_s")
    st["summary"] = {k: summary[k] for k in ("steps", "resumed_from_step", "train_samples_per_s") if k in summary}
    return st


def run_scale(fraction: float, work: Path, steps: int, batch: int, train: bool = True) -> dict[str, Any]:
    workers = os.cpu_count() or 1
    raw = work / "raw"
    t0, c0 = time.perf_counter(), _cpu()
    rows, text = synth_days(raw, fraction, workers)
    synth = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0, "rows": rows, "text_bytes": text,
             "gzip_bytes": sum(p.stat().st_size for p in raw.iterdir())}  # fmt: skip
    stages: dict[str, Any] = {"synth": synth}
    stages["preprocess_hash"] = _preprocess(
        raw, work / "hash", workers, text, ["--max-ids", ",".join(map(str, feature_counts(fraction)))]
    )
    stages["preprocess_vocab"] = _preprocess(raw, work / "vocab", workers, text, ["--min-count", "2"])
    stages["stream"] = _stream(work / "hash", batch, stages["preprocess_hash"]["output_bytes"])
    if train:
        stages["train"] = _train(work / "hash", work / "run", steps, batch, steps, resume=False)
        stages["train_resume"] = _train(work / "hash", work / "run", 2 * steps, batch, steps, resume=True)
    return {
        "fraction": fraction,
        "workers": workers,
        "rows": rows,
        "stages": stages,
        "projection": _project(stages, fraction, workers),
    }


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _project(stages: dict[str, Any], fraction: float, cores: int) -> dict[str, Any]:
    """Hours for the full 1TB's text on `cores` cores at the measured MB per CPU-second (a projection)."""
    full = stages["synth"]["text_bytes"] / fraction / 1e6
    out = {"full_text_gb": full / 1e3, "cores": cores, "assumes": "the measured MB per CPU-second holds on every core"}
    for name in ("preprocess_hash", "preprocess_vocab"):
        out[f"{name}_hours"] = full / stages[name]["mb_per_cpu_s"] / cores / 3600
    return out


def print_result(result: dict[str, Any]) -> None:
    st = result["stages"]
    console.print(f"Criteo-1TB shape at {result['fraction']:g}: {result['rows']:,} rows, {result['workers']} workers")
    for name in ("preprocess_hash", "preprocess_vocab", "stream"):
        s = st[name]
        console.print(
            f"{name:>17}: {s['mb_per_s_wall']:8.1f} MB/s wall  {s['mb_per_cpu_s']:8.1f} MB/CPU-s  "
            f"peak RSS {s['peak_rss_mb']:,.0f} MiB"
            + (
                f"  {s['parts']} parts, {s['output_bytes'] / 1e9:.2f} GB"
                if "parts" in s
                else f"  {s['rows_per_s']:,.0f} rows/s"
            )
        )
    for name in ("train", "train_resume"):
        if name not in st:
            continue
        s = st[name]
        console.print(f"{name:>17}: {s['wall_s']:.1f} s wall, peak RSS {s['peak_rss_mb']:,.0f} MiB, {s['summary']}")
    p = result["projection"]
    console.print(
        f"projection (not a measurement): the full 1TB ({p['full_text_gb']:,.0f} GB of text) on {p['cores']} cores: "
        f"hashing {p['preprocess_hash_hours']:.1f} h, vocabulary {p['preprocess_vocab_hours']:.1f} h"
    )


if __name__ == "__main__" and sys.argv[1:2] == ["stream"]:
    stream_child(Path(sys.argv[2]), int(sys.argv[3]))
