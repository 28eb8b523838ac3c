"""bench loader's report from its runs: which ratio compares what, and no figure the run's size
cannot support."""

from __future__ import annotations

from shardrec.tools.bench.loader.loader_bench import _report, print_result
from shardrec.tools.bench.rounds import Run

CONFIGS = (
    "shardrec_shuffle", "shardrec_shuffle_many_parts", "shardrec_shuffle_numpy",
    "shardrec_no_shuffle", "shardrec_no_shuffle_many_parts", "torchrec_shuffle",
    "torchrec_no_shuffle", "torchrec_global_shuffle",
)  # fmt: skip


def _result(rows: int) -> dict:
    """One round: ours shuffled at 4 M rows/s, torchrec's global shuffle reading at 8 M rows/s after
    a 0.5 s shuffle at build; the rest of the report's figures made up."""
    runs = {name: [Run(2_000_000, 0.5, 0.5)] for name in CONFIGS}
    runs["torchrec_global_shuffle"] = [Run(2_000_000, 0.25, 0.25)]
    report = _report(rows, 3, 8192, 1, 200.0, 10.0, runs, dict.fromkeys(CONFIGS, 4), (0.5, 0.5))
    quality = {"ratio": 1.0, "file_order_std": 2.0, "full_permutation_std": 1.0}
    return report | {
        "torchrec_load_into_ram_s": 0.1,
        "shardrec_anon_memory_growth_mb": 0.0,
        "resume": {"resume_other_world_size_s": 0.01, "order_deep_in_4_2b_rows_s": 0.01},
        "shuffle_quality_drifting_labels": quality,
    }


def test_the_global_shuffle_ratios_say_which_of_its_epochs_they_compare(capsys):
    report = _result(2_000_000)
    # Its epoch: 1,998,848 rows (whole batches) in 0.5 s of shuffle + their reads at 8 M rows/s.
    assert report["ratios"]["shardrec_vs_torchrec_global_shuffle_reads"]["median"] == 0.5
    assert report["ratios"]["shardrec_vs_torchrec_global_shuffle_epoch"]["median"] == 1.501
    assert report["ratios"]["shardrec_vs_torchrec_shuffle"]["median"] == 1.0  # bench check's key
    print_result(report)
    out = " ".join(capsys.readouterr().out.split())
    assert "shardrec vs torchrec global shuffle's in-order reads, its shuffle untimed: 0.50x" in out
    assert "shardrec vs torchrec global shuffle's epoch, its shuffle timed: 1.50x" in out
    assert "shardrec vs torchrec global shuffle: " not in out
    assert "fraction of the roofline: shuffle 0.08, no shuffle 0.08" in out
    # README's goal for it (shuffled shardrec / torchrec shuffled >= 2x), as the other benches'.
    assert report["goals"] == {"shardrec_vs_torchrec_shuffle_2x": False}
    assert "goal shardrec_vs_torchrec_shuffle_2x: NOT met" in out


def test_a_run_too_small_to_measure_prints_no_fraction_of_the_roofline(capsys):
    report = _result(100_000)
    assert "too_small" in report["ratios"]["shardrec_vs_torchrec_global_shuffle_epoch"]
    print_result(report)
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "fraction of the roofline: too small to measure (100,000 rows fit in the CPU's caches; "
        "use --rows >= 1,000,000)" in out
    )
    assert "goal shardrec_vs_torchrec_shuffle_2x: not measured (too small)" in out
