"""A click log written by pandas' `to_csv(na_rep="NA")` (R's `NA`, a MySQL dump's `\\N`) is read
with `[format] missing = ["NA"]` as the same log written with empty fields: preprocessing makes the
same part files (plain, .gz), and `predict` gives its raw rows the same probabilities. Before, the
key was unknown (`unknown key 'missing'`), and without it every row with `NA` in a number column
was a malformed row (`bad_integer`, `bad_float`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import cli
from test_spec_flow import write_untrained_model

SPEC = """[format]
kind = "csv"
header = true
{missing}
[[columns]]
name = "click"
role = "label"
[[columns]]
name = "n"
role = "dense"
[[columns]]
name = "price"
role = "dense"
type = "float"
[[columns]]
name = "city"
role = "categorical"
hash_size = 16
[[columns]]
name = "user_id"
role = "categorical"
kind = "integer"
hash_size = 64
[[columns]]
name = "tags"
role = "list"
hash_size = 16
"""


def _frame(rows: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "click": rng.integers(0, 2, rows),
            "n": pd.array(rng.integers(0, 50, rows), dtype="Int64"),
            "price": np.round(rng.random(rows) * 100, 2),
            "city": rng.choice(["paris", "rome", "oslo"], rows).astype(object),
            "user_id": pd.array(rng.integers(0, 1000, rows), dtype="Int64"),
            "tags": rng.choice(["a|b", "b", "c|a|b"], rows).astype(object),
        }
    )
    for column, every in (("n", 5), ("price", 7), ("city", 9), ("user_id", 11), ("tags", 13)):
        df.loc[:: every, column] = None  # fmt: skip
    return df


def _parts(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("*/part-*"))}


@pytest.mark.parametrize("word", ["NA", "\\N", "null"])
def test_words_for_a_missing_value_read_as_empty_fields_in_preprocess_and_predict(
    tmp_path: Path, word: str
) -> None:
    df = _frame()
    empty, written = tmp_path / "empty.csv", tmp_path / "written.csv"
    df.to_csv(empty, index=False)
    df.to_csv(written, index=False, na_rep=word)
    assert f",{word}," in written.read_text()
    packed = tmp_path / "written.csv.gz"
    packed.write_bytes(gzip.compress(written.read_bytes()))
    plain, given = tmp_path / "plain.toml", tmp_path / "given.toml"
    plain.write_text(SPEC.format(missing=""))
    given.write_text(SPEC.format(missing=f"missing = [{json.dumps(word)}]"))
    cli("preprocess", empty, "--spec", plain, "--out", tmp_path / "from_empty")
    cli("preprocess", written, "--spec", given, "--out", tmp_path / "from_words")
    cli("preprocess", packed, "--spec", given, "--out", tmp_path / "from_gz")
    want = _parts(tmp_path / "from_empty")
    assert want and _parts(tmp_path / "from_words") == want == _parts(tmp_path / "from_gz")
    # The model's spec holds the key: its raw rows score as the emptied ones do.
    model = tmp_path / "m.safetensors"
    write_untrained_model(tmp_path / "from_words", model)
    for flags in ((), ("--no-label",)):
        for rows, out in ((empty, "p_empty.txt"), (written, "p_words.txt")):
            cli("predict", model, rows, "--out", tmp_path / out, *flags)
        scores = (tmp_path / "p_words.txt").read_bytes()
        assert scores and scores == (tmp_path / "p_empty.txt").read_bytes()
    # Without the key, such a row is malformed, as before; its message gives the key (before, it
    # said `n: 'NA' (bad_integer)` alone).
    res = cli("preprocess", written, "--spec", plain, "--out", tmp_path / "refused", ok=False)
    key = f"[format] missing = [{json.dumps(word)}]"
    assert f"n: {word!r} (a word for a missing value? {key} reads it as one) (bad_integer)" in (
        res.output
    )


def _without_comments(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(True) if not line.startswith("#"))


def _inferred_alike(empty: Path, written: Path, key: str) -> str:
    """spec infer of a log with empty fields and of the same log writing a word for them: the
    second's spec (comments left out) is the first's plus `key`, and each spec preprocesses its
    log into the same part files. Returns the second's spec."""
    for log in (empty, written):
        cli("spec", "infer", log, "--label", "click", "--out", log.with_suffix(".toml"))
    proposed = _without_comments(written.with_suffix(".toml"))
    assert proposed.replace(key, "") == _without_comments(empty.with_suffix(".toml"))
    for log, out in ((empty, "a"), (written, "b")):
        cli("preprocess", log, "--spec", log.with_suffix(".toml"), "--out", log.parent / out)
    assert _parts(empty.parent / "a") == _parts(written.parent / "b")
    return proposed


