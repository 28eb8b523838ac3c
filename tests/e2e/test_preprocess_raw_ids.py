"""`shardrec preprocess --raw-ids`: chosen categoricals kept as the 64-bit ids they are written
as (no modulo), the others hashed as they always were, statistics for the row-budget proposal."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from helpers import assert_one_line_error
from test_preprocess_cli import all_rows, cli, reference_rows

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.tools.synth.drift import write_drift


def _hex_values(path: Path, column: int) -> list[int]:
    """The column's values as written (hex), MISSING_KEY where empty."""
    out = []
    for line in path.read_text().splitlines():
        fields = line.split("\t") + [""] * 40
        out.append(int(fields[column], 16) if fields[column] else MISSING_KEY)
    return out


def test_raw_ids_keep_the_values_as_written_and_the_rest_as_hashed(tmp_path: Path) -> None:
    days, _ = write_drift(tmp_path / "raw", 1400, seed=2, days=1, max_vocab=2000)
    raw, hashed = tmp_path / "raw-ids", tmp_path / "hashed"
    cli("preprocess", days[0], "--out", raw, "--max-ids", "500", "--raw-ids", "C2,C7")
    cli("preprocess", days[0], "--out", hashed, "--max-ids", "500")
    manifest = Manifest.load(raw)
    kinds = {f.name: (f.ids, f.cardinality, f.dtype) for f in manifest.sparse_features}
    assert kinds["C2"] == ("raw", 0, "uint64") and kinds["C7"] == ("raw", 0, "uint64")
    assert kinds["C1"] == ("", 500, "uint16")
    assert manifest.options["raw_ids"] == ["C2", "C7"]
    written = {c: _hex_values(days[0], 13 + int(c[1:])) for c in ("C2", "C7")}
    rows = sum(p.rows for p in manifest.splits["train"].parts)
    for name, values in written.items():
        kept = np.concatenate([p.sparse[name] for p in open_split(raw, "train")])
        assert kept.tolist() == values[:rows]
    assert written["C2"].count(MISSING_KEY) > 0 or written["C7"].count(MISSING_KEY) > 0
    # The other features: the bytes hashing mode always gave them.
    expected = np.stack([r[2] for r in reference_rows(days[0], 500)])[:rows]
    _, _, sparse = all_rows(hashed, "train")
    np.testing.assert_array_equal(sparse, expected)
    for f in range(26):
        if f not in (1, 6):
            got = np.concatenate([p.sparse[f"C{f + 1}"] for p in open_split(raw, "train")])
            np.testing.assert_array_equal(got, expected[:, f])
    stats = manifest.feature("C2").stats
    counts = stats["count_of_counts"]
    assert sum(ids for _, _, ids, _ in counts) == stats["distinct_ids"]
    assert sum(lookups for _, _, _, lookups in counts) == stats["lookups"]
    head = json.loads(cli("data", "head", raw, "-n", "1", "--json").stdout)
    assert head[0]["C2"] in (str(written["C2"][0]), None)
    # The table shows a hex raw id as the log wrote it (JSON: its integer, as a string).
    fields = days[0].read_text().splitlines()[0].split("\t") + [""] * 40
    for name, column in (("C2", 15), ("C7", 20)):
        (row,) = [
            line
            for line in cli("data", "head", raw, "-n", "1").stdout.splitlines()
            if f"{name} (raw, hex)" in line
        ]
        assert row.split()[-2] == (fields[column] or "None"), row
    assert cli("data", "verify", raw).exit_code == 0
    # The tables people read say what a raw-id feature's size is: none, the table decides.
    again = tmp_path / "again"
    printed = cli("preprocess", days[0], "--out", again, "--max-ids", "500", "--raw-ids", "C2,C7")
    for text in (printed.stdout, cli("data", "stats", raw).stdout):
        (row,) = [line for line in text.splitlines() if re.search(r"\bC2\b", line)]
        assert "raw ids" in row, text


