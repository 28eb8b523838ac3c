"""After training, `shardrec export` -> `shardrec predict`: split and raw-text rows agree with
eval; raw rows of another shape, data preprocessed otherwise, a table larger than memory, a moved
or changed dataset, each met as the README says. The run they share is conftest's
`after_training`; test_eval_export.py has the eval side, test_predict_vocab_multihot.py and
test_export_predict_refusals.py the rest of export and predict."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from after_training import (
    final_eval,
    in_process,
    ok,
)
from helpers import assert_one_line_error


@pytest.mark.slow
def test_export_then_predict_matches_eval_on_a_split_and_on_raw_rows(after_training: Path) -> None:
    ok(in_process("export", "run", "--out", "model.safetensors", cwd=after_training))
    from safetensors import safe_open

    with safe_open(str(after_training / "model.safetensors"), framework="pt") as f:
        header = json.loads(f.metadata()["shardrec"])
        assert len([k for k in f.keys() if ".embedding_bags." in k]) == 26
    assert (
        header["transform"]["mode"] == "hash"
        and header["transform"]["cardinalities"] == [1000] * 26
    )
    split = json.loads(
        ok(
            in_process(
                "predict",
                "model.safetensors",
                "data",
                "--split",
                "test",
                "--out",
                "split.npy",
                "--json",
                cwd=after_training,
            )
        ).stdout
    )
    assert split["rows"] == 1000 and split["auc"] == pytest.approx(
        final_eval(after_training / "run", "test")["auc"], abs=1e-6
    )
    # The test split is the second half of day_1: the same rows as raw text, transformed by predict.
    lines = (after_training / "raw" / "day_1").read_bytes().splitlines(keepends=True)
    (after_training / "test.tsv").write_bytes(b"".join(lines[-1000:]))
    ok(
        in_process(
            "predict", "model.safetensors", "test.tsv", "--out", "raw.txt", cwd=after_training
        )
    )
    raw = np.loadtxt(after_training / "raw.txt")
    np.testing.assert_allclose(raw, np.load(after_training / "split.npy"), rtol=0, atol=1e-6)
    bad = after_training / "bad.tsv"
    bad.write_bytes(lines[-1] + b"1\tnot-a-row\n")
    assert_one_line_error(
        in_process("predict", "model.safetensors", "bad.tsv", cwd=after_training),
        r"bad.tsv:2: row: 2 fields, .* \(too_few_fields\)",
    )
    assert_one_line_error(
        in_process("predict", "test.tsv", "data", cwd=after_training),
        r"test.tsv: not a safetensors model file",
    )
    # Rows without a label column (as Criteo's test.txt): named, then scored with --no-label.
    (after_training / "nolabel.tsv").write_bytes(
        b"".join(line.split(b"\t", 1)[1] for line in lines[-1000:])
    )
    assert_one_line_error(
        in_process("predict", "model.safetensors", "nolabel.tsv", cwd=after_training),
        r"nolabel.tsv: rows of at most 39 fields, a labeled row has 40: no label column \(as Criteo's "
        r"test.txt\)\? score them with --no-label$",
    )
    unlabeled = ok(
        in_process(
            "predict",
            "model.safetensors",
            "nolabel.tsv",
            "--no-label",
            "--out",
            "nl.txt",
            cwd=after_training,
        )
    )
    # (Its next lines count the lookups of rows that never trained: test_predict_untrained_rows.py.)
    assert unlabeled.stderr.splitlines()[0] == (
        "wrote 1,000 probabilities to nl.txt (no labels, no AUC)"
    )
    np.testing.assert_array_equal(np.loadtxt(after_training / "nl.txt"), raw)


PREDICT_WITHOUT_TORCH = """
import sys
from typer.testing import CliRunner
from shardrec.tools.cli.app import app
result = CliRunner().invoke(app, sys.argv[1:])
print(result.exit_code, "torch" in sys.modules, (result.stderr.strip().splitlines() or [""])[-1])
"""


@pytest.mark.slow
def test_raw_rows_of_another_shape_are_refused_before_torch_with_a_hint_that_works(
    after_training: Path,
) -> None:
    """Rows the model cannot read: a CSV (its hint: the spec infer that starts a model for them),
    an extra field (its hint: the cut that drops it), labeled rows with --no-label (the counts of
    the user's rows); each hint's command is run here and works."""
    if not (after_training / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=after_training))
    ok(in_process("synth", "ml", "--like", "movielens", "--rows", "300", cwd=after_training))
    # Refused by the model's header and the file's first rows alone: torch is never imported.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PREDICT_WITHOUT_TORCH,
            "predict",
            "model.safetensors",
            "ml/train.csv",
        ],
        cwd=after_training,
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, torch_loaded, line = done.stdout.strip().split(" ", 2)
    assert (code, torch_loaded) == ("1", "False"), done.stdout + done.stderr[-2000:]
    assert line == (
        "error: ml/train.csv:1: row: 1 fields, schema needs at least 37 of 40 (too_few_fields) (a "
        "CSV row: this model reads Criteo's tab-separated rows of 40 fields, as it was trained on, "
        "and cannot score these; a model for them starts with `shardrec spec infer ml/train.csv "
        "--label COLUMN`)"
    )
    ok(
        in_process(
            "spec",
            "infer",
            "ml/train.csv",
            "--label",
            "rating>=4",
            "--out",
            "ml.toml",
            cwd=after_training,
        )
    )

    lines = (after_training / "raw" / "day_1").read_bytes().splitlines(keepends=True)[-50:]
    (after_training / "extra.tsv").write_bytes(
        b"".join(line.rstrip(b"\n") + b"\tx\n" for line in lines)
    )
    line = assert_one_line_error(
        in_process("predict", "model.safetensors", "extra.tsv", cwd=after_training),
        r"^error: extra.tsv:1: row: 41 fields, schema has 40 \(too_many_fields\) \(the model reads rows "
        r"of 40 fields, as its training data had; if the extra ones are the last: `cut -f1-40 "
        r"extra.tsv > rows.txt` keeps the first 40\)$",
    )
    cut = line.split("`")[1]
    subprocess.run(cut, shell=True, cwd=after_training, check=True)
    ok(
        in_process(
            "predict", "model.safetensors", "rows.txt", "--out", "cut.txt", cwd=after_training
        )
    )
    assert len(np.loadtxt(after_training / "cut.txt")) == 50

    assert_one_line_error(
        in_process("predict", "model.safetensors", "rows.txt", "--no-label", cwd=after_training),
        r"^error: rows.txt:1: row: 40 fields, a row without its label has 39 \(too_many_fields\) "
        r"\(with --no-label: the rows have a label column; leave --no-label out\)$",
    )


@pytest.mark.slow
def test_data_preprocessed_otherwise_is_refused_by_predict_and_eval(after_training: Path) -> None:
    """The same rows preprocessed with other table sizes or another dense transform give other
    inputs: scoring them would be wrong without a word."""
    if not (after_training / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=after_training))
    for out, flags in (
        ("data500", ["--max-ids", "500"]),
        ("raw_dense", ["--max-ids", "1000", "--dense-transform", "none"]),
    ):
        ok(
            in_process(
                "preprocess", "raw/day_0", "raw/day_1", "--out", out, *flags, cwd=after_training
            )
        )
    assert_one_line_error(
        in_process("predict", "model.safetensors", "data500", cwd=after_training),
        r"^error: data500: preprocessed with other settings than the model's training data \(cardinalities\[0\]: "
        r"1000 in training, 500 here, max_ids\[0\]: 1000 in training, 500 here\); preprocess it with the "
        r"training data's settings, or score its raw rows \(the model applies them\)$",
    )
    assert_one_line_error(
        in_process("predict", "model.safetensors", "raw_dense", cwd=after_training),
        r"^error: raw_dense: preprocessed with other settings .*\(dense_transform: 'log1p' in training, "
        r"'none' here\)",
    )
    assert_one_line_error(
        in_process("eval", "run", "--data", "raw_dense", cwd=after_training),
        r"^error: --data raw_dense: preprocessed with other settings than the data run trained on "
        r"\(dense_transform: 'log1p' in training, 'none' here\); preprocess it with the training data's settings$",
    )


@pytest.mark.slow
def test_export_refuses_a_table_larger_than_memory_before_writing(
    after_training: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardrec.trainer.inference.export import export_model

    # Trained with --data data from `trained`: config.toml keeps the path absolute, dataset.json as
    # typed too.
    assert (
        f'path = "{(after_training / "data").resolve()}"'
        in (after_training / "run" / "config.toml").read_text()
    )
    assert json.loads((after_training / "run" / "dataset.json").read_text())["given"] == "data"
    monkeypatch.chdir(
        after_training / "raw"
    )  # not where it trained: the absolute path still finds the data
    out = after_training / "too_big.safetensors"
    with pytest.raises(
        ValueError,
        match=r"tensor sparse_arch\.embedding_bag_collection\.embedding_bags\.t_C\d+\.weight "
        r"takes 0\.00 GiB, more than the 0\.00 GiB of memory available here",
    ):
        export_model(after_training / "run", out, memory_bytes=1000)
    assert not out.exists() and not list(after_training.glob(".too_big*"))


@pytest.mark.slow
def test_export_of_a_run_whose_dataset_moved_takes_its_new_place(after_training: Path) -> None:
    """The refusal names --data, and export has it: the same model file as from the old place."""
    if not (after_training / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=after_training))
    (after_training / "data").rename(after_training / "moved")
    try:
        assert_one_line_error(
            in_process("export", "run", "--out", "m.safetensors", cwd=after_training),
            r"data.path = '.*/data' is not a directory here \(a relative path is taken from where "
            r"the command runs; pass --data DIR\)$",
        )
        ok(
            in_process(
                "export", "run", "--out", "m.safetensors", "--data", "moved", cwd=after_training
            )
        )
    finally:
        (after_training / "moved").rename(after_training / "data")
    from safetensors import safe_open

    with (
        safe_open(str(after_training / "m.safetensors"), framework="pt") as moved,
        safe_open(str(after_training / "model.safetensors"), framework="pt") as before,
    ):
        assert sorted(moved.keys()) == sorted(before.keys())
        for key in before.keys():
            assert moved.get_tensor(key).equal(before.get_tensor(key)), key
        header, old = (json.loads(f.metadata()["shardrec"]) for f in (moved, before))
    assert header["model"] == old["model"] and header["tables"] == old["tables"]


def test_export_of_a_run_whose_data_changed_names_a_data_that_export_takes(
    after_training: Path,
) -> None:
    """The run's data.path holding other data: the refusal says "to export" (it said "to
    evaluate"), and names --data of that path only where export would take it: data of other
    cardinalities is named as such, not offered to be refused a second time."""
    (after_training / "data").rename(after_training / "kept")
    data = after_training / "data"
    changed = rf"^error: run was trained on other data than {data} now holds \(fingerprint "
    changed += r"[0-9a-f]{12}; the data there is [0-9a-f]{12}\)"
    try:
        days = ("raw/day_1", "raw/day_0")  # the same features of the same sizes, other rows
        ok(
            in_process(
                "preprocess", *days, "--out", "data", "--max-ids", "1000", cwd=after_training
            )
        )
        assert_one_line_error(
            in_process("export", "run", "--out", "m2.safetensors", cwd=after_training),
            rf"{changed}: to export on this data all the same, pass --data {data}$",
        )
        shutil.rmtree(data)
        days = ("raw/day_0", "raw/day_1")
        ok(in_process("preprocess", *days, "--out", "data", "--max-ids", "300", cwd=after_training))
        assert_one_line_error(
            in_process("export", "run", "--out", "m2.safetensors", cwd=after_training),
            rf"{changed}, and --data {data} would be refused too \(feature C1: 300 rows here, "
            r"1,000 rows in the data run trained on\): to export the run, pass "
            r"--data DIR naming the data it trained on \(or other data of its features and "
            r"cardinalities\)$",
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)
        (after_training / "kept").rename(data)
    assert not (after_training / "m2.safetensors").exists()
