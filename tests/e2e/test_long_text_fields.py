"""A text field longer than the csv module's default limit (128 KiB) is read as any other: the
compiled parsers have no limit, and neither have `spec infer` nor the malformed-row messages."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import cli, click_city_spec


def test_a_field_past_csvs_limit_is_inferred_and_reported_not_a_traceback(tmp_path: Path) -> None:
    """Before, both ended in '_csv.Error: field larger than field limit (131072)'."""
    log, spec = tmp_path / "log.csv", tmp_path / "s.toml"
    long = "x" * 200_000
    rows = [
        f"{i % 2},{long if i == 7 else 'c'}{i}" + (",extra" if i == 7 else "") for i in range(400)
    ]
    log.write_text("click,city\n" + "\n".join(rows) + "\n")
    cli("spec", "infer", log, "--label", "click", "--out", tmp_path / "inferred.toml")
    spec.write_text(click_city_spec())
    res = json.loads(
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o", "--json").stdout
    )
    assert res["rows_skipped"] == {"too_many_fields": 1}
    assert res["first_errors"] == [f"{log}:9: row: 3 fields, the spec has 2 (too_many_fields)"]