def test_a_raw_id_setting_that_cannot_be_is_one_line(tmp_path: Path) -> None:
    days, _ = write_drift(tmp_path / "raw", 300, seed=2, days=1, max_vocab=200)
    result = cli("preprocess", days[0], "--out", tmp_path / "a", "--raw-ids", "C2,X9", ok=False)
    assert_one_line_error(result, "--raw-ids C2,X9: no sparse feature 'X9'")
    result = cli(
        "preprocess", days[0], "--out", tmp_path / "b", "--raw-ids", "C2", "--min-count", "2",
        ok=False,
    )  # fmt: skip
    assert_one_line_error(result, "--raw-ids keeps ids as they are")
    reserved = tmp_path / "reserved.txt"
    line = days[0].read_text().splitlines()[0].split("\t")
    line[14] = "8000000000000000"
    reserved.write_text("\t".join(line) + "\n")
    result = cli("preprocess", reserved, "--out", tmp_path / "c", "--raw-ids", "C1", ok=False)
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(reserved))}:1: C1: 8000000000000000 \(this raw id marks an empty field",
    )


def test_data_head_shows_a_16_digit_hex_id_with_its_leading_zeros(tmp_path: Path) -> None:
    days, _ = write_drift(tmp_path / "raw", 300, seed=2, days=1, max_vocab=200)
    lines = days[0].read_text().splitlines()
    fields = lines[0].split("\t")
    fields[13 + 4] = "05d7928af8558719"  # C4, as 16 digits, a leading zero
    days[0].write_text("\n".join(["\t".join(fields), *lines[1:]]) + "\n")
    cli("preprocess", days[0], "--out", tmp_path / "d", "--raw-ids", "all")
    (row,) = [
        line
        for line in cli("data", "head", tmp_path / "d", "-n", "1").stdout.splitlines()
        if "C4 (raw, hex)" in line
    ]
    assert row.split()[-2] == "05d7928af8558719", row


def test_data_head_json_writes_raw_64_bit_ids_as_strings_no_reader_rounds(tmp_path: Path) -> None:
    """JSON readers hold numbers as doubles: jq and JavaScript read 8312711846037992141 as
    8312711846037992000. A raw-id column's ids are strings; the hashed ones stay numbers."""
    days, _ = write_drift(tmp_path / "raw", 300, seed=2, days=1, max_vocab=200)
    lines = days[0].read_text().splitlines()
    fields = lines[0].split("\t")
    fields[13 + 4] = "735caf619f46b2cd"  # C4: 8312711846037992141, above 2**53
    days[0].write_text("\n".join(["\t".join(fields), *lines[1:]]) + "\n")
    cli("preprocess", days[0], "--out", tmp_path / "d", "--raw-ids", "C4")
    text = cli("data", "head", tmp_path / "d", "-n", "1", "--json").stdout
    assert '"C4": "8312711846037992141"' in text, text
    (first,) = json.loads(text, parse_int=float)  # as a reader of doubles sees it
    assert first["C4"] == "8312711846037992141" and isinstance(first["C1"], float)
    (row,) = [
        line
        for line in cli("data", "head", tmp_path / "d", "-n", "1").stdout.splitlines()
        if "C4 (raw, hex)" in line
    ]
    assert row.split()[-2] == "735caf619f46b2cd", row  # the table keeps the log's hex


def test_a_folder_made_with_raw_ids_names_them_when_a_rerun_has_none(tmp_path: Path) -> None:
    """The setting only one of the two runs has is the one that differs: it is named, with what
    each side holds, and the folder is left as it was."""
    days, _ = write_drift(tmp_path / "raw", 600, seed=2, days=1, max_vocab=2000)
    out = tmp_path / "days"
    cli("preprocess", days[0], "--out", out, "--raw-ids", "all")
    manifest = (out / "manifest.json").read_bytes()
    result = cli("preprocess", days[0], "--out", out, ok=False)
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(out))}: holds a run with different raw_ids \(all in the folder, "
        r"not given now\); remove the directory or choose another --out$",
    )
    assert (out / "manifest.json").read_bytes() == manifest
    plain = tmp_path / "plain"
    cli("preprocess", days[0], "--out", plain)
    result = cli("preprocess", days[0], "--out", plain, "--raw-ids", "C2", ok=False)
    assert_one_line_error(result, r"different raw_ids \(not in the folder's run, C2 now\)")


