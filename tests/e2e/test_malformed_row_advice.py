"""The one line that refuses a preprocess run for a malformed row (more of them than
--max-skipped-fraction allows, or the first under --strict) ends with what to do about it, by its
reason: what the field reads, and the spec key or flag that would read the value or skip the row;
for Criteo's rows, a CSV read by a spec and a Parquet file alike (tasks/row_advice.py). Before, each
line ended at the row, as `first: log.csv:6: count: '1.5' (bad_integer)`."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_one_line_error, cli

SKIP = "or skip such rows with --max-skipped-fraction 0.05"
STRICT = "or leave out --strict to skip such rows (up to --max-skipped-fraction of them)"
SPEC = """[format]
kind = "{kind}"
{header}
[[columns]]
name = "click"
role = "label"

[[columns]]
name = "count"
role = "dense"

[[columns]]
name = "price"
role = "dense"
type = "float"

[[columns]]
name = "site"
role = "categorical"
kind = "hex"
hash_size = 100

[[columns]]
name = "user"
role = "categorical"
hash_size = 100
"""
CSV_ROWS = [[str(k % 2), str(k), f"{k / 7:.2f}", f"{k + 16:06x}", f"u{k % 3}"] for k in range(20)]


def _refused(log: Path, out: Path, *flags: object) -> str:
    """The one line of a preprocess run refused (exit 1, nothing else on stderr)."""
    return assert_one_line_error(cli("preprocess", log, "--out", out, *flags, ok=False), "")


def _share(log: Path, kind: str, where: str, value: str, reason: str) -> str:
    return (
        f"error: {log}: 1 of 20 {kind} malformed (5.00%: {reason} 1), more than the 0.003 allowed "
        f"(--max-skipped-fraction); first: {log}{where}: {value} ({reason}); "
    )


@pytest.mark.parametrize(
    "field, value, shown, reason, advice",
    [
        (20, "zz12", "C7: 'zz12'", "bad_hex", "C7 reads hex ids of 1 to 16 digits"),
        (3, "NA", "I3: 'NA'", "bad_integer", "I3 reads whole numbers"),
        (0, "x", "label: 'x'", "bad_label", "the label reads 0 or 1 and is never missing"),
    ],
)
def test_criteo_rows(
    tmp_path: Path, field: int, value: str, shown: str, reason: str, advice: str
) -> None:
    rows = [[str(k % 2), *[str(k)] * 13, *[f"{k + 16:08x}"] * 26] for k in range(20)]
    rows[4][field] = value
    log = tmp_path / "train.txt"
    log.write_text("".join("\t".join(r) + "\n" for r in rows))
    missing = "" if reason == "bad_label" else ", a missing value as an empty field"
    assert _refused(log, tmp_path / "o", "--max-ids", 100) == (
        _share(log, "lines", ":5", shown, reason) + f"{advice}{missing}: correct the row {SKIP}"
    )
    if reason == "bad_hex":  # the value it names accepts the row
        flags = ("--max-ids", 100, "--max-skipped-fraction", 0.05)
        done = cli("preprocess", log, "--out", tmp_path / "o", *flags)
        assert "skipped: bad_hex" in done.stdout


def test_criteo_rows_of_too_few_fields_name_min_fields(tmp_path: Path) -> None:
    rows = ["\t".join([str(k % 2), *[str(k)] * 13, *[f"{k:08x}"] * 26]) for k in range(20)]
    rows[4] = "1\t2\t3"
    log = tmp_path / "train.txt"
    log.write_text("\n".join(rows) + "\n")
    assert _refused(log, tmp_path / "o", "--strict") == (
        f"error: {log}:5: row: 3 fields, schema needs at least 37 of 40 (too_few_fields); correct "
        f"the row, lower --min-fields to read a shorter row's missing last fields as empty, {STRICT}"
    )


@pytest.mark.parametrize(
    "column, value, reason, advice",
    [
        (1, "1.5", "bad_integer", 'count reads whole numbers, a missing value as an empty field: '
         'correct the row, give count type = "float" if its values have fractions, '),
        (3, "zz12", "bad_hex", "site reads hex ids of 1 to 16 digits, a missing value as an empty "
         'field: correct the row, give site kind = "string" (any value, hashed), '),
        (0, "x", "bad_label", "the label column click reads 0 or 1 and is never missing: correct "
         "the row, give click a threshold or a mapping of its values, "),
    ],
)  # fmt: skip
def test_a_csv_read_by_a_spec(
    tmp_path: Path, column: int, value: str, reason: str, advice: str
) -> None:
    rows = [list(r) for r in CSV_ROWS]
    rows[4][column] = value
    log, spec = tmp_path / "log.csv", tmp_path / "s.toml"
    log.write_text("click,count,price,site,user\n" + "".join(",".join(r) + "\n" for r in rows))
    spec.write_text(SPEC.format(kind="csv", header="header = true\n"))
    name = ["click", "count", "price", "site", "user"][column]
    first = _share(log, "lines", ":6", f"{name}: {value!r}", reason)
    assert _refused(log, tmp_path / "o", "--spec", spec) == first + advice + SKIP
    strict = f"error: {log}:6: {name}: {value!r} ({reason}); {advice}{STRICT}"
    assert _refused(log, tmp_path / "s", "--spec", spec, "--strict") == strict


def test_a_csv_row_of_too_many_fields_or_an_open_quote(tmp_path: Path) -> None:
    log, spec = tmp_path / "log.csv", tmp_path / "s.toml"
    spec.write_text(SPEC.format(kind="csv", header="header = true\n"))
    lines = ["click,count,price,site,user", *(",".join(r) for r in CSV_ROWS)]
    extra = 'give each field a [[columns]] table (role = "ignore" to leave one out)'
    quote = "give [format] quoting = false if its quotes are part of the values"
    for k, (row, said) in enumerate(
        (
            ("0,4,0.57,000014,u1,9", f"row: 6 fields, the spec has 5 (too_many_fields); {extra}"),
            (
                '0,4,0.57,000014,"u1',
                "user: '\"u1' (its quote is not closed on the line: a line break inside quotes "
                f"is not read) (bad_quote); {quote}",
            ),
        )
    ):
        log.write_text("\n".join([*lines[:5], row, *lines[6:]]) + "\n")
        line = _refused(log, tmp_path / f"o{k}", "--spec", spec, "--strict")
        head, tail = said.split("; ")
        assert line == f"error: {log}:6: {head}; correct the row, {tail}, {STRICT}"


@pytest.mark.parametrize(
    "column, value, shown, reason, advice",
    [
        ("price", math.nan, "price: nan", "bad_float", "price reads finite numbers, a missing "
         "value as null: correct the row "),
        ("count", 1.5, "count: 1.5", "bad_integer", "count reads whole numbers, a missing value "
         'as null: correct the row, give count type = "float" if its values have fractions, '),
        ("click", None, "click: null", "bad_label", "the label column click reads 0 or 1 and is "
         "never missing: correct the row "),
    ],
)  # fmt: skip
def test_a_parquet_file(
    tmp_path: Path, column: str, value: object, shown: str, reason: str, advice: str
) -> None:
    columns = dict(zip(["click", "count", "price", "site", "user"], map(list, zip(*CSV_ROWS))))
    table = {
        "click": [int(v) for v in columns["click"]],
        "count": [float(v) for v in columns["count"]],
        "price": [float(v) for v in columns["price"]],
        "site": columns["site"],
        "user": columns["user"],
    }
    table[column][4] = value
    log, spec = tmp_path / "log.parquet", tmp_path / "s.toml"
    pq.write_table(pa.table(table), log)
    spec.write_text(SPEC.format(kind="parquet", header=""))
    line = _refused(log, tmp_path / "o", "--spec", spec)
    assert line == _share(log, "rows", ": row 5", shown, reason) + advice + SKIP


def test_a_skipped_row_is_shown_as_read_with_the_key_its_word_wants(tmp_path: Path) -> None:
    """A run that skips a row shows it with the key that reads its word as missing. Before, rich
    took "[format]" and a value's "[b]" for markup: "count: 'NA' (a word for a missing value?
    missing = ["NA"] reads it as one)", and "site: 'zz' (bad_hex)" for the value '[b]zz'."""
    rows = [list(CSV_ROWS[k % 20]) for k in range(800)]
    rows[4][1], rows[9][3] = "NA", "[b]zz"
    log, spec = tmp_path / "log.csv", tmp_path / "s.toml"
    log.write_text("click,count,price,site,user\n" + "".join(",".join(r) + "\n" for r in rows))
    spec.write_text(SPEC.format(kind="csv", header="header = true\n"))
    shown = cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o").stdout.splitlines()
    word = '(a word for a missing value? [format] missing = ["NA"] reads it as one)'
    assert f"  {log}:6: count: 'NA' {word} (bad_integer)" in shown
    assert f"  {log}:11: site: '[b]zz' (bad_hex)" in shown


