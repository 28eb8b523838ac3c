"""The trained run the after-training tests share (tests/e2e/test_eval_export.py,
test_export_predict.py, test_predict_vocab_multihot.py, test_export_predict_refusals.py;
importable as `after_training`: tests/ is on sys.path via conftest.py): synth -> preprocess -> a
2-rank train with a low target AUC, made once a session by conftest's `after_training` fixture,
and the commands and records the tests read it with.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

from helpers import TINY_MODEL, settings
from typer.testing import CliRunner, Result

from shardrec.tools.cli.app import app

REPO = Path(__file__).resolve().parents[1]


BATCH = 128


TARGET = 0.6


FRACTION = 0.25


TINY = settings(
    'train.device="cpu"',
    *TINY_MODEL,
    f"train.global_batch_size={BATCH}",
    'data.eval_splits=["val", "test"]',
    # A constraint that holds on 2 ranks only (two 4-wide column shards on distinct ranks):
    # evaluating on another number of ranks must still work.
    'sharding.constraints={t_C3={sharding_types=["column_wise"], min_partition=4}}',
)


INIT_EVENTS = (
    "cache_clear init_start submission_benchmark submission_org submission_division submission_status "
    "submission_platform global_batch_size gradient_accumulation_steps seed opt_name opt_base_learning_rate "
    "opt_adagrad_learning_rate_decay opt_weight_decay opt_adagrad_initial_accumulator_value opt_adagrad_epsilon "
    "opt_learning_rate_warmup_steps opt_learning_rate_decay_start_step opt_learning_rate_decay_steps"
).split()


TO_TARGET = settings(
    "train.epochs=3", f"eval.every_epoch_fraction={FRACTION}", f"train.target_auc={TARGET}"
)


def shardrec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def in_process(*args: str, cwd: Path) -> Result:
    """`shardrec ARGS` in directory cwd, in this process: for the commands that start no ranks
    (synth, preprocess, export, predict, and refusals and reruns that end before any rank starts),
    which would otherwise pay an interpreter start (and torch's import) each."""
    with contextlib.chdir(cwd):
        return CliRunner().invoke(app, list(args))


TRAIN_TO_TARGET = (
    "train",
    "--data",
    "data",
    "--out-dir",
    "run",
    "--nproc-per-node",
    "2",
    "--json",
    *TINY,
    *TO_TARGET,
)
"""`shardrec train` of the tiny model on data into run, stopping at the target AUC."""


def ok(done: subprocess.CompletedProcess | Result) -> subprocess.CompletedProcess | Result:
    if isinstance(done, Result):
        assert done.exit_code == 0, f"{done.output[-3000:]}\n{done.exception!r}"
    else:
        assert done.returncode == 0, f"{done.args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def run_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_eval(run: Path, split: str) -> dict:
    (record,) = [
        r for r in run_records(run) if r["kind"] == "eval" and r["final"] and r["split"] == split
    ]
    return record


def train_to_target(root: Path) -> Path:
    """A preprocessed dataset (day_0: train, day_1: val + test) and a run that stopped at the
    target."""
    ok(in_process("synth", "raw", "--rows", "4000", "--days", "2", "--max-vocab", "500", cwd=root))
    ok(
        in_process(
            "preprocess", "raw/day_0", "raw/day_1", "--out", "data", "--max-ids", "1000", cwd=root
        )
    )
    done = ok(
        shardrec(*TRAIN_TO_TARGET, cwd=root)
    )  # a process of its own: its stderr is the ranks' too
    # torch's deprecation notices about calls torchrec makes are no concern of the user's.
    assert "Warning" not in done.stderr, done.stderr[-3000:]
    return root


def model_file(root: Path) -> Path:
    """The run exported to root/model.safetensors (once)."""
    if not (root / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=root))
    return root / "model.safetensors"


def data500(root: Path) -> Path:
    """The same rows preprocessed into tables of 500 rows (the run's have 1000)."""
    if not (root / "data500").is_dir():
        flags = ["--out", "data500", "--max-ids", "500"]
        ok(in_process("preprocess", "raw/day_0", "raw/day_1", *flags, cwd=root))
    return root / "data500"


def rewrite_header(model: Path, out: Path, edit) -> None:
    """`model`'s tensors under its header as `edit` changes it, written to `out`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(model), framework="pt") as f:
        header = json.loads(f.metadata()["shardrec"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(header)
    save_file(tensors, str(out), metadata={"shardrec": json.dumps(header, sort_keys=True)})
