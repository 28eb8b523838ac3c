"""`shardrec spec infer`: the spec it proposes for a plain click log works as it is."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    IgnoredColumn,
    LabelColumn,
    ListColumn,
)
from shardrec.dataloader.spec.spec_file import load_spec


def _ctr_log(path: Path, rows: int = 3000) -> None:
    """The issue's ordinary log: a label, 3 counts, a colour name, a city, a tag list, a row id."""
    rng = np.random.default_rng(1)
    colours = ["red", "green", "blue", "teal", "black"]
    cities = [f"city_{i}" for i in range(300)]
    lines = ["click\tviews\tclicks_7d\tage\tcolour\tcity\ttags\trequest_id"]
    for i in range(rows):
        tags = ",".join(
            rng.choice(["sale", "new", "eco", "kids", "gift"], rng.integers(0, 4), replace=False)
        )
        views = str(rng.integers(0, 500)) if rng.random() > 0.1 else ""
        lines.append(
            f"{int(rng.random() < 0.3)}\t{views}\t{rng.integers(0, 9)}\t{rng.integers(18, 80)}\t"
            f"{rng.choice(colours)}\t{rng.choice(cities)}\t{tags}\treq-{i:08d}-{rng.integers(0, 10**9):09d}"
        )
    path.write_text("\n".join(lines) + "\n")


def test_the_proposed_spec_of_a_plain_click_log_preprocesses_it_as_it_is(tmp_path: Path) -> None:
    log, spec = tmp_path / "clicks.tsv", tmp_path / "clicks.toml"
    _ctr_log(log)
    out = cli("spec", "infer", log, "--label", "click", "--out", spec).stdout
    # Whitespace aside: the console wraps a long temporary path (pytest-xdist's are longer)
    # anywhere.
    expected = f"wrote {spec}: 8 columns (3 dense, 2 categorical, 1 list, 1 ignore)"
    assert "".join(out.split()) == "".join(expected.split())
    proposed = load_spec(spec)
    assert proposed.format.kind == "tsv" and proposed.format.header
    assert proposed.columns[0] == LabelColumn("click")
    assert proposed.columns[1] == DenseColumn("views", transform="log1p")
    assert (
        isinstance(proposed.columns[4], CategoricalColumn) and proposed.columns[4].kind == "string"
    )
    assert isinstance(proposed.columns[6], ListColumn) and proposed.columns[6].separator == ","
    assert proposed.columns[7] == IgnoredColumn("request_id")
    assert "# values cut by ','" in spec.read_text()
    res = json.loads(
        cli(
            "preprocess", log, "--spec", spec, "--out", tmp_path / "d", "--workers", "2", "--json"
        ).stdout
    )
    assert res["rows_skipped"] == {} and sum(res["rows_kept"].values()) == 3000
    manifest = Manifest.load(tmp_path / "d")
    assert manifest.feature_names == ["colour", "city", "tags"] and manifest.dense_features == [
        "views",
        "clicks_7d",
        "age",
    ]


def test_a_carriage_return_inside_a_field_is_data_to_infer_and_to_preprocess(
    tmp_path: Path,
) -> None:
    """A stray \\r inside an unquoted text field (pasted from another system): before, infer
    ended in csv's traceback ('_csv.Error: new-line character seen in unquoted field') though
    preprocess keeps the row, the \\r in its value; and preprocess ended in the same traceback
    where such a row was malformed, instead of its one line."""
    log, spec = tmp_path / "clicks.csv", tmp_path / "clicks.toml"
    rows = [f"{i % 2},item{i % 40},{i}" for i in range(300)]
    rows[200] = "1,bad\rvalue,7"
    log.write_text("click,name,views\n" + "\n".join(rows) + "\n")
    out = cli("spec", "infer", log, "--label", "click", "--out", spec).stdout
    assert "".join(out.split()) == "".join(
        f"wrote {spec}: 3 columns (1 dense, 1 categorical)".split()
    )
    name = load_spec(spec).columns[1]
    assert isinstance(name, CategoricalColumn) and name.name == "name" and name.kind == "string"
    res = json.loads(
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d", "--json").stdout
    )
    assert res["rows_skipped"] == {} and sum(res["rows_kept"].values()) == 300
    with log.open("a") as f:
        f.write("1,bad\rvalue,7,extra\n")
    assert_one_line_error(
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d2", ok=False),
        rf"first: {log}:302: row: 4 fields, the spec has 3 \(too_many_fields\); correct the "
        r'row, give each field a \[\[columns\]\] table \(role = "ignore" to leave one out\), '
        r"or skip such rows with --max-skipped-fraction 0\.0034$",
    )


