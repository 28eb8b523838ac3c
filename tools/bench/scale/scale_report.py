"""`shardrec bench scale`'s projection to the full Criteo 1TB, and its report.

The projection for the full 1TB on a PROJECTED_CORES-core machine is a projection, not a
measurement: the full text over the measured MB per CPU-second over the cores (assumes the
per-core rate holds on every core), or the bytes read and written over an assumed disk bandwidth,
whichever is longer; the arithmetic is printed with it."""

from __future__ import annotations

from typing import Any

from shardrec.tools.bench.rounds import ratio_text
from shardrec.tools.console import console

PROJECTED_CORES = 16
PROJECTED_MEMORY_GB = 64
DISK_GB_PER_S = 3.0
GOAL_MINUTES = {"preprocess_hash": 10, "preprocess_vocab": 20}


def project(stages: dict[str, Any], fraction: float, workers: int) -> dict[str, Any]:
    """Each preprocessing mode's wall time for the full 1TB on PROJECTED_CORES cores (a projection).

    CPU: the full text / the measured MB per CPU-second / the cores. Disk: the full gzip input read
    plus the full dataset written, over DISK_GB_PER_S. The projected time is the longer of the two.
    Memory: the measured peak PSS per worker times the cores (vocabulary mode's tables grow with
    the distinct ids, so there it is a lower bound)."""
    synth = stages["synth"]
    text_mb = synth["text_bytes"] / fraction / 1e6
    gzip_gb = synth["gzip_bytes"] / fraction / 1e9
    out: dict[str, Any] = {"full_text_gb": text_mb / 1e3, "full_gzip_gb": gzip_gb, "cores": PROJECTED_CORES,
                           "memory_gb": PROJECTED_MEMORY_GB, "disk_gb_per_s": DISK_GB_PER_S,
                           "measured_workers": workers}  # fmt: skip
    for name, goal in GOAL_MINUTES.items():
        st = stages[name]
        written_gb = st["output_bytes"] / fraction / 1e9
        cpu_s = text_mb / st["mb_per_cpu_s"] / PROJECTED_CORES
        disk_s = (gzip_gb + written_gb) / DISK_GB_PER_S
        memory_gb = st["peak_pss_mb"] / workers * PROJECTED_CORES * 2**20 / 1e9
        out[name] = {
            "minutes": max(cpu_s, disk_s) / 60,
            "bound": "CPU" if cpu_s >= disk_s else "disk",
            "goal_minutes": goal,
            "cpu_s": cpu_s,
            "disk_s": disk_s,
            "written_gb": written_gb,
            "memory_gb": memory_gb,
            "arithmetic": (
                f"CPU {text_mb / 1e3:,.0f} GB / {st['mb_per_cpu_s']:.1f} MB per CPU-s / {PROJECTED_CORES} cores"
                f" = {cpu_s:,.0f} s; disk ({gzip_gb:,.0f} GB read + {written_gb:,.0f} GB written)"
                f" / {DISK_GB_PER_S:g} GB/s = {disk_s:,.0f} s; memory {st['peak_pss_mb']:,.0f} MiB PSS"
                f" / {workers} workers x {PROJECTED_CORES} = {memory_gb:.1f} GB of {PROJECTED_MEMORY_GB}"
            ),
        }
    return out


def print_result(result: dict[str, Any]) -> None:
    st = result["stages"]
    console.print(
        f"Criteo-1TB shape at {result['fraction']:g}: {result['rows']:,} rows, {result['workers']} workers"
    )
    console.print(
        f"{'stage':>17}  {'MB/s wall':>9} {'MB/CPU-s':>9} {'rows/s wall':>12} {'rows/CPU-s':>11} "
        f"{'peak PSS':>9} {'(RSS sum)':>9}  parts / notes",
        highlight=False,
        soft_wrap=True,
    )
    for name in ("synth", "preprocess_hash", "preprocess_vocab", "stream"):
        s = st[name]
        pss = f"{s['peak_pss_mb']:,.0f} MiB" if "peak_pss_mb" in s else "-"
        rss = f"{s['peak_rss_mb']:,.0f} MiB" if "peak_rss_mb" in s else "-"
        note = (
            f"{s['parts']} parts, {s['files']} files (goal: parts + manifest), "
            f"{s['output_bytes'] / 1e9:.2f} GB"
            if "parts" in s
            else ""
        )
        console.print(
            f"{name:>17}  {s['mb_per_s_wall']:9.1f} {s['mb_per_cpu_s']:9.1f} {s['rows_per_s_wall']:12,.0f} "
            f"{s['rows_per_cpu_s']:11,.0f} {pss:>9} {rss:>9}  {note}",
            highlight=False,
            soft_wrap=True,
        )
    _print_stream(st["stream"])
    for name in ("train", "train_resume"):
        if name not in st:
            continue
        s = st[name]
        console.print(
            f"{name:>17}: {s['wall_s']:.1f} s wall, peak PSS {s['peak_pss_mb']:,.0f} MiB, {s['summary']}"
        )
    p = result["projection"]
    console.print(
        f"projection (not a measurement): the full 1TB ({p['full_text_gb']:,.0f} GB of text, "
        f"{p['full_gzip_gb']:,.0f} GB gzip) on {p['cores']} cores, {p['memory_gb']} GB, "
        f"disks at {p['disk_gb_per_s']:g} GB/s:",
        highlight=False,
        soft_wrap=True,
    )
    for name in GOAL_MINUTES:
        q = p[name]
        console.print(
            f"{name:>17}: {q['minutes']:.1f} min ({q['bound']}-bound; goal <= {q['goal_minutes']} min): "
            f"{q['arithmetic']}",
            highlight=False,
            soft_wrap=True,
        )


def _print_stream(s: dict[str, Any]) -> None:
    base = s["one_part"]
    console.print(
        f"{'stream':>17}: {s['ranks']} ranks, global batch {s['global_batch']}: {s['rows_per_s']:,.0f} rows/s, "
        f"one warm part {base['rows_per_s']:,.0f} rows/s; after that first pass, stream / one part "
        f"{ratio_text(s['ratio_vs_one_part'], per='cpu')} (goal >= 0.9x per CPU-second; load average "
        f"{s['load_average'][0]:.1f}); "
        f"CPU {s['cpu_share']:.0%} of the loop, waiting {s['wait_s_per_rank']:.1f} s per rank; "
        f"{s['ms_per_batch']:.2f} ms per batch (one part {base['ms_per_batch']:.2f}); "
        f"page faults {s['major_faults']:,} major, {s['minor_faults']:,} minor",
        highlight=False,
        soft_wrap=True,
    )
