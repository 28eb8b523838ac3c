"""`[format] missing`: the words a text log writes for a missing value (R's and pandas' `NA`, a
MySQL dump's `\\N`, `null`) read as an empty field reads, in every kind of column and as a list's
value; a bad setting is one line naming the key. Before, the key was unknown, and such a word was
a malformed row in a number column (`bad_integer`, `bad_float`) or hashed as a value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    LabelColumn,
    ListColumn,
    SequenceColumn,
    SpecError,
    criteo_spec,
)
from shardrec.dataloader.spec.spec_file import load_spec, spec_from_dict, spec_to_toml
from shardrec.dataloader.spec.text_format import TextFormat
from shardrec.tools.preprocess.parse.criteo_text import REASONS
from shardrec.tools.preprocess.parse.spec_parse import SpecChunk, parse_spec_chunk
from shardrec.tools.preprocess.parse.spec_program import criteo_schema, resolve_program

COLUMNS = (
    LabelColumn("click"),
    DenseColumn("n"),
    DenseColumn("price", type="float", transform="none"),
    CategoricalColumn("city"),
    CategoricalColumn("user", kind="integer"),
    CategoricalColumn("site", kind="hex"),
    ListColumn("tags"),
    SequenceColumn("seen", kind="integer", max_length=2),
)
HEADER = [c.name for c in COLUMNS]
# Each word in each kind of column, quoted too; a list's value; words that only start like one.
ROWS = [
    ["1", "NA", "2.5", "paris", "7", "0000000a", "a|NA|b", "1|2|3"],
    ["0", "3", "NA", "NA", "\\N", "\\N", "NA", "NA|4|NA|5"],
    ["1", "\\N", "\\N", '"NA"', "NA", "NA", "\\N|c", "\\N"],
    ["0", "4", "1.5", "NAN", "-8", "000000ff", "NAN|x", "6"],
]


def _text(rows: list[list[str]], words: tuple[str, ...] = ()) -> bytes:
    """The rows as CSV, each field that is one of `words` written empty."""
    lines = [",".join(v if v.strip('"') not in words else "" for v in row) for row in rows]
    return "\n".join(lines).encode() + b"\n"


def _lists_of(words: tuple[str, ...]) -> list[list[str]]:
    """ROWS with the list values that are `words` taken out (an empty list value is skipped)."""
    return [
        [*row[:6], *("|".join(v for v in f.split("|") if v not in words) for f in row[6:])]
        for row in ROWS
    ]


def _chunk(data: bytes, missing: tuple[str, ...]) -> SpecChunk:
    spec = FeatureSpec(TextFormat("csv", missing=missing), COLUMNS)
    return parse_spec_chunk(data, resolve_program(spec, HEADER, "x.csv"))


def _arrays(chunk: SpecChunk) -> list[np.ndarray]:
    return [
        chunk.labels, chunk.dense, chunk.dense_missing, chunk.sparse, chunk.sparse_missing,
        chunk.list_values[: int(chunk.list_len.sum())], chunk.list_len, chunk.reason,
    ]  # fmt: skip


def test_a_word_for_a_missing_value_reads_as_an_empty_field() -> None:
    words = ("NA", "\\N")
    read = _chunk(_text(ROWS), words)
    assert read.ok.all(), [REASONS[r] for r in read.reason if r >= 0]
    emptied = _chunk(_text(_lists_of(words), words), ())
    for got, want in zip(_arrays(read), _arrays(emptied)):
        assert got.tobytes() == want.tobytes()
    assert read.dense_missing[:, 0].tolist() == [True, False, True, False]
    assert read.sparse_missing[:, 0].tolist() == [False, True, True, False]  # city; 'NAN' a value
    assert read.list_len.tolist() == [[2, 2], [0, 2], [1, 0], [2, 1]]  # seen keeps its last 2


def test_without_the_key_the_words_are_values_or_malformed_rows_as_before() -> None:
    chunk = _chunk(_text(ROWS), ())
    reasons = [REASONS[r] if r >= 0 else "ok" for r in chunk.reason]
    assert reasons == ["bad_integer", "bad_float", "bad_integer", "ok"]
    assert not chunk.sparse_missing[1, 0]  # city's NA: a value, hashed


def test_a_spec_with_words_is_read_by_the_spec_parser_not_criteos() -> None:
    spec = criteo_spec(2, 2)
    with_words = FeatureSpec(TextFormat("tsv", min_fields=2, missing=("NA",)), spec.columns)
    assert criteo_schema(resolve_program(spec, None, "day_0")) is not None
    program = resolve_program(with_words, None, "day_0")
    assert criteo_schema(program) is None
    chunk = parse_spec_chunk(b"1\tNA\t3\tNA\t0000000a\n", program)
    assert chunk.ok.all() and chunk.dense_missing[0].tolist() == [True, False]


def test_the_key_round_trips_through_toml_and_the_manifests_data(tmp_path: Path) -> None:
    spec = FeatureSpec(TextFormat("csv", header=True, missing=("NA", "\\N")), COLUMNS)
    path = tmp_path / "s.toml"
    path.write_text(spec_to_toml(spec))
    assert 'missing = ["NA", "\\\\N"]' in path.read_text()
    assert load_spec(path) == spec
    assert spec_from_dict(spec.to_dict(), "m") == spec
    # Without the key, a spec's data and hash are what they were: the key is left out.
    plain = FeatureSpec(TextFormat("csv", header=True), COLUMNS)
    assert "missing" not in plain.to_dict()["format"] and "missing" not in spec_to_toml(plain)
    assert plain.sha256() != spec.sha256()


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ('missing = "NA"', r'/s.toml: format: missing = \'NA\' should be a list of strings, such as \["NA"\]$'),
        ("missing = [1]", r"/s.toml: format: missing = \[1\] should be a list of strings"),
        ('missing = [""]', r"/s.toml: format: missing \[''\]: each word must be a non-empty string$"),
        (
            'missing = ["N,A"]',
            r"/s.toml: format: missing word 'N,A' holds ',': a word for a missing value is a "
            r"whole field, without the delimiter, a quote or a line break$",
        ),
        ('missing = ["NA", "NA"]', r"/s.toml: format: missing gives 'NA' more than once$"),
        (
            'kind = "parquet"\nmissing = ["NA"]',
            r"/s.toml: format: missing is for text formats: a Parquet file writes a missing "
            r"value as a null, which is read as one already$",
        ),
    ],
)  # fmt: skip
def test_a_bad_setting_is_one_line_naming_the_key(tmp_path: Path, fmt: str, message: str) -> None:
    path = tmp_path / "s.toml"
    kind = "" if "parquet" in fmt else 'kind = "csv"\n'
    path.write_text(f'[format]\n{kind}{fmt}\n[[columns]]\nname = "click"\nrole = "label"\n')
    with pytest.raises(SpecError, match=message):
        load_spec(path)


def test_a_word_that_is_a_label_value_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^missing word 'no' is a value of 'y''s mapping"):
        FeatureSpec(
            TextFormat("csv", missing=("no",)), (LabelColumn("y", mapping={"yes": 1, "no": 0}),)
        )
