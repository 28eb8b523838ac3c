"""Planner statistics on a dataset written directly (one-hot and multi-hot features)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset

from shardrec.dataloader.format.part_file import open_split
from shardrec.tools.preprocess.parts.feature_stats import compute_feature_stats


def test_stats_of_one_hot_and_multi_hot_features(tmp_path: Path):
    manifest = write_tiny_dataset(tmp_path, multi_hot=("f1",))
    stats = compute_feature_stats(tmp_path, manifest)
    parts = open_split(tmp_path, "train")
    lengths = np.concatenate([np.diff(p.offsets["f1"]) for p in parts])
    assert stats["f1"]["mean_ids_per_sample"] == pytest.approx(lengths.mean(), abs=1e-6)
    assert stats["f1"]["p95_ids_per_sample"] == pytest.approx(np.percentile(lengths, 95))
    assert stats["f1"]["lookups"] == lengths.sum()
    f3 = np.concatenate([p.sparse["f3"] for p in parts])
    counts = np.sort(np.bincount(f3, minlength=1000))[::-1]
    assert stats["f3"]["distinct_ids"] == (counts > 0).sum()
    assert stats["f3"]["top10_share"] == pytest.approx(counts[:100].sum() / len(f3), abs=1e-6)
    assert stats["f0"]["mean_ids_per_sample"] == 1.0 and stats["f0"]["sampled"] == 0
