"""Preprocessing bad input (README, Failures and trust: Preprocessing): input that is not rows is
an error, never a 0-row dataset, and an offending value is shown cut to ~80 characters with its
length."""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.manifest import Manifest
from shardrec.tools.cli.app import app
from shardrec.tools.synth.criteo import write_dataset

runner = CliRunner()
ARGS = ["--max-ids", "5000"]


def preprocess(*args) -> object:
    return runner.invoke(app, ["preprocess", *[str(a) for a in args], *ARGS])


def test_binary_garbage_is_an_error_not_an_empty_dataset(tmp_path: Path):
    junk = tmp_path / "train.txt"
    junk.write_bytes(random.Random(0).randbytes(64 << 10))
    res = preprocess(junk, "--out", tmp_path / "data")
    assert_one_line_error(
        res,
        rf"^error: {re.escape(str(junk))}: no rows kept, all [\d,]+ lines are malformed \(.*\); "
        rf"first: {re.escape(str(junk))}:\d+: ",
    )
    assert not (tmp_path / "data" / "manifest.json").exists()


def test_header_only_csv_is_an_error_even_with_strict(tmp_path: Path):
    csv = tmp_path / "train.csv"
    csv.write_text(
        "label,"
        + ",".join(f"I{i}" for i in range(1, 14))
        + ","
        + ",".join(f"C{i}" for i in range(1, 27))
        + "\n"
    )
    res = preprocess(csv, "--out", tmp_path / "data", "--csv", "--strict")
    assert_one_line_error(
        res,
        rf"^error: {re.escape(str(csv))}: no rows: the input holds no data lines after its header$",
    )
    assert not (tmp_path / "data" / "manifest.json").exists()


def test_a_csv_read_as_tsv_is_told_to_add_csv(tmp_path: Path):
    csv = tmp_path / "train.csv"
    header = (
        "label,"
        + ",".join(f"I{i}" for i in range(1, 14))
        + ","
        + ",".join(f"C{i}" for i in range(1, 27))
    )
    csv.write_text(header + "\n" + ("1," + ",".join(["5"] * 13 + ["a1b2"] * 26) + "\n") * 5)
    res = preprocess(csv, "--out", tmp_path / "data")
    assert_one_line_error(
        res,
        rf"first: {re.escape(str(csv))}:1: row: 1 fields, schema needs at least 37 of 40 "
        r"\(commas in the row: a CSV file\? preprocess it with --csv\) \(too_few_fields\)$",
    )
    assert preprocess(csv, "--out", tmp_path / "as_csv", "--csv").exit_code == 0


def test_one_10mb_line_gives_a_short_line_naming_file_line_field_and_cut_value(tmp_path: Path):
    big = tmp_path / "train.txt"
    big.write_bytes(b"1\t" + b"x" * (10 << 20) + b"\t" * 38 + b"\n")
    value = r"'x{80}'\.\.\. \(10,485,760 bytes\)"
    res = preprocess(big, "--out", tmp_path / "data")
    line = assert_one_line_error(
        res,
        rf"^error: {re.escape(str(big))}: no rows kept, .*; "
        rf"first: {re.escape(str(big))}:1: I1: {value} \(bad_integer\); I1 reads whole numbers, "
        r"a missing value as an empty field: correct the row$",
    )
    assert len(line) < 500 and len(res.stdout) < 2000  # the value cut, the advice after it
    # A run refused for its share of malformed rows keeps its tasks' markers: small too.
    big.write_bytes(big.read_bytes() + b"0" + b"\t" * 39 + b"\n")
    assert preprocess(big, "--out", tmp_path / "kept").exit_code == 1
    assert max(p.stat().st_size for p in (tmp_path / "kept" / ".work").glob("task-*.json")) < 2000
    strict = preprocess(big, "--out", tmp_path / "strict", "--strict")
    assert (
        len(
            assert_one_line_error(
                strict,
                rf"^error: {re.escape(str(big))}:1: I1: {value} \(bad_integer\); I1 reads whole "
                r"numbers, a missing value as an empty field: correct the row or leave out "
                r"--strict to skip such rows \(up to --max-skipped-fraction of them\)$",
            )
        )
        < 500
    )


