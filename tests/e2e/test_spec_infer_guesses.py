"""`spec infer` says in one line the guesses that values alone made and that a wrong one would
train on without a word, with the edit that changes them: integer columns of a file without a
header proposed as dense numbers (an Avazu-shaped log's codes read the same), and a word for a
missing value among numbers (`NA`) proposed as `[format] missing`. The line is
printed (stderr) and written at the top of the spec. Before, neither was said anywhere: the
comments beside the columns read "integers, min 0" and "strings; 62 distinct among 300 values"."""

from __future__ import annotations

import csv
import random
import re
import subprocess
from pathlib import Path

from helpers import assert_one_line_error, cli


def _avazu_rows(rows: int) -> str:
    """Avazu's 24 columns without its header: a unique 20-digit id, click, hour (YYMMDDHH), C1,
    banner_pos, nine 8-character hex ids, device_type, device_conn_type, C14-C21 (decimal codes)."""
    rng = random.Random(0)
    hexes = [
        [f"{rng.getrandbits(32):08x}" for _ in range(rng.choice((5, 50, 400)))] for _ in range(9)
    ]
    lines = []
    for i in range(rows):
        codes = [rng.randint(375, 24052), rng.choice((120, 216, 300, 320, 468, 480, 728)),
                 rng.choice((20, 36, 50, 90, 250, 480)), rng.randint(112, 2758), rng.randint(0, 3),
                 rng.choice((35, 39, 43, 161, 167, 1063)), rng.choice((-1, 100083, 100148)),
                 rng.randint(1, 219)]  # fmt: skip
        lines.append(",".join(map(str, [
            10**19 + i * 7919, rng.randint(0, 1), 14102100 + rng.randint(0, 9) * 100 + rng.randint(0, 23),
            rng.choice((1005, 1002, 1010)), rng.choice((0, 0, 1, 7)), *(rng.choice(h) for h in hexes),
            rng.choice((1, 1, 0, 4)), rng.choice((0, 2, 3)), *codes,
        ])))  # fmt: skip
    return "\n".join(lines) + "\n"


def _run_printed_command(line: str, log: Path) -> Path:
    """The log after the command that the warning `line` prints (`perl ... FILE > NEW_FILE`)."""
    perl = re.search(r"\((perl .*) FILE > NEW_FILE\)", line).group(1)
    emptied = log.with_name(f"emptied{log.suffix}")
    with open(emptied, "wb") as out:
        subprocess.run(f"{perl} {log}", shell=True, stdout=out, check=True)
    return emptied


