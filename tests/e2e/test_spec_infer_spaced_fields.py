"""A CSV written `a, b, c` (a space after each delimiter) is refused by `spec infer` in one line
that says how to remove the spaces: preprocessing reads fields as written, so a spec inferred from
it named columns the header does not hold (` price` is no `price`) and read numbers as strings."""

from __future__ import annotations

from pathlib import Path

from helpers import assert_one_line_error, cli


def _write(path: Path, sep: str) -> None:
    rows = [f"{i % 2}{sep}{i % 10 + 0.5}{sep}s{i % 4}" for i in range(200)]
    path.write_text("\n".join([f"click{sep}price{sep}site", *rows]) + "\n")


def test_fields_spaced_after_the_delimiter_are_refused_with_the_fix(tmp_path: Path):
    _write(tmp_path / "log.csv", ", ")
    refused = cli("spec", "infer", tmp_path / "log.csv", "--label", "click", "--out",
                  tmp_path / "s.toml", ok=False)  # fmt: skip
    assert_one_line_error(
        refused,
        r"log.csv: its fields start with a space after ',' \('click, price, site'\); "
        r"preprocessing reads each field as written, so remove the spaces first, e\.g\. "
        r"sed 's/, \*/,/g' .*log.csv > clean.csv$",
    )
    assert not (tmp_path / "s.toml").exists()
    _write(tmp_path / "clean.csv", ",")  # what the sed makes: inferred and preprocessed
    cli("spec", "infer", tmp_path / "clean.csv", "--label", "click", "--out", tmp_path / "s.toml")
    assert 'name = "price"\nrole = "dense"' in (tmp_path / "s.toml").read_text()
    spec, out = tmp_path / "s.toml", tmp_path / "o"
    cli("preprocess", tmp_path / "clean.csv", "--spec", spec, "--out", out)
