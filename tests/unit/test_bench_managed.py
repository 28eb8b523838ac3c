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