def test_more_malformed_rows_than_allowed_is_an_error_and_a_higher_limit_accepts_them(
    tmp_path: Path,
):
    raw = write_dataset(tmp_path / "raw", rows=1000, seed=2, max_vocab=300)[0]
    text = raw.read_bytes()
    raw.write_bytes(text + b"oops\n" * 30)  # 30 of 1,030 lines: 2.9%, above the 0.3% default
    out = tmp_path / "data"
    res = preprocess(raw, "--out", out)
    assert_one_line_error(
        res,
        rf"^error: {re.escape(str(raw))}: 30 of 1,030 lines malformed \(2\.91%: too_few_fields 30\), "
        rf"more than the 0\.003 allowed .*; first: {re.escape(str(raw))}:1001: row: ",
    )
    assert not (out / "manifest.json").exists()
    again = runner.invoke(
        app,
        [
            "preprocess",
            str(raw),
            "--out",
            str(out),
            *ARGS,
            "--max-skipped-fraction",
            "0.05",
            "--json",
        ],
    )
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert (
        report["complete"]
        and report["tasks_run"] == 0
        and report["rows_skipped"] == {"too_few_fields": 30}
    )


def test_directory_input_takes_only_day_files_and_names_what_it_ignored(tmp_path: Path, caplog):
    raw = tmp_path / "raw"
    write_dataset(raw, rows=600, seed=4, max_vocab=300, days=3)
    (raw / "README").write_text("Criteo 1TB click logs, days 0-2\n")
    (raw / "day_2.md5").write_text("d41d8cd98f00b204e9800998ecf8427e  day_2\n")
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        res = runner.invoke(
            app, ["preprocess", str(raw), "--out", str(tmp_path / "data"), *ARGS, "--json"]
        )
    assert res.exit_code == 0, res.output
    options = Manifest.load(tmp_path / "data").options
    assert [f["name"] for f in options["inputs"]] == [
        "day_0",
        "day_1",
        "day_2",
    ]  # day_2, not the .md5, is halved
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{raw}: ignored 2 file(s) not named day_N[.gz], train.txt[.gz] or dac_sample.txt: README, day_2.md5"
    ]
    assert json.loads(res.stdout)["rows_skipped"] == {}


def test_a_csv_beside_criteos_train_txt_is_never_a_day_of_it(tmp_path: Path, caplog):
    """The README's two tours write raw/train.txt and raw/train.csv side by side: the directory is
    Criteo's train.txt alone, and both files named are refused with the CSV's counts, never a
    dataset whose train split is empty."""
    from shardrec.tools.synth.avazu_movielens import write_like

    raw = tmp_path / "raw"
    write_dataset(raw, rows=2000, seed=4, max_vocab=300)
    write_like(raw / "train.csv", "movielens", 300, seed=1)
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        res = preprocess(raw, "--out", tmp_path / "data", "--json")
    assert res.exit_code == 0, res.output
    assert [f["name"] for f in Manifest.load(tmp_path / "data").options["inputs"]] == ["train.txt"]
    assert json.loads(res.stdout)["rows_kept"] == {"train": 1714, "val": 143, "test": 143}
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{raw}: ignored 1 file(s) not named day_N[.gz], train.txt[.gz] or dac_sample.txt: train.csv"
    ]
    # Named on the command line, the CSV is a day of its own: refused with its counts (its 301
    # lines are 13% of the whole, and each of them is malformed).
    both = preprocess(raw / "train.txt", raw / "train.csv", "--out", tmp_path / "both")
    assert_one_line_error(
        both,
        rf"^error: {re.escape(str(raw / 'train.csv'))}: no rows kept, all 301 lines are malformed "
        r"\(too_few_fields 301\); first: .*train\.csv:1: row: 1 fields",
    )
    assert not (tmp_path / "both" / "manifest.json").exists()