def _warnings(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning:")]


def test_integer_columns_no_header_names_are_said_to_be_guessed_dense(tmp_path: Path) -> None:
    log, spec = tmp_path / "avazu.csv", tmp_path / "avazu.toml"
    log.write_text(_avazu_rows(2000))
    res = cli("spec", "infer", log, "--label", "1", "--out", spec)
    dense = "c4, c14, c15, c16, c17, c18, c19, c20, c21, c22, c23"
    line = (
        f"{dense}: integer columns that no header names, proposed as dense numbers from their "
        "values alone; one that holds codes (a category written as a number, as Avazu's C14-C21 "
        'or banner_pos) wants role = "categorical", kind = "integer" and a hash_size instead'
    )
    assert _warnings(res)[0] == f"warning: {log}: {line}"
    assert _warnings(res)[1].startswith(f"warning: {log}: c2 (YYMMDDHH, 2014-10-21 00h .. ")
    assert f"\n# {line}\n# c2 (YYMMDDHH, " in spec.read_text()
    # Named by a header, the columns say what they are: nothing is added.
    named = tmp_path / "named.csv"
    named.write_text("label,count,city\n" + "".join(f"{i % 2},{i},c{i % 3}\n" for i in range(60)))
    assert _warnings(cli("spec", "infer", named, "--label", "label")) == []


def test_a_word_for_a_missing_value_among_numbers_is_proposed_with_the_command_for_a_value(
    tmp_path: Path,
) -> None:
    """`NA` among numbers is proposed as `[format] missing`, the column dense; where another column
    holds `NA` too (a country's code, Namibia's), the line says it would read as missing there,
    with the command that empties the number column's fields alone. Before, the column was proposed
    as a string categorical, and the line said that preprocessing reads only an empty field as
    missing."""
    log, spec = tmp_path / "na.csv", tmp_path / "na.toml"
    rows = [
        f"{i % 2},{'NA' if i % 10 == 0 else 18 + i % 50},{i},{('NA', 'FR', 'US')[i % 3]}"
        for i in range(200)
    ]
    log.write_text("click,age,n,country\n" + "\n".join(rows) + "\n")
    res = cli("spec", "infer", log, "--label", "click", "--out", spec)
    (line,) = _warnings(res)
    field = r'(?>"(?:[^"\n]|"")*"|[^,"\n][^,\n]*|)'  # a field, quoted or not
    command = rf"""perl -pe 's{{^((?:{field},){{1}})(?:NA|"NA")(?![^,\r\n])}}{{$1}}'"""
    assert line == (
        f"warning: {log}: [format] missing = [\"NA\"] proposed for age ('NA' in 20 of 200 rows), "
        "numbers but for words for a missing value; it is read as missing in every column: in "
        "country ('NA' in 67 of 200 rows) too; where it is a value there (as NA is a country's "
        "code), take it out of missing and empty the number columns' fields alone instead "
        f"({command} FILE > NEW_FILE), then infer again"
    )
    text = spec.read_text()
    assert '\nmissing = ["NA"]\n' in text
    assert 'name = "age"\nrole = "dense"\ntype = "int"' in text
    # The command as printed makes the column one of numbers with empty fields: dense, no key.
    emptied = _run_printed_command(line, log)
    res = cli("spec", "infer", emptied, "--label", "click", "--out", tmp_path / "e.toml")
    assert _warnings(res) == []
    emptied_spec = (tmp_path / "e.toml").read_text()
    assert 'name = "age"\nrole = "dense"\ntype = "int"' in emptied_spec
    assert "\nmissing =" not in emptied_spec
    # Only that column's fields: before, every field "NA" was emptied, the country's too.
    country = [line.split(",")[3] for line in emptied.read_text().splitlines()]
    assert country == [line.split(",")[3] for line in log.read_text().splitlines()]


def test_a_label_named_for_a_file_without_a_header_says_to_give_its_index(tmp_path: Path) -> None:
    # Before: "no column 'click' for the label (columns: c0, c1, ..., c23)", the names infer
    # gives the fields, with no word that the file has no header or that a field index is taken.
    log = tmp_path / "avazu.csv"
    log.write_text(_avazu_rows(300))
    assert_one_line_error(
        cli("spec", "infer", log, "--label", "click", ok=False),
        rf"^error: {re.escape(str(log))}: no column 'click' for the label: the file has no header "
        r"line, so its columns are known by place, c0 to c23; give the label's field index \(0 for "
        r"the first\), e.g. --label 1 \(0s and 1s\)$",
    )


def test_the_printed_command_counts_a_quoted_field_holding_the_delimiter_as_one(
    tmp_path: Path,
) -> None:
    """A city written `"Paris, France"` before the country and the age: the command empties the
    age's `NA` (quoted too) and leaves the country's. Before, it cut fields at every comma, so in
    those rows it emptied the country's `NA` (Namibia's code, a value) and left the age's."""
    log = tmp_path / "quoted.csv"
    cities = ('"Paris, France"', "Rome", '"Oslo, Norway"')
    ages = ("NA", '"NA"', "31", "47", "52")
    rows = [f"{i % 2},{cities[i % 3]},{('NA', 'FR')[i % 2]},{ages[i % 5]}" for i in range(200)]
    log.write_text("click,city,country,age\n" + "\n".join(rows) + "\n")
    (line,) = _warnings(cli("spec", "infer", log, "--label", "click"))
    emptied = _run_printed_command(line, log)
    before = list(csv.reader(log.open()))
    after = list(csv.reader(emptied.open()))
    assert [r[:3] for r in after] == [r[:3] for r in before]  # the country's NA kept
    assert [r[3] for r in after[1:]] == [("", "", "31", "47", "52")[i % 5] for i in range(200)]
    assert _warnings(cli("spec", "infer", emptied, "--label", "click")) == []


def test_date_codes_proposed_as_categoricals_are_said_in_a_warning(tmp_path: Path) -> None:
    """Avazu's `hour` (YYMMDDHH) in a log sorted by time: the sample's hours are the first of
    many, and the later ones would be ids no row trained on. Before, the column was proposed as a
    categorical without a word (a comment said "codes ... one width"). A YYYYMMDD day is said too;
    codes of one width that are no dates (99999999) are not."""
    log, spec = tmp_path / "hours.csv", tmp_path / "hours.toml"
    rows = [
        f"{i % 2},{14102100 + (i // 100) % 24},{20141021 + (i // 1000) % 9},{90000000 + i % 7 * 1111111}"
        for i in range(3000)
    ]
    log.write_text("click,hour,day,code\n" + "\n".join(rows) + "\n")
    res = cli("spec", "infer", log, "--label", "click", "--out", spec)
    line = (
        "hour (YYMMDDHH, 2014-10-21 00h .. 2014-10-21 23h), day (YYYYMMDD, 2014-10-21 .. "
        "2014-10-23): date codes in the first 3,000 rows, proposed as categoricals: the days and "
        "hours after these (validation, test, the next day's log) are ids no row trained on; "
        "derive an hour of day or a day of week from them before preprocessing, or give them "
        'role = "ignore"'
    )
    assert _warnings(res) == [f"warning: {log}: {line}"]
    text = spec.read_text()
    assert f"\n# {line}\n[format]\n" in text
    assert "; YYMMDDHH codes, 2014-10-21 00h .. 2014-10-21 23h: later ones are ids no row " in text
    assert text.count("codes, 20") == 2  # hour's and day's notes; code's values are no dates
