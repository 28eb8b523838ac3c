"""Feature specs: TOML in and out, the built-in Criteo spec, and errors that name the file, the key
and the nearest known word."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    IgnoredColumn,
    LabelColumn,
    ListColumn,
    SpecError,
    criteo_spec,
)
from shardrec.dataloader.spec.spec_file import load_spec, spec_from_dict, spec_to_toml
from shardrec.dataloader.spec.text_format import TextFormat

MOVIELENS = """
[format]
kind = "csv"
header = true

[[columns]]
name = "user_id"
role = "categorical"
kind = "integer"
hash_size = 10000

[[columns]]
name = "rating"
role = "label"
threshold = 4

[[columns]]
name = "genres"
role = "list"
separator = "|"
max_length = 6
pooling = "mean"

[[columns]]
name = "title"
role = "ignore"
"""


def test_a_spec_file_reads_into_typed_columns(tmp_path: Path) -> None:
    path = tmp_path / "ml.toml"
    path.write_text(MOVIELENS)
    spec = load_spec(path)
    assert spec == FeatureSpec(
        TextFormat("csv", ",", True, True),
        (
            CategoricalColumn("user_id", kind="integer", hash_size=10000),
            LabelColumn("rating", threshold=4.0),
            ListColumn("genres", max_length=6, pooling="mean"),
            IgnoredColumn("title"),
        ),
    )
    assert [c.name for c in spec.sparse] == ["user_id", "genres"] and spec.lists[
        0
    ].pooling == "mean"


@pytest.mark.parametrize(
    "spec",
    [
        criteo_spec(),
        criteo_spec(3, 2, ",", True, 6, "signed-log1p"),
        FeatureSpec(
            TextFormat("tsv", ";", False, True, 3),
            (
                IgnoredColumn("id", position=0),
                LabelColumn("click", position=2, mapping={"yes": 1, "no": 0}),
                DenseColumn("price", position=1, type="float", transform="none"),
                ListColumn("tags", position=3, kind="hex", separator=" ", hash_size=99),
            ),
        ),
    ],
)
def test_toml_and_plain_data_round_trip(spec: FeatureSpec) -> None:
    assert (
        spec_from_dict(
            tomllib.loads(spec_to_toml(spec, {spec.label.name: "the click"}, "a spec")), "x"
        )
        == spec
    )
    assert spec_from_dict(spec.to_dict(), "manifest.json") == spec
    assert spec_from_dict(spec.to_dict(), "m").sha256() == spec.sha256()


def test_the_builtin_spec_is_criteos_row() -> None:
    spec = criteo_spec()
    assert [c.name for c in spec.columns][:3] == ["label", "I1", "I2"] and len(spec.columns) == 40
    assert spec.format == TextFormat("tsv", "\t", False, False, 37)
    assert {c.kind for c in spec.sparse} == {"hex"} and {d.transform for d in spec.dense} == {
        "log1p"
    }


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ('separator = "|"', 'seperator = "|"'),
            r"columns\[2\] \(genres\): unknown key 'seperator'; did you mean separator\?",
        ),
        (
            ('role = "list"', 'role = "lst"'),
            r"columns\[2\] \(genres\): role is 'lst', .*; did you mean list\?",
        ),
        (  # a missing role has no near miss (it once got "did you mean ignore?", from 'None')
            ('role = "list"', ""),
            r"columns\[2\] \(genres\): role is missing, expected one of label, dense, "
            r"categorical, list, sequence, ignore$",
        ),
        (
            ('pooling = "mean"', 'pooling = "maen"'),
            r"columns\[2\] \(genres\): pooling = 'maen' is not one of sum, mean; did you mean mean\?",
        ),
        (
            ('pooling = "mean"', 'pooling = "max"'),  # the choices once, not again as `known`
            r"columns\[2\] \(genres\): pooling = 'max' is not one of sum, mean$",
        ),
        (
            ('kind = "integer"', 'kind = "int"'),
            r"columns\[0\] \(user_id\): kind = 'int' is not one of hex, integer, string; did you mean integer\?",
        ),
        (
            ("hash_size = 10000", 'hash_size = "10k"'),
            r"columns\[0\] \(user_id\): hash_size = '10k' should be an integer",
        ),
        (
            ("hash_size = 10000", "hash_size = 1"),
            r"columns\[0\] \(user_id\): hash_size 1 must be at least 2",
        ),
        (
            ("hash_size = 10000", "hash_size = 9223372036854775808"),
            r"columns\[0\] \(user_id\): hash_size 9223372036854775808 is over "
            r"9223372036854775807 \(2\^63 - 1\)",
        ),
        (('kind = "csv"', 'knd = "csv"'), r"format: unknown key 'knd'; did you mean kind\?"),
        (("[format]", "[formt]"), r"unknown section 'formt'; did you mean format\?"),
        (
            ("threshold = 4", "threshold = 4\nmapping = { a = 1 }"),
            r"columns\[1\] \(rating\): give threshold or mapping, not both",
        ),
        (
            ('role = "label"\nthreshold = 4', 'role = "ignore"'),
            r"a spec needs exactly one label column, found 0",
        ),
        (('name = "title"', 'name = "user_id"'), r"column names must be unique: user_id"),
        (
            ("max_length = 6", "max_length = 0"),
            r"columns\[2\] \(genres\): max_length 0 must be at least 1",
        ),
        (('name = "genres"', 'name = "dense"'), r"column 'dense' names a feature's file"),
        (("threshold = 4", "threshold = 4\nposition = -1"), r"position = -1 must be 0 or more"),
        (("header = true", "header = tru"), r"not a TOML spec"),
    ],
)
def test_spec_errors_name_the_file_and_the_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    path = tmp_path / "ml.toml"
    path.write_text(MOVIELENS.replace(*edit, 1))
    with pytest.raises(SpecError, match=rf"^{path}: .*{message}"):
        load_spec(path)
