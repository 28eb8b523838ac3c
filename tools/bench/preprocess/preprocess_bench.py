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
Each runs once untimed, then once per round over `rounds` interleaved rounds (child_runs.py,
tools/bench/rounds.py): rates are medians, ratios medians of same-round ratios with their spread.
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

from shardrec.tools.bench.preprocess.child_runs import (
    Child,
    per_cpu_median,
    polars_env,
    rate_lines,
    report_head,
    rounds_of,
    too_small,
)
from shardrec.tools.bench.preprocess.polars_pipeline import compare_with_dataset
from shardrec.tools.bench.rounds import Run, goal_text, ratio, ratio_text, summarize
from shardrec.tools.console import console, err_console
from shardrec.tools.synth.criteo import SynthSpec, write_file

BYTES_PER_ROW = 240  # synth's Criteo-shaped rows, measured; only sizes the generated file
MAX_IDS = 1_000_000


def generate(path: Path, size_gb: float, seed: int = 0) -> int:
    rows = max(1000, int(size_gb * 1e9 / BYTES_PER_ROW))
    return write_file(path, rows, SynthSpec.from_seed(seed), stream_seed=0)


def preprocess_command(path: Path, out: Path, workers: int, chunk_mb: float) -> list[str]:
    """`shardrec preprocess` of `path` in hashing mode, its figures as JSON on stdout."""
    return [sys.executable, "-P", "-m", "shardrec.tools.cli", "preprocess", str(path), "--out",
            str(out), "--max-ids", str(MAX_IDS), "--workers", str(workers), "--chunk-mb",
            str(chunk_mb), "--json"]  # fmt: skip


def cpu_breakdown(stages: dict[str, float], cpu_s: float) -> dict[str, float]:
    """The run's CPU-seconds by stage, and the rest: the tree's CPU time (what the rates divide by)
    less every stage (what no timer covers: the interpreter's exit, finding inputs, task
    markers)."""
    return {**stages, "rest (not timed)": round(cpu_s - sum(stages.values()), 3)}


def polars_command(path: Path, out: Path) -> list[str]:
    """The polars pipeline as a child (its threads set by polars_env)."""
    return [sys.executable, "-P", "-m", "shardrec.tools.bench.preprocess.polars_pipeline", str(path),
            str(out), str(MAX_IDS)]  # fmt: skip


def polars_version() -> str | None:
    try:
        import polars
    except ImportError:
        return None
    return polars.__version__


def parse_only(path: Path) -> dict[str, float]:
    """Our parser alone over the file, in the pipeline's piece size."""
    from shardrec.tools.preprocess.parse.criteo_text import parse_chunk
    from shardrec.tools.preprocess.tasks.task import Task
    from shardrec.tools.preprocess.tasks.task_text import read_pieces

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


def run_bench(
    size_gb: float, workers: int, work_dir: Path, chunk_mb: float, rounds: int = 3
) -> dict[str, Any]:
    path = work_dir / "bench.tsv"
    if not path.is_file() or abs(path.stat().st_size - size_gb * 1e9) > 0.2 * size_gb * 1e9:
        err_console.print(
            f"generating {size_gb:g} GB of Criteo-shaped TSV in {path} ...", highlight=False
        )
        generate(path, size_gb)
    mb = path.stat().st_size / 1e6
    out = work_dir / "out"
    command = preprocess_command(path, out, workers, chunk_mb)
    children = {"shardrec": Child(command, "shardrec preprocess", mb, out)}
    for name, threads in (("polars_one_thread", 1), ("polars_all_threads", None)):
        polars_out = work_dir / f"polars-out-{threads or 'all'}"
        what = f"the polars pipeline ({threads or 'all'} thread(s))"
        children[name] = Child(
            polars_command(path, polars_out), what, mb, polars_out, polars_env(threads)
        )
    pandas_setup: dict[str, Any] = {}

    def parse() -> Run:
        err_console.print("timing the parser alone ...")
        figures = parse_only(path)
        return Run(mb, figures["wall_s"], figures["cpu_s"])

    def pandas() -> Run:
        err_console.print("timing pandas.read_csv (C engine, parse only) ...")
        figures = pandas_parse(path)
        pandas_setup.update(figures["setup"])
        return Run(mb, figures["wall_s"], figures["cpu_s"])

    differ: set[str] = set()
    try:
        runs = rounds_of({**children, "parse_only": parse, "pandas_parse_only": pandas}, rounds, mb)
        for name in ("polars_one_thread", "polars_all_threads"):
            differ.update(compare_with_dataset(out, children[name].out))
    finally:
        for child in children.values():
            shutil.rmtree(child.out, ignore_errors=True)
    return _report(mb, workers, runs, children, sorted(differ), pandas_setup)


