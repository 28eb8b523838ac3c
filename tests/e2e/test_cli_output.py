"""What the CLI prints: no log line or library warning without -v,
no library chatter with it, no empty progress bar before an error; numbers with separators and
units; one rate that means one thing; an idle-rank warning from the planner."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from shardrec.tools.cli.app import app


def shardrec(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}  # wide tables: headers are not wrapped
    return subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_preprocess_and_data_commands_are_quiet_and_readable(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    assert shardrec("synth", "raw", "--rows", "2000", cwd=tmp_path).returncode == 0
    first = shardrec("preprocess", "raw/train.txt", "--out", "pp", cwd=tmp_path)
    assert first.returncode == 0 and first.stderr == "", first.stderr  # no INFO line without -v
    # The features' share under "lookups on top 1% of table rows" is a percentage, as data stats
    # shows it: it read 0.025 for data stats' 2.5%.
    c1 = next(line for line in first.stdout.splitlines() if line.startswith("│ C1 "))
    assert re.search(r"│ +\d+\.\d% │$", c1), c1
    # Distinct ids and shares are the training split's: a whole file's count differs.
    assert re.search(r"^ +features \(train\) +$", first.stdout, re.M), first.stdout
    last = first.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"2,000 lines, 0\.5 MB of text; parsed at [\d,]+\.\d MB/s \(0\.5 MB in \d+\.\d s"
        r"(, plus \d+\.\d s compiling kernels: a first run's only)?\); \d+\.\d s in all",
        last,
    ), last
    again = shardrec("preprocess", "raw/train.txt", "--out", "pp", cwd=tmp_path)
    assert (
        again.stdout.strip()
        .splitlines()[-1]
        .startswith("nothing to do: all 1 task(s) were already done; 2,000 lines")
    )
    assert "MB/s" not in again.stdout

    failed = shardrec("preprocess", "nothere", "--out", "pp2", cwd=tmp_path)
    assert failed.returncode == 1 and failed.stdout == ""  # no empty progress bar
    assert failed.stderr == "error: nothere: no such file or directory\n"

    digest = shardrec(
        "data", "digest", tiny_dataset, "--global-batch", "64", "--batches", "1", cwd=tmp_path
    )
    assert (
        digest.returncode == 0
        and "is_fx_tracing" not in digest.stderr
        and "W1" not in digest.stderr
    ), digest.stderr
    verbose = shardrec(
        "-v", "data", "digest", tiny_dataset, "--global-batch", "64", "--batches", "1", cwd=tmp_path
    )
    assert verbose.returncode == 0 and "Successfully loaded" not in verbose.stderr, verbose.stderr

    stats = shardrec("data", "stats", "pp", cwd=tmp_path)
    header = next(
        line for line in stats.stdout.splitlines() if "feature" in line and "dtype" in line
    )
    assert "table rows" in header and "lookups on top 1% of table rows" in header
    assert re.search(r"^ +sparse features \(train\) +$", stats.stdout, re.M), stats.stdout
    c1 = next(line for line in stats.stdout.splitlines() if line.startswith("│ C1 "))
    assert re.search(r"│ +\d+\.\d% │ +\d+\.\d% │$", c1), c1

    exported = shardrec("data", "export-npy", "pp", "--out", "npy", cwd=tmp_path)
    assert re.fullmatch(
        r"wrote 2 day file\(s\) to npy: day_0 [\d,]+ rows, day_1 [\d,]+ rows "
        r"\(val [\d,]+ rows, then test [\d,]+\)\n",
        exported.stdout,
    ), exported.stdout
    imported = shardrec("data", "import-npy", "npy", "--out", "back", cwd=tmp_path)
    assert re.fullmatch(
        r"imported train [\d,]+ rows, val [\d,]+ rows, test [\d,]+ rows into back\n",
        imported.stdout,
    ), imported.stdout


def test_plan_numbers_have_separators_and_units(tiny_dataset: Path) -> None:
    simulated = CliRunner().invoke(app, ["plan", "--data", str(tiny_dataset), "--simulate"])
    assert simulated.exit_code == 0, simulated.output
    row = next(line for line in simulated.stdout.splitlines() if line.startswith("│ 4,096 │"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert all(
        re.fullmatch(r"\d{1,3}(,\d{3})*\.\d\d", c) for i, c in enumerate(cells) if i not in (0, 4)
    ), cells
    planned = CliRunner().invoke(app, ["plan", "--data", str(tiny_dataset)])
    assert "memory used of 4,096 MiB per rank" in " ".join(planned.stdout.split())


def test_planner_warns_about_idle_ranks(tiny_dataset: Path, tmp_path: Path, caplog) -> None:
    job = tmp_path / "job.toml"
    job.write_text(
        "[sharding.constraints]\n"
        + "".join(f't_f{i} = {{ sharding_types = ["table_wise"] }}\n' for i in range(4))
    )
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        result = CliRunner().invoke(
            app, ["plan", "--data", str(tiny_dataset), "--config", str(job), "--world-size", "8"]
        )
    assert result.exit_code == 0, result.output
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "4 of 8 ranks hold no embedding table (ranks 4-7): their memory and lookups go unused; plan for fewer ranks, "
        "or allow row-wise/column-wise sharding for the largest tables"
    ]
    caplog.clear()
    CliRunner().invoke(app, ["plan", "--data", str(tiny_dataset), "--world-size", "2"])
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_rank_holding_only_empty_row_wise_shards_is_idle(
    tiny_dataset: Path, tmp_path: Path, caplog
) -> None:
    """t_f2's 7 rows row-wise on 8 ranks: blocks of 1 row on ranks 0-6, and on rank 7 an empty
    shard (torchrec builds it). The report said "8" shards on ranks "0-7" and no rank idle, though
    rank 7 holds no row of any table."""
    job = tmp_path / "job.toml"
    job.write_text(
        "[sharding.constraints]\n"
        + "".join(
            f't_f{i} = {{ sharding_types = ["table_wise"], ranks = [{r}] }}\n'
            for i, r in ((0, 0), (1, 1), (3, 2))
        )
        + 't_f2 = { sharding_types = ["row_wise"] }\n'
    )
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        result = CliRunner().invoke(
            app,
            ["plan", "--data", str(tiny_dataset), "--config", str(job), "--world-size", "8"],
            terminal_width=200,
        )
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if " t_f2 " in line)
    cells = row.replace("│", " ").split()
    assert cells == ["t_f2", "row_wise", "fused", "7", "(+1", "empty)", "0-6"], row
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "1 of 8 ranks hold no embedding table (ranks 7): their memory and lookups go unused; plan for fewer ranks, "
        "or allow row-wise/column-wise sharding for the largest tables"
    ]


def test_training_says_which_evaluation_splits_have_no_rows(tmp_path: Path, monkeypatch) -> None:
    # A small input's val and test can be empty: the run printed an empty results table and wrote
    # "eval": {} without a word.
    from conftest import write_tiny_dataset
    from helpers import TINY_MODEL, jobs_handed_to_ranks, settings

    job = settings('train.device="cpu"', *TINY_MODEL, "train.global_batch_size=64")
    write_tiny_dataset(tmp_path / "none", {"train": [600, 400], "val": [], "test": []})
    args = ["train", "--data", str(tmp_path / "none"), "--steps", "1", "--json", *job]
    done = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "run")])
    assert done.exit_code == 0, done.output
    assert done.stderr.splitlines()[0] == (
        f"warning: {tmp_path / 'none'}: splits 'val' and 'test' (data.eval_splits) have no rows: "
        "nothing is evaluated on them, and the run reports no AUC"
    )
    assert json.loads(done.stdout)["eval"] == {}
    # One of them: named alone (no rank started to learn it).
    handed = jobs_handed_to_ranks(monkeypatch)
    write_tiny_dataset(tmp_path / "one", {"train": [600, 400], "val": [256], "test": []})
    args = ["train", "--data", str(tmp_path / "one"), "--steps", "1", *job]
    one = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "run2")])
    assert len(handed) == 1, one.output
    assert one.stderr.splitlines()[0] == (
        f"warning: {tmp_path / 'one'}: split 'test' (data.eval_splits) has no rows: "
        "nothing is evaluated on it"
    )


def test_output_into_a_pipe_keeps_every_number_and_header_whole(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """A log file or a pipe has no width: tables keep their natural width (rich would cut them at
    80 columns, `1,000,…`), even where COLUMNS says 80; --json is JSON as before. Two commands that
    need no torch, each in a process of its own, their stdout a pipe."""
    plan = tmp_path / "p.json"
    planned = CliRunner().invoke(
        app, ["plan", "--data", str(tiny_dataset), "--world-size", "2", "--out", str(plan)]
    )
    assert planned.exit_code == 0, planned.output
    env = {**os.environ, "COLUMNS": "80"}
    printed = {}
    for args in (["data", "stats", str(tiny_dataset)], ["plan", "show", str(plan)]):
        done = subprocess.run(
            [sys.executable, "-m", "shardrec.tools.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "…" not in done.stdout, done.stdout
        assert max(map(len, done.stdout.splitlines())) > 80, done.stdout  # not wrapped to fit 80
        printed[args[0]] = done.stdout
    header = next(
        line for line in printed["data"].splitlines() if "feature" in line and "dtype" in line
    )
    assert "distinct ids" in header and "lookups on top 10% of table rows" in header, header
    as_json = CliRunner().invoke(app, ["data", "stats", str(tiny_dataset), "--json"])
    assert json.loads(as_json.stdout)["splits"][0] == {"split": "train", "rows": 1000, "parts": 2}


def test_json_output_writes_a_nan_or_infinite_number_as_null(capsys) -> None:
    # eval, predict and others print an AUC of NaN for a split of one class: json.dumps wrote it
    # as bare NaN, which is no JSON (jq and JavaScript refuse the whole document).
    from shardrec.tools.cli.common import print_json

    print_json({"auc": float("nan"), "rates": [float("inf"), 0.5], "rows": 3})

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is no JSON")

    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=refuse) == {"auc": None, "rates": [None, 0.5], "rows": 3}


def test_preprocess_rate_leaves_a_first_runs_kernel_compiles_apart() -> None:
    # A first run (kernels not in numba's cache yet) printed "read at 0.0 MB/s (0.9 MB in
    # 24.0 s)": the compile was counted as reading.
    from numba.core import event
    from rich.progress import Progress

    from shardrec.tools.cli.preprocess_report import Bar, rate_line
    from shardrec.tools.preprocess.kept_rows import PreprocessResult

    bar = Bar(Progress(disable=True))
    with bar.compiles_apart():
        bar.start(1_000_000, "parse")
        with event.trigger_event("numba:compile"):  # as a kernel's first call compiles
            time.sleep(0.5)
        bar.advance(1_000_000, 1_000_000, 1000)
    result = PreprocessResult(None, 1000, 1_000_000, {"train": 1000}, {}, [], 1, 1)
    line = rate_line(result, 0.6, bar, parquet=False)
    mbps, seconds, compiled = re.search(
        r"parsed at ([\d,.]+) MB/s \(1\.0 MB in (\d+\.\d) s, plus (\d\.\d) s compiling kernels: "
        r"a first run's only\); 0\.6 s in all$",
        line,
    ).groups()
    assert float(seconds) < 0.3 and float(mbps.replace(",", "")) > 3 and compiled == "0.5", line
