"""`shardrec predict` and ids of the training data's range that no training step brought: their
table rows still hold their initial random weights. predict says, per table, how many lookups
fell on such rows (and which tables it cannot tell of), scores them as they are unless asked,
and with `--untrained-as-missing` scores them as a missing value. A model file exported before
files recorded it says it cannot tell, in one line, and scores as it did."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"
"""A run of 2 ranks (table-wise tables, row-wise Adagrad) with one checkpoint, step 4, of global
batches of 64 rows."""
STEPS, BATCH = 4, 64


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fixture's run, its dataset, and its export, model.safetensors."""
    root = tmp_path_factory.mktemp("untrained")
    shutil.copytree(FIXTURE, root / "run")
    write_tiny_dataset(root / "data")
    cli("export", root / "run", "--data", root / "data", "--out", root / "model.safetensors")
    return root


def _lookups(data: Path) -> tuple[dict[str, set[int]], dict[str, np.ndarray]]:
    """The ids the run's training steps looked up (the same global batches at any world size), and
    each feature's ids of the val split."""
    from shardrec.dataloader.loader import NO_SHUFFLE, build_loader
    from shardrec.dataloader.order import ShuffleSpec

    train = build_loader(
        data, "train", global_batch_size=BATCH, rank=0, world_size=1, shuffle=ShuffleSpec(seed=0)
    )
    trained: dict[str, set[int]] = {}
    for batch in itertools.islice(iter(train), STEPS):
        for key in batch.sparse_features.keys():
            trained.setdefault(key, set()).update(batch.sparse_features[key].values().tolist())
    (val,) = build_loader(
        data, "val", global_batch_size=256, rank=0, world_size=1, shuffle=NO_SHUFFLE
    )
    return trained, {k: val.sparse_features[k].values().numpy() for k in val.sparse_features.keys()}


def _predict(root: Path, model: Path, *flags: str, ok: bool = True):
    return cli(
        "predict", model, root / "data", "--split", "val", "--out", root / "p.txt", *flags, ok=ok
    )


def test_predict_counts_per_table_the_lookups_of_rows_no_step_trained(root: Path) -> None:
    # Before: "wrote 256 probabilities to p.txt (AUC ...)" and not a word of the 300 lookups
    # (of 512 in two tables) that scored with random weights.
    trained, val = _lookups(root / "data")
    sizes = {"f0": 50, "f1": 300, "f2": 7, "f3": 1000}
    # f0 and f2 trained every row of their tables, f1 and f3 have rows that never trained: those
    # say the run drew on the CPU, so f0 and f2 are told as trained whole (before: "can't tell").
    assert [f for f in sizes if len(trained[f]) == sizes[f]] == ["f0", "f2"]
    untrained = {f: int(sum(i not in trained[f] for i in val[f])) for f in ("f1", "f3")}
    assert all(untrained.values())
    done = _predict(root, root / "model.safetensors")
    lines = done.stderr.splitlines()
    total = sum(untrained.values())
    assert lines[1:] == [
        f"{total:,} of 1,024 lookups fell on rows that never trained (at their initial random "
        "weights), in 2 of 4 tables; scored with those weights (--untrained-as-missing scores "
        "them as missing values):",
        *(f"  t_{f}: {n:,} of 256 ({n / 256:.1%})" for f, n in untrained.items()),
    ]
    summary = json.loads(_predict(root, root / "model.safetensors", "--json").stdout)
    assert summary["untrained"] == {
        "t_f0": {"lookups": 256, "untrained": 0},
        "t_f1": {"lookups": 256, "untrained": untrained["f1"]},
        "t_f2": {"lookups": 256, "untrained": 0},
        "t_f3": {"lookups": 256, "untrained": untrained["f3"]},
    }


