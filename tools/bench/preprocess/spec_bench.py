"""`shardrec bench preprocess --like movielens|avazu`: a feature spec's preprocessing against
polars.

On one generated file (synth --like: MovieLens-1M joined, with string categoricals, quoted titles
and a genre list; or Avazu's 24 columns), with the spec `spec infer` proposes for it, in the same
run: `shardrec preprocess --spec` end to end in a child process, then the polars pipeline of
polars_spec.py in a child on one thread and on all, its columns checked against shardrec's (values
and list lengths: the two did the same work). Rates are MB of text per second and per CPU-second
(CPU time of the whole process tree); the goal is shardrec at 2x polars or more per CPU-second.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from shardrec.tools.bench.proctree import run_measured
from shardrec.tools.console import err_console

BYTES_PER_ROW = {
    "movielens": 68,
    "avazu": 150,
}  # synth --like's rows, measured; only sizes the file
_LABEL = {"movielens": "rating>=4", "avazu": "click"}


def measured(cmd: list[str], what: str, env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall and CPU seconds and peak RSS of a child process tree; RuntimeError if it fails."""
    res = run_measured(cmd, env)
    if res["returncode"] != 0:
        raise RuntimeError(f"{what} failed: {res['stderr'].strip()[-2000:]}")
    return {k: res[k] for k in ("wall_s", "cpu_s", "peak_rss_mb")}


def rates(mb: float, run: dict[str, float]) -> dict[str, float]:
    return {
        "mb_s": round(mb / run["wall_s"], 1),
        "mb_per_cpu_s": round(mb / run["cpu_s"], 1),
        "peak_rss_mb": round(run["peak_rss_mb"], 1),
        "wall_s": round(run["wall_s"], 2),
        "cpu_s": round(run["cpu_s"], 2),
    }


def prepare(like: str, size_gb: float, work_dir: Path) -> tuple[Path, Path]:
    """The generated log (reused when it is there at about the size) and its inferred spec."""
    from shardrec.dataloader.spec.spec_file import spec_to_toml
    from shardrec.tools.preprocess.parse.spec_infer import infer_spec
    from shardrec.tools.synth.avazu_movielens import write_like

    path, spec_path = work_dir / f"{like}.csv", work_dir / f"{like}.toml"
    if not path.is_file() or abs(path.stat().st_size - size_gb * 1e9) > 0.2 * size_gb * 1e9:
        err_console.print(
            f"generating {size_gb:g} GB of {like}-shaped CSV in {path} ...", highlight=False
        )
        write_like(path, like, max(1000, int(size_gb * 1e9 / BYTES_PER_ROW[like])), seed=0)
    spec, notes = infer_spec(path, _LABEL[like])
    spec_path.write_text(spec_to_toml(spec, notes))
    return path, spec_path


def run_like_bench(
    like: str, size_gb: float, workers: int, work_dir: Path, chunk_mb: float
) -> dict[str, Any]:
    from shardrec.tools.bench.preprocess.polars_spec import compare_jagged

    path, spec = prepare(like, size_gb, work_dir)
    mb = path.stat().st_size / 1e6
    out, polars_out = work_dir / "out", work_dir / "polars-out"
    shutil.rmtree(out, ignore_errors=True)
    err_console.print(f"timing shardrec preprocess --spec ({like}) end to end ...")
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "preprocess",
        str(path),
        "--spec",
        str(spec),
        "--out",
        str(out),
        # fmt: skip
        "--layout",
        "kaggle",
        "--workers",
        str(workers),
        "--chunk-mb",
        str(chunk_mb),
        "--json",
    ]
    ours = rates(mb, measured(cmd, "preprocess"))
    runs, differ = {}, set()
    try:
        for label, threads in (("one_thread", 1), ("all_threads", None)):
            shutil.rmtree(polars_out, ignore_errors=True)
            err_console.print(f"timing the polars pipeline ({label.replace('_', ' ')}) ...")
            env = polars_env(threads)
            child = [
                sys.executable,
                "-m",
                "shardrec.tools.bench.preprocess.polars_spec",
                str(path),
                str(spec),
                str(polars_out),
            ]
            runs[label] = rates(mb, measured(child, f"polars pipeline ({label})", env))
            differ.update(compare_jagged(out, polars_out))
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(polars_out, ignore_errors=True)
    pl1, pln = runs["one_thread"], runs["all_threads"]
    ratio = ratios(ours, pl1, pln)["ratio_vs_polars_one_thread_cpu"]
    return {
        "like": like,
        **report_head(mb, workers, ours, pl1, pln, sorted(differ)),
        "goals": {"end_to_end_2x_polars_per_cpu_s": ratio >= 2},
    }


