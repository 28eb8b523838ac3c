"""bench train --managed's report from rank 0's file: runs per side in round order, written as JSON
by the ranks and read back by the command (the ranks' Runs once failed to serialise: the bench
ended in a traceback after minutes of training)."""

from __future__ import annotations

import dataclasses
import json

from shardrec.tools.bench.rounds import Run
from shardrec.tools.bench.train.managed_bench import print_managed, summarise_managed


def test_the_ranks_figures_read_back_as_the_median_same_round_ratio(capsys):
    static = [Run(4096, 1.0, 1.8), Run(4096, 2.0, 3.6), Run(4096, 1.0, 1.8)]
    managed = [Run(4096, 1.25, 2.0), Run(4096, 2.0, 3.6), Run(4096, 1.6, 2.5)]
    counts = {"admitted": 1200, "evicted": 300, "shared_row_share": 0.125}
    raw = json.loads(
        json.dumps(
            {
                "runs": {
                    "static": [dataclasses.asdict(r) for r in static],
                    "managed": [dataclasses.asdict(r) for r in managed],
                },
                "id_maps": counts,
            }
        )
    )
    report = summarise_managed(raw, "reference", 2, 1, 64, 50)
    # same-round ratios 0.8, 1.0, 0.625: the median is the middle one, not a ratio of medians
    assert report["managed_vs_static"]["median"] == 0.8
    assert report["managed_vs_static"]["low"] == 0.625 and report["rounds"] == 3
    assert report["median_samples_per_s"] == {"static": 4096.0, "managed": 2560.0}
    print_managed(report)
    out = " ".join(capsys.readouterr().out.split())
    assert "managed / static tables of the same rows: 0.80x (0.62-1.00 over 3 rounds" in out
    assert "admitted 1,200 ids, evicted 300; 12.5% of lookups on the shared row" in out


def _raw(rounds: int, shared: float = 1.0) -> dict:
    runs = [dataclasses.asdict(Run(4096, 1.0, 1.8)) for _ in range(rounds)]
    counts = {"admitted": 0, "evicted": 0, "shared_row_share": shared}
    return {"runs": {"static": runs, "managed": runs}, "id_maps": counts}


def test_a_window_without_a_map_update_is_too_small_to_measure(capsys):
    # --steps 16 --rounds 1: the warm-up trains steps 0-15, the timed window 16-31; the maps
    # update every 50 steps, so the managed side never updated them while timed.
    report = summarise_managed(_raw(1), "reference", 2, 1, 16, 50)
    assert "median" not in report["managed_vs_static"]
    print_managed(report)
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "managed / static tables of the same rows: too small to measure (1 of 1 timed windows of "
        "16 steps hold no update of the maps, every 50 steps: give --steps 50 or more)" in out
    )
    assert "1.00x" not in out


def test_windows_that_each_hold_an_update_are_measured():
    # 40 steps a window, updates every 50: windows 40-79 and 80-119 hold steps 50 and 100.
    report = summarise_managed(_raw(2), "reference", 2, 1, 40, 50)
    assert report["managed_vs_static"]["median"] == 1.0
    # the third window, 120-159, holds 150; a fourth, 160-199, none (200 is past it)
    assert (
        "too_small"
        not in summarise_managed(_raw(3), "reference", 2, 1, 40, 50)["managed_vs_static"]
    )
    small = summarise_managed(_raw(4), "reference", 2, 1, 40, 50)["managed_vs_static"]
    assert small["too_small"].startswith("1 of 4 timed windows of 40 steps")
