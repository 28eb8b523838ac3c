import errno
import json
import os
import re
from pathlib import Path
from types import ModuleType

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.bench.loader import loader_bench, multihot_bench, parts_bench
from shardrec.tools.cli.app import app


@pytest.mark.slow
def test_bench_loader_reports_rates_and_ratios_against_same_run_baselines(tmp_path: Path):
    args = [
        "bench",
        "loader",
        "--rows",
        "20000",
        "--global-batch",
        "1024",
        "--rounds",
        "1",
        "--max-batches",
        "4",
        "--parts",
        "3",
    ]
    result = CliRunner().invoke(app, [*args, "--work-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert set(r["rows_per_s"]) == {
        "shardrec_shuffle", "shardrec_shuffle_many_parts", "shardrec_shuffle_numpy", "shardrec_no_shuffle",
        "shardrec_no_shuffle_many_parts", "torchrec_shuffle", "torchrec_no_shuffle", "torchrec_global_shuffle",
    }  # fmt: skip
    assert all(v > 0 for v in r["rows_per_s"].values())
    assert all(v > 0 for v in r["rows_per_cpu_s"].values())
    assert set(r["batches_per_run"].values()) == {4} and r["rounds"] == 1
    assert (
        r["torchrec_global_shuffle_build_s"] > 0
        and 0
        < r["torchrec_global_shuffle_epoch_rows_per_s"]
        < r["rows_per_s"]["torchrec_global_shuffle"]
    )
    assert r["parts"] == 3
    # 20,000 rows fit in the CPU's caches: no ratio is printed, each says why.
    assert r["ratios"]["shardrec_vs_torchrec_shuffle"] == {
        "too_small": "20,000 rows fit in the CPU's caches; use --rows >= 1,000,000",
        "rounds": 1,
    }
    assert all("too_small" in v for v in r["ratios"].values())
    assert r["bytes_per_row"] > 100 and r["roofline_rows_per_s"] > 0
    assert 0.5 < r["shuffle_quality_drifting_labels"]["ratio"] < 3
    assert list(tmp_path.iterdir()) == []  # the generated data is removed
    bad = CliRunner().invoke(app, ["bench", "loader", "--rows", "100", "--global-batch", "1024"])
    assert_one_line_error(bad, re.escape("--rows 100: must be >= 2 x --global-batch (2,048)"))
    text = CliRunner().invoke(app, [*args, "--work-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert "shardrec vs torchrec shuffle: too small to measure (20,000 rows fit" in text.stdout
    bad = CliRunner().invoke(app, ["bench", "loader", "--parts", "0"])
    assert_one_line_error(bad, re.escape("--parts 0: must be >= 1"))


@pytest.mark.slow
def test_bench_loader_multihot_reports_samples_per_rank_against_the_one_hot_loader(tmp_path: Path):
    args = [
        "bench",
        "loader",
        "--multihot",
        "--rows",
        "4096",
        "--global-batch",
        "512",
        "--rounds",
        "1",
        # fmt: skip
        "--max-batches",
        "2",
        "--table-rows",
        "64,100",
        "--cache",
        str(tmp_path / "cache"),
    ]
    result = CliRunner().invoke(app, [*args, "--work-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    rates = r["samples_per_s_per_rank"]
    runs = [f"multihot_{n}_rows_{w}_workers" for n in (64, 100) for w in (0, 2)]
    assert set(rates) == {"one_hot", *runs} and r["ids_per_sample"] == 214
    assert all(rates[k] > 0 for k in rates) and r["rounds"] == 1
    assert set(r["vs_one_hot"]) == set(runs) and all(
        r["vs_one_hot"][k]["too_small"].startswith("4,096 rows fit in the CPU's caches")
        for k in runs
    )
    assert r["vs_gpu_rate"]["one_hot"] == pytest.approx(rates["one_hot"] / 1.8e6, abs=1e-3)
    assert set(r["cpu_ns_per_sample"]) == set(rates) and all(
        v > 0 for v in r["cpu_ns_per_sample"].values()
    )
    # The tables are mapped while measured: the share of their pages on 2 MB pages is known.
    assert set(r["huge_mapped"]) == {"64", "100"} and all(
        0 <= v <= 1 for v in r["huge_mapped"].values()
    )
    bad = CliRunner().invoke(app, ["bench", "loader", "--multihot", "--table-rows", "10,x"])
    assert_one_line_error(bad, re.escape("--table-rows '10,x': expected comma-separated integers"))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--global-batch", "0"], "--global-batch 0: must be >= 1"),
        (["--rounds", "0"], "--rounds 0: must be >= 1"),
        (["--max-batches", "-1"], "--max-batches -1: must be >= 0 (0: sized by the warm-up)"),
        (
            ["--rows", "100", "--global-batch", "1024"],
            "--rows 100: must be >= 2 x --global-batch (2,048)",
        ),
        (["--parts", "0"], "--parts 0: must be >= 1"),
        (["--rows", "20000", "--parts", "30000"], "--parts 30000: must be <= --rows (20,000)"),
        (["--part-rows", "100"], "--part-rows 100: must be >= --global-batch (8,192)"),
        (["--part-rows", "-3"], "--part-rows -3: must be >= 0 (0: off)"),
        (["--part-rows", "100000", "--parts", "0"], "--parts 0: must be >= 1"),
        (["--part-rows", "100000", "--parts", "-2"], "--parts -2: must be >= 1"),
    ],
)
def test_bench_loader_names_the_one_bad_option(args: list[str], error: str, tmp_path: Path) -> None:
    command = ["bench", "loader", "--work-dir", str(tmp_path), *args]
    result = CliRunner().invoke(app, command)
    assert_one_line_error(result, rf"^error: {re.escape(error)}$")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_bench_loader_past_the_file_systems_link_limit_says_how_many_parts_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = []
    real_link = os.link

    def link(source, target):  # as ext4 refuses the 65,000th link to one file
        if len(made) == 3:
            raise OSError(errno.EMLINK, os.strerror(errno.EMLINK), str(source), str(target))
        made.append(target)
        real_link(source, target)

    monkeypatch.setattr(parts_bench.os, "link", link)
    command = ["bench", "loader", "--work-dir", str(tmp_path), "--part-rows", "8192"]
    result = CliRunner().invoke(app, [*command, "--parts", "10", "--global-batch", "1024"])
    assert_one_line_error(
        result,
        rf"^error: --parts 10: the file system of {re.escape(str(tmp_path))}/shardrec-bench-parts-"
        r"\w+ holds at most 4 links to one file \(ext4: 65,000\); give --parts 3 or fewer, or a "
        r"--work-dir on another file system$",
    )
    assert list(tmp_path.iterdir()) == []  # the temporary data is gone


@pytest.mark.parametrize(
    ("args", "bench", "run"),
    [
        # --rows is not read with --part-rows: its default, 2,000,000, is under 2 x this batch.
        (
            ["--part-rows", "1000001", "--parts", "2", "--global-batch", "1000001"],
            parts_bench,
            "run_parts_bench",
        ),
        # --parts is not read with --multihot: its default, 120, is over these rows.
        (
            ["--multihot", "--rows", "100", "--global-batch", "8"],
            multihot_bench,
            "run_multihot_bench",
        ),
    ],
)
def test_bench_loader_checks_only_the_options_its_benchmark_reads(
    args: list[str], bench: ModuleType, run: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, run, lambda *given: {"ran": run})
    command = ["bench", "loader", "--work-dir", str(tmp_path), *args, "--json"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"ran": run}


_RUNS = [
    (loader_bench, "run_bench"),
    (parts_bench, "run_parts_bench"),
    (multihot_bench, "run_multihot_bench"),
]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--multihot", "--part-rows", "100000"],
            "--multihot and --part-rows are two different benchmarks: give one",
        ),
        (["--part-rows", "100000", "--rows", "300000"], "--rows does nothing with --part-rows"),
        (["--multihot", "--parts", "3"], "--parts does nothing with --multihot"),
        (["--table-rows", "64"], "--table-rows does nothing without --multihot"),
        (["--part-rows", "100000", "--cache", "c"], "--cache does nothing without --multihot"),
    ],
)
def test_bench_loader_refuses_an_option_its_benchmark_would_ignore(
    args: list[str], error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bench, run in _RUNS:  # a run, refused or not, must not measure here
        monkeypatch.setattr(bench, run, lambda *given, run=run: {"ran": run})
    command = ["bench", "loader", "--work-dir", str(tmp_path), *args, "--json"]
    result = CliRunner().invoke(app, command)
    assert_one_line_error(result, rf"^error: {re.escape(error)}(: leave it out)?$")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_bench_loader_says_a_work_dir_that_does_not_exist_does_not_exist(tmp_path: Path) -> None:
    missing, a_file = tmp_path / "missing", tmp_path / "a-file"
    a_file.write_text("")
    result = CliRunner().invoke(app, ["bench", "loader", "--work-dir", str(missing)])
    assert_one_line_error(result, rf"^error: --work-dir {re.escape(str(missing))}: does not exist$")
    result = CliRunner().invoke(app, ["bench", "loader", "--work-dir", str(a_file)])
    assert_one_line_error(result, rf"^error: --work-dir {re.escape(str(a_file))}: not a directory$")


def test_bench_loader_over_parts_times_one_shuffle_group_a_round() -> None:
    # The stream pays for a group's parts when it enters it: a round of one group's batches holds
    # one crossing, where 800 batches (~0.4 group) held one or none and rounds spread 32-54%.
    from types import SimpleNamespace

    from shardrec.dataloader.order import OrderSpec, ShuffleSpec

    def rounds_of(part_rows: tuple[int, ...], batch: int, **shuffle) -> int:
        spec = OrderSpec(part_rows, batch, shuffle=ShuffleSpec(**shuffle))
        return parts_bench.group_batches(SimpleNamespace(spec=spec))

    assert rounds_of((450_000,) * 10_000, 8192) == 2048  # 256 x 256 x 256 rows
    assert rounds_of((450_000,) * 10_000, 4096, segment_blocks=64) == 1024
    assert rounds_of((64,) * 300, 64) == 300  # a dataset under one group: all of it
    assert rounds_of((10,), 64) == 1
