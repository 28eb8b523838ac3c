"""`shardrec bench check` (`make bench-check`): the quick benchmarks in one command, each ratio held
against a floor recorded in the repository for this machine class, so that a change to a hot path
is checked in minutes (not in CI: a shared runner's load would fail it at random).

A machine class is the CPU's architecture, its best vector ISA as torch dispatches to it (AVX2,
AVX512), AMX where present, and the core count: ratios depend on all four (bf16 needs AMX or
AVX512-BF16; the ranks share the cores). The floors (configs/bench-floors.toml) are the medians
measured on a known-good tree; a ratio passes while its median stays above TOLERANCE of its floor
(two runs of an unchanged tree agree within 10% on a quiet machine). `--record` writes this run's
medians as the floors of this machine's class, to be committed with the change that earned them.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.tools.bench.rounds import load_average
from shardrec.tools.console import console, err_console

FLOORS = Path(__file__).resolve().parents[2] / "configs" / "bench-floors.toml"
TOLERANCE = 0.9
"""A median below this share of its floor fails."""


@dataclass(frozen=True)
class Check:
    """One ratio of one quick benchmark."""

    name: str
    """bench.ratio, the key of its floor."""
    run: str
    """The benchmark run it comes from (several ratios share one)."""
    path: tuple[str, ...]
    """Where its JSON form (rounds.Ratio.to_dict) sits in that run's result."""
    per: str = "wall"
    """The figure held against the floor: wall or cpu (per CPU-second)."""


CHECKS = (
    Check("loader.shardrec_vs_torchrec_shuffle", "loader", ("ratios", "shardrec_vs_torchrec_shuffle")),
    Check("loader.many_parts_vs_one_part_shuffle", "loader", ("ratios", "many_parts_vs_one_part_shuffle")),
    Check("preprocess.vs_polars_one_thread", "preprocess", ("ratios", "vs_polars_one_thread"), "cpu"),
    Check("train_demo.ours_fp32_vs_stock_fp32", "train_demo", ("ours_fp32_vs_stock_fp32",)),
    Check("train_demo.loader_vs_in_memory", "train_demo", ("loader_vs_in_memory",)),
    Check("train_reference.ours_fp32_vs_stock_fp32", "train_reference", ("ours_fp32_vs_stock_fp32",)),
    Check("train_reference.ours_bf16_vs_stock_fp32", "train_reference", ("ours_bf16_vs_stock_fp32",)),
)  # fmt: skip


def machine_class() -> str:
    """e.g. x86_64-AVX512-amx-2cpu: architecture, torch's CPU capability, AMX, cores."""
    import torch

    amx = "-amx" if torch.cpu._is_amx_tile_supported() else ""
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{platform.machine()}-{capability}{amx}-{os.cpu_count()}cpu"


def _loader() -> dict[str, Any]:
    from shardrec.tools.bench.loader import loader_bench

    return loader_bench.run_bench(2_000_000, 8192, 5, 0, None)


def _preprocess() -> dict[str, Any]:
    from shardrec.tools.bench.preprocess import preprocess_bench

    with tempfile.TemporaryDirectory(prefix="shardrec-bench-check-") as tmp:
        return preprocess_bench.run_bench(0.5, 1, Path(tmp), 128, rounds=3)


def _train(
    model: str, steps: int, quality_steps: int, rounds: int = 3
) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        from shardrec.tools.bench.train import train_bench

        return train_bench.run_bench(model, steps, rounds, quality_steps, 2, "cpu", 1)

    return run


RUNS: dict[str, Callable[[], dict[str, Any]]] = {
    "loader": _loader,
    "preprocess": _preprocess,
    "train_demo": _train("demo", 256, 125),
    # 5 rounds: the bf16 ratio's 3-round median read 1.51x-1.99x over four runs of one day on
    # unchanged training code (rounds spread 30-38%), where one round in three moved it.
    "train_reference": _train("reference", 32, 32, rounds=5),
}


def load_floors(path: Path, cls: str) -> dict[str, float]:
    """This machine class's floors in `path` ({} if none are recorded)."""
    if not path.is_file():
        return {}
    section = tomllib.loads(path.read_text()).get("classes", {}).get(cls, {})
    return {k: float(v) for k, v in section.get("floors", {}).items()}


def _check_floors_file(path: Path, cls: str) -> None:
    if not path.is_file():
        raise ValueError(
            f"--floors {path}: no such file; give the floors file (default {FLOORS}), or write "
            "one with --record"
        )
    if not load_floors(path, cls):
        classes = tomllib.loads(path.read_text()).get("classes", {})
        recorded = ", ".join(sorted(c for c, v in classes.items() if v.get("floors"))) or "none"
        raise ValueError(
            f"no floors are recorded for machine class {cls} in {path} (classes with floors: "
            f"{recorded}): nothing to check against; record them on a known-good tree with "
            "`shardrec bench check --record`"
        )


def _figure(result: dict[str, Any], check: Check) -> dict[str, Any]:
    r: Any = result
    for key in check.path:
        r = r[key]
    for withheld in ("not_compared", "too_small"):
        if withheld in r:
            return {withheld: r[withheld]}
    return r["per_cpu_s"] if check.per == "cpu" else r


