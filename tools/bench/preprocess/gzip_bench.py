"""`shardrec bench preprocess --gzip`: one gzip file against the same rows as plain text, and over N
workers.

In one run, on one generated Criteo-shaped file written twice (synth's writer, same seed: the same
rows as TSV and as .gz, ISA-L level 1), each `shardrec preprocess` a child measured as a tree
(proctree.py), hashing mode:
1. the plain TSV on one worker (the baseline per CPU-second);
2. the .gz on one worker: gzip against plain per CPU-second (goal >= 0.8x);
3. the .gz on `workers` workers: the wall-clock ratio against 2. (goal >= 1.6x on 2 workers), and
   its dataset compared byte for byte with 2.'s (the plan never depends on the workers).
A single file is the Kaggle layout, so the .gz is split into ranges when it is at least
SPLIT_MIN_CHUNKS x --chunk-mb compressed (the report says whether it was): decoded once by the main
process, each range's text parsed by a worker as it comes (gz_stream.py). Sizes where the .gz is
one or two ranges per worker measure worker start-up more than the stream: take >= 1 GB.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path
from typing import Any

from shardrec.tools.bench.preprocess.child_runs import (
    Child,
    per_cpu_median,
    rates,
    rounds_of,
    too_small,
)
from shardrec.tools.bench.preprocess.preprocess_bench import BYTES_PER_ROW, preprocess_command
from shardrec.tools.bench.rounds import goal_text, load_average, ratio, ratio_text
from shardrec.tools.console import console, err_console
from shardrec.tools.preprocess.text.gz_split import SPLIT_MIN_CHUNKS, should_split

GOAL_GZIP_VS_PLAIN = 0.8
GOAL_WORKERS_SPEEDUP = 1.6


def _dataset_digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file() and ".work" not in p.parts:
            h.update(str(p.relative_to(out)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _generate(work_dir: Path, size_gb: float) -> tuple[Path, Path]:
    from shardrec.tools.synth.criteo import SynthSpec, write_file

    plain, packed = work_dir / "plain" / "train.txt", work_dir / "gz" / "train.txt.gz"
    rows = max(1000, int(size_gb * 1e9 / BYTES_PER_ROW))
    if (
        not plain.is_file()
        or abs(plain.stat().st_size - size_gb * 1e9) > 0.2 * size_gb * 1e9
        or not packed.is_file()
    ):
        err_console.print(
            f"generating {size_gb:g} GB of Criteo-shaped TSV, plain and gzip, in {work_dir} ..."
        )
        for path, level in ((plain, None), (packed, 1)):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, rows, SynthSpec.from_seed(0), stream_seed=0, gzip_level=level)
    return plain, packed


def split_chunk_mb(gzip_mb: float) -> float:
    """The largest --chunk-mb (to 3 digits, rounded down) at which a .gz of gzip_mb MB is split."""
    return math.floor(gzip_mb * 1e6 / SPLIT_MIN_CHUNKS / (1 << 20) * 1000) / 1000


def run_gzip_bench(
    size_gb: float, workers: int, work_dir: Path, chunk_mb: float, rounds: int = 3
) -> dict[str, Any]:
    plain, packed = _generate(work_dir, size_gb)
    mb = plain.stat().st_size / 1e6
    children = {}
    for name, path, n in (
        ("plain_1", plain, 1),
        ("gzip_1", packed, 1),
        (f"gzip_{workers}", packed, workers),
    ):
        out = work_dir / f"out-{name}"
        what = f"shardrec preprocess of the {name.replace('_', ' on ')} worker(s)"
        children[name] = Child(preprocess_command(path, out, n, chunk_mb), what, mb, out)
    try:
        runs = rounds_of(children, rounds, mb)
        digests = {name: _dataset_digest(child.out) for name, child in children.items()}
    finally:
        for child in children.values():
            shutil.rmtree(child.out, ignore_errors=True)
    small = too_small(mb)
    # gzip against plain per CPU-second (one worker each); the workers' speed-up in wall time.
    gzip_vs_plain = ratio(runs["gzip_1"], runs["plain_1"], too_small=small).to_dict()
    # On one worker the .gz run is its own baseline: no speed-up to measure (None).
    speedup = (
        ratio(runs[f"gzip_{workers}"], runs["gzip_1"], too_small=small, cpu=False).to_dict()
        if workers > 1
        else None
    )
    per_cpu, wall = per_cpu_median(gzip_vs_plain), speedup and speedup.get("median")
    split = should_split(packed, int(chunk_mb * (1 << 20)))
    return {
        "text_mb": round(mb, 1),
        "gzip_mb": round(packed.stat().st_size / 1e6, 1),
        "workers": workers,
        "chunk_mb": chunk_mb,
        "split": split,
        "rounds": rounds,
        "load_average": load_average(),
        "runs": {name: rates(runs[name], child.peaks) for name, child in children.items()},
        "ratios": {"gzip_vs_plain": gzip_vs_plain, "workers_speedup": speedup},
        "gzip_vs_plain_per_cpu_s": per_cpu,
        "workers_speedup": wall,
        "same_bytes": digests["gzip_1"] == digests[f"gzip_{workers}"] if workers > 1 else None,
        "goals": {
            f"gzip_{GOAL_GZIP_VS_PLAIN}x_plain_per_cpu_s": None
            if per_cpu is None
            else per_cpu >= GOAL_GZIP_VS_PLAIN,
            # An unsplit .gz is one task: its workers have nothing to share, and a ratio of ~1.0
            # would judge the split design by a run that did not use it (None: not measured).
            # On one worker the goal is named for the 2 it is set on.
            f"gzip_{GOAL_WORKERS_SPEEDUP}x_on_{max(workers, 2)}_workers": wall
            >= GOAL_WORKERS_SPEEDUP
            if split and wall is not None
            else None,
        },
    }


def print_gzip_report(r: dict[str, Any]) -> None:
    lines = [
        f"{r['text_mb']:,.0f} MB of text, {r['gzip_mb']:,.0f} MB gzip, --chunk-mb {r['chunk_mb']:g}: "
        # fmt: skip
        f"{'split into ranges' if r['split'] else 'NOT split (too small for the chunk size)'}"
    ]
    lines.append(
        f"medians of {r['rounds']} interleaved rounds (load average {r['load_average'][0]})"
    )
    for name, s in r["runs"].items():
        lines.append(
            f"{name.replace('_', ' on '):>12} worker(s): {s['mb_s']:8.1f} MB/s wall {s['mb_per_cpu_s']:8.1f} MB/CPU-s"
            f"  ({s['wall_s']:.1f} s wall, {s['cpu_s']:.1f} CPU-s, peak RSS {s['peak_rss_mb']:,.0f} MiB)"
        )
    lines.append(f"gzip / plain on 1 worker: {ratio_text(r['ratios']['gzip_vs_plain'], 'cpu')}")
    one_worker = "not measured: --workers 1 gives no second run to compare; run with --workers 2"
    if r["workers"] > 1:
        lines.append(
            f"gzip on {r['workers']} workers / 1 worker, wall: "
            f"{ratio_text(r['ratios']['workers_speedup'])}; "
            f"same dataset bytes: {'yes' if r['same_bytes'] else 'NO'}"
        )
    else:
        lines.append(f"gzip on more workers / 1 worker, wall: {one_worker}")
    unsplit = (
        f"not measured: the .gz was not split, it needs at least {SPLIT_MIN_CHUNKS} x --chunk-mb compressed; "
        f"run with --chunk-mb {split_chunk_mb(r['gzip_mb'])} or a larger --size-gb"
    )
    for k, v in r["goals"].items():
        if v is None and "workers" in k and (r["workers"] == 1 or not r["split"]):
            lines.append(f"goal {k}: {one_worker if r['workers'] == 1 else unsplit}")
        else:
            lines.append(f"goal {k}: {goal_text(v)}")
    console.print("\n".join(lines), highlight=False)
