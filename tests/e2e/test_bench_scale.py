"""`shardrec bench scale` at a tiny fraction: every stage reports positive figures, the rows add up and
the projection's arithmetic is the one it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardrec.tools.bench.scale import DAYS, DISK_GB_PER_S, PROJECTED_CORES, TRAIN_RANKS, feature_counts


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
        for key in ("wall_s", "cpu_s", "peak_rss_mb", "peak_pss_mb", "mb_per_s_wall", "rows_per_cpu_s"):
            assert s[key] > 0, (name, key)
        assert s["peak_pss_mb"] <= s["peak_rss_mb"] + 1, name  # shared pages count once in PSS
    stream, train_rows = st["stream"], st["preprocess_hash"]["rows_kept"]["train"]
    assert stream["ranks"] == TRAIN_RANKS and len(stream["per_rank"]) == TRAIN_RANKS
    assert stream["rows"] == train_rows // 64 * 64 and stream["rows_per_s"] > 0 and stream["cpu_share"] > 0
    assert stream["one_part"]["rows_per_s"] > 0 and stream["vs_one_part"] > 0
    manifest = json.loads((tmp_path / "w" / "hash" / "manifest.json").read_text())
    assert [f["cardinality"] for f in manifest["sparse_features"]] == feature_counts(0.000005)
    p, synth = out["projection"], st["synth"]
    for name in ("preprocess_hash", "preprocess_vocab"):
        s, q = st[name], p[name]
        cpu_s = synth["text_bytes"] / 0.000005 / 1e6 / s["mb_per_cpu_s"] / PROJECTED_CORES
        disk_s = (synth["gzip_bytes"] + s["output_bytes"]) / 0.000005 / 1e9 / DISK_GB_PER_S
        assert q["minutes"] == pytest.approx(max(cpu_s, disk_s) / 60) and f"= {cpu_s:,.0f} s" in q["arithmetic"]


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
