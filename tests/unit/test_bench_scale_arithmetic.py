"""bench scale's arithmetic on known figures: ranks run side by side, and the 1TB projection on 16
cores; its work directory: a rerun replaces its own stage folders, a directory it did not make is
refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli

from shardrec.tools.bench.scale.scale_bench import STAGE_DIRS, WORK_MARKER, prepare_work_dir
from shardrec.tools.bench.scale.scale_report import project
from shardrec.tools.bench.scale.scale_stream import combine_ranks, stream_ratio


def test_ranks_side_by_side_count_every_row_over_the_slowest_loop():
    fast = {
        "rows": 100,
        "batches": 5,
        "loop_s": 2.0,
        "cpu_s": 1.0,
        "major_faults": 1,
        "minor_faults": 10,
    }
    slow = {
        "rows": 100,
        "batches": 5,
        "loop_s": 4.0,
        "cpu_s": 1.0,
        "major_faults": 0,
        "minor_faults": 20,
    }
    out = combine_ranks([fast, slow])
    assert out["rows"] == 200 and out["loop_s"] == 4.0 and out["rows_per_s"] == 50.0
    assert (
        out["cpu_share"] == 0.25 and out["wait_s_per_rank"] == 3.0 and out["ms_per_batch"] == 800.0
    )
    assert (out["major_faults"], out["minor_faults"]) == (1, 30)


def test_projection_is_the_longer_of_cpu_and_disk_on_16_cores():
    # 1 GB of text, 0.3 GB gzip at 1/100: the full run reads 100 GB of text, 30 GB of gzip
    stages = {
        "synth": {"text_bytes": 1e9, "gzip_bytes": 3e8},
        "preprocess_hash": {"mb_per_cpu_s": 1000.0, "output_bytes": 2e8, "peak_pss_mb": 1000.0},
        "preprocess_vocab": {"mb_per_cpu_s": 10.0, "output_bytes": 2e8, "peak_pss_mb": 500.0},
    }
    p = project(stages, 0.01, workers=2)
    assert p["full_text_gb"] == pytest.approx(100) and p["full_gzip_gb"] == pytest.approx(30)
    hashed, vocab = p["preprocess_hash"], p["preprocess_vocab"]
    # CPU 100,000 MB / 1,000 MB per CPU-s / 16 = 6.25 s; disk (30 + 20 GB) / 3 GB/s = 16.7 s
    assert hashed["bound"] == "disk" and hashed["minutes"] == pytest.approx(50 / 3 / 60)
    assert hashed["cpu_s"] == pytest.approx(6.25) and hashed["written_gb"] == pytest.approx(20)
    # CPU 100,000 / 10 / 16 = 625 s
    assert vocab["bound"] == "CPU" and vocab["minutes"] == pytest.approx(625 / 60)
    assert hashed["memory_gb"] == pytest.approx(1000 / 2 * 16 * 2**20 / 1e9)
    assert "= 625 s; disk (30 GB read + 20 GB written) / 3 GB/s = 17 s" in vocab["arithmetic"]


def test_a_rerun_into_the_same_work_dir_starts_from_empty_stage_folders(tmp_path: Path):
    # The last run's datasets were made from inputs that synth is about to rewrite: preprocess
    # would refuse them ("holds a run with different inputs") after the whole synth stage.
    work = tmp_path / "w"
    prepare_work_dir(work)
    for name in STAGE_DIRS:
        (work / name).mkdir()
        (work / name / "manifest.json").write_text("{}")
    (work / "notes.txt").write_text("mine")
    prepare_work_dir(work)
    assert sorted(p.name for p in work.iterdir()) == sorted([WORK_MARKER, "notes.txt"])


def test_a_work_dir_the_bench_did_not_make_is_refused_before_anything_is_written(tmp_path: Path):
    (tmp_path / "hash").mkdir()
    (tmp_path / "hash" / "keep.npy").write_bytes(b"x")
    result = cli("bench", "scale", "--fraction", "1e-9", "--work-dir", tmp_path, ok=False)
    assert_one_line_error(
        result,
        rf"^error: --work-dir {re.escape(str(tmp_path))}: not empty and not a bench scale's work directory "
        rf"\(no {re.escape(WORK_MARKER)}\); give a new or empty directory$",
    )
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["hash"]
        and (tmp_path / "hash" / "keep.npy").read_bytes() == b"x"
    )


def test_the_stream_ratio_is_the_median_of_same_round_ratios_of_all_ranks_together():
    def rnd(rows: int, loop_s: float, cpu_s: float) -> dict:
        return {"rows": rows, "loop_s": loop_s, "cpu_s": cpu_s}

    # Rounds of rows over the slowest rank's loop: stream 100, 90, 50 rows/s; one part 100 each.
    measured = {
        "stream": [rnd(100, 1.0, 1.0), rnd(90, 1.0, 0.5), rnd(50, 1.0, 1.0)],
        "one_part": [rnd(100, 1.0, 1.0)] * 3,
    }
    r = stream_ratio(measured).to_dict()
    assert (r["median"], r["low"], r["high"], r["rounds"]) == (0.9, 0.5, 1.0, 3)
    assert r["per_cpu_s"]["median"] == 1.0  # 1.0, 1.8, 0.5 per CPU-second
    short = {"stream": [rnd(100, 0.01, 0.01)] * 3, "one_part": [rnd(100, 0.01, 0.01)] * 3}
    assert "too_small" in stream_ratio(short).to_dict()