def test_utf16_text_and_a_binary_file_are_refused_in_one_line(tmp_path: Path) -> None:
    """A spreadsheet's "Unicode text" (UTF-16) and a binary file: before, infer proposed columns
    of their bytes ("no column 'label' for the label (columns: " then 'label,name' decoded a byte
    at a time) and preprocess --spec listed them as the header's, kilobytes of a binary file in
    one line."""
    text = "click,name\n" + "".join(f"{i % 2},item{i}\n" for i in range(50))
    spec = tmp_path / "clicks.toml"
    (tmp_path / "clicks.csv").write_text(text)
    cli("spec", "infer", tmp_path / "clicks.csv", "--label", "click", "--out", spec)
    wide, binary = tmp_path / "wide.csv", tmp_path / "blob.csv"
    wide.write_bytes(text.encode("utf-16"))
    binary.write_bytes(b"\x7fELF\x02\x01\x00\x00\n" * 3)
    for file, said in (
        (wide, f"{wide}: UTF-16 text; shardrec reads UTF-8: convert it first (iconv -f UTF-16 -t "
         f"UTF-8 {wide} > wide-utf8.csv)"),
        (binary, f"{binary}:1: a NUL byte: not CSV or TSV text (a binary file?)"),
    ):  # fmt: skip
        pattern = "^error: " + re.escape(said) + "$"
        assert_one_line_error(cli("spec", "infer", file, "--label", "click", ok=False), pattern)
        refused = cli("preprocess", file, "--spec", spec, "--out", tmp_path / "d", ok=False)
        assert_one_line_error(refused, pattern)


def test_a_headerless_criteo_log_gets_a_spec_by_position(tmp_path: Path) -> None:
    cli("synth", tmp_path / "raw", "--rows", "2000", "--seed", "7", "--max-vocab", "300")
    spec = tmp_path / "c.toml"
    cli("spec", "infer", tmp_path / "raw" / "train.txt", "--label", "0", "--out", spec)
    proposed = load_spec(spec)
    assert (
        not proposed.format.header and proposed.format.min_fields == 38
    )  # trailing empty fields stripped
    assert proposed.label.name == "c0" and len(proposed.dense) == 13 and len(proposed.sparse) == 26
    assert {c.kind for c in proposed.sparse} == {"hex"}
    res = json.loads(
        cli(
            "preprocess", tmp_path / "raw", "--spec", spec, "--out", tmp_path / "d", "--json"
        ).stdout
    )
    assert res["rows_skipped"] == {} and sum(res["rows_kept"].values()) == 2000


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (
            "rating",
            r"label column 'rating' holds values other than 0 and 1 \(e.g. \['1', '2', '3', '4', "
            r"'5'\]; they run 1 to 5, median \d\); give the threshold at which a row counts as 1, "
            r"e.g. --label 'rating>=\d'$",
        ),
        (
            "genres>=4",
            r"label column 'genres' holds values that are not numbers \(e.g. \[.*\]\); a "
            r"threshold compares numbers: give the label column without one$",
        ),
        ("ratng>=4", r"no column 'ratng' for the label \(columns: .*\); did you mean rating\?$"),
        (
            "rating>4",
            r"^error: --label 'rating>4': a threshold is written NAME>=NUMBER \(label 1 where the "
            r"value is >= it\); use --label 'rating>=5' \(the same for whole numbers\)$",
        ),
        (  # before: "use --label 'rating=>=5' (the same for whole numbers)"
            "rating=>4",
            r"^error: --label 'rating=>4': a threshold is written NAME>=NUMBER \(label 1 where the "
            r"value is >= it\); use --label 'rating>=4'$",
        ),
        (  # before: "use a spec's label mapping (...) for one value": the others malformed rows
            "rating==4",
            r"^error: --label 'rating==4': a threshold is written NAME>=NUMBER \(label 1 where the "
            r"value is >= it\); use a label mapping in the spec for label 1 where rating == 4: one "
            r'that lists every value of rating, "4" as 1 and every other as 0 \(mapping = \{ '
            r'"4" = 1, "OTHER" = 0, \.\.\. \}\); a value it does not list makes its row malformed$',
        ),
        (  # before: "use --label 'rating>=4'", which gives every row the opposite label
            "rating<4",
            r"^error: --label 'rating<4': .*; use a label mapping in the spec for label 1 where "
            r"rating < 4: one that lists every value of rating, each value < 4 as 1 and every "
            r"other as 0 \(mapping = ",
        ),
        ("rating>=four", r"--label 'rating>=four': the threshold after >= must be a number"),
        (
            "rating>=9",
            r"--label 'rating>=9' makes every label 0: it is above every value read \(200 values, "
            r"1 to 5, median \d\); give a threshold within them, e.g. --label 'rating>=\d'$",
        ),
        (
            "rating>=1",
            r"--label 'rating>=1' makes every label 1: it is at or below every value read \(200 "
            r"values, 1 to 5, median \d\); give a threshold within them, e.g. --label 'rating>=\d'$",
        ),
    ],
)
def test_a_label_infer_cannot_use_is_one_line(tmp_path: Path, label: str, message: str) -> None:
    cli("synth", tmp_path / "raw", "--like", "movielens", "--rows", "200")
    assert_one_line_error(
        cli("spec", "infer", tmp_path / "raw" / "train.csv", "--label", label, ok=False), message
    )


