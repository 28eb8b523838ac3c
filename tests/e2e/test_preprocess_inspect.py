"""`data stats`, `data head --plot`, and torchrec day-file import/export, end to end."""

from __future__ import annotations

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
from shardrec.tools.synth.criteo import write_dataset

runner = CliRunner()


def cli(*args, ok: bool = True):
    result = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def columns(directory: Path, split: str) -> dict[str, np.ndarray]:
    parts = open_split(directory, split)
    names = ["labels", "dense", *Manifest.load(directory).feature_names]
    get = lambda p, n: p.labels if n == "labels" else p.dense if n == "dense" else p.sparse[n]  # noqa: E731
    return {n: np.concatenate([np.asarray(get(p, n)) for p in parts]) for n in names}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("inspect")
    raw = write_dataset(base / "raw", rows=1500, seed=2, max_vocab=400)[0]
    cli("preprocess", raw, "--out", base / "data", "--max-ids", "700", "--chunk-mb", "0.1")
    return base / "data"


def test_stats_json_and_planner_statistics(dataset: Path, tmp_path: Path):
    res = json.loads(cli("data", "stats", dataset, "--json", "--plot", tmp_path / "f.png").stdout)
    assert {s["split"]: s["rows"] for s in res["splits"]} == {
        "train": 1285,
        "val": 108,
        "test": 107,
    }
    c1 = next(f for f in res["features"] if f["feature"] == "C1")
    train_c1 = columns(dataset, "train")["C1"]
    counts = np.sort(np.bincount(train_c1, minlength=700))[::-1]
    assert c1["distinct_ids"] == int((counts > 0).sum())
    assert c1["top1_share"] == pytest.approx(counts[:7].sum() / len(train_c1), abs=1e-6)
    assert c1["top10_share"] == pytest.approx(counts[:70].sum() / len(train_c1), abs=1e-6)
    assert c1["mean_ids_per_sample"] == 1.0 and c1["p95_ids_per_sample"] == 1.0
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [d["feature"] for d in res["dense"]][:2] == ["I1", "I2"] and res["dense"][1]["min"] >= 0


def test_plot_to_an_unwritable_path_is_a_clear_error(dataset: Path, tmp_path: Path):
    (tmp_path / "a_file").write_text("")
    png = tmp_path / "a_file" / "f.png"  # a file where a folder should be
    res = cli("data", "stats", dataset, "--plot", png, ok=False)
    assert_one_line_error(res, "(?=.*cannot write the figure)(?=.*f\\.png)")
    assert list(tmp_path.iterdir()) == [tmp_path / "a_file"]


def test_head_shows_decoded_rows(dataset: Path):
    rows = json.loads(cli("data", "head", dataset, "-n", "3", "--split", "test", "--json").stdout)
    test = columns(dataset, "test")
    assert len(rows) == 3
    assert [r["label"] for r in rows] == test["labels"][:3].tolist()
    assert [r["C7"] for r in rows] == test["C7"][:3].tolist()
    assert rows[2]["I13"] == float(test["dense"][2, 12])
    text = cli("data", "head", dataset, "-n", "2").stdout
    assert "C26" in text and "label" in text


def test_inspecting_a_non_dataset_is_a_clear_error(tmp_path: Path):
    res = cli("data", "stats", tmp_path, ok=False)
    assert_one_line_error(res, re.escape("not a shardrec dataset"))


def test_a_torchrec_npy_folder_is_named_with_the_command_that_converts_it(tmp_path: Path):
    # It was told to `shardrec preprocess`, which does not read .npy files.
    for kind, shape in (("dense", (4, 13)), ("sparse", (4, 26)), ("labels", (4, 1))):
        np.save(
            tmp_path / f"day_0_{kind}.npy",
            np.zeros(shape, np.float32 if kind == "dense" else np.int64),
        )
    want = (
        f"{tmp_path}: torchrec's .npy layout (day_N_dense/sparse/labels.npy), not a shardrec "
        f"dataset (no manifest.json); convert it with `shardrec data import-npy {tmp_path} "
        "--out NEW_DIR`"
    )
    for command in (["data", "stats", tmp_path], ["data", "head", tmp_path]):
        assert_one_line_error(cli(*command, ok=False), re.escape(want))
    for command in ("plan", "train"):
        assert_one_line_error(cli(command, "--data", tmp_path, ok=False), re.escape(want))


