"""predict on rows whose labels are all one class says the AUC has none, as eval does. Before, it
printed "AUC against the input's labels nan"."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import cli, cli_process, click_city_spec
from test_spec_flow import write_untrained_model


def test_rows_of_one_class_print_no_auc_and_why(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(click_city_spec())
    rows = "".join(f"{i % 2},city{i % 5}\n" for i in range(200))
    (tmp_path / "log.csv").write_text("click,city\n" + rows)
    cli("preprocess", tmp_path / "log.csv", "--spec", tmp_path / "s.toml", "--out", tmp_path / "d")
    model = tmp_path / "m.safetensors"
    write_untrained_model(tmp_path / "d", model)
    (tmp_path / "zeros.csv").write_text("click,city\n0,city1\n0,city2\n0,city3\n")
    # (The lines after the first say which lookups fell on rows that never trained.)
    done = cli_process(["predict", str(model), "zeros.csv", "--out", "p.txt"], tmp_path)
    assert re.fullmatch(
        r"wrote 3 probabilities to p.txt \(AUC against the input's labels n/a \(labels of one "
        r"class\)\)",
        done.stderr.splitlines()[0],
    ), done.stderr
    done = cli_process(["predict", str(model), "log.csv", "--out", "p.txt"], tmp_path)
    assert re.fullmatch(
        r"wrote 200 probabilities to p.txt \(AUC against the input's labels 0\.\d{6}\)",
        done.stderr.splitlines()[0],
    ), done.stderr