def test_a_large_labels_suggested_threshold_pastes_back_as_printed(tmp_path: Path) -> None:
    """Values like 14102100 (a date-hour): the threshold was printed as %g (`hour>=1.41021e+07`),
    below every value, and pasted back it made every label 1. Now it is the whole number, and
    about half the rows are 1."""
    log, spec = tmp_path / "hours.csv", tmp_path / "h.toml"
    hours = [14102100 + (i * 7) % 24 for i in range(300)]
    log.write_text("hour,shop\n" + "".join(f"{h},s{i % 7}\n" for i, h in enumerate(hours)))
    refused = assert_one_line_error(cli("spec", "infer", log, "--label", "hour", ok=False), "")
    assert refused.endswith(
        "they run 14102100 to 14102123, median 14102111); give the threshold at which a row "
        "counts as 1, e.g. --label 'hour>=14102111'"
    ), refused
    cli("spec", "infer", log, "--label", "hour>=14102111", "--out", spec)
    assert "# the label: 1 where hour >= 14102111\n" in spec.read_text()
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d")
    splits = Manifest.load(tmp_path / "d").splits
    got = np.concatenate(
        [_labels(tmp_path / "d" / split / p.name) for split in splits for p in splits[split].parts]
    )
    assert got.tolist() == [int(h >= 14102111) for h in hours]
    assert "label: hour >= 14102111 " in cli("data", "head", tmp_path / "d", "-n", "1").stdout


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_a_mistyped_label_lists_every_column_and_the_one_meant(tmp_path: Path, kind: str) -> None:
    """21 columns: the refusal listed the first 20 with no sign of more, and no "did you mean"."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    names = ["click", *(f"c{i}" for i in range(20))]
    table = pa.table({n: [i % 2 if n == "click" else i for i in range(50)] for n in names})
    log = tmp_path / f"log.{kind}"
    (pq.write_table if kind == "parquet" else pcsv.write_csv)(table, log)
    assert_one_line_error(
        cli("spec", "infer", log, "--label", "clik", ok=False),
        rf"^error: {log}: no column 'clik' for the label \(columns: {', '.join(names)}\); did "
        r"you mean click\?$",
    )
    many = tmp_path / f"many.{kind}"
    wide = pa.table({f"x{i}": [0, 1] for i in range(40)})
    (pq.write_table if kind == "parquet" else pcsv.write_csv)(wide, many)
    assert_one_line_error(
        cli("spec", "infer", many, "--label", "click", ok=False),
        r"\(columns: x0, x1, .*, x29, \.\.\. and 10 more\)$",
    )


def test_a_parquet_labels_threshold_above_every_value_is_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    log = tmp_path / "log.parquet"
    pq.write_table(pa.table({"rating": [1.5, 2.0, 4.5] * 10, "city": ["a", "b", "c"] * 10}), log)
    assert_one_line_error(
        cli("spec", "infer", log, "--label", "rating>=9", ok=False),
        rf"^error: {log}: --label 'rating>=9' makes every label 0: it is above every value read "
        r"\(30 values, 1.5 to 4.5, median 2\); give a threshold within them, e.g. --label "
        r"'rating>=2'$",
    )


def test_a_label_written_as_0_0_and_1_0_is_read_as_0_and_1(tmp_path: Path) -> None:
    """Labels written as floats (`0.0`, `1.0`, as pandas writes a float column) are 0/1 labels:
    the spec reads them so, and the parts hold the same labels as the log."""
    log, spec = tmp_path / "flab.csv", tmp_path / "f.toml"
    labels = [float(i % 3 == 0) for i in range(300)]
    log.write_text(
        "label,shop,price\n" + "".join(f"{y},s{i % 7},{i % 50}\n" for i, y in enumerate(labels))
    )
    cli("spec", "infer", log, "--label", "label", "--out", spec)
    assert load_spec(spec).columns[0] == LabelColumn("label", threshold=1.0)
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d")
    data = tmp_path / "d"
    splits = Manifest.load(data).splits  # the log's rows in order: train, then val, then test
    got = [_labels(data / split / p.name) for split in splits for p in splits[split].parts]
    assert np.concatenate(got).tolist() == [int(y) for y in labels]


def _labels(path: Path) -> np.ndarray:
    import pyarrow.ipc

    with pyarrow.ipc.open_file(path) as f:
        return f.read_all().column("label").to_numpy()


def test_infer_keeps_an_existing_spec_and_names_a_directorys_file(tmp_path: Path) -> None:
    """The README's flow is infer, edit, preprocess: a second infer must not replace the edited
    spec unless asked; a directory (preprocess reads one) names one of its files."""
    log, spec = tmp_path / "logs" / "clicks.tsv", tmp_path / "clicks.toml"
    log.parent.mkdir()
    _ctr_log(log, rows=200)
    spec.write_text("# edited by hand\n")
    assert_one_line_error(
        cli("spec", "infer", log, "--label", "click", "--out", spec, ok=False),
        rf"^error: {spec}: exists \(edits made to it would be lost\); pass --force to replace it$",
    )
    assert spec.read_text() == "# edited by hand\n"
    cli("spec", "infer", log, "--label", "click", "--out", spec, "--force")
    assert load_spec(spec).columns[0] == LabelColumn("click")
    assert_one_line_error(
        cli("spec", "infer", log.parent, "--label", "click", ok=False),
        rf"^error: {log.parent}: a directory; spec infer reads one file: name one of its files "
        rf"\(e.g. {log}\)$",
    )


def test_unix_times_are_left_out_and_ids_kept(tmp_path: Path) -> None:
    """MovieLens' timestamp would be a ten-million-row table of values seen once: infer ignores it,
    saying why; an id column of the same digits stays a categorical."""
    cli("synth", tmp_path / "raw", "--like", "movielens", "--rows", "300")
    spec = tmp_path / "ml.toml"
    cli("spec", "infer", tmp_path / "raw" / "train.csv", "--label", "rating>=4", "--out", spec)
    proposed = {c.name: c for c in load_spec(spec).columns}
    assert proposed["timestamp"] == IgnoredColumn("timestamp")
    assert (
        "# Unix times (2000-04-25 .. 2000-04-25): later data holds only new values"
        in spec.read_text()
    )
    log = tmp_path / "ids.tsv"
    log.write_text(
        "click\tuser_id\tevent_ts\n"
        + "".join(
            f"{i % 2}\t{1_000_000_000 + i % 20}\t{1_600_000_000_123 + i}\n" for i in range(60)
        )
    )
    spec = tmp_path / "ids.toml"
    cli("spec", "infer", log, "--label", "click", "--out", spec)
    proposed = {c.name: c for c in load_spec(spec).columns}
    assert isinstance(proposed["user_id"], CategoricalColumn)
    assert proposed["event_ts"] == IgnoredColumn("event_ts")
    assert "# Unix times, in milliseconds (2020-09-13 .. 2020-09-13)" in spec.read_text()


def test_avazus_anonymised_integer_columns_are_categoricals(tmp_path: Path) -> None:
    """Avazu's C14-C21 are categoricals written as integers (C20 mostly -1): by their C<n> names
    infer makes them string categoricals, saying why, not log1p'd quantities."""
    cli("synth", tmp_path / "raw", "--like", "avazu", "--rows", "500")
    spec = tmp_path / "av.toml"
    cli("spec", "infer", tmp_path / "raw" / "train.csv", "--label", "click", "--out", spec)
    proposed = {c.name: c for c in load_spec(spec).columns}
    for name in ("C1", *(f"C{i}" for i in range(14, 22))):
        assert isinstance(proposed[name], CategoricalColumn) and proposed[name].kind == "string", (
            proposed[name]
        )
    assert "# codes (leading zeros, an id's or a C<n> name, or one width); " in spec.read_text()
    assert proposed["id"] == IgnoredColumn("id") and isinstance(proposed["banner_pos"], DenseColumn)


