"""A click log of no dense columns (a spec of a label and categoricals) trains, exports and scores
without torch's notices: its dense layers read nothing and learn their bias alone, which torch's
initializer warned of ("Initializing zero-element tensors is a no-op") in every rank of train,
eval and predict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import cli, click_city_spec, train_tiny


def test_a_log_without_dense_columns_trains_and_predicts_without_torchs_notices(
    tmp_path: Path,
) -> None:
    (tmp_path / "s.toml").write_text(click_city_spec())
    rows = "".join(f"{i % 2},city{i % 5}\n" for i in range(600))
    (tmp_path / "log.csv").write_text("click,city\n" + rows)
    cli("preprocess", tmp_path / "log.csv", "--spec", tmp_path / "s.toml", "--out", tmp_path / "d")
    trained = train_tiny(tmp_path / "d", tmp_path / "run", "train.global_batch_size=64")
    assert "Warning" not in trained.stderr, trained.stderr[-3000:]
    cli("export", tmp_path / "run", "--out", tmp_path / "m.safetensors")
    predicted = subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", "predict", "m.safetensors", "log.csv",
         "--out", "p.txt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    assert predicted.stderr.startswith("wrote 600 probabilities to p.txt"), predicted.stderr
