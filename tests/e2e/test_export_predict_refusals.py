"""After training, what `shardrec export` and `shardrec predict` refuse in one clear line: a
checkpoint of another model, a model file whose tensors disagree with its header, input without
rows, a model that cannot read raw rows, a truncated checkpoint file (eval too), an interrupted
export; and that each replaces only its own earlier output. The run they share is conftest's
`after_training`."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from after_training import (
    BATCH,
    data500,
    in_process,
    model_file,
    ok,
    rewrite_header,
    shardrec,
)
from helpers import TINY_MODEL, assert_one_line_error, settings


@pytest.mark.slow
def test_export_refuses_a_checkpoint_of_another_model_in_the_line_eval_does(
    after_training: Path,
) -> None:
    """A checkpoint of run (tables of 1000 rows) put among the checkpoints of a run on data500
    (500 rows): eval refuses it, and export refuses it in the same line, writing nothing."""
    data500(after_training)
    small = settings('train.device="cpu"', *TINY_MODEL, f"train.global_batch_size={BATCH}")
    one_rank = ("--nproc-per-node", "1", "--steps", "2", *small)
    ok(shardrec("train", "--data", "data500", "--out-dir", "run500", *one_rank, cwd=after_training))
    newest = sorted((after_training / "run" / "checkpoints").glob("step-*"))[-1]
    # Under its own step's name (a folder named for another step is refused as such first), the
    # newest of run500's (2 steps).
    assert int(newest.name.split("-")[1]) > 2, newest
    shutil.copytree(newest, after_training / "run500" / "checkpoints" / newest.name)
    line = assert_one_line_error(
        in_process("export", "run500", "--out", "foreign.safetensors", cwd=after_training),
        rf"^error: run500/checkpoints/{newest.name}: checkpoint of another model, optimizer or "
        r"dataset: .*table t_C1 \[rows, dim\]: checkpoint \[1000, 8\], job \[500, 8\]",
    )
    assert not (after_training / "foreign.safetensors").exists()
    evaluated = shardrec(
        "eval", "run500", "--device", "cpu", "--nproc-per-node", "1", cwd=after_training
    )
    assert evaluated.returncode == 1 and line in evaluated.stderr.splitlines(), evaluated.stderr


@pytest.mark.slow
def test_predict_refuses_a_model_file_whose_tensors_disagree_with_its_header(
    after_training: Path,
) -> None:
    def fewer_rows(header: dict) -> None:
        (t_c1,) = [t for t in header["tables"] if t["name"] == "t_C1"]
        t_c1["rows"] = 500

    rewrite_header(model_file(after_training), after_training / "lying.safetensors", fewer_rows)
    assert_one_line_error(
        in_process("predict", "lying.safetensors", "data", cwd=after_training),
        r"^error: lying.safetensors: tensor sparse_arch\.embedding_bag_collection\.embedding_bags\."
        r"t_C1\.weight is \[1000, 8\], its header's model needs \[500, 8\]; ",
    )


@pytest.mark.slow
def test_export_and_predict_replace_only_their_own_earlier_output(after_training: Path) -> None:
    """--out over a file of the user's is refused and the file kept; over the command's own
    earlier output (a rerun) it is replaced."""
    model_file(after_training)
    notes = after_training / "notes.txt"
    notes.write_text("notes\n")
    assert_one_line_error(
        in_process("export", "run", "--out", "notes.txt", cwd=after_training),
        r"^error: --out notes.txt: exists and is not a model file of `shardrec export`, so it is "
        r"kept; give another file name, or remove it first$",
    )
    np.save(after_training / "ints.npy", np.arange(3))
    for theirs in ("notes.txt", "ints.npy"):
        assert_one_line_error(
            in_process("predict", "model.safetensors", "data", "--out", theirs, cwd=after_training),
            rf"^error: --out {theirs}: exists and is not a file of probabilities `shardrec "
            r"predict` wrote, so it is kept; give another file name, or remove it first$",
        )
    assert notes.read_text() == "notes\n" and np.load(after_training / "ints.npy").tolist() == [
        0,
        1,
        2,
    ]
    ok(in_process("export", "run", "--out", "model.safetensors", cwd=after_training))
    for ours in ("again.npy", "again.txt"):
        for _ in range(2):
            ok(
                in_process(
                    "predict", "model.safetensors", "data", "--out", ours, cwd=after_training
                )
            )


@pytest.mark.slow
def test_ctrl_c_during_export_ends_in_one_line_and_writes_nothing(
    after_training: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    # Raised inside DCP's read, which wraps whatever its reads raise.
    monkeypatch.setattr(FileSystemReader, "read_data", pressed)
    done = in_process("export", "run", "--out", "stopped.safetensors", cwd=after_training)
    assert done.exit_code == 130, (done.output, done.exception)
    assert done.stderr.strip() == (
        "interrupted: stopped.safetensors: nothing written; rerun the same command to export"
    )
    assert not list(after_training.glob("*stopped.safetensors*"))


@pytest.mark.slow
def test_predict_refuses_input_without_rows(after_training: Path) -> None:
    model_file(after_training)
    (after_training / "empty.tsv").write_bytes(b"")
    with (after_training / "empty.tsv.gz").open("wb") as f:
        f.write(gzip.compress(b""))
    for name, line in (
        ("empty.tsv", r"^error: empty.tsv: empty \(no rows\): nothing to score$"),
        ("empty.tsv.gz", r"^error: empty.tsv.gz: no rows: nothing to score$"),
    ):
        assert_one_line_error(
            in_process("predict", "model.safetensors", name, "--out", "o.txt", cwd=after_training),
            line,
        )
    assert not (after_training / "o.txt").exists()


@pytest.mark.slow
def test_a_model_that_cannot_read_raw_rows_says_so_by_its_file_name(after_training: Path) -> None:
    """A model of data without a text schema (as `data import-npy` makes): raw rows are refused
    naming the model file and what to score instead, and no refusal offers raw rows."""

    def imported(header: dict) -> None:
        del header["transform"]["schema"]

    rewrite_header(model_file(after_training), after_training / "npy.safetensors", imported)
    lines = (after_training / "raw" / "day_1").read_bytes().splitlines(keepends=True)[-5:]
    (after_training / "five.tsv").write_bytes(b"".join(lines))
    assert_one_line_error(
        in_process("predict", "npy.safetensors", "five.tsv", cwd=after_training),
        r"^error: npy.safetensors: cannot read raw rows: .* score a preprocessed split of such "
        r"data instead: `shardrec predict npy.safetensors DATASET_DIR --split test`$",
    )
    data500(after_training)
    assert_one_line_error(
        in_process("predict", "npy.safetensors", "data500", cwd=after_training),
        r"^error: data500: preprocessed with other settings .*; preprocess it with the training "
        r"data's settings$",
    )


@pytest.mark.slow
def test_a_truncated_checkpoint_file_is_one_line_naming_it_in_export_and_eval(
    after_training: Path,
) -> None:
    """A data file cut short before its digests were written (they match it): export and eval
    say which checkpoint and which of its files cannot be read and what to do, not torch's CheckpointException; export
    leaves no file at --out."""
    from shardrec.trainer.rundir.checkpoint.trust import write_digests

    shutil.copytree(after_training / "run", after_training / "cut")
    newest = sorted((after_training / "cut" / "checkpoints").glob("step-*"))[-1]
    data = newest / "__0_0.distcp"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    write_digests(newest)
    cut = (
        rf"^error: cut/checkpoints/{newest.name}: a file of this checkpoint is truncated or "
        r"unreadable \(__0_0\.distcp: RuntimeError: [^)]*\), "
    )
    line = assert_one_line_error(
        in_process("export", "cut", "--out", "cut.safetensors", cwd=after_training),
        cut + r".*; export another checkpoint with --checkpoint STEP \(this run",
    )
    assert not list(after_training.glob("*cut.safetensors*")), line
    evaluated = shardrec(
        "eval", "cut", "--device", "cpu", "--nproc-per-node", "1", cwd=after_training
    )
    assert evaluated.returncode == 1 and "Traceback" not in evaluated.stderr, evaluated.stderr
    # eval finds it before any rank starts (torch-free: the shard's length against .metadata).
    cut_early = cut.replace(r"RuntimeError: [^)]*", r"[\d,]+ bytes, \.metadata says [\d,]+")
    assert any(
        re.search(
            cut_early + r".*; evaluate or export another checkpoint with --checkpoint STEP", x
        )
        for x in evaluated.stderr.splitlines()
    ), evaluated.stderr
