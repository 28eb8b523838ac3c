"""`shardrec report RUN_DIR` draws the curves a run's metrics.jsonl holds."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from shardrec.tools.cli.app import app

runner = CliRunner()


def test_report_draws_a_png_and_names_a_bad_record(tmp_path: Path) -> None:
    records = [
        {"kind": "train", "step": s, "loss": 0.7 - s / 100, "samples_per_s": 1000.0 + s}
        for s in (10, 20, 30)
    ]
    records += [
        {
            "kind": "eval",
            "split": "val",
            "step": s,
            "auc": 0.6 + s / 100,
            "logloss": 0.6,
            "final": s == 30,
        }
        for s in (10, 30)
    ]
    records += [
        {"kind": "resume", "step": 20},
        {"kind": "train", "step": 30, "loss": 0.4, "samples_per_s": 900.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = runner.invoke(app, ["report", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["panels"] == ["train loss", "AUC", "log loss", "samples/s"] and out["final_auc"] == {
        "val": 0.9
    }
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (tmp_path / "metrics.jsonl").write_text('{"kind": "train"\n')
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 1 and "metrics.jsonl:1" in result.output
    result = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 1 and f"{tmp_path / 'missing'}: does not exist" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "no metrics.jsonl" in result.output


def test_a_run_stopped_before_its_first_loss_record_says_so_in_the_loss_panel(
    tmp_path: Path,
) -> None:
    """A run that reached train.target_auc at step 10, before the first train record (every
    train.log_interval = 25 steps): the loss panel is there and says no loss was recorded; a
    run with one train record draws its one point."""
    evals = [
        {"kind": "eval", "split": "val", "step": 10, "auc": 0.70, "logloss": 0.63, "final": f}
        for f in (False, True)
    ]
    target = {"kind": "target", "step": 10, "split": "val", "auc": 0.70, "target_auc": 0.5}
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [evals[0], target, evals[1]])
    )
    shown = runner.invoke(app, ["report", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.strip() == (
        f"wrote {tmp_path / 'curves.png'} (train loss: none recorded before the run ended at "
        "step 10 (it is logged every train.log_interval steps), AUC, log loss; 3 records)"
    )
    out = json.loads(runner.invoke(app, ["report", str(tmp_path), "--json"]).stdout)
    assert out["panels"] == ["train loss", "AUC", "log loss"]
    assert out["empty_panels"] == ["train loss"]

    one = {"kind": "train", "step": 10, "loss": 0.65, "samples_per_s": 1000.0}
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [one, evals[0], target, evals[1]])
    )
    out = json.loads(runner.invoke(app, ["report", str(tmp_path), "--json"]).stdout)
    assert out["panels"] == ["train loss", "AUC", "log loss", "samples/s"]
    assert out["empty_panels"] == []
