"""`shardrec bench hitrate`: the planner's UVM cache hit rates against exact LRU and LFU caches
replaying a Criteo-skewed synthetic dataset's own id stream (and its DLRMv2-style multi-hot
expansion)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

runner = CliRunner()


@pytest.fixture(scope="module")
def skewed_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hitrate")
    res = runner.invoke(
        app, ["synth", str(root / "raw"), "--rows", "60000", "--max-vocab", "200000", "--seed", "5"]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        app,
        [
            "preprocess",
            str(root / "raw" / "train.txt"),
            "--out",
            str(root / "data"),
            "--max-ids",
            "200000",
        ],
    )
    assert res.exit_code == 0, res.output
    return root / "data"


@pytest.mark.parametrize("multihot", [False, True], ids=["one-hot", "multi-hot"])
def test_predicted_hit_rates_are_within_two_points_of_exact_caches(
    skewed_dataset: Path, tmp_path: Path, multihot
) -> None:
    job = tmp_path / "job.toml"
    text = "[model]\nembedding_dim = 16\n[train]\nglobal_batch_size = 1024\n"
    if multihot:  # DLRMv2's sizes, index tables of the dataset's rows
        sizes = "3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1"
        text = f'[data]\nmultihot_sizes = [{sizes}]\nmultihot_cache = "{tmp_path / "mh"}"\n' + text
    job.write_text(text)
    args = [
        "bench",
        "hitrate",
        "--data",
        str(skewed_dataset),
        "--config",
        str(job),
        "--world-size",
        "2",
    ]
    res = runner.invoke(app, args + ["--hbm-share", "0.2", "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["batches"] > 40  # one epoch of the train split
    assert result["shards"] and result["goal_points"] == 2.0
    for shard in result["shards"]:
        assert shard["cache_rows"] % 32 == 0 and 0 < shard["load_factor"] < 1
        for model in ("lru", "lfu"):
            assert 0 <= shard[model]["simulated_unique"] <= 1
    assert result["worst_lru_points"] <= 2.0 and result["worst_lfu_points"] <= 2.0


def test_the_replayed_plan_keeps_the_jobs_sharding_constraints(
    skewed_dataset: Path, tmp_path: Path
) -> None:
    """Before, the bench planned without the job's [sharding.constraints]: it replayed t_C12
    row-wise over both ranks, a plan `train` would never run, and took a constraint that cannot
    hold without a word."""
    job = tmp_path / "job.toml"
    head = (
        "[model]\nembedding_dim = 16\n[train]\nglobal_batch_size = 1024\n[sharding.constraints]\n"
    )
    args = ["bench", "hitrate", "--data", str(skewed_dataset), "--config", str(job),
            "--world-size", "2", "--hbm-share", "0.2"]  # fmt: skip
    job.write_text(head + 't_C12 = {sharding_types = ["table_wise"], ranks = [1]}\n')
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    shards = [s for s in json.loads(res.stdout)["shards"] if s["table"] == "t_C12"]
    assert [(s["rank"], s["rows"]) for s in shards] == [(1, 200000)]
    job.write_text(head + "t_C12 = {ranks = [5]}\n")
    res = runner.invoke(app, args)
    assert res.exit_code == 1 and res.output == (
        f"error: {job}:6: sharding.constraints.t_C12.ranks: rank 5 is outside world size 2\n"
    )


def test_plan_past_hbm_shows_kernels_caches_and_hit_rates(
    skewed_dataset: Path, tmp_path: Path
) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[model]\nembedding_dim = 16\n[train]\nglobal_batch_size = 1024\n")
    args = [
        "plan",
        "--data",
        str(skewed_dataset),
        "--config",
        str(job),
        "--topology",
        "h100",
        "--world-size",
        "2",
    ]
    res = runner.invoke(
        app, args + ["--memory-gib", "0.03", "--json", "--out", str(tmp_path / "plan.json")]
    )
    assert res.exit_code == 0, res.output
    cached = [
        t
        for t in json.loads(res.stdout)["tables_plan"]
        if t["compute_kernel"] == "fused_uvm_caching"
    ]
    assert cached and all(
        0 < t["cache"]["load_factor"] < 1 and t["cache"]["hit_rates"] for t in cached
    )
    res = runner.invoke(app, ["plan", "show", str(tmp_path / "plan.json")], terminal_width=160)
    assert res.exit_code == 0, res.output
    assert (
        "fused_uvm_caching" in res.stdout
        and "cache rows" in res.stdout
        and "hit rate" in res.stdout
    )
    res = runner.invoke(app, args + ["--memory-gib", "0.001"])
    assert res.exit_code == 1
    assert "needs" in res.output and "of HBM" in res.output and "short" in res.output


def test_small_tables_are_refused_with_the_share_that_fits_or_why_nothing_is_cached(
    tmp_path: Path,
) -> None:
    # Below 0.45 nothing fits; at 0.45 every table fits only in host memory uncached, which the
    # planner refused as "the plan does not fit: ...;  (even with ..." naming no rank; above it the
    # bench said to plan for fewer ranks or a smaller --hbm-share.
    from conftest import write_tiny_dataset

    write_tiny_dataset(tmp_path / "data")  # ids spread evenly: no cache pays
    args = ["bench", "hitrate", "--data", str(tmp_path / "data"), "--world-size", "2",
            "--set", "model.embedding_dim=16", "--set", "train.global_batch_size=64"]  # fmt: skip
    low = runner.invoke(app, [*args, "--hbm-share", "0.4"])
    assert low.exit_code == 1 and len(low.output.splitlines()) == 1, low.output
    assert low.output == (
        "error: --hbm-share 0.4 leaves each of the 2 ranks 38.02 KiB of HBM after the reserve, but "
        "rank 0 needs 40.11 KiB even with every table in host memory behind the smallest useful "
        "cache: raise --hbm-share to 0.45 or more\n"
    )
    for share in ("0.45", "0.6"):
        none = runner.invoke(app, [*args, "--hbm-share", share])
        assert none.exit_code == 1 and len(none.output.splitlines()) == 1, none.output
        assert none.output.startswith(f"error: at --hbm-share {share} the plan caches no table: ")
        assert "stay in host memory uncached (fused_uvm: no cache was worth its HBM" in none.output
        assert none.output.endswith(
            "skewed ids (Criteo's) get caches, or pass --plan a plan that caches a table\n"
        )


@pytest.mark.parametrize("stop, code", [(KeyboardInterrupt, 130), ("kill", 143)])
def test_a_stopped_replay_ends_in_one_line(monkeypatch, tmp_path: Path, stop, code) -> None:
    # Ctrl-C, or a kill (SIGTERM, raised as common.Terminated), while the caches replay.
    from shardrec.tools.bench.plan import hitrate_bench
    from shardrec.tools.cli.common import Terminated

    def stopped(*args, **kwargs):
        raise Terminated if stop == "kill" else stop

    monkeypatch.setattr(hitrate_bench, "run_hitrate", stopped)
    res = runner.invoke(app, ["bench", "hitrate", "--data", str(tmp_path)])
    assert res.exit_code == code, res.output
    assert res.output.splitlines() == ["interrupted: nothing measured"]