def _exported_before(root: Path) -> Path:
    """The model file as an export before files recorded which rows trained wrote it: the same
    tensors and header, less those (and, as files before their digest, unsealed)."""
    from safetensors.torch import load_file, save_file

    from shardrec.trainer.inference.model_file import META_KEY, read_header

    header = read_header(root / "model.safetensors")
    del header["trained_rows"]
    tensors = {
        k: v
        for k, v in load_file(root / "model.safetensors").items()
        if not k.startswith("trained_rows.")
    }
    path = root / "before.safetensors"
    save_file(tensors, path, metadata={META_KEY: json.dumps(header, sort_keys=True)})
    return path


def test_by_default_the_probabilities_are_those_of_a_file_exported_before(root: Path) -> None:
    before = _exported_before(root)
    done = _predict(root, before)
    # The only word of it: one line, after the summary.
    assert done.stderr.splitlines()[1:] == [
        f"{before}: exported before model files recorded which rows trained: can't tell whether "
        "lookups fell on rows that never trained (export the run again to know)"
    ]
    scored_before = (root / "p.txt").read_bytes()
    _predict(root, root / "model.safetensors")
    assert (root / "p.txt").read_bytes() == scored_before
    assert_one_line_error(
        _predict(root, before, "--untrained-as-missing", ok=False),
        f"^error: --untrained-as-missing: {before} was exported before model files recorded which "
        "rows trained; export the run again$",
    )


def test_untrained_as_missing_changes_the_rows_with_an_untrained_lookup_only(root: Path) -> None:
    trained, val = _lookups(root / "data")
    hit = np.zeros(256, bool)
    for feature in ("f1", "f3"):
        hit |= np.array([i not in trained[feature] for i in val[feature]])
    _predict(root, root / "model.safetensors")
    as_they_are = np.loadtxt(root / "p.txt")
    done = _predict(root, root / "model.safetensors", "--untrained-as-missing")
    assert "; scored as their feature's missing value (--untrained-as-missing):" in done.stderr
    as_missing = np.loadtxt(root / "p.txt")
    assert np.array_equal(as_missing[~hit], as_they_are[~hit])
    assert (as_missing[hit] != as_they_are[hit]).all()


def test_a_run_whose_tables_a_gpu_drew_says_so_in_one_line(root: Path, tmp_path: Path) -> None:
    # Before: export wrote the file without a word and predict said "none of their rows is at its
    # initial weights (every row trained, or the run drew them on a GPU ...)", never which. The
    # record stands for a run's first start on a GPU: its draws are CUDA's, which no CPU repeats.
    run, model = tmp_path / "run", tmp_path / "gpu.safetensors"
    shutil.copytree(root / "run", run)
    (run / "initial_weights.json").write_text('{"device": "cuda", "seed": 0}\n')
    exported = cli("export", run, "--data", root / "data", "--out", model)
    assert exported.stdout.splitlines()[1:] == [
        f"{model}: can't tell which rows never trained: {run} drew its tables' initial weights "
        "on cuda (initial_weights.json), whose draws export does not repeat on the CPU"
    ]
    assert _predict(root, model).stderr.splitlines()[1:] == [
        "can't tell which lookups of t_f0, t_f1, t_f2, t_f3 fell on rows that never trained: the "
        "run drew their initial weights on cuda, whose draws export does not repeat on the CPU"
    ]


def test_a_cpu_record_tells_the_tables_only_under_the_torch_that_drew_them(
    root: Path, tmp_path: Path
) -> None:
    # Another torch release's CPU draws may differ from this one's: its record is left out of the
    # file's header (what the rows say decides), this release's is in it.
    import torch

    from shardrec.trainer.inference.model_file import read_header
    from shardrec.trainer.inference.trained_rows import DRAWN_ON_KEY

    run = tmp_path / "run"
    shutil.copytree(root / "run", run)
    found = {}
    for release in (torch.__version__, "1.0.0"):
        record = {"device": "cpu", "seed": 0, "torch": release}
        (run / "initial_weights.json").write_text(json.dumps(record))
        cli("export", run, "--data", root / "data", "--out", tmp_path / "m.safetensors")
        found[release] = read_header(tmp_path / "m.safetensors").get(DRAWN_ON_KEY)
    assert found == {torch.__version__: "cpu", "1.0.0": None}
