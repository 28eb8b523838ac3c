"""`shardrec bench preprocess`: end-to-end preprocessing speed against a polars pipeline doing the
same work.

`--like movielens|avazu` measures the feature-spec parser instead (spec_bench.py). By default,
on one generated Criteo-shaped TSV (synth's vectorized writer), in the same run:
1. `shardrec preprocess` end to end in a child process (hashing mode, `--max-ids 1000000`);
2. the polars pipeline of polars_pipeline.py in a child process, once on one thread
   (POLARS_MAX_THREADS=1) and once on all threads: read_csv with the schema, fill/clamp/log1p of
   the integers, hex -> the same hashed ids, one .npy per column. Its columns are checked byte
   for byte against shardrec's (so the baseline provably does the same work);
3. secondary references: our parser alone, and `pandas.read_csv` (C engine, default dtypes,
   parse only, in chunks), in this process.
Every child's peak RSS is summed over its whole process tree (workers included: proctree.py).
Wall-clock and CPU-time rates are both reported: on a shared machine CPU time is the steadier
measure, and the ratios are what to compare across machines. CPU seconds include every thread.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from shardrec.tools.bench.preprocess.polars_pipeline import compare_with_dataset
from shardrec.tools.bench.preprocess.spec_bench import (
    measured,
    polars_env,
    rate_lines,
    rates,
    report_head,
)
from shardrec.tools.bench.proctree import run_measured
from shardrec.tools.console import console, err_console

BYTES_PER_ROW = 240  # synth's Criteo-shaped rows, measured; only sizes the generated file
MAX_IDS = 1_000_000


def generate(path: Path, size_gb: float, seed: int = 0) -> int:
    from shardrec.tools.synth.criteo import SynthSpec, write_file

    rows = max(1000, int(size_gb * 1e9 / BYTES_PER_ROW))
    return write_file(path, rows, SynthSpec.from_seed(seed), stream_seed=0)


def run_preprocess_child(path: Path, out: Path, workers: int, chunk_mb: float) -> dict[str, float]:
    """Run the CLI in a child; returns wall seconds, CPU seconds of it and its workers, peak RSS of
    the tree."""
    return run_preprocess_staged(path, out, workers, chunk_mb)[0]


def run_preprocess_staged(
    path: Path, out: Path, workers: int, chunk_mb: float
) -> tuple[dict[str, float], dict]:
    """run_preprocess_child's figures, and the CPU-seconds by stage the child measured (its --json's
    cpu_seconds_by_stage)."""
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "preprocess",
        str(path),
        "--out",
        str(out),
        # fmt: skip
        "--max-ids",
        str(MAX_IDS),
        "--workers",
        str(workers),
        "--chunk-mb",
        str(chunk_mb),
        "--json",
    ]
    res = run_measured(cmd)
    if res["returncode"] != 0:
        raise RuntimeError(f"preprocess failed: {res['stderr'].strip()[-2000:]}")
    run = {k: res[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")}
    return run, json.loads(res["stdout"])["cpu_seconds_by_stage"]


def cpu_breakdown(stages: dict[str, float], cpu_s: float) -> dict[str, float]:
    """The run's CPU-seconds by stage, and the rest: the tree's CPU time (what the rates divide by)
    less every stage (what no timer covers: the interpreter's exit, finding inputs, task
    markers)."""
    return {**stages, "rest (not timed)": round(cpu_s - sum(stages.values()), 3)}


def run_polars_child(path: Path, out: Path, threads: int | None) -> dict[str, float]:
    """The polars pipeline in a child on `threads` threads (None: polars' default, all cores)."""
    env = polars_env(threads)
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.bench.preprocess.polars_pipeline",
        str(path),
        str(out),
        str(MAX_IDS),
    ]
    return measured(cmd, f"polars pipeline ({threads or 'all'} threads)", env)


def polars_version() -> str | None:
    try:
        import polars
    except ImportError:
        return None
    return polars.__version__


def parse_only(path: Path) -> dict[str, float]:
    """Our parser alone over the file, in the pipeline's piece size."""
    from shardrec.tools.preprocess.parse.criteo_text import parse_chunk
    from shardrec.tools.preprocess.task import Task
    from shardrec.tools.preprocess.task_text import read_pieces

    task = Task(0, str(path), 0, path.stat().st_size, 0, (), "train", False)
    parse_chunk(b"0\n")  # load the compiled kernel first, as pandas is imported before its clock
    t0, c0 = time.perf_counter(), time.process_time()
    for piece in read_pieces(task.text):
        parse_chunk(piece)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def pandas_parse(path: Path, chunk_rows: int = 500_000) -> dict[str, Any]:
    """pandas.read_csv, C engine, default dtypes, parse only (see the module docstring)."""
    import pandas as pd

    dtypes: dict[str, str] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for frame in pd.read_csv(path, sep="\t", header=None, engine="c", chunksize=chunk_rows):
        if not dtypes:
            dtypes = {
                "label": str(frame.dtypes.iloc[0]),
                "integer_columns": str(frame.dtypes.iloc[1]),
                "hex_columns": str(frame.dtypes.iloc[-1]),
            }
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    setup = {"version": pd.__version__, "engine": "c", "chunk_rows": chunk_rows, "dtypes": dtypes}
    return {"wall_s": wall, "cpu_s": cpu, "setup": setup}