def polars_env(threads: int | None) -> dict[str, str]:
    """This environment with polars on `threads` threads (None: its default, all cores)."""
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    if threads is not None:
        env["POLARS_MAX_THREADS"] = str(threads)
    return env


def report_head(
    mb: float, workers: int, ours: dict, pl1: dict, pln: dict, differ: list[str]
) -> dict[str, Any]:
    """What both reports start with: the file, the runs, whether polars did the same work, the
    ratios."""
    return {
        "file_mb": round(mb, 1),
        "workers": workers,
        "cores": os.cpu_count(),
        "shardrec": ours,
        "polars_one_thread": pl1,
        "polars_all_threads": pln,
        # The baseline's columns equal shardrec's: the two did the same work.
        "polars_columns_equal": not differ,
        "polars_columns_differ": differ,
        **ratios(ours, pl1, pln),
    }


def ratios(ours: dict, pl1: dict, pln: dict) -> dict[str, float]:
    """shardrec's rates over polars' (one thread, all threads), per CPU-second and wall."""
    return {
        "ratio_vs_polars_one_thread_cpu": round(ours["mb_per_cpu_s"] / pl1["mb_per_cpu_s"], 2),
        "ratio_vs_polars_one_thread_wall": round(ours["mb_s"] / pl1["mb_s"], 2),
        "ratio_vs_polars_all_threads_cpu": round(ours["mb_per_cpu_s"] / pln["mb_per_cpu_s"], 2),
        "ratio_vs_polars_all_threads_wall": round(ours["mb_s"] / pln["mb_s"], 2),
    }


def rate_lines(r: dict[str, Any], title: str) -> str:
    """The report's first lines: the file, each run's rates, the ratios."""
    ours, pl1, pln = r["shardrec"], r["polars_one_thread"], r["polars_all_threads"]
    line = "{:<22} {:>7.1f} MB/s {:>7.1f} MB/CPU-s {:>6.0f} MB peak RSS"
    return (
        f"{r['file_mb']:,} MB {title}, same run ({r['cores']} cores)\n"
        + line.format(
            f"shardrec, {r['workers']} worker(s)",
            ours["mb_s"],
            ours["mb_per_cpu_s"],
            ours["peak_rss_mb"],
        )
        + "\n"
        + line.format("polars, 1 thread", pl1["mb_s"], pl1["mb_per_cpu_s"], pl1["peak_rss_mb"])
        + "\n"
        + line.format("polars, all threads", pln["mb_s"], pln["mb_per_cpu_s"], pln["peak_rss_mb"])
        + f"\nshardrec / polars 1 thread: {r['ratio_vs_polars_one_thread_cpu']:.2f}x per CPU-second, "
        f"{r['ratio_vs_polars_one_thread_wall']:.2f}x wall\n"
        f"shardrec / polars all threads: {r['ratio_vs_polars_all_threads_cpu']:.2f}x per CPU-second, "
        f"{r['ratio_vs_polars_all_threads_wall']:.2f}x wall\n"
    )


def print_like_report(r: dict[str, Any], console) -> None:
    console.print(
        rate_lines(r, f"{r['like']}-shaped CSV, its inferred spec")
        + "polars columns equal shardrec's (values and list lengths): "
        + ("yes" if r["polars_columns_equal"] else f"NO ({', '.join(r['polars_columns_differ'])})")
        + "\n"
        + "\n".join(f"goal {k}: {'met' if v else 'NOT met'}" for k, v in r["goals"].items()),
        highlight=False,
    )
