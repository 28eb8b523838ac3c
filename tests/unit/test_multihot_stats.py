"""The planner statistics of a materialised multi-hot dataset, counted by the conversion's
workers from the one-hot ids, equal the ones counted from the written columns afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tiny_dataset

from shardrec.dataloader.format.manifest import Manifest
from shardrec.tools.preprocess.derived import multihot_stats
from shardrec.tools.preprocess.derived.multihot_dataset import materialize_multihot
from shardrec.tools.preprocess.parts.feature_stats import compute_feature_stats


@pytest.mark.parametrize(
    ("workers", "jit"), [(2, True), (1, False)], ids=["2-workers-compiled", "1-worker-numpy"]
)
def test_stats_counted_by_the_workers_equal_the_stats_counted_after(
    tmp_path: Path, monkeypatch, workers: int, jit: bool
):
    monkeypatch.setattr(multihot_stats, "AVAILABLE", jit and multihot_stats.AVAILABLE)
    write_tiny_dataset(tmp_path / "one", rows={"train": [300, 200, 100], "val": [100]})
    # Tables smaller than the one-hot cardinalities (50, 300, 7, 1000) fold ids; pareto rows
    # repeat ids within a row: both must count as the written columns do.
    out = materialize_multihot(
        tmp_path / "one", tmp_path / "mh", [3, 1, 2, 6], rows=[20, 300, 7, 64], dist="pareto",
        cache_dir=tmp_path / "cache", workers=workers,
    )  # fmt: skip
    after = compute_feature_stats(tmp_path / "mh", Manifest.load(tmp_path / "mh"), "train")
    assert {f.name: f.stats for f in out.sparse_features} == after
    assert after["f0"]["mean_ids_per_sample"] == 3 and after["f3"]["lookups"] == 600 * 6
