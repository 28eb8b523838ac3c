"""A CSV whose rows, not its header, end with the delimiter (`1,paris,3,`, as some writers add):
spec infer proposes a column for the empty field past the header's names; a spec without one is
refused in one line that says which column to add, and the refusal leaves no folder behind.

Before, infer proposed the header's 3 columns alone, and preprocess with that spec said "no rows
kept, all 40 lines are malformed (too_many_fields 40); first: log.csv:2: row: 4 fields, the spec
has 3 (too_many_fields)", leaving OUT/.work, so the fixed spec's rerun into the same --out was
refused: "holds a run with different spec, spec_sha256; remove the directory or choose another
--out"."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import assert_one_line_error, cli, click_city_spec

SPEC = click_city_spec(hash_size=100) + '\n[[columns]]\nname = "n"\nrole = "dense"\n'


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "log.csv"
    log.write_text("click,city,n\n" + "".join(f"{i % 2},c{i % 7},{i},\n" for i in range(40)))
    return log


def test_infer_proposes_a_column_for_the_field_past_the_header(tmp_path: Path) -> None:
    log = _log(tmp_path)
    cli("spec", "infer", log, "--label", "click", "--out", tmp_path / "s.toml")
    assert (
        '# empty in all 40 rows; the header names 3 fields, the rows have 4\n[[columns]]\nname = "c_3"'
        '\nrole = "ignore"\nposition = 3\n'
    ) in (tmp_path / "s.toml").read_text()
    cli("preprocess", log, "--spec", tmp_path / "s.toml", "--out", tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sum(s["rows"] for s in manifest["splits"].values()) == 40


def test_a_spec_without_it_is_refused_in_one_line_leaving_nothing_behind(tmp_path: Path) -> None:
    log, spec, out = _log(tmp_path), tmp_path / "s.toml", tmp_path / "out"
    spec.write_text(SPEC)
    refused = cli("preprocess", log, "--spec", spec, "--out", out, ok=False)
    assert_one_line_error(
        refused,
        "^error: "
        + re.escape(
            f"{log}: no rows kept, all 40 lines are malformed (too_many_fields 40); first: "
            f"{log}:2: row: 4 fields, the spec has 3, the last one empty (the row ends with ','); "
            'add a column of role = "ignore" at position = 3 (too_many_fields)'
        )
        + "$",
    )
    assert not out.exists()
    # A folder that was there before keeps what it held, and nothing else.
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    cli("preprocess", log, "--spec", spec, "--out", out, ok=False)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    spec.write_text(SPEC + '\n[[columns]]\nname = "end"\nrole = "ignore"\nposition = 3\n')
    cli("preprocess", log, "--spec", spec, "--out", out)
    assert (out / "manifest.json").is_file()
