"""The benchmarks' harness of repeated rounds: untimed warm-up, rotating order, ratios as medians of
same-round ratios with their spread, and no figure where a run is too short to measure."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardrec.tools.bench.rounds import Run, ratio, ratio_text, run_rounds, summarize, timed


def test_each_variant_warms_up_once_untimed_then_runs_once_a_round_in_rotating_order():
    calls: list[str] = []

    def variant(name: str):
        def run() -> Run:
            calls.append(name)
            return Run(1.0, 1.0, 1.0)

        return run

    runs = run_rounds({n: variant(n) for n in "abc"}, 3)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert {n: len(r) for n, r in runs.items()} == {"a": 3, "b": 3, "c": 3}
    calls.clear()
    run_rounds({n: variant(n) for n in "ab"}, 1, warmup=False)
    assert calls == ["a", "b"]


def test_a_ratio_is_the_median_of_same_round_ratios_with_its_spread():
    # Round 2 was slow for both sides (another process): the same-round ratio hardly moves, while
    # a ratio of the sides' own medians or bests would mix rounds.
    ours = [Run(100, 1.0, 0.5), Run(100, 2.0, 1.0), Run(100, 1.1, 0.5)]
    base = [Run(100, 2.0, 1.0), Run(100, 4.4, 2.0), Run(100, 2.0, 1.1)]
    r = ratio(ours, base)
    assert r.median == pytest.approx(2.0)
    assert (r.wall.low, r.wall.high) == pytest.approx((2.0 / 1.1, 2.2))
    assert r.cpu.median == pytest.approx(2.0) and r.rounds == 3
    d = r.to_dict()
    assert d["spread"] == pytest.approx((2.2 - 2.0 / 1.1) / 2.0, abs=1e-3)
    assert ratio_text(d).startswith("2.00x (1.82-2.20 over 3 rounds, spread 19%); per CPU-s 2.00x")
    assert ratio_text(d, "cpu") == (
        "2.00x (2.00-2.20 over 3 rounds, spread 10%) per CPU-s; wall 2.00x (1.82-2.20)"
    )


def test_runs_too_short_to_measure_give_a_reason_instead_of_a_ratio():
    ours, base = [Run(10, 0.01, 0.01)] * 3, [Run(10, 0.02, 0.02)] * 3
    r = ratio(ours, base, min_run_s=0.2)
    assert r.median is None and "0.010 s, under 0.2 s" in r.too_small
    assert ratio_text(r.to_dict()) == f"too small to measure ({r.too_small})"
    # A size the benchmark knows is too small is refused even with long runs.
    long = [Run(10, 1.0, 1.0)] * 3
    assert ratio(long, long, too_small="fits in cache").to_dict() == {
        "too_small": "fits in cache",
        "rounds": 3,
    }


def test_summary_and_timed_runs():
    s = summarize([Run(10, 1.0, 2.0), Run(10, 2.0, 2.0), Run(10, 4.0, 5.0)])
    assert (s.rate, s.low, s.high, s.cpu_rate, s.run_s) == (5.0, 2.5, 10.0, 5.0, 2.0)
    run = timed(lambda: sum(range(100_000)) * 0 + 7)
    assert run.work == 7 and run.wall_s > 0 and run.cpu_s >= 0


def test_the_preprocess_bench_gives_its_children_our_modules_bytecode():
    import importlib.util

    from shardrec.tools.bench.preprocess import child_runs

    source = child_runs.__file__
    cached = importlib.util.cache_from_source(source)
    Path(cached).unlink(missing_ok=True)
    child_runs.compile_bytecode()
    assert Path(cached).is_file()
    with open(cached, "rb") as f:  # its header's source size: this file's, a current bytecode
        assert int.from_bytes(f.read(16)[12:16], "little") == Path(source).stat().st_size


def _preprocess_report(mb: float, peak_mb: float, mb_per_cpu_s: float) -> dict:
    """bench preprocess's report of one round on an `mb` MB file: shardrec at `mb_per_cpu_s` and
    `peak_mb`, polars and the parsers at half its rate."""
    import json

    from shardrec.tools.bench.preprocess.child_runs import Child
    from shardrec.tools.bench.preprocess.preprocess_bench import _report

    ours = Run(mb, mb / mb_per_cpu_s, mb / mb_per_cpu_s)
    half = Run(mb, 2 * mb / mb_per_cpu_s, 2 * mb / mb_per_cpu_s)
    names = ("shardrec", "polars_one_thread", "polars_all_threads")
    children = {n: Child([], n, mb, peaks=[peak_mb]) for n in names}
    children["shardrec"].stdout = json.dumps({"cpu_seconds_by_stage": {"parse kernel": 0.1}})
    runs = {n: [ours if n == "shardrec" else half] for n in (*names, "parse_only")}
    return _report(mb, 1, {**runs, "pandas_parse_only": [half]}, children, [], {"version": "x"})


def test_a_preprocess_run_too_small_to_measure_measures_none_of_its_goals(capsys):
    from shardrec.tools.bench.preprocess.preprocess_bench import print_report

    report = _preprocess_report(20.0, 300.0, 400.0)
    assert set(report["goals"].values()) == {None}
    print_report(report)
    goals = [line for line in capsys.readouterr().out.splitlines() if line.startswith("goal ")]
    assert len(goals) == 3
    assert all(line.endswith(": not measured (too small)") for line in goals), goals


def test_a_preprocess_run_large_enough_holds_every_goal():
    report = _preprocess_report(600.0, 300.0, 900.0)
    assert report["goals"] == {
        "end_to_end_3x_polars_per_cpu_s": False,
        "peak_rss_under_1_gb_per_worker": True,
        "moonshot_800_mb_per_cpu_s": True,
    }


def test_a_preprocess_input_under_a_megabyte_is_said_at_its_size_not_as_zero():
    """`bench preprocess --size-gb 0.0002` headed its report "0.2 MB TSV", then called it "a 0 MB
    file"."""
    from shardrec.tools.bench.preprocess.child_runs import too_small

    assert too_small(0.2).startswith("a 0.2 MB file measures process start-up")
    assert too_small(3.4).startswith("a 3 MB file measures")
    assert too_small(0.2, 0.1).startswith("a 0.1 MB file holding 0.2 MB of text")


def test_a_streams_warmer_still_running_when_its_run_ends_counts_in_that_runs_cpu_not_its_wall():
    """A warmer left running fell into the next run's CPU (another configuration's): up to ~4%
    of the many-part stream's CPU went uncounted against one part."""
    import threading

    from shardrec.dataloader.group_maps import WARM_THREAD
    from shardrec.tools.bench.loader.stream_runs import timed_stream

    def spin() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    def run() -> float:
        threading.Thread(target=spin, name=WARM_THREAD).start()
        return 1.0

    r = timed_stream(run)
    assert r.cpu_s >= 0.3
    assert r.wall_s < 0.1
    assert not any(t.name == WARM_THREAD for t in threading.enumerate())
