"""The runs of the preprocess benchmarks: each variant (shardrec preprocess, a polars pipeline) a
child process measured as a tree (wall, CPU seconds of every process in it, peak RSS), over the
interleaved rounds of tools/bench/rounds.py, and the report lines they share.

A file under MIN_MB measures process start-up (imports: ~0.5 s of each child) more than the
preprocessing: its ratios print "too small to measure".
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardrec.tools.bench.proctree import interrupted_by_ctrl_c, run_measured
from shardrec.tools.bench.rounds import (
    Run,
    load_average,
    ratio,
    ratio_text,
    run_rounds,
)
from shardrec.tools.console import err_console

MIN_MB = 500.0
"""The smallest file whose ratios are printed."""
BASELINES = ("polars_one_thread", "polars_all_threads")


def measured(cmd: list[str], what: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Wall and CPU seconds, peak RSS and stdout of a child process tree; RuntimeError if it
    fails."""
    res = run_measured(cmd, env)
    if interrupted_by_ctrl_c(res["returncode"], res["stderr"]):
        raise KeyboardInterrupt  # its error is no error of the child's: nothing was measured
    if res["returncode"] != 0:
        raise RuntimeError(f"{what} failed: {res['stderr'].strip()[-2000:]}")
    return {k: res[k] for k in ("wall_s", "cpu_s", "peak_rss_mb", "stdout")}


def polars_env(threads: int | None) -> dict[str, str]:
    """This environment with polars on `threads` threads (None: its default, all cores)."""
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    if threads is not None:
        env["POLARS_MAX_THREADS"] = str(threads)
    return env


@dataclass
class Child:
    """One variant: a command run as a child on `mb` MB of input, writing into `out` (emptied
    before each run). Keeps every run's peak RSS and the last run's stdout."""

    cmd: list[str]
    what: str
    mb: float
    out: Path | None = None
    env: dict[str, str] | None = None
    peaks: list[float] = field(default_factory=list)
    stdout: str = ""

    def __call__(self) -> Run:
        if self.out is not None:
            shutil.rmtree(self.out, ignore_errors=True)
        err_console.print(f"timing {self.what} ...", highlight=False)
        res = measured(self.cmd, self.what, self.env)
        self.peaks.append(res["peak_rss_mb"])
        self.stdout = res["stdout"]
        return Run(self.mb, res["wall_s"], res["cpu_s"])


def rounds_of(children: dict[str, Any], rounds: int, mb: float) -> dict[str, list[Run]]:
    """Every child once untimed (page cache, compiled kernels, polars' first run), then
    `rounds` interleaved rounds. A file too small to give a ratio skips the warm-up: its runs
    only show that every side works."""
    compile_bytecode()
    return run_rounds(children, rounds, warmup=not too_small(mb))


def compile_bytecode() -> None:
    """shardrec's modules compiled to bytecode, as pip does when it installs a package (polars'
    are): an editable install under PYTHONDONTWRITEBYTECODE (set on some machines, this sandbox's
    among them) would have each child compile ~65 of our modules again, ~0.08 CPU-s. Modules
    whose bytecode is current are left as they are."""
    import compileall

    import shardrec.tools

    root = Path(shardrec.tools.__path__[0]).parent
    for folder in PACKAGES:
        compileall.compile_dir(root / folder, quiet=2)


PACKAGES = ("embeddings", "sharding", "dataloader", "trainer", "tools")
"""The folders that install as shardrec.<name>."""


def rates(runs: list[Run], peaks: list[float]) -> dict[str, float]:
    """A variant's medians over its runs (rates per wall and CPU second) and its highest peak."""
    wall = statistics.median(r.wall_s for r in runs)
    cpu = statistics.median(r.cpu_s for r in runs)
    return {
        "mb_s": round(statistics.median(r.rate for r in runs), 1),
        "mb_per_cpu_s": round(statistics.median(r.cpu_rate for r in runs), 1),
        "peak_rss_mb": round(max(peaks), 1),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
    }


def too_small(mb: float, file_mb: float | None = None) -> str:
    """Why `mb` MB of text are too few to time ("" if they are not); file_mb: the size of the file
    that holds them where it is not text (a Parquet file's), said beside them."""
    if mb >= MIN_MB:
        return ""
    # Under 1 MB in two significant digits: a 0.2 MB input said "a 0 MB file".
    text = f"{mb:.0f}" if mb >= 1 else f"{mb:.2g}"
    what = f"a {text} MB file"
    if file_mb is not None:
        what = f"a {file_mb:.1f} MB file holding {text} MB of text"
    return (
        f"{what} measures process start-up more than preprocessing; "
        f"use --size-gb >= {MIN_MB / 1000:g}"
    )


