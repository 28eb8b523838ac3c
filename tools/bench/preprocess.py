"""`shardrec bench preprocess`: end-to-end preprocessing speed against pandas' CSV parser.

On one generated Criteo-shaped TSV (synth's vectorized writer), in the same run:
1. `shardrec preprocess` end to end in a child process (so its peak RSS is its own);
2. our parser alone (parse only, one core) over the same file;
3. `pandas.read_csv` (C engine), parse only, in chunks so its memory stays bounded.
Both wall-clock and CPU-time rates are reported: on a shared machine CPU time is the steadier
measure, and the ratios are what to compare across machines.

The pandas baseline is pandas' default, fastest configuration for this file, not a straw man:
`engine="c"`, no dtype hints, so integer columns with missing values come out as float64 and the
hex columns in pandas' default string dtype (pandas >= 3: `str`, stored in pyarrow when it is
installed; pandas 2 would build one Python object per cell and be several times slower). It
only splits and converts text: it neither decodes hex nor hashes ids nor writes anything, so
the end-to-end ratio compares our whole pipeline with pandas' parse step alone. The report
names the pandas version and the dtypes it produced. CPU seconds include every thread (pyarrow
may use more than one).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from shardrec.tools.cli.common import console, err_console, fail, print_json

_BYTES_PER_ROW = 240  # synth's Criteo-shaped rows, measured; only sizes the generated file


def generate(path: Path, size_gb: float, seed: int = 0) -> int:
    from shardrec.tools.synth import SynthSpec, write_file

    rows = max(1000, int(size_gb * 1e9 / _BYTES_PER_ROW))
    return write_file(path, rows, SynthSpec.from_seed(seed), stream_seed=0)


def run_preprocess_child(path: Path, out: Path, workers: int, chunk_mb: float) -> dict[str, float]:
    """Run the CLI in a child; returns wall seconds, CPU seconds of it and its workers, peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "shardrec.tools.cli", "preprocess", str(path), "--out", str(out),
           "--max-ids", "1000000", "--workers", str(workers), "--chunk-mb", str(chunk_mb), "--json"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"preprocess failed: {proc.stderr.strip()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": after.ru_maxrss / 1024}


def parse_only(path: Path) -> dict[str, float]:
    """Our parser alone over the file, in the pipeline's piece size."""
    from shardrec.tools.preprocess.parse import parse_chunk
    from shardrec.tools.preprocess.inputs import Task
    from shardrec.tools.preprocess.task import read_pieces

    task = Task(0, str(path), 0, path.stat().st_size, 0, (), "train", False)
    parse_chunk(b"0\n")  # load the compiled kernel first, as pandas is imported before its clock
    t0, c0 = time.perf_counter(), time.process_time()
    for piece in read_pieces(task):
        parse_chunk(piece)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def pandas_parse(path: Path, chunk_rows: int = 500_000) -> dict[str, Any]:
    """pandas.read_csv, C engine, default dtypes, parse only (see the module docstring)."""
    import pandas as pd

    dtypes: dict[str, str] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for frame in pd.read_csv(path, sep="\t", header=None, engine="c", chunksize=chunk_rows):
        if not dtypes:
            dtypes = {"label": str(frame.dtypes.iloc[0]), "integer_columns": str(frame.dtypes.iloc[1]), "hex_columns": str(frame.dtypes.iloc[-1])}
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    setup = {"version": pd.__version__, "engine": "c", "chunk_rows": chunk_rows, "dtypes": dtypes}
    return {"wall_s": wall, "cpu_s": cpu, "setup": setup}


