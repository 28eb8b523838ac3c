"""Preprocessing bad input (README, Failures and trust: Preprocessing): input that is not rows is
an error, never a 0-row dataset, and an offending value is shown cut to ~80 characters with its
length."""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

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
        rf"first: {re.escape(str(big))}:1: I1: {value} \(bad_integer\)$",
    )
    assert len(line) < 400 and len(res.stdout) < 2000
    assert (
        max(p.stat().st_size for p in (tmp_path / "data" / ".work").glob("task-*.json")) < 2000
    )  # the marker too
    strict = preprocess(big, "--out", tmp_path / "strict", "--strict")
    assert (
        len(
            assert_one_line_error(
                strict, rf"^error: {re.escape(str(big))}:1: I1: {value} \(bad_integer\)$"
            )
        )
        < 400
    )


def test_more_malformed_rows_than_allowed_is_an_error_and_a_higher_limit_accepts_them(
    tmp_path: Path,
):
    raw = write_dataset(tmp_path / "raw", rows=1000, seed=2, max_vocab=300)[0]
    text = raw.read_bytes()
    raw.write_bytes(text + b"oops\n" * 30)  # 30 of 1,030 lines: 2.9%, above the 1% default
    out = tmp_path / "data"
    res = preprocess(raw, "--out", out)
    assert_one_line_error(
        res,
        rf"^error: {re.escape(str(raw))}: 30 of 1,030 lines malformed \(2\.91%: too_few_fields 30\), "
        rf"more than the 0\.01 allowed .*; first: {re.escape(str(raw))}:1001: row: ",
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