def report_head(
    mb: float,
    workers: int,
    runs: dict[str, list[Run]],
    children: dict[str, Child],
    differ: list[str],
    judged_mb: float | None = None,
) -> dict[str, Any]:
    """What both reports start with: the file, each variant's medians, whether polars did the
    same work, shardrec's ratios against each polars run. judged_mb: the text size that decides
    whether the run is too small to measure (a Parquet file's: the text it holds), default mb."""
    small = too_small(mb) if judged_mb is None else too_small(judged_mb, file_mb=mb)
    return {
        "file_mb": round(mb, 1),
        "workers": workers,
        "cores": os.cpu_count(),
        "rounds": len(runs["shardrec"]),
        "load_average": load_average(),
        **{name: rates(runs[name], children[name].peaks) for name in ("shardrec", *BASELINES)},
        # The baseline's columns equal shardrec's: the two did the same work.
        "polars_columns_equal": not differ,
        "polars_columns_differ": differ,
        "ratios": {
            f"vs_{name}": ratio(
                runs["shardrec"], runs[name], too_small=small, not_compared=not_compared(differ)
            ).to_dict()
            for name in BASELINES
        },
    }


def not_compared(differ: list[str]) -> str:
    """Why polars' times say nothing against shardrec's ("" where they do): its columns are not
    shardrec's, so the two did not do the same work."""
    if not differ:
        return ""
    return (
        f"polars' columns {', '.join(differ)} differ from shardrec's: the two did not do the same "
        "work"
    )


def per_cpu_median(r: dict[str, Any]) -> float | None:
    """A ratio's median per CPU-second, None where it was withheld (too small, not compared)."""
    return r["per_cpu_s"]["median"] if "per_cpu_s" in r else None


def rate_lines(r: dict[str, Any], title: str) -> str:
    """The report's first lines: the file, each run's rates, the ratios (per CPU-second first:
    the goals are stated per CPU-second)."""
    line = "{:<22} {:>7.1f} MB/s {:>7.1f} MB/CPU-s {:>6.0f} MB peak RSS"
    rows = [
        (f"shardrec, {r['workers']} worker(s)", r["shardrec"]),
        ("polars, 1 thread", r["polars_one_thread"]),
        ("polars, all threads", r["polars_all_threads"]),
    ]
    head = (
        f"{r['file_mb']:,} MB {title}, medians of {r['rounds']} interleaved rounds "
        f"({r['cores']} cores, load average {r['load_average'][0]})\n"
    )
    return (
        head
        + "".join(
            line.format(n, s["mb_s"], s["mb_per_cpu_s"], s["peak_rss_mb"]) + "\n" for n, s in rows
        )
        + f"shardrec / polars 1 thread: {ratio_text(r['ratios']['vs_polars_one_thread'], 'cpu')}\n"
        + "shardrec / polars all threads: "
        + f"{ratio_text(r['ratios']['vs_polars_all_threads'], 'cpu')}\n"
    )


def spec_rounds(
    path: Path,
    spec: Path,
    what: str,
    mb: float,
    workers: int,
    work_dir: Path,
    chunk_mb: float,
    rounds: int,
    judged_mb: float | None = None,
) -> dict[str, Any]:
    """`shardrec preprocess --spec` of one file against polars_spec.py's pipeline on one thread
    and on all, in interleaved rounds; each polars output checked against shardrec's (values and
    list lengths), every output removed after. Returns report_head's dict."""
    from shardrec.tools.bench.preprocess.polars_spec import compare_jagged

    out = work_dir / "out"
    cmd = [sys.executable, "-P", "-m", "shardrec.tools.cli", "preprocess", str(path), "--spec",
           str(spec), "--out", str(out), "--layout", "kaggle", "--workers", str(workers),
           "--chunk-mb", str(chunk_mb), "--json"]  # fmt: skip
    children = {"shardrec": Child(cmd, what, mb, out)}
    for name, threads in (("polars_one_thread", 1), ("polars_all_threads", None)):
        polars_out = work_dir / f"polars-out-{threads or 'all'}"
        polars = [sys.executable, "-P", "-m", "shardrec.tools.bench.preprocess.polars_spec",
                  str(path), str(spec), str(polars_out)]  # fmt: skip
        label = f"the polars pipeline ({threads or 'all'} thread(s))"
        children[name] = Child(polars, label, mb, polars_out, polars_env(threads))
    judged = mb if judged_mb is None else judged_mb
    differ: set[str] = set()
    try:
        runs = rounds_of(children, rounds, judged)
        for child in children.values():
            if child.out != out:
                differ.update(compare_jagged(out, child.out))
    finally:
        for child in children.values():
            shutil.rmtree(child.out, ignore_errors=True)
    return report_head(mb, workers, runs, children, sorted(differ), judged_mb=judged_mb)
