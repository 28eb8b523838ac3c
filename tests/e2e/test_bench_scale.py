"""`shardrec bench scale` at a tiny fraction: every stage reports positive figures and the rows add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardrec.tools.bench.scale import DAYS, feature_counts


def _scale(tmp_path: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "shardrec.tools.cli", "bench", "scale", "--fraction", "0.000005", "--batch", "64",
           "--work-dir", str(tmp_path / "w"), "--json", *extra]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _check_common(out: dict, tmp_path: Path) -> None:
    st = out["stages"]
    assert len(list((tmp_path / "w" / "raw").glob("day_*.gz"))) == DAYS
    assert st["synth"]["rows"] == out["rows"] and st["synth"]["text_bytes"] > 0
    for name in ("preprocess_hash", "preprocess_vocab"):
        s = st[name]
        assert (
            s["lines"] == out["rows"] and sum(s["rows_kept"].values()) == out["rows"]
        )  # synth rows are all well formed
        assert s["parts"] >= DAYS and s["output_bytes"] > 0
        for key in ("wall_s", "cpu_s", "peak_rss_mb", "mb_per_s_wall", "mb_per_cpu_s"):
            assert s[key] > 0, (name, key)
    train_rows = st["preprocess_hash"]["rows_kept"]["train"]
    assert st["stream"]["rows"] == train_rows // 64 * 64 and st["stream"]["rows_per_s"] > 0
    manifest = json.loads((tmp_path / "w" / "hash" / "manifest.json").read_text())
    assert [f["cardinality"] for f in manifest["sparse_features"]] == feature_counts(0.000005)
    p = out["projection"]
    assert p["preprocess_hash_hours"] > 0 and p["preprocess_vocab_hours"] > 0 and p["cores"] >= 1


def test_scale_without_training(tmp_path: Path):
    out = _scale(tmp_path, "--no-train")
    _check_common(out, tmp_path)
    assert "train" not in out["stages"]


@pytest.mark.slow
def test_scale_trains_and_resumes_deep_in_the_stream(tmp_path: Path):
    out = _scale(tmp_path, "--steps", "4")
    _check_common(out, tmp_path)
    assert out["stages"]["train"]["summary"]["steps"] == 4
    assert out["stages"]["train_resume"]["summary"] == {
        **out["stages"]["train_resume"]["summary"],
        "steps": 8,
        "resumed_from_step": 4,
    }