def run_check(
    only: str | None = None, floors_path: Path = FLOORS, recording: bool = False
) -> dict[str, Any]:
    """Run the quick benchmarks (those whose run name contains `only`); each ratio's median,
    spread and verdict against this machine class's floor. Unless `recording` (--record), a
    floors file that is missing or holds no floors for this class is a ValueError before any
    benchmark runs: there would be nothing to check against."""
    cls = machine_class()
    runs = [name for name in RUNS if only is None or only in name]
    if not runs:
        raise ValueError(f"--only {only!r} matches none of {', '.join(RUNS)}")
    if not recording:
        _check_floors_file(floors_path, cls)
    floors = load_floors(floors_path, cls)
    rows = []
    for name in runs:
        err_console.print(f"bench check: {name} ...")
        try:
            result = RUNS[name]()
        except (RuntimeError, ValueError, OSError) as e:  # one broken benchmark fails its rows
            why = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
            rows += [{"ratio": c.name, "per": c.per, "floor": floors.get(c.name),
                      "failed": why, "verdict": "FAILED"} for c in CHECKS if c.run == name]  # fmt: skip
            continue
        for check in (c for c in CHECKS if c.run == name):
            try:
                figure = _figure(result, check)
            except KeyError:
                continue  # a ratio this machine does not measure (no bf16 variant)
            floor = floors.get(check.name)
            rows.append({"ratio": check.name, "per": check.per, "floor": floor, **figure,
                         "verdict": verdict(figure, floor)})  # fmt: skip
    return {"machine_class": cls, "load_average": load_average(), "rows": rows}


def verdict(figure: dict[str, Any], floor: float | None) -> str:
    if "not_compared" in figure:
        return "not compared"
    if "too_small" in figure:
        return "too small"
    if floor is None:
        return "no floor"
    return "ok" if figure["median"] >= TOLERANCE * floor else "BELOW FLOOR"


def failed(result: dict[str, Any]) -> bool:
    """Whether the check did not pass: a ratio below its floor, too small to measure, not compared
    (the baseline did other work), failed, or with no floor to hold it against (not checked is
    not passed)."""
    verdicts = ("BELOW FLOOR", "too small", "not compared", "FAILED", "no floor")
    return any(r["verdict"] in verdicts for r in result["rows"])


def record(result: dict[str, Any], path: Path = FLOORS, note: str = "") -> None:
    """Write this run's medians as the floors of its machine class (other classes, and this
    class's floors the run did not measure, kept)."""
    doc = tomllib.loads(path.read_text()) if path.is_file() else {}
    classes = doc.get("classes", {})
    # Floors this run did not measure (--only, too small) keep their recorded value.
    measured = dict(classes.get(result["machine_class"], {}).get("floors", {}))
    measured.update({r["ratio"]: round(r["median"], 2) for r in result["rows"] if "median" in r})
    day = datetime.date.today().isoformat()
    load = result["load_average"]
    classes[result["machine_class"]] = {
        "recorded": f"{day}, load average {load[0]} {load[1]} {load[2]}"
        + (f"; {note}" if note else ""),
        "floors": measured,
    }
    lines = [
        "# Floors of `make bench-check` (tools/bench/check.py): per machine class, the median of",
        "# each ratio measured on a known-good tree. A median under 90% of its floor fails.",
        "# Re-record with `shardrec bench check --record` on a quiet machine (load average < 1).",
    ]
    for cls, section in sorted(classes.items()):
        lines += ["", f'[classes."{cls}"]', f"recorded = {_quote(section['recorded'])}"]
        lines += [f'[classes."{cls}".floors]']
        lines += [f'"{k}" = {v}' for k, v in sorted(section["floors"].items())]
    # A temporary name, then the rename: an interrupted --record leaves the old floors whole.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, path)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def print_check(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=f"bench check on {result['machine_class']} (load average {result['load_average'][0]})",
        title_justify="left",
    )
    for column in ("ratio", "floor", "measured (median, lowest-highest round)", "verdict"):
        table.add_column(column, justify="right" if column == "floor" else "left")
    for r in result["rows"]:
        if "failed" in r:
            measured = f"the benchmark failed: {r['failed']}"
        elif "not_compared" in r:
            measured = f"not compared ({r['not_compared']})"
        elif "too_small" in r:
            measured = f"too small to measure ({r['too_small']})"
        else:
            measured = f"{r['median']:.2f}x ({r['low']:.2f}-{r['high']:.2f})"
        per = " per CPU-s" if r["per"] == "cpu" else ""
        floor = "-" if r["floor"] is None else f"{r['floor']:.2f}"
        table.add_row(r["ratio"] + per, floor, measured, r["verdict"])
    console.print(table)
    unchecked = [r["ratio"] for r in result["rows"] if r["verdict"] == "no floor"]
    if unchecked:
        console.print(
            f"not checked: {', '.join(unchecked)} {'has' if len(unchecked) == 1 else 'have'} no "
            f"floor recorded for machine class {result['machine_class']}; record "
            f"{'it' if len(unchecked) == 1 else 'them'} on a known-good tree with --record",
            highlight=False,
        )
