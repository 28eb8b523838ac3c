"""`shardrec preprocess` end to end on small synthetic click logs."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.integrity import verify
from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.tools.cli.app import app
from shardrec.tools.preprocess.ids.id_maps import hash_ids
from shardrec.tools.preprocess.parse.criteo_text import transform_dense
from shardrec.tools.preprocess.settings import PreprocessConfig
from shardrec.tools.synth.criteo import write_dataset

runner = CliRunner()


def cli(*args: str, ok: bool = True):
    result = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def reference_rows(path: Path, max_ids: int, skip_header: bool = False, delimiter: str = "\t"):
    """Each text line decoded with plain Python: the row rules, independently of the parser."""
    lines = path.read_text().splitlines()[1 if skip_header else 0 :]
    rows = []
    for line in lines:
        fields = line.split(delimiter)
        fields += [""] * (40 - len(fields))
        dense = np.array([[int(float(f)) if f else 0 for f in fields[1:14]]], dtype=np.int64)
        missing = np.array([[f == "" for f in fields[1:14]]])
        values = np.array([int(f, 16) if f else 0 for f in fields[14:]], dtype=np.uint64)
        ids = hash_ids(values, np.array([f == "" for f in fields[14:]]), max_ids)
        rows.append((int(fields[0]), transform_dense(dense, missing)[0], ids))
    return rows


def all_rows(directory: Path, split: str):
    parts = open_split(directory, split)
    labels = np.concatenate([p.labels for p in parts])
    dense = np.concatenate([p.dense for p in parts])
    sparse = np.stack(
        [np.concatenate([p.sparse[f"C{i}"] for p in parts]) for i in range(1, 27)], axis=1
    )
    return labels, dense, sparse


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("raw")
    return write_dataset(raw, rows=2000, seed=3, max_vocab=500)[0]


def test_round_trip_matches_python_reference_exactly(kaggle: Path, tmp_path: Path):
    out = tmp_path / "data"
    res = json.loads(
        cli(
            "preprocess", kaggle, "--out", out, "--max-ids", "1000", "--chunk-mb", "0.05", "--json"
        ).stdout
    )
    assert res["complete"] and res["lines"] == 2000 and res["rows_skipped"] == {}
    assert verify(out) == []
    ref = reference_rows(kaggle, 1000)
    first_eval = 6 * 2000 // 7
    half = (2000 - first_eval + 1) // 2
    expected = {
        "train": ref[:first_eval],
        "val": ref[first_eval : first_eval + half],
        "test": ref[first_eval + half :],
    }
    manifest = Manifest.load(out)
    assert manifest.options["splits"]["val_half"] == "first"
    for split, rows in expected.items():
        labels, dense, sparse = all_rows(out, split)
        assert labels.tolist() == [r[0] for r in rows]
        np.testing.assert_array_equal(dense, np.stack([r[1] for r in rows]))
        np.testing.assert_array_equal(sparse, np.stack([r[2] for r in rows]))
    assert all(f.cardinality == 1000 and f.dtype == "uint16" for f in manifest.sparse_features)
    head = json.loads(cli("data", "head", out, "-n", "2", "--split", "val", "--json").stdout)
    assert head[1]["label"] == expected["val"][1][0]
    assert head[1]["C26"] == int(expected["val"][1][2][25])
    assert head[1]["I2"] == float(expected["val"][1][1][1])


def test_a_split_whose_labels_are_all_one_class_is_warned_of(kaggle: Path, tmp_path: Path):
    """val and test (the last seventh of the rows) all labeled 0: preprocessing finishes, with a
    warning for each on stderr, none for train; a log of both classes gets none."""
    lines = kaggle.read_text().splitlines(keepends=True)
    first_eval = 6 * len(lines) // 7
    tail = ["0" + line[line.index("\t") :] for line in lines[first_eval:]]
    (tmp_path / "day.txt").write_text("".join(lines[:first_eval] + tail))
    result = cli("preprocess", tmp_path / "day.txt", "--out", tmp_path / "d", "--max-ids", "100")
    warned = re.findall(r"warning: .*", result.stderr)
    assert warned == [
        f"warning: {tmp_path / 'd'}: every label of split {s} is 0: an AUC needs both 0 and 1"
        for s in ("val", "test")
    ]
    both = cli("preprocess", kaggle, "--out", tmp_path / "k", "--max-ids", "100")
    assert "warning" not in both.stderr


def test_val_half_second_swaps_the_halves(kaggle: Path, tmp_path: Path):
    cli("preprocess", kaggle, "--out", tmp_path / "a", "--max-ids", "100")
    cli("preprocess", kaggle, "--out", tmp_path / "b", "--max-ids", "100", "--val-half", "second")
    a_val, b_test = all_rows(tmp_path / "a", "val"), all_rows(tmp_path / "b", "test")
    for x, y in zip(a_val, b_test):
        np.testing.assert_array_equal(x, y)
    assert Manifest.load(tmp_path / "b").options["splits"]["val_half"] == "second"


def test_csv_copy_gives_the_same_dataset(tmp_path: Path):
    # The same seed and fewer rows than synth's chunk: identical rows as TSV and as CSV.
    tsv = write_dataset(tmp_path / "tsv", rows=700, seed=5, max_vocab=300)[0]
    csv = write_dataset(tmp_path / "csv", rows=700, seed=5, max_vocab=300, csv=True)[0]
    assert csv.read_text().startswith("label,I1,") and ".0," in csv.read_text()
    cli("preprocess", tsv, "--out", tmp_path / "a", "--max-ids", "5000")
    cli("preprocess", csv, "--out", tmp_path / "b", "--max-ids", "5000", "--csv")
    for split in ("train", "val", "test"):
        for x, y in zip(all_rows(tmp_path / "a", split), all_rows(tmp_path / "b", split)):
            np.testing.assert_array_equal(x, y)


def test_gz_day_files_last_day_halved(tmp_path: Path):
    days = write_dataset(tmp_path / "raw", rows=900, seed=1, days=3, gz=True, max_vocab=200)
    out = tmp_path / "data"
    res = json.loads(
        cli("preprocess", tmp_path / "raw", "--out", out, "--max-ids", "300", "--json").stdout
    )
    lines = [len(gzip.open(d).read().splitlines()) for d in days]
    assert res["rows_kept"] == {
        "train": lines[0] + lines[1],
        "val": (lines[2] + 1) // 2,
        "test": lines[2] // 2,
    }
    assert Manifest.load(out).options["layout"] == "days"


def test_truncated_gz_names_the_file_and_keeps_other_output(tmp_path: Path):
    days = write_dataset(tmp_path / "raw", rows=3000, seed=1, days=2, gz=True, max_vocab=200)
    data = days[0].read_bytes()
    days[0].write_bytes(data[: len(data) // 2])
    res = cli(
        "preprocess", tmp_path / "raw", "--out", tmp_path / "data", "--max-ids", "300", ok=False
    )
    assert_one_line_error(res, re.escape(f"{days[0]}: unreadable or truncated"))
    assert (tmp_path / "data" / ".work" / "task-00001.json").is_file()  # day_1 was finished
    assert not (tmp_path / "data" / "manifest.json").exists()


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_unreadable_inputs_are_clear_errors(tmp_path: Path, what: str):
    path = tmp_path / "train.txt"
    if what == "empty":
        path.write_bytes(b"")
    res = cli("preprocess", path, "--out", tmp_path / "data", ok=False)
    assert_one_line_error(
        res, re.escape(str(path)) + ": " + ("empty file" if what == "empty" else "no such file")
    )


def test_a_run_refused_before_it_reads_rows_leaves_no_folder(kaggle: Path, tmp_path: Path):
    """A missing input or a --raw-ids name no feature has: before, --out (and its parents) was made
    and the run recorded in it, so the corrected command was refused ("holds a run with different
    raw_ids")."""
    out = tmp_path / "deep" / "a" / "data"
    res = runner.invoke(app, ["preprocess", str(tmp_path / "nosuch.txt"), "--out", str(out)])
    assert_one_line_error(res, re.escape(f"{tmp_path / 'nosuch.txt'}: no such file"))
    assert not (tmp_path / "deep").exists()
    args = ["preprocess", str(kaggle), "--out", str(out), "--max-ids", "500", "--chunk-mb", "0.25"]
    res = runner.invoke(app, [*args, "--raw-ids", "C99"])
    assert_one_line_error(res, re.escape("--raw-ids C99: no sparse feature 'C99'"))
    # a name typed in another case is named with the one meant (before: the list alone)
    res = runner.invoke(app, [*args, "--raw-ids", "c3"])
    # Criteo's 26 features are all named (before: the first 6 and '...').
    every = ", ".join(f"C{i}" for i in range(1, 27))
    shown = f"no sparse feature 'c3' (the features: {every}); did you mean C3?"
    assert_one_line_error(res, re.escape(shown) + "$")
    assert not (tmp_path / "deep").exists()
    res = runner.invoke(app, [*args, "--raw-ids", "C3", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["complete"]


def test_malformed_rows_skipped_and_reported_or_strict(kaggle: Path, tmp_path: Path):
    lines = kaggle.read_bytes().splitlines(keepends=True)
    lines[10] = b"1\tx1" + lines[10][lines[10].index(b"\t", 2) :]
    lines[20] = b"7" + lines[20][1:]
    bad = tmp_path / "train.txt"
    bad.write_bytes(b"".join(lines))
    res = json.loads(
        cli("preprocess", bad, "--out", tmp_path / "a", "--max-ids", "100", "--json").stdout
    )
    assert res["rows_skipped"] == {"bad_integer": 1, "bad_label": 1}
    assert res["first_errors"] == [
        f"{bad}:11: I1: 'x1' (bad_integer)",
        f"{bad}:21: label: '7' (bad_label)",
    ]
    assert sum(res["rows_kept"].values()) == 1998
    assert Manifest.load(tmp_path / "a").skipped == {"bad_integer": 1, "bad_label": 1}
    strict = cli(
        "preprocess", bad, "--out", tmp_path / "b", "--max-ids", "100", "--strict", ok=False
    )
    assert_one_line_error(strict, re.escape(f"{bad}:11: I1: 'x1'"))
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_rows_with_too_few_fields_are_malformed_unless_min_fields_allows_them(
    kaggle: Path, tmp_path: Path
):
    lines = kaggle.read_bytes().splitlines(keepends=True)
    lines[5] = b"1\t2\n"
    bad = tmp_path / "train.txt"
    bad.write_bytes(b"".join(lines))
    res = json.loads(
        cli("preprocess", bad, "--out", tmp_path / "a", "--max-ids", "100", "--json").stdout
    )
    assert res["rows_skipped"] == {"too_few_fields": 1}
    assert res["first_errors"] == [
        f"{bad}:6: row: 2 fields, schema needs at least 37 of 40 (too_few_fields)"
    ]
    strict = cli(
        "preprocess", bad, "--out", tmp_path / "b", "--max-ids", "100", "--strict", ok=False
    )
    assert_one_line_error(strict, re.escape(f"{bad}:6: row: 2 fields"))
    loose = json.loads(
        cli(
            "preprocess",
            bad,
            "--out",
            tmp_path / "c",
            "--max-ids",
            "100",
            "--min-fields",
            "2",
            "--json",
        ).stdout
    )
    assert loose["rows_skipped"] == {} and sum(loose["rows_kept"].values()) == 2000
    assert Manifest.load(tmp_path / "c").options["schema"]["min_fields"] == 2
    wrong = cli("preprocess", bad, "--out", tmp_path / "d", "--min-fields", "41", ok=False)
    assert_one_line_error(wrong, "min_fields=41")


def test_vocabulary_mode_oov_and_missing_ids(tmp_path: Path):
    text = "".join(
        f"{i % 2}\t1" + "\t" * 12 + "\t" + c1 + "\t" * 25 + "\n"
        for i, c1 in enumerate(
            ["0000000a"] * 3
            + ["0000000b"] * 2
            + ["0000000c"]
            + [""]
            + ["0000000a"] * 7
            + ["0000000d", "0000000a"]
        )
    )
    path = tmp_path / "train.txt"
    path.write_text(text)
    out = tmp_path / "data"
    cli("preprocess", path, "--out", out, "--min-count", "2")
    manifest = Manifest.load(out)
    # 16 lines: training days are the first 6*16//7 = 13: a x9 (id 2), b x2 (id 3), c once
    # (below --min-count: OOV), one missing; lines 14-15 are val (the odd line goes to the
    # first half, as in torchrec), line 16 test.
    assert manifest.feature("C1").cardinality == 4 and manifest.options["oov_id"] == 1
    _, _, train = all_rows(out, "train")
    assert train[:, 0].tolist() == [2, 2, 2, 3, 3, 1, 0, 2, 2, 2, 2, 2, 2]
    _, _, val = all_rows(out, "val")
    _, _, test = all_rows(out, "test")
    assert val[:, 0].tolist() == [2, 1] and test[:, 0].tolist() == [
        2
    ]  # d unseen in training -> OOV
    assert (train[:, 1:] == 0).all()  # C2..C26 always missing


def test_rerun_with_other_options_into_same_dir_is_refused(kaggle: Path, tmp_path: Path):
    cli("preprocess", kaggle, "--out", tmp_path / "d", "--max-ids", "100")
    res = cli("preprocess", kaggle, "--out", tmp_path / "d", "--max-ids", "200", ok=False)
    assert_one_line_error(res, "different max_ids")


@pytest.mark.parametrize("mark", ["dataset.json", "metrics.jsonl", "checkpoints"])
def test_out_that_holds_a_training_run_is_refused(kaggle: Path, tmp_path: Path, mark: str):
    """--out naming a run directory (a slip between runs/ and data/): before, the parts and
    manifest.json were written among the run's files, and `train --restart` on that run then moved
    the new dataset aside with it. Refused before any work, event logs too."""
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    if mark == "checkpoints":
        (run / mark).mkdir()
    else:
        (run / mark).write_text("{}")
    line = f"--out {run} is a run directory (it holds {mark}); give the dataset a directory of its "
    for extra in ((), ("--events", tmp_path / "events.toml")):
        res = cli("preprocess", kaggle, "--out", run, "--max-ids", "100", *extra, ok=False)
        assert_one_line_error(res, "^error: " + re.escape(line + "own") + "$")
    assert [p.name for p in run.iterdir()] == [mark]


def test_rerun_after_an_input_was_replaced_by_one_of_the_same_size_is_refused(
    kaggle: Path, tmp_path: Path
):
    import os

    src = tmp_path / "train.txt"
    src.write_bytes(kaggle.read_bytes())
    cli("preprocess", src, "--out", tmp_path / "d", "--max-ids", "100")
    st = src.stat()
    text = src.read_bytes()
    src.write_bytes(text.replace(b"\n1\t", b"\n0\t", 1))  # other labels, same size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert src.stat().st_size == st.st_size and src.read_bytes() != text
    res = cli("preprocess", src, "--out", tmp_path / "d", "--max-ids", "100", ok=False)
    assert_one_line_error(res, "different inputs")
    assert "mtime" not in json.dumps(
        Manifest.load(tmp_path / "d").options
    )  # a copy gives the same manifest


def test_custom_schema_float16_and_per_feature_max_ids(tmp_path: Path):
    # Two integers, three categoricals, ';'-separated, with a header line.
    lines = ["label;a;b;x;y;z"] + [f"{i % 2};{i};-{i % 4};{i:08x};{i * 7:08x};" for i in range(40)]
    path = tmp_path / "logs.txt"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "data"
    cli("preprocess", path, "--out", out, "--num-dense", "2", "--num-sparse", "3", "--delimiter", ";", "--header",
        "--max-ids", "300,70000,2", "--float16", "--dense-transform", "signed-log1p")  # fmt: skip
    m = Manifest.load(out)
    assert (
        m.dense_features == ["I1", "I2"]
        and m.feature_names == ["C1", "C2", "C3"]
        and m.dense_dtype == "float16"
    )
    assert [(f.cardinality, f.dtype) for f in m.sparse_features] == [
        (300, "uint16"),
        (70000, "uint32"),
        (2, "uint8"),
    ]
    part = open_split(out, "train")[0]
    assert part.dense.dtype == np.float16 and part.rows == 6 * 40 // 7
    assert float(part.dense[3, 1]) == pytest.approx(-np.log1p(3.0), rel=1e-3)
    assert (part.sparse["C3"] == 0).all()  # always missing
    bad = cli("preprocess", path, "--out", tmp_path / "bad", "--max-ids", "10,20", ok=False)
    assert_one_line_error(bad, re.escape("give 1 or one per sparse feature (26)"))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--workers", "0"], "--workers 0: must be >= 1"),
        (["--chunk-mb", "0"], "--chunk-mb 0: must be > 0"),
        (["--workers", "2", "--chunk-mb", "-0.5"], "--chunk-mb -0.5: must be > 0"),
        (["--vocab-memory-mb", "0"], "--vocab-memory-mb 0: must be > 0"),
        (["--max-skipped-fraction", "2"], "--max-skipped-fraction 2: must be in [0, 1]"),
        (
            ["--max-ids", "-5"],
            "--max-ids -5: -5 is not 2 to 9223372036854775807 (2^63 - 1) table rows: id 0 is the "
            "missing value, and ids are 64-bit",
        ),
        (
            ["--max-ids", "99999999999999999999"],
            "--max-ids 99999999999999999999: 99999999999999999999 is not 2 to 9223372036854775807 "
            "(2^63 - 1) table rows: id 0 is the missing value, and ids are 64-bit",
        ),
        (
            ["--max-ids", "10,20"],
            "--max-ids 10,20: 2 values; give 1 or one per sparse feature (26)",
        ),
    ],
)
def test_a_bad_amount_is_named_by_its_flag_before_any_input_is_read(
    kaggle: Path, tmp_path: Path, args: list[str], error: str
):
    res = cli("preprocess", kaggle, "--out", tmp_path / "data", *args, ok=False)
    assert_one_line_error(res, rf"^error: {re.escape(error)}$")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("workers", 0, "workers 0: must be >= 1"),
        ("chunk_mb", 0.0, "chunk_mb 0: must be > 0"),
        ("vocab_memory_mb", 0.0, "vocab_memory_mb 0: must be > 0"),
        ("max_skipped_fraction", 2.0, "max_skipped_fraction 2: must be in [0, 1]"),
        (
            "max_ids",
            [2**63],
            "max_ids [9223372036854775808] must all be 2 to 2^63 - 1 (id 0 is the missing value, "
            "ids are 64-bit)",
        ),
    ],
)
def test_the_settings_name_the_one_bad_key(tmp_path: Path, key: str, value: float, error: str):
    with pytest.raises(ValueError, match=rf"^{re.escape(error)}$"):
        PreprocessConfig(inputs=[], out=tmp_path / "data", **{key: value})
