"""A Parquet file given where text rows are read, and a folder of files given to predict: one line
that says what the input is and what to do. Before, preprocess read the Parquet bytes as lines
('no rows kept, all 1,854 lines are malformed ... too_few_fields'), predict said 'its first line
has no ','', and a folder of Parquet files was 'not a shardrec dataset ... create one with
`shardrec preprocess`'."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"


def _parquet(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"click": [0, 1] * 50, "city": ["paris", "oslo"] * 50})
    pq.write_table(table, path)
    return path


def test_preprocess_of_a_parquet_file_without_a_parquet_spec_says_so(tmp_path: Path) -> None:
    log, out = _parquet(tmp_path / "log.parquet"), tmp_path / "data"
    fix = (
        r'; a Parquet file is read by a spec of kind = "parquet": `shardrec spec infer '
        rf"{re.escape(str(log))} --label COLUMN --out spec.toml` proposes one, then preprocess "
        r"--spec spec.toml$"
    )
    assert_one_line_error(
        cli("preprocess", log, "--out", out, ok=False),
        rf"^error: {re.escape(str(log))}: a Parquet file, and without --spec, preprocess reads "
        rf"Criteo's text{fix}",
    )
    spec = tmp_path / "csv.toml"
    spec.write_text(
        '[format]\nkind = "csv"\nheader = true\n[[columns]]\nname = "click"\nrole = "label"\n'
        '[[columns]]\nname = "city"\nrole = "categorical"\nhash_size = 10\n'
    )
    assert_one_line_error(
        cli("preprocess", log, "--spec", spec, "--out", out, ok=False),
        rf"^error: {re.escape(str(log))}: a Parquet file, and the spec {re.escape(str(spec))} "
        rf"reads CSV text{fix}",
    )
    assert not out.exists()


@pytest.fixture
def text_model(tmp_path: Path) -> Path:
    """A model of Criteo-like text rows: the fixture run exported, its header given the text
    schema its data would have recorded."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(FIXTURE, tmp_path / "run")
    write_tiny_dataset(tmp_path / "data")
    model = tmp_path / "m.safetensors"
    cli("export", tmp_path / "run", "--data", tmp_path / "data", "--out", model)
    with safe_open(str(model), framework="pt") as f:
        header = json.loads(f.metadata()["shardrec"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    header["transform"].update(schema={"num_sparse": 4}, dense_transform="log1p")
    save_file(tensors, str(model), metadata={"shardrec": json.dumps(header, sort_keys=True)})
    return model


def test_predict_names_a_parquet_file_and_a_folders_file(tmp_path: Path, text_model: Path) -> None:
    log = _parquet(tmp_path / "logs" / "part-0.parquet")
    assert_one_line_error(
        cli("predict", text_model, log, ok=False),
        rf"^error: {re.escape(str(log))}: a Parquet file, and the model reads Criteo's text rows, "
        r"as its data was written: give it rows in that format, or a dataset directory "
        r"preprocessed as its data was$",
    )
    assert_one_line_error(
        cli("predict", text_model, log.parent, ok=False),
        rf"^error: {re.escape(str(log.parent))}: a directory but not a dataset \(no "
        r"manifest.json\); predict scores a dataset directory or one file of raw rows: name one "
        rf"of its files \(e.g. {re.escape(str(log))}\)$",
    )


def test_predict_of_a_folder_names_its_file_of_the_models_rows(
    tmp_path: Path, text_model: Path
) -> None:
    """A folder of notes and a file of rows: the file named is the one of rows the model reads
    (tab-separated text), not the first by name. Before, it was `e.g. logs/a.txt`, a note."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.txt").write_text("rows of 2024-10-21\n")
    (logs / "b.csv").write_text("1,5,0000000a\n")
    (logs / "day_0").write_text("1\t5\t" + "\t" * 12 + "0000000a\t\t\t\n")
    assert_one_line_error(
        cli("predict", text_model, logs, ok=False),
        rf"^error: {re.escape(str(logs))}: a directory but not a dataset \(no manifest.json\); "
        r"predict scores a dataset directory or one file of raw rows: name one of its files "
        rf"\(e.g. {re.escape(str(logs / 'day_0'))}\)$",
    )


def test_predict_of_a_parquet_model_names_a_text_file(tmp_path: Path) -> None:
    """The other way round: a model of Parquet rows given a CSV file. Before: "error: log.csv: not
    a readable Parquet file (Parquet magic bytes not found in footer. Either the file is
    corrupted or this is not a parquet file.)", with no word of what the model reads."""
    from test_spec_flow import write_untrained_model

    log, spec = _parquet(tmp_path / "log.parquet"), tmp_path / "p.toml"
    spec.write_text(
        '[format]\nkind = "parquet"\n[[columns]]\nname = "click"\nrole = "label"\n'
        '[[columns]]\nname = "city"\nrole = "categorical"\nkind = "string"\nhash_size = 10\n'
    )
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d")
    write_untrained_model(tmp_path / "d", tmp_path / "m.safetensors")
    text = tmp_path / "log.csv"
    pq.read_table(log).to_pandas().to_csv(text, index=False)
    assert_one_line_error(
        cli("predict", tmp_path / "m.safetensors", text, ok=False),
        rf"^error: {re.escape(str(text))}: not a Parquet file, and the model reads Parquet files, "
        r"as its data was written: give it rows in that format, or a dataset directory "
        r"preprocessed as its data was$",
    )
    cli("predict", tmp_path / "m.safetensors", log, "--out", tmp_path / "p.txt")
    assert len((tmp_path / "p.txt").read_text().split()) == 100