def test_the_label_hints_name_a_label_that_works(tmp_path: Path) -> None:
    cli("synth", tmp_path / "raw", "--like", "movielens", "--rows", "200")
    for label in ("rating>=4", "rating>=5"):  # the first hint's, and the >= of 'rating>4'
        cli("spec", "infer", tmp_path / "raw" / "train.csv", "--label", label)


def test_a_two_valued_text_label_gets_a_mapping_and_a_decimal_comma_csv_its_format(
    tmp_path: Path,
) -> None:
    """A semicolon CSV from a spreadsheet: decimal commas, a yes/no label. The proposed spec reads
    it as it is, and states the rows it read."""
    rng = np.random.default_rng(3)
    lines = ["clicked;price;visits;country"]
    for _ in range(200):
        lines.append(
            f"{rng.choice(['yes', 'no', 'no'])};{rng.integers(0, 99)},{rng.integers(0, 99):02d};"
            f"{rng.integers(0, 40)};{rng.choice(['de', 'at', 'ch'])}"
        )
    log, spec = tmp_path / "eu.csv", tmp_path / "eu.toml"
    log.write_text("\n".join(lines) + "\n")
    cli("spec", "infer", log, "--label", "clicked", "--out", spec)
    text = spec.read_text()
    assert text.startswith(
        "# Feature spec proposed by `shardrec spec infer eu.csv --label 'clicked'` from its 200 rows "
        "(the whole file).\n"
    )
    proposed = load_spec(spec)
    fmt = proposed.format
    assert (fmt.kind, fmt.delimiter, fmt.decimal, fmt.header) == ("csv", ";", ",", True)
    assert proposed.columns[0] == LabelColumn("clicked", mapping={"yes": 1, "no": 0})
    assert "# the label: 1 where clicked is 'yes', 0 where 'no' (by their words)" in text
    assert proposed.columns[1] == DenseColumn("price", type="float", transform="log1p")
    res = json.loads(
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d", "--json").stdout
    )
    assert res["rows_skipped"] == {}
    (first,) = json.loads(cli("data", "head", tmp_path / "d", "--rows", "1", "--json").stdout)
    price = float(lines[1].split(";")[1].replace(",", "."))
    assert first["price"] == pytest.approx(np.log1p(price), rel=1e-6)
    assert first["label"] == int(lines[1].startswith("yes"))
    # The first 10 rows of a longer file: the preamble says so.
    cli("spec", "infer", log, "--label", "clicked", "--rows", "10", "--out", spec, "--force")
    assert "from its first 10 rows.\n" in spec.read_text().splitlines(keepends=True)[0]