def test_a_file_of_few_malformed_rows_among_many_is_refused_with_its_own_share(tmp_path: Path):
    raw = tmp_path / "raw"
    write_dataset(raw, rows=4000, seed=4, max_vocab=300, days=2)
    day0 = raw / "day_0"
    day0.write_bytes(day0.read_bytes() + b"oops\n" * 8)  # 8 of ~2,000 lines: over 0.3%
    res = preprocess(raw, "--out", tmp_path / "data")
    assert_one_line_error(
        res,
        rf"^error: {re.escape(str(day0))}: 8 of 2,008 lines malformed \(0\.40%: too_few_fields 8\), "
        r"more than the 0\.003 allowed \(--max-skipped-fraction\); first: .*day_0:2001: row: ",
    )
    again = preprocess(raw, "--out", tmp_path / "data", "--max-skipped-fraction", "0.005", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["rows_skipped"] == {"too_few_fields": 8}


def test_a_split_whose_lines_were_all_skipped_is_an_error_with_the_counts(tmp_path: Path, caplog):
    """With every malformed row allowed, a CSV named before Criteo's train.txt is the training day
    and leaves train empty: refused with the counts. A file of 7 rows leaves test empty by the
    layout alone: a warning with the counts."""
    from shardrec.tools.synth.avazu_movielens import write_like

    raw = tmp_path / "raw"
    write_dataset(raw, rows=2000, seed=4, max_vocab=300)
    write_like(raw / "train.csv", "movielens", 300, seed=1)
    res = preprocess(
        raw / "train.csv", raw / "train.txt", "--out", tmp_path / "d", "--max-skipped-fraction", "1"
    )
    assert_one_line_error(
        res,
        r"split train would hold no rows: its lines were all skipped as malformed \(301 lines of "
        r"train; rows kept: train 0, val 1,000, test 1,000; 301 skipped\); 2 files \(train\.csv, "
        r"train\.txt\): every file but the last \(train\.txt\) is a training day, the last is "
        r"halved into val and test; name the input files on the command line in day order$",
    )
    assert not (tmp_path / "d" / "manifest.json").exists()
    seven = write_dataset(tmp_path / "seven", rows=7, seed=4, max_vocab=300)[0]
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        assert preprocess(seven, "--out", tmp_path / "s").exit_code == 0
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{seven}: split test holds no rows, the input has too few lines (rows kept: train 6, val "
        "1, test 0); one file (train.txt) is cut into 7 pseudo-days, days 0-5 train and day 6 "
        "halved into val and test: it needs at least 8 lines"
    ]


def test_a_spec_reads_a_directory_by_its_files_pattern(tmp_path: Path):
    """A directory of a spec's own file names: refused naming them and the pattern to give; with
    `[format] files`, its files are the days."""
    from shardrec.tools.synth.avazu_movielens import write_like

    raw = tmp_path / "raw"
    raw.mkdir()
    write_like(raw / "part-0.csv", "movielens", 400, seed=1)
    write_like(raw / "part-1.csv", "movielens", 400, seed=2)
    spec = tmp_path / "ml.toml"
    assert (
        runner.invoke(
            app,
            ["spec", "infer", str(raw / "part-0.csv"), "--label", "rating>=4", "--out", str(spec)],
        ).exit_code
        == 0
    )
    args = ["preprocess", str(raw), "--spec", str(spec), "--out", str(tmp_path / "data"), "--json"]
    assert_one_line_error(
        runner.invoke(app, args),
        rf"^error: {re.escape(str(raw))}: directory holds no input files named day_N\[\.csv\]\[\.gz\], "
        r"train\.csv\[\.gz\] or dac_sample\.csv \(found part-0\.csv, part-1\.csv; name input files on "
        r"the command line to take them, or give a spec a \[format\] files pattern\)$",
    )
    spec.write_text(spec.read_text().replace("[format]\n", '[format]\nfiles = "part-*.csv"\n'))
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert [f["name"] for f in Manifest.load(tmp_path / "data").options["inputs"]] == [
        "part-0.csv",
        "part-1.csv",
    ]
    assert json.loads(res.stdout)["rows_kept"] == {"train": 400, "val": 200, "test": 200}


def test_a_dense_value_its_dtype_cannot_hold_is_one_line_and_both_fixes_it_names_work(
    tmp_path: Path,
):
    raw = write_dataset(tmp_path / "raw", rows=400, seed=2, max_vocab=300)[0]
    lines = raw.read_bytes().splitlines(keepends=True)
    fields = lines[10].split(b"\t")
    fields[3] = b"70000"  # I3: past float16's 65,504
    lines[10] = b"\t".join(fields)
    raw.write_bytes(b"".join(lines))
    args = ["--dense-transform", "none", "--float16"]
    assert_one_line_error(
        preprocess(raw, "--out", tmp_path / "a", *args),
        rf"^error: {re.escape(str(raw))}:11: I3: 70000 is past what float16 holds with transform "
        r"none: it would train as infinity; drop --float16, or preprocess with --dense-transform "
        r"signed-log1p$",
    )
    assert not (tmp_path / "a" / "manifest.json").exists()
    assert preprocess(raw, "--out", tmp_path / "b", "--dense-transform", "none").exit_code == 0
    fixed = preprocess(
        raw, "--out", tmp_path / "c", "--dense-transform", "signed-log1p", "--float16"
    )
    assert fixed.exit_code == 0, fixed.output


def test_a_csv_of_other_columns_is_sent_to_spec_infer_and_that_command_works(tmp_path: Path):
    from shardrec.tools.synth.avazu_movielens import write_like

    csv = tmp_path / "train.csv"
    write_like(csv, "movielens", 300, seed=1)
    line = assert_one_line_error(
        preprocess(csv, "--out", tmp_path / "data"),
        rf"\(commas in the row: a CSV of 10 fields, not Criteo's 40\? `shardrec spec infer "
        rf"{re.escape(str(csv))} --label COLUMN --out spec.toml` describes it; then preprocess "
        r"--spec spec.toml\) \(too_few_fields\)$",
    )
    infer = line.split("`")[1].split()[1:]  # spec infer FILE --label COLUMN --out spec.toml
    infer[infer.index("COLUMN")] = "rating>=4"
    infer[-1] = str(tmp_path / "spec.toml")
    assert runner.invoke(app, infer).exit_code == 0
    res = runner.invoke(
        app,
        [
            "preprocess",
            str(csv),
            "--spec",
            str(tmp_path / "spec.toml"),
            "--out",
            str(tmp_path / "d"),
        ],
    )
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("size", ["99999999999999999999", "18446744073709551615"])
def test_a_hash_size_past_64_bit_ids_is_one_line_before_any_folder(tmp_path: Path, size: str):
    """It was a traceback (OverflowError) or, once the work had begun, `id ... does not fit in 64
    bits` naming no column, leaving a folder that refused the fixed spec's rerun."""
    from shardrec.tools.synth.avazu_movielens import write_like

    csv, spec, out = tmp_path / "train.csv", tmp_path / "ml.toml", tmp_path / "data"
    write_like(csv, "movielens", 300, seed=1)
    args = ["spec", "infer", str(csv), "--label", "rating>=4", "--out", str(spec)]
    assert runner.invoke(app, args).exit_code == 0
    good = spec.read_text()
    at = good.index('name = "user_id"')
    size_line = re.search(r"hash_size = \d+", good[at:])[0]
    spec.write_text(good[:at] + good[at:].replace(size_line, f"hash_size = {size}", 1))
    args = ["preprocess", str(csv), "--spec", str(spec), "--out", str(out)]
    assert_one_line_error(
        runner.invoke(app, args),
        rf"^error: {re.escape(str(spec))}: columns\[0\] \(user_id\): hash_size {size} is over "
        r"9223372036854775807 \(2\^63 - 1\), the most table rows 64-bit ids can number: give a "
        r"smaller one$",
    )
    assert not out.exists()
    spec.write_text(good)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output


def test_a_last_text_file_of_a_header_alone_is_named_as_why_val_and_test_are_empty(
    tmp_path: Path, caplog
):
    """As a Parquet file of a schema alone: the warning said 'the input has too few lines' and
    named 1 file, as a header alone gave its file no task."""
    logs = tmp_path / "logs"
    logs.mkdir()
    rows = "".join(f"{i % 2},{['paris', 'oslo', 'lima', 'rome'][i % 4]}\n" for i in range(200))
    (logs / "part-0.csv").write_text("click,city\n" + rows)
    (logs / "part-1.csv").write_text("click,city\n")
    spec = tmp_path / "csv.toml"
    spec.write_text(
        '[format]\nkind = "csv"\nheader = true\n[[columns]]\nname = "click"\nrole = "label"\n'
        '[[columns]]\nname = "city"\nrole = "categorical"\nhash_size = 10\n'
    )
    inputs = [str(logs / "part-0.csv"), str(logs / "part-1.csv")]
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        done = runner.invoke(
            app, ["preprocess", *inputs, "--spec", str(spec), "--out", str(tmp_path / "d")]
        )
    assert done.exit_code == 0, done.output
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{', '.join(inputs)}: split val and test holds no rows: the last file, part-1.csv, holds "
        "no data lines after its header, and of 2 files the last is the one halved into val and "
        "test, every other a training day (rows kept: train 200, val 0, test 0); remove it, or "
        "give it the rows of the day it stands for"
    ]