def test_a_raw_id_name_no_feature_has_lists_the_features_as_the_other_refusals_do(
    tmp_path: Path,
) -> None:
    """Before, the refusal listed the first 6 features and '...': a spec's 40 features are named
    as `spec infer`'s label refusal names columns, the first 30 and how many more."""
    columns = ['[[columns]]\nname = "click"\nrole = "label"\n'] + [
        f'[[columns]]\nname = "f{i}"\nrole = "categorical"\nhash_size = 10\n' for i in range(40)
    ]
    spec = tmp_path / "wide.toml"
    spec.write_text('[format]\nkind = "csv"\nheader = true\n' + "".join(columns))
    log = tmp_path / "wide.csv"
    names = [f"f{i}" for i in range(40)]
    log.write_text(",".join(["click", *names]) + "\n" + "1," + ",".join("7" * 40) + "\n")
    args = ["preprocess", log, "--spec", spec, "--out", tmp_path / "d", "--raw-ids", "f5x"]
    shown = f"(the features: {', '.join(names[:30])}, ... and 10 more); did you mean f5?"
    assert_one_line_error(cli(*args, ok=False), re.escape(shown) + "$")


def test_data_head_shows_a_negative_integer_raw_id_as_written(tmp_path: Path) -> None:
    """Integer ids are kept in two's complement: the log's -47 is shown (and written to JSON) as
    -47, not as 2^64 - 47, so that it joins with the user's own tables."""
    (tmp_path / "log.csv").write_text(
        "label,uid,tags\n" + "1,-47,-1|5\n0,999999999999999999,\n1,,7\n" * 4
    )
    (tmp_path / "spec.toml").write_text(
        '[format]\nkind = "csv"\nheader = true\n\n'
        '[[columns]]\nname = "label"\nrole = "label"\n\n'
        '[[columns]]\nname = "uid"\nrole = "categorical"\nkind = "integer"\n\n'
        '[[columns]]\nname = "tags"\nrole = "list"\nkind = "integer"\n'
    )
    out = tmp_path / "d"
    cli("preprocess", tmp_path / "log.csv", "--spec", tmp_path / "spec.toml", "--out", out,
        "--raw-ids", "all")  # fmt: skip
    rows = json.loads(cli("data", "head", out, "-n", "3", "--json").stdout)
    assert [(r["uid"], r["tags"]) for r in rows] == [
        ("-47", ["-1", "5"]),
        ("999999999999999999", []),
        (None, ["7"]),
    ]
    (row,) = [
        line for line in cli("data", "head", out, "-n", "1").stdout.splitlines() if "uid" in line
    ]
    assert row.split()[-2] == "-47", row


def test_data_head_shows_a_parquet_uint64_raw_id_unsigned(tmp_path: Path) -> None:
    """A Parquet uint64 column's ids (64-bit hashes as ids) are shown as the file holds them,
    an int64 column's -1 as -1. Before, both read -1: 18446744073709551615 was shown with a sign,
    which joins with nothing in the user's own tables."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    top = 2**64 - 1
    pq.write_table(
        pa.table(
            {
                "label": [1, 0, 1] * 4,
                "uid": pa.array([top, 2**63 + 1, 5] * 4, pa.uint64()),
                "sid": pa.array([-1, -(2**63) + 1, 5] * 4, pa.int64()),
                "tags": pa.array([[top, 1], [], [2**63 + 1]] * 4, pa.list_(pa.uint64())),
            }
        ),
        tmp_path / "log.parquet",
    )
    (tmp_path / "spec.toml").write_text(
        '[format]\nkind = "parquet"\n\n[[columns]]\nname = "label"\nrole = "label"\n\n'
        '[[columns]]\nname = "uid"\nrole = "categorical"\nkind = "integer"\n\n'
        '[[columns]]\nname = "sid"\nrole = "categorical"\nkind = "integer"\n\n'
        '[[columns]]\nname = "tags"\nrole = "list"\nkind = "integer"\n'
    )
    out = tmp_path / "d"
    cli("preprocess", tmp_path / "log.parquet", "--spec", tmp_path / "spec.toml", "--out", out,
        "--raw-ids", "all")  # fmt: skip
    rows = json.loads(cli("data", "head", out, "-n", "3", "--json").stdout)
    assert [(r["uid"], r["sid"], r["tags"]) for r in rows] == [
        (str(top), "-1", [str(top), "1"]),
        (str(2**63 + 1), str(-(2**63) + 1), []),
        ("5", "5", [str(2**63 + 1)]),
    ]
    (row,) = [
        line for line in cli("data", "head", out, "-n", "1").stdout.splitlines() if "uid" in line
    ]
    assert row.split()[-2] == str(top), row
    # Only raw ids of an unsigned column are marked: other datasets keep their manifests' bytes.
    assert [f.unsigned for f in Manifest.load(out).sparse_features] == [True, False, True]