def test_torchrec_npy_export_then_import_round_trips(dataset: Path, tmp_path: Path):
    written = json.loads(
        cli("data", "export-npy", dataset, "--out", tmp_path / "npy", "--json").stdout
    )
    n = len(written)
    assert np.load(tmp_path / "npy" / f"day_{n - 1}_labels.npy").shape == (108 + 107, 1)
    assert np.load(tmp_path / "npy" / "day_0_sparse.npy").dtype == np.int64
    cli("data", "import-npy", tmp_path / "npy", "--out", tmp_path / "back", "--max-ids", "700")
    assert verify(tmp_path / "back") == []
    for split in ("train", "val", "test"):
        a, b = columns(dataset, split), columns(tmp_path / "back", split)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{split} {name}")


def test_npy_import_takes_ids_modulo_hashes_like_torchrec(tmp_path: Path):
    src = tmp_path / "npy"
    src.mkdir()
    rng = np.random.default_rng(0)
    for day, rows in enumerate([6, 5]):
        np.save(src / f"day_{day}_dense.npy", rng.random((rows, 13), dtype=np.float32))
        np.save(src / f"day_{day}_sparse.npy", rng.integers(0, 2**32, (rows, 26), dtype=np.int64))
        np.save(src / f"day_{day}_labels.npy", rng.integers(0, 2, (rows, 1)).astype(np.int32))
    cli("data", "import-npy", src, "--out", tmp_path / "data", "--max-ids", "97")
    sparse1 = np.load(src / "day_1_sparse.npy")
    val, test = columns(tmp_path / "data", "val"), columns(tmp_path / "data", "test")
    assert len(val["labels"]) == 3 and len(test["labels"]) == 2  # torchrec: val = first ceil(5/2)
    np.testing.assert_array_equal(test["C5"], sparse1[3:, 4] % 97)
    np.testing.assert_array_equal(val["dense"], np.load(src / "day_1_dense.npy")[:3])
    missing = cli("data", "import-npy", tmp_path / "nothing", "--out", tmp_path / "x", ok=False)
    assert_one_line_error(missing, re.escape("not a directory"))


@pytest.mark.slow
def test_exported_days_read_back_by_torchrec_with_the_same_val_split(dataset: Path, tmp_path: Path):
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

    written = json.loads(cli("data", "export-npy", dataset, "--out", tmp_path, "--json").stdout)
    last = len(written) - 1
    paths = {k: [str(tmp_path / f"day_{last}_{k}.npy")] for k in ("dense", "sparse", "labels")}
    cards = [f.cardinality for f in Manifest.load(dataset).sparse_features]
    pipe = InMemoryBinaryCriteoIterDataPipe("val", paths["dense"], paths["sparse"], paths["labels"], batch_size=1000,
                                            rank=0, world_size=1, hashes=cards)  # fmt: skip
    batch = next(iter(pipe))
    val = columns(dataset, "val")
    assert batch.labels.numpy().astype(np.uint8).tolist() == val["labels"].tolist()
    np.testing.assert_array_equal(batch.dense_features.numpy(), val["dense"])
    ids = batch.sparse_features.to_dict()
    np.testing.assert_array_equal(ids["cat_4"].values().numpy(), val["C5"])


@pytest.mark.parametrize("val_half", ["first", "second"])
def test_npy_round_trip_gives_back_val_as_val_whichever_half_it_was(val_half, tmp_path: Path):
    # A --val-half second dataset was exported test-first and imported (torchrec's val-first
    # default) with val and test swapped, without a word.
    from shardrec.dataloader.format.source import open_source

    raw = write_dataset(tmp_path / "raw", rows=1500, seed=2, max_vocab=400)[0]
    cli("preprocess", raw, "--out", tmp_path / "d", "--max-ids", "700", "--val-half", val_half)
    val, test = columns(tmp_path / "d", "val"), columns(tmp_path / "d", "test")
    assert len(val["labels"]) + len(test["labels"]) == 215  # odd: halves that are not ceil/floor
    exported = cli("data", "export-npy", tmp_path / "d", "--out", tmp_path / "npy").stdout
    cli("data", "import-npy", tmp_path / "npy", "--out", tmp_path / "back", "--max-ids", "700")
    for split, want in (("val", val), ("test", test)):
        got = columns(tmp_path / "back", split)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{split} {name}")
        in_place = open_source(tmp_path / "npy", split).parts[0]
        np.testing.assert_array_equal(in_place.labels, want["labels"], err_msg=split)
    assert exported.endswith(f"(val {len(val['labels'])} rows, then test {len(test['labels'])})\n")
    swapped = ["--max-ids", "700", "--val-half", "second"]
    refused = cli(
        "data", "import-npy", tmp_path / "npy", "--out", tmp_path / "x", *swapped, ok=False
    )
    assert_one_line_error(refused, re.escape("--val-half second would swap them: leave it out"))
    assert not (tmp_path / "x").exists()