def test_an_empty_last_parquet_file_is_named_as_why_val_and_test_are_empty(tmp_path: Path, caplog):
    """The warning said 'the input has too few lines' of a folder whose last file (the one halved
    into val and test) is a Parquet file of a schema alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    logs = tmp_path / "logs"
    logs.mkdir()
    table = pa.table({"click": [0, 1] * 100, "city": ["paris", "oslo", "lima", "rome"] * 50})
    pq.write_table(table, logs / "part-0.parquet")
    pq.write_table(table.slice(0, 0), logs / "part-1.parquet")
    spec = tmp_path / "pq.toml"
    spec.write_text(
        '[format]\nkind = "parquet"\n[[columns]]\nname = "click"\nrole = "label"\n'
        '[[columns]]\nname = "city"\nrole = "categorical"\nhash_size = 10\n'
    )
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        done = runner.invoke(
            app, ["preprocess", str(logs), "--spec", str(spec), "--out", str(tmp_path / "d")]
        )
    assert done.exit_code == 0, done.output
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{logs}: split val and test holds no rows: the last file, part-1.parquet, holds no rows, "
        "and of 2 files the last is the one halved into val and test, every other a training day "
        "(rows kept: train 200, val 0, test 0); remove it, or give it the rows of the day it "
        "stands for"
    ]
