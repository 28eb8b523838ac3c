"""Data preprocessed by another spec than the model's training data: predict and `eval --data`
name the first column (or format setting) that differs, where both specs are known. Before, they
named only the specs' hashes: "preprocessed with other settings than the model's training data
(spec_sha256: 'd677...' in training, '924f...' here)", which says nothing of what to change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli
from test_spec_flow import write_untrained_model

from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.inference.eval_request import _check_schema
from shardrec.trainer.rundir.life.trained_data import dataset_record


def _dataset(tmp_path: Path, name: str, transform: str) -> Path:
    """The same log and spec but for the dense column's transform."""
    log, spec = tmp_path / "log.csv", tmp_path / f"{name}.toml"
    log.write_text("click,city,n\n" + "".join(f"{i % 2},c{i % 7},{i % 13}\n" for i in range(300)))
    spec.write_text(
        '[format]\nkind = "csv"\nheader = true\n[[columns]]\nname = "click"\nrole = "label"\n'
        '[[columns]]\nname = "city"\nrole = "categorical"\nkind = "string"\nhash_size = 16\n'
        f'[[columns]]\nname = "n"\nrole = "dense"\ntransform = "{transform}"\n'
    )
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / name)
    return tmp_path / name


def test_predict_and_eval_name_the_column_whose_spec_differs(tmp_path: Path) -> None:
    trained, other = _dataset(tmp_path, "a", "log1p"), _dataset(tmp_path, "b", "none")
    model = tmp_path / "m.safetensors"
    write_untrained_model(trained, model)
    differs = "(spec column 'n': transform: 'log1p' in training, 'none' here)"
    assert_one_line_error(
        cli("predict", model, other, ok=False),
        rf"^error: {re.escape(str(other))}: preprocessed with other settings than the model's "
        rf"training data {re.escape(differs)}; preprocess it with the training data's settings, "
        r"or score its raw rows \(the model applies them\)$",
    )
    # `eval RUN --data`: the run's record names its data, whose manifest holds the spec.
    run = tmp_path / "run"
    run.mkdir()
    (run / "dataset.json").write_bytes(dataset_record(str(trained), Manifest.load(trained)))
    said = (
        f"--data {other}: preprocessed with other settings than the data {run} trained on "
        f"{differs}; preprocess it with the training data's settings"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        _check_schema(run, other, Manifest.load(other))