def _run_polars_both(path: Path, out: Path, shardrec_out: Path) -> tuple[dict, dict, list[str]]:
    """The polars pipeline on one thread, then on all; each output compared with shardrec's."""
    runs, differ = {}, set()
    for label, threads in (("one_thread", 1), ("all_threads", None)):
        shutil.rmtree(out, ignore_errors=True)
        err_console.print(f"timing the polars pipeline ({label.replace('_', ' ')}) ...")
        runs[label] = run_polars_child(path, out, threads)
        differ.update(compare_with_dataset(shardrec_out, out))
    shutil.rmtree(out, ignore_errors=True)
    return runs["one_thread"], runs["all_threads"], sorted(differ)


def run_bench(size_gb: float, workers: int, work_dir: Path, chunk_mb: float) -> dict[str, Any]:
    path = work_dir / "bench.tsv"
    if not path.is_file() or abs(path.stat().st_size - size_gb * 1e9) > 0.2 * size_gb * 1e9:
        err_console.print(
            f"generating {size_gb:g} GB of Criteo-shaped TSV in {path} ...", highlight=False
        )
        generate(path, size_gb)
    mb = path.stat().st_size / 1e6
    out = work_dir / "out"
    shutil.rmtree(out, ignore_errors=True)
    err_console.print("timing shardrec preprocess end to end ...")
    run, stages = run_preprocess_staged(path, out, workers, chunk_mb)
    ours = rates(mb, run)
    try:
        pl1, pln, differ = _run_polars_both(path, work_dir / "polars-out", out)
        pl1, pln = rates(mb, pl1), rates(mb, pln)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    err_console.print("timing the parser alone ...")
    parse = parse_only(path)
    err_console.print("timing pandas.read_csv (C engine, parse only) ...")
    pd_ = pandas_parse(path)
    pandas_cpu = mb / pd_["cpu_s"]
    return {
        **report_head(mb, workers, ours, pl1, pln, differ),
        "polars": {"version": polars_version(), "max_ids": MAX_IDS},
        "ratio_rss_vs_polars_all_threads": round(
            ours["peak_rss_mb"] / max(pln["peak_rss_mb"], 1e-9), 2
        ),
        "cpu_s_by_stage": cpu_breakdown(stages, run["cpu_s"]),
        "parse_only_mb_s": round(mb / parse["wall_s"], 1),
        "parse_only_mb_per_cpu_s": round(mb / parse["cpu_s"], 1),
        "pandas_parse_only": {
            "mb_s": round(mb / pd_["wall_s"], 1),
            "mb_per_cpu_s": round(pandas_cpu, 1),
            **pd_["setup"],
        },
        "ratio_vs_pandas_parse_only_cpu": round(ours["mb_per_cpu_s"] / pandas_cpu, 2),
        # The goals, per CPU-second: what one core spends, whatever the machine load.
        "goals": {
            "end_to_end_3x_polars_per_cpu_s": ours["mb_per_cpu_s"] >= 3 * pl1["mb_per_cpu_s"],
            "peak_rss_under_1_gb_per_worker": ours["peak_rss_mb"] <= 1024 * workers,
            "moonshot_800_mb_per_cpu_s": ours["mb_per_cpu_s"] >= 800,
        },
    }


def breakdown_lines(stages: dict[str, float], cpu_s: float) -> str:
    """Where shardrec's CPU-seconds went, stage by stage, as shares of the run's."""
    head = f"where shardrec's {cpu_s:.2f} CPU-s went (timers around each stage, CPU time):\n"
    return head + "".join(
        f"  {k:<28} {v:6.2f} s {v / max(cpu_s, 1e-9):6.1%}\n" for k, v in stages.items()
    )


def print_report(r: dict[str, Any]) -> None:
    console.print(
        rate_lines(r, "TSV, same file")
        + f"polars {r['polars']['version']} columns equal shardrec's byte for byte: "
        + ("yes" if r["polars_columns_equal"] else f"NO ({', '.join(r['polars_columns_differ'])})")
        + "\n"
        + breakdown_lines(r["cpu_s_by_stage"], r["shardrec"]["cpu_s"])
        + f"secondary: parser alone {r['parse_only_mb_per_cpu_s']:.1f} MB/CPU-s;\n"
        f"  pandas {r['pandas_parse_only']['version']} read_csv parse only "
        f"{r['pandas_parse_only']['mb_per_cpu_s']:.1f} MB per CPU-s ({r['ratio_vs_pandas_parse_only_cpu']:.2f}x)\n"
        + "\n".join(f"goal {k}: {'met' if v else 'NOT met'}" for k, v in r["goals"].items()),
        highlight=False,
    )