def _report(
    mb: float,
    workers: int,
    runs: dict[str, list[Run]],
    children: dict[str, Child],
    differ: list[str],
    pandas_setup: dict[str, Any],
) -> dict[str, Any]:
    stages = json.loads(children["shardrec"].stdout)["cpu_seconds_by_stage"]
    head = report_head(mb, workers, runs, children, differ)
    ours, vs_polars = head["shardrec"], per_cpu_median(head["ratios"]["vs_polars_one_thread"])
    parse, pandas = summarize(runs["parse_only"]), summarize(runs["pandas_parse_only"])
    vs_pandas = ratio(runs["shardrec"], runs["pandas_parse_only"], too_small=too_small(mb))
    return {
        **head,
        "polars": {"version": polars_version(), "max_ids": MAX_IDS},
        "ratio_rss_vs_polars_all_threads": round(
            ours["peak_rss_mb"] / max(head["polars_all_threads"]["peak_rss_mb"], 1e-9), 2
        ),
        # The stages of shardrec's last run, against that run's CPU time.
        "cpu_s_by_stage": cpu_breakdown(stages, runs["shardrec"][-1].cpu_s),
        "parse_only_mb_s": round(parse.rate, 1),
        "parse_only_mb_per_cpu_s": round(parse.cpu_rate, 1),
        "pandas_parse_only": {
            "mb_s": round(pandas.rate, 1),
            "mb_per_cpu_s": round(pandas.cpu_rate, 1),
            **pandas_setup,
        },
        "ratios": {**head["ratios"], "vs_pandas_parse_only": vs_pandas.to_dict()},
        "goals": _goals(mb, workers, ours, vs_polars),
    }


def _goals(
    mb: float, workers: int, ours: dict[str, float], vs_polars: float | None
) -> dict[str, bool | None]:
    """The goals, per CPU-second (what one core spends, whatever the machine load); None, not
    measured, on a file too small to measure: its rate is mostly start-up and its peak RSS that of
    chunks never filled."""
    small = bool(too_small(mb))
    return {
        "end_to_end_3x_polars_per_cpu_s": None if vs_polars is None else vs_polars >= 3,
        "peak_rss_under_1_gb_per_worker": None if small else ours["peak_rss_mb"] <= 1024 * workers,
        "moonshot_800_mb_per_cpu_s": None if small else ours["mb_per_cpu_s"] >= 800,
    }


def breakdown_lines(stages: dict[str, float], cpu_s: float) -> str:
    """Where shardrec's CPU-seconds went, stage by stage, as shares of the run's."""
    head = (
        f"where the {cpu_s:.2f} CPU-s of shardrec's last run went (timers around each stage, "
        "CPU time):\n"
    )
    return head + "".join(
        f"  {k:<28} {v:6.2f} s {v / max(cpu_s, 1e-9):6.1%}\n" for k, v in stages.items()
    )


def print_report(r: dict[str, Any]) -> None:
    stages, polars = r["cpu_s_by_stage"], r["ratios"]["vs_polars_one_thread"]
    console.print(
        rate_lines(r, "TSV, same file")
        + f"polars {r['polars']['version']} columns equal shardrec's byte for byte: "
        + ("yes" if r["polars_columns_equal"] else f"NO ({', '.join(r['polars_columns_differ'])})")
        + "\n"
        + breakdown_lines(stages, sum(stages.values()))
        + f"secondary: parser alone {r['parse_only_mb_per_cpu_s']:.1f} MB/CPU-s;\n"
        f"  pandas {r['pandas_parse_only']['version']} read_csv parse only "
        f"{r['pandas_parse_only']['mb_per_cpu_s']:.1f} MB per CPU-s; shardrec / pandas: "
        f"{ratio_text(r['ratios']['vs_pandas_parse_only'], 'cpu')}\n"
        + "\n".join(
            f"goal {k}: {goal_text(v, polars if k.startswith('end_to_end') else None)}"
            for k, v in r["goals"].items()
        ),
        highlight=False,
    )