@pytest.mark.parametrize("word", ["NA", "\\N"])
def test_spec_infer_proposes_the_word_and_its_spec_reads_the_log_as_the_emptied_one(
    tmp_path: Path, word: str
) -> None:
    """Before, `NA` among numbers made a string categorical (with a line saying to empty those
    fields), and `\\N` was not seen at all: both columns were hashed strings."""
    df = _frame()
    empty, written = tmp_path / "empty.csv", tmp_path / "written.csv"
    df.to_csv(empty, index=False)
    df.to_csv(written, index=False, na_rep=word)
    proposed = _inferred_alike(empty, written, f"missing = [{json.dumps(word)}]\n")
    assert f"\nmissing = [{json.dumps(word)}]\n" in proposed
    assert 'name = "n"\nrole = "dense"\ntype = "int"' in proposed


def test_spec_infer_reads_na_among_decimal_commas_as_r_write_csv2_writes_them(
    tmp_path: Path,
) -> None:
    """R's write.csv2 (and a spreadsheet in many locales) writes `;`, decimal commas and `NA`: the
    price column is proposed as float with `[format] missing`, as the log with empty fields is.
    Before, `13,44` was no number to the word's search, so the `NA` went unseen and the price was
    proposed as a list of strings cut at its comma (`13` and `44`)."""
    df = _frame()[["click", "price", "city"]]
    empty, written = tmp_path / "empty.csv", tmp_path / "written.csv"
    df.to_csv(empty, index=False, sep=";", decimal=",")
    df.to_csv(written, index=False, sep=";", decimal=",", na_rep="NA")
    proposed = _inferred_alike(empty, written, 'missing = ["NA"]\n')
    assert 'decimal = ","\nmissing = ["NA"]\n' in proposed
    assert 'name = "price"\nrole = "dense"\ntype = "float"' in proposed


def test_a_word_among_strings_alone_is_a_value_its_note_says_how_to_make_it_missing(
    tmp_path: Path,
) -> None:
    log, spec = tmp_path / "log.csv", tmp_path / "log.toml"
    cities = ("\\N", "oslo", "rome")
    rows = [f"{i % 2},{('NA', 'FR')[i % 2]},{cities[i % 3]}\n" for i in range(60)]
    log.write_text("click,country,city\n" + "".join(rows))
    res = cli("spec", "infer", log, "--label", "click", "--out", spec)
    text = spec.read_text()
    assert '\nmissing = ["\\\\N"]\n' in text  # a MySQL dump's NULL is never a value
    assert "'\\N' is a MySQL or Hive dump's NULL" in res.stderr
    # The key it proposes already, with the word added: before, the note said to add a second
    # `missing = ["NA"]` line to [format], which TOML refuses ("Cannot overwrite a value").
    key = 'missing = ["\\\\N", "NA"]'
    assert (
        "# strings; 2 distinct among 60 values (~2 estimated); 'NA' in 30 of 60 rows: a value "
        f"here; if it means a missing one, make [format]'s {key} (then missing in every "
        'column)\n[[columns]]\nname = "country"'
    ) in text
    spec.write_text(text.replace('missing = ["\\\\N"]', key))
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "edited")
    head = json.loads(cli("data", "head", tmp_path / "edited", "-n", "2", "--json").stdout)
    assert head[0]["country"] == 0 < head[1]["country"]  # NA read as missing (id 0), FR an id
    # Where the spec proposes no key, the note gives the whole key.
    log.write_text("click,country,city\n" + "".join(r.replace("\\N", "oslo") for r in rows))
    text = cli("spec", "infer", log, "--label", "click").stdout
    assert 'a missing one, add missing = ["NA"] to [format] (then missing in every column)' in text