def _blocks_keys(toml_text: str) -> dict[str, list[str]]:
    """A spec's [format] and each column ([[columns]], by name) -> its keys, in the order
    written (comments dropped)."""
    keys: dict[str, list[str]] = {}
    for block in toml_text.split("\n\n"):
        lines = [line for line in block.splitlines() if line and not line.startswith("#")]
        if not lines or lines[0] not in ("[format]", "[[columns]]"):
            continue
        written = [line.split(" = ", 1)[0] for line in lines[1:]]
        name = next(line for line in lines if line.startswith("name = ") or line == "[format]")
        keys[name.removeprefix("name = ").strip('"')] = written
    return keys


def test_the_readme_spec_example_has_the_keys_infer_writes(tmp_path: Path) -> None:
    """The README's example of a proposed spec ("Your own data") shows each of its blocks with
    the keys `spec infer` writes for MovieLens, in its order (it lacked `table = ""`)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Your own data\n", 1)[1].split("\n### ", 1)[0]
    shown = _blocks_keys(section.split("```toml\n", 1)[1].split("```", 1)[0])
    cli("synth", tmp_path / "raw", "--like", "movielens", "--rows", "300")
    spec = tmp_path / "ml.toml"
    cli("spec", "infer", tmp_path / "raw" / "train.csv", "--label", "rating>=4", "--out", spec)
    written = _blocks_keys(spec.read_text())
    assert set(shown) == {"[format]", "rating", "zip", "genres"}
    assert {name: written[name] for name in shown} == shown
