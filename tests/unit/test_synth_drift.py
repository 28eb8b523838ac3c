"""`shardrec synth --like drift`: days whose new ids appear and old ones fade, the same bytes for
the same seed, in Criteo's format with 64-bit hex ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardrec.tools.synth.criteo import NUM_DENSE
from shardrec.tools.synth.drift import DriftSpec, write_drift


def _ids(path: Path, column: int) -> np.ndarray:
    fields = [line.rstrip(b"\n").split(b"\t") for line in path.read_bytes().splitlines()]
    return np.array(
        [int(f[column], 16) for f in fields if len(f) > column and f[column]], np.uint64
    )


def test_a_drifting_log_brings_new_ids_each_day_and_fades_old_ones(tmp_path: Path) -> None:
    paths, stats = write_drift(tmp_path / "a", 9000, seed=3, days=3, max_vocab=3000)
    assert [p.name for p in paths] == ["day_0", "day_1", "day_2"]
    assert [s.rows for s in stats] == [3000, 3000, 3000]
    assert stats[0].new_traffic_share == 1.0
    for s in stats[1:]:
        assert 0.02 < s.new_traffic_share < 0.6 and 0 < s.new_distinct_share < 1
    spec = DriftSpec.from_seed(3, 3, 3000)
    churn = int(np.flatnonzero(spec.births == 1.0)[0])  # a table that renews its ids daily
    static = int(np.flatnonzero(spec.births == 0)[0])
    column = 1 + NUM_DENSE + churn
    day0, day2 = _ids(paths[0], column), _ids(paths[2], column)
    assert np.isin(day2, day0).mean() < 0.9  # day 2's ids are mostly not day 0's
    assert (
        np.isin(
            _ids(paths[2], 1 + NUM_DENSE + static), _ids(paths[0], 1 + NUM_DENSE + static)
        ).mean()
        > 0.9
    )
    assert int(day2.max()) >= 1 << 60  # 64-bit ids, written as 16 hex digits
    again, _ = write_drift(tmp_path / "b", 9000, seed=3, days=3, max_vocab=3000)
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(paths, again))