def run_bench(size_gb: float, workers: int, work_dir: Path, chunk_mb: float) -> dict[str, Any]:
    path = work_dir / "bench.tsv"
    if not path.is_file() or abs(path.stat().st_size - size_gb * 1e9) > 0.2 * size_gb * 1e9:
        err_console.print(f"generating {size_gb:g} GB of Criteo-shaped TSV in {path} ...", highlight=False)
        generate(path, size_gb)
    mb = path.stat().st_size / 1e6
    out = work_dir / "out"
    shutil.rmtree(out, ignore_errors=True)
    err_console.print("timing shardrec preprocess end to end ...")
    ours = run_preprocess_child(path, out, workers, chunk_mb)
    shutil.rmtree(out, ignore_errors=True)
    err_console.print("timing the parser alone ...")
    parse = parse_only(path)
    err_console.print("timing pandas.read_csv (C engine, parse only) ...")
    pd_ = pandas_parse(path)
    rates = {
        "end_to_end_mb_s_per_worker": mb / ours["wall_s"] / workers,
        "end_to_end_mb_s_per_cpu_s": mb / ours["cpu_s"],
        "parse_only_mb_s": mb / parse["wall_s"],
        "parse_only_mb_s_per_cpu_s": mb / parse["cpu_s"],
        "pandas_mb_s": mb / pd_["wall_s"],
        "pandas_mb_s_per_cpu_s": mb / pd_["cpu_s"],
    }
    return {
        "file_mb": round(mb, 1),
        "workers": workers,
        "peak_rss_mb": round(ours["peak_rss_mb"], 1),
        **{k: round(v, 1) for k, v in rates.items()},
        "ratio_end_to_end_vs_pandas": round(rates["end_to_end_mb_s_per_worker"] / rates["pandas_mb_s"], 2),
        "ratio_end_to_end_vs_pandas_cpu": round(rates["end_to_end_mb_s_per_cpu_s"] / rates["pandas_mb_s_per_cpu_s"], 2),
        "ratio_parse_vs_pandas_cpu": round(rates["parse_only_mb_s_per_cpu_s"] / rates["pandas_mb_s_per_cpu_s"], 2),
        # The goals, per core: CPU time is what one core spends, whatever the machine load.
        "goals": {
            "end_to_end_3x_pandas_per_core": rates["end_to_end_mb_s_per_cpu_s"] >= 3 * rates["pandas_mb_s_per_cpu_s"],
            "end_to_end_100_mb_s_per_core": rates["end_to_end_mb_s_per_cpu_s"] >= 100,
            "peak_rss_under_2_gb": ours["peak_rss_mb"] < 2048,
        },
        "pandas": pd_["setup"],
        "seconds": {"preprocess": round(ours["wall_s"], 2), "parse_only": round(parse["wall_s"], 2), "pandas": round(pd_["wall_s"], 2)},
    }


def bench_preprocess(
    size_gb: Annotated[float, typer.Option(help="Size of the generated TSV in GB (the goal is measured at >= 1).")] = 1.0,
    workers: Annotated[int, typer.Option(help="Worker processes of the preprocess run.")] = 1,
    chunk_mb: Annotated[float, typer.Option(help="--chunk-mb of the preprocess run.")] = 128,
    work_dir: Annotated[Path | None, typer.Option(help="Keep the generated file here and reuse it (default: a temporary directory).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Preprocess MB/s per worker and peak RSS, against pandas.read_csv parse-only on the same file."""
    if size_gb <= 0 or workers < 1:
        fail(f"--size-gb ({size_gb}) and --workers ({workers}) must be positive")
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="shardrec-bench-")
        work_dir = Path(tmp.name)
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = run_bench(size_gb, workers, work_dir, chunk_mb)
    except RuntimeError as e:
        fail(str(e))
    finally:
        if tmp is not None:
            tmp.cleanup()
    if json_out:
        print_json(result)
        return
    console.print(
        f"{result['file_mb']:,} MB TSV, {workers} worker(s): preprocess end to end "
        f"{result['end_to_end_mb_s_per_worker']:.1f} MB/s per worker ({result['end_to_end_mb_s_per_cpu_s']:.1f} MB per CPU-second), "
        f"peak RSS {result['peak_rss_mb']:.0f} MB\n"
        f"parser alone {result['parse_only_mb_s']:.1f} MB/s; pandas.read_csv parse only {result['pandas_mb_s']:.1f} MB/s\n"
        f"ratio end-to-end / pandas: {result['ratio_end_to_end_vs_pandas']:.2f}x wall, "
        f"{result['ratio_end_to_end_vs_pandas_cpu']:.2f}x CPU time; parser / pandas: {result['ratio_parse_vs_pandas_cpu']:.2f}x CPU time\n"
        f"pandas {result['pandas']['version']} (engine c), hex columns as {result['pandas']['dtypes'].get('hex_columns', '?')}\n"
        "goals per core: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in result["goals"].items()),
        highlight=False,
    )


def register(bench_app: typer.Typer) -> None:
    bench_app.command("preprocess")(bench_preprocess)
