"""After training, models whose ids are not hashed from the raw value alone score raw rows as
their split: a vocabulary model (ids counted over its dataset, rebuilt or moved) and a model of
multi-hot ids (materialised, or named when asked on the fly). The run they start from is
conftest's `after_training`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from after_training import (
    REPO,
    TINY,
    in_process,
    model_file,
    ok,
    rewrite_header,
    shardrec,
)
from helpers import assert_one_line_error

VOCAB = ("--min-count", "3")


@pytest.fixture(scope="module")
def vocab_run(after_training: Path) -> Path:
    """A run on vocabulary-mode data (kept as vdata.orig: tests that rebuild vdata copy it back),
    its model file, the probabilities of its test split (vsplit.npy) and the split's raw rows
    (vtest.tsv)."""
    ok(
        in_process(
            "preprocess", "raw/day_0", "raw/day_1", "--out", "vdata", *VOCAB, cwd=after_training
        )
    )
    run = ("--out-dir", "vrun", "--steps", "4", *TINY[:-2])
    ok(shardrec("train", "--data", "vdata", *run, cwd=after_training))
    ok(in_process("export", "vrun", "--out", "vocab.safetensors", cwd=after_training))
    split = ("vocab.safetensors", "vdata", "--split", "test", "--out", "vsplit.npy")
    ok(in_process("predict", *split, cwd=after_training))
    lines = (after_training / "raw" / "day_1").read_bytes().splitlines(keepends=True)
    (after_training / "vtest.tsv").write_bytes(b"".join(lines[-1000:]))
    shutil.copytree(after_training / "vdata", after_training / "vdata.orig")
    return after_training


def _raw_rows_score_as_the_split(root: Path, model: str) -> None:
    ok(in_process("predict", model, "vtest.tsv", "--out", "vraw.txt", cwd=root))
    np.testing.assert_allclose(
        np.loadtxt(root / "vraw.txt"), np.load(root / "vsplit.npy"), atol=1e-6
    )


def _rebuild_vdata(root: Path) -> None:
    """vdata preprocessed again from the days the other way round: another vocabulary."""
    shutil.rmtree(root / "vdata", ignore_errors=True)
    ok(in_process("preprocess", "raw/day_1", "raw/day_0", "--out", "vdata", *VOCAB, cwd=root))


@pytest.mark.slow
def test_a_vocabulary_model_scores_raw_rows_as_its_split_after_its_dataset_is_rebuilt(
    vocab_run: Path,
) -> None:
    """Vocabulary mode (--min-count): raw rows get the ids of the vocabulary the model trained on,
    which the model file holds: the same probabilities as the preprocessed split, also once the
    dataset directory was preprocessed again from other days (another vocabulary: raw rows were
    looked up in it, ids past the tables' rows ended in torch's traceback) and once it is gone."""
    root = vocab_run
    try:
        _raw_rows_score_as_the_split(root, "vocab.safetensors")
        _rebuild_vdata(root)
        _raw_rows_score_as_the_split(root, "vocab.safetensors")
        shutil.rmtree(root / "vdata")
        _raw_rows_score_as_the_split(root, "vocab.safetensors")
    finally:
        shutil.rmtree(root / "vdata", ignore_errors=True)
        shutil.copytree(root / "vdata.orig", root / "vdata")


@pytest.mark.slow
def test_export_with_data_of_a_moved_vocabulary_dataset_holds_that_datasets_vocabulary(
    vocab_run: Path,
) -> None:
    """`export --data DIR` of a run whose dataset moved, while its old place holds other data (as
    the refusal of that export suggests): the file records DIR and holds DIR's vocabulary (it took
    the old place's: raw rows got another vocabulary's ids)."""
    root = vocab_run
    try:
        (root / "vdata").rename(root / "vmoved")
        _rebuild_vdata(root)
        ok(in_process("export", "vrun", "--out", "m.safetensors", "--data", "vmoved", cwd=root))
        _raw_rows_score_as_the_split(root, "m.safetensors")
        from safetensors import safe_open

        with safe_open(str(root / "m.safetensors"), framework="np") as f:
            header = json.loads(f.metadata()["shardrec"])
        assert header["transform"]["dataset"] == str((root / "vmoved").resolve())
    finally:
        shutil.rmtree(root / "vdata", ignore_errors=True)
        shutil.rmtree(root / "vmoved", ignore_errors=True)
        shutil.copytree(root / "vdata.orig", root / "vdata")


@pytest.mark.slow
def test_a_model_of_materialised_multi_hot_ids_scores_raw_rows_as_its_split(
    after_training: Path,
) -> None:
    """Trained on a `data multihot` copy: raw rows are hashed as its one-hot source was and
    expanded by the same index tables (the split's probabilities), and the one-hot source itself
    is refused, not scored as if its ids were the model's."""
    sizes = "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1"
    ok(in_process("data", "multihot", "data", "--out", "mh", "--sizes", sizes, "--cache",
                  "cache", cwd=after_training))  # fmt: skip
    ok(
        shardrec(
            "train", "--config", str(REPO / "configs" / "dlrmv2.toml"), "--data", "mh",
            "--out-dir", "mat", "--nproc-per-node", "2", "--steps", "3",
            "--set", 'train.device="cpu"', "--set", "train.global_batch_size=128",
            "--set", "data.multihot_sizes=[]", "--set", "data.multihot_rows=[]",
            "--set", "model.embedding_dim=8", "--set", "model.dense_arch=[16, 8]",
            "--set", "model.over_arch=[32, 16, 1]", "--set", "model.dcn_low_rank=8",
            "--set", "train.mlperf_log=false", cwd=after_training,
        )
    )  # fmt: skip
    ok(in_process("export", "mat", "--out", "mat.safetensors", cwd=after_training))
    ok(in_process("predict", "mat.safetensors", "mh", "--out", "mh.npy", cwd=after_training))
    lines = (after_training / "raw" / "day_1").read_bytes().splitlines(keepends=True)
    (after_training / "mat_rows.tsv").write_bytes(b"".join(lines[-1000:]))
    ok(
        in_process(
            "predict", "mat.safetensors", "mat_rows.tsv", "--out", "mr.txt", cwd=after_training
        )
    )
    np.testing.assert_allclose(
        np.loadtxt(after_training / "mr.txt"), np.load(after_training / "mh.npy"), rtol=0, atol=1e-6
    )
    assert_one_line_error(
        in_process("predict", "mat.safetensors", "data", cwd=after_training),
        r"^error: data: one-hot ids, the model was trained on multi-hot ids \(sizes \[3, 2, 1\]\.\.\., "
        r"seed 0\); score data made as its training data was, or raw rows$",
    )


@pytest.mark.slow
def test_predict_with_on_the_fly_multi_hot_names_a_multi_hot_copy_and_what_to_score(
    after_training: Path,
) -> None:
    """A model that makes its multi-hot ids itself, given a `data multihot` copy: the line names
    the dataset, what made it multi-hot and what to score instead."""

    def on_the_fly(header: dict) -> None:
        header["transform"]["multihot"] = {"sizes": [2] * 26, "rows": None, "dist": "uniform",
                                           "seed": 0, "cache_dir": "cache"}  # fmt: skip

    rewrite_header(model_file(after_training), after_training / "fly.safetensors", on_the_fly)
    sizes = ",".join(["2"] * 26)
    ok(in_process("data", "multihot", "data", "--out", "mh2", "--sizes", sizes, "--cache",
                  "cache", cwd=after_training))  # fmt: skip
    assert_one_line_error(
        in_process("predict", "fly.safetensors", "mh2", "--split", "test", cwd=after_training),
        r"^error: mh2: feature C1 is already multi-hot \(a `shardrec data multihot` copy of "
        r"data\), and the model makes its multi-hot ids from one-hot ones \(trained with "
        r"data\.multihot_sizes\): score the one-hot dataset it was copied from, or raw rows$",
    )
