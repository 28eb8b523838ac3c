"""An event log written with words for a missing value (`[format] missing`, as pandas'
`na_rep="NA"` or a MySQL dump's `\\N` write them) reads each as an empty field: the dataset of an
empty field where it stands, a refusal of an empty one where the event needs a value; Parquet,
whose nulls are its missing values, refuses the key in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from helpers import EVENT_SPEC, assert_one_line_error, cli

from shardrec.tools.synth.yambda import write_yambda_like

MISSING = '[format]\nkind = "csv"\nmissing = ["NA", "\\\\N"]\n'


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """A Yambda-like log as CSV (a like's played ratio empty), its artist map, and two specs:
    `plain.toml` without the key, `missing.toml` with NA and \\N, `backslash_n.toml` with \\N."""
    raw = tmp_path_factory.mktemp("raw")
    write_yambda_like(raw, 3_000, seed=1)
    log = pq.read_table(raw / "events.parquet")
    pcsv.write_csv(
        log.set_column(4, "event_type", log["event_type"].cast(pa.string())), raw / "log.csv"
    )
    (raw / "plain.toml").write_text('[format]\nkind = "csv"\n' + EVENT_SPEC)
    (raw / "missing.toml").write_text(MISSING + EVENT_SPEC)
    (raw / "backslash_n.toml").write_text(MISSING.replace('"NA", ', "") + EVENT_SPEC)
    return raw


def _lines(raw: Path) -> list[str]:
    return (raw / "log.csv").read_text().splitlines()


def _preprocess(raw: Path, lines: list[str], spec: str, out: Path, ok: bool = True):
    path = out.parent / f"{out.name}.csv"
    path.write_text("\n".join(lines) + "\n")
    return cli("preprocess", path, "--events", raw / spec, "--out", out, ok=ok)


def test_a_word_for_a_missing_value_makes_the_dataset_an_empty_field_makes(tmp_path, raw):
    # A like has no played ratio: written \N (quoted or not) or NA, as empty. Before, the spec's
    # [format] took kind alone, and without the key each word was "not a number".
    lines = _lines(raw)
    likes = [i for i, line in enumerate(lines) if ',"like",,' in line]
    words = [
        lines[i].replace(',"like",,', f',"like",{w},')
        for i, w in zip(likes, ["\\N", '"\\N"', "NA"])
    ]
    assert len(words) == 3
    changed = list(lines)
    for i, line in zip(likes, words):
        changed[i] = line
    _preprocess(raw, lines, "plain.toml", tmp_path / "empty")
    _preprocess(raw, changed, "missing.toml", tmp_path / "words")
    files = {
        name: {p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name).rglob("*")
               if p.is_file() and p.name != "manifest.json"}
        for name in ("empty", "words")
    }  # fmt: skip
    assert files["empty"] and files["empty"] == files["words"]
    # The key is part of the spec a dataset was made with (before, shown as null where not given).
    assert_one_line_error(
        _preprocess(raw, changed, "missing.toml", tmp_path / "empty", ok=False),
        rf"^error: {re.escape(str(tmp_path / 'empty'))}: holds a dataset made with another event "
        r'spec \(format.missing = \[\] there, \["NA", "\\\\N"\] in .*missing.toml\); remove',
    )


@pytest.mark.parametrize(
    ("column", "said"),
    [
        (5, r"played_ratio_pct: empty for a listen \(1 listens have none\); a listen's percent "),
        (0, r"uid: empty \(every event needs one\)$"),
    ],
    ids=["a listen's played ratio", "a user"],
)
def test_a_word_for_a_missing_value_where_an_event_needs_one_is_refused_as_empty(
    tmp_path, raw, column, said
):
    lines = _lines(raw)
    fields = lines[1].split(",")
    assert fields[4] == '"listen"'
    fields[column] = "NA"
    lines[1] = ",".join(fields)
    out = tmp_path / "out"
    assert_one_line_error(
        _preprocess(raw, lines, "missing.toml", out, ok=False),
        rf"^error: {re.escape(str(tmp_path / 'out.csv'))}:2: {said}",
    )


@pytest.mark.parametrize(
    ("spec", "key"), [("plain.toml", '["NA"]'), ("backslash_n.toml", '["\\\\N", "NA"]')]
)
def test_a_missing_word_the_spec_lacks_is_refused_naming_the_key_that_reads_it(
    tmp_path, raw, spec, key
):
    # As a click log's refusal names it; before, the line ended at "(the percent played)".
    lines = _lines(raw)
    fields = lines[1].split(",")
    fields[5] = "NA"
    lines[1] = ",".join(fields)
    assert_one_line_error(
        _preprocess(raw, lines, spec, tmp_path / "out", ok=False),
        rf"^error: {re.escape(str(tmp_path / 'out.csv'))}:2: played_ratio_pct: 'NA' is not a "
        rf"number \(the percent played\) \(a word for a missing value\? \[format\] missing = "
        rf"{re.escape(key)} reads it as one\)$",
    )


def test_the_key_is_refused_for_a_parquet_log(tmp_path, raw):
    spec = tmp_path / "spec.toml"
    spec.write_text(MISSING.replace('"csv"', '"parquet"') + EVENT_SPEC)
    result = cli(
        "preprocess", raw / "events.parquet", "--events", spec, "--out", tmp_path / "o", ok=False
    )
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(spec))}: \[format\] missing is for text formats: a Parquet file "
        r"writes a missing value as a null, which is read as one already$",
    )


def test_a_word_that_is_an_event_types_written_value_is_refused_in_the_spec(tmp_path, raw):
    # Its events would read as typeless, each refused as "'' is not one of listen, NA" naming
    # neither key; before, the spec was taken and the log read.
    spec = raw / "types.toml"  # beside the artist map it names
    spec.write_text(MISSING + EVENT_SPEC + '\n[events.types]\nlisten = "listen"\nlike = "NA"\n')
    result = cli("preprocess", raw / "log.csv", "--events", spec, "--out", tmp_path / "o", ok=False)
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(spec))}: \[format\] missing word 'NA' is the value written for "
        r"\[events.types\] like: its events would have no type; take it out of one of them$",
    )