def test_a_spec_of_criteos_shape_names_the_key_for_a_missing_word(tmp_path: Path) -> None:
    """A spec of Criteo's shape (label, integers, hex ids; read by Criteo's parser) names the key
    for `NA`, as any other spec's rows do. Before: "n: 'NA' (bad_integer)" alone."""
    log, spec = tmp_path / "log.tsv", tmp_path / "s.toml"
    rows = [f"{k % 2}\t{k}\t{k + 10:x}" for k in range(20)]
    rows[4] = "1\tNA\tab"
    log.write_text("\n".join(rows) + "\n")
    spec.write_text(
        '[format]\nkind = "tsv"\n\n[[columns]]\nname = "y"\nrole = "label"\n\n[[columns]]\n'
        'name = "n"\nrole = "dense"\n\n[[columns]]\nname = "h"\nrole = "categorical"\n'
        'kind = "hex"\nhash_size = 100\n'
    )
    word = '(a word for a missing value? [format] missing = ["NA"] reads it as one)'
    assert _refused(log, tmp_path / "o", "--spec", spec, "--strict") == (
        f"error: {log}:5: n: 'NA' {word} (bad_integer); n reads whole numbers, a missing value as "
        'an empty field: correct the row, give n type = "float" if its values have fractions, '
        f"{STRICT}"
    )
