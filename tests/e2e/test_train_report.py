"""`shardrec report RUN_DIR` draws the curves a run's metrics.jsonl holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardrec.tools.cli import report as report_cli
from shardrec.tools.cli.app import app
from shardrec.trainer.rundir.life.stretches import Stretch, read_stretches, write_stretches

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
    # A killed attempt's step 30 logged before it, the resumed run's after: the resumed run's final.
    records[3:3] = [
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


def test_the_curves_leave_out_what_an_attempt_killed_past_its_checkpoint_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after step 7 with its checkpoint at 4 (losses logged every 2 steps), rerun with
    train.log_interval = 5 (a setting free to change): the killed attempt's step 6 was of a model
    that is gone, and the rerun logs no step 6 to replace it. Its loss and AUC must not be drawn
    between the resumed run's; nor those of a stretch's killed attempt, once it is begun again."""

    def train(step: int, loss: float) -> dict:
        return {"kind": "train", "step": step, "loss": loss, "samples_per_s": 500.0}

    def val(step: int, auc: float, final: bool = False) -> dict:
        return {"kind": "eval", "split": "val", "step": step, "auc": auc, "final": final}

    killed = [train(2, 0.697), train(4, 0.688), train(6, 0.684), val(6, 0.80)]
    resumed = [{"kind": "resume", "step": 4}, train(5, 0.698), train(10, 0.658)]
    stretch = [val(10, 0.69, True), train(12, 0.5), {"kind": "stretch", "step": 10}]
    records = killed + resumed + stretch
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn: list = []
    plot_run = report_cli.plot_run
    monkeypatch.setattr(
        report_cli, "plot_run", lambda recs, *args: drawn.extend(recs) or plot_run(recs, *args)
    )
    result = runner.invoke(app, ["report", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    losses = report_cli._series(drawn, "train", "loss")
    assert losses == ([2, 4, 5, 10], [0.697, 0.688, 0.698, 0.658])
    assert report_cli._series(drawn, "eval", "auc", "val") == ([10], [0.69])
    assert json.loads(result.stdout)["records"] == len(records) - 3


def test_a_final_evaluation_without_an_auc_is_null_in_json(tmp_path: Path) -> None:
    # Labels of one class: AUC NaN, which --json printed as NaN, no JSON number.
    evals = [{"kind": "eval", "split": "val", "step": 4, "auc": float("nan"), "final": True}]
    train = [{"kind": "train", "step": 4, "loss": 0.6, "samples_per_s": 10.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train + evals))
    shown = runner.invoke(app, ["report", str(tmp_path), "--json"])
    assert shown.exit_code == 0 and "NaN" not in shown.stdout
    assert json.loads(shown.stdout)["final_auc"] == {"val": None}


def test_a_run_that_went_on_draws_each_days_progressive_validation_and_test_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run of three days (--continue-on) evaluated days 1 and 2 before training on them: the
    # figures drew only the test split's AUC, not the progressive validation a day-by-day run is
    # judged by. Each day's test AUC is measured on that day's own test split, yet the three were
    # one "test" curve (0.67 -> 0.66 -> 0.70), read as one split's trend: each day's is its own.
    def rec(kind: str, step: int, **more) -> dict:
        return {"kind": kind, "step": step, **more}

    records = [
        rec("train", 100, loss=0.6, samples_per_s=900.0),
        rec("eval", 100, split="test", auc=0.67, logloss=0.64, final=True),
        rec("stretch", 100, stretch=1, data="days/1"),
        rec("pv", 100, stretch=1, split="train", auc=0.65, logloss=0.66),
        rec("train", 146, loss=0.62, samples_per_s=900.0),
        rec("eval", 120, split="test", auc=0.65, logloss=0.65),
        rec("eval", 146, split="test", auc=0.66, logloss=0.64, final=True),
        rec("stretch", 146, stretch=2, data="days/2"),
        rec("pv", 146, stretch=2, split="train", auc=0.67, logloss=0.64),
        rec("eval", 190, split="test", auc=0.70, logloss=0.62, final=True),
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    bounds = ((0, 100), (100, 146), (146, 190))
    write_stretches(
        tmp_path,
        [Stretch(i, str(tmp_path / "days" / str(i)), "", a, b) for i, (a, b) in enumerate(bounds)],
    )
    monkeypatch.chdir(tmp_path)  # the legend names each day's data from here
    result = runner.invoke(app, ["report", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    pv = "pv (new data, before training on it)"
    days = ["test of days/0", "test of days/1", "test of days/2"]
    assert json.loads(result.stdout)["curves"] == {
        "train loss": ["train"],
        "AUC": [*days, pv],
        "log loss": [*days, pv],
        "samples/s": ["train"],
    }
    assert report_cli._series(records, "pv", "auc") == ([100, 146], [0.65, 0.67])
    assert report_cli._eval_curves(records, "auc", read_stretches(tmp_path)) == [
        ("test of days/0", [100], [0.67]),
        ("test of days/1", [120, 146], [0.65, 0.66]),
        ("test of days/2", [190], [0.70]),
    ]


def test_json_figures_name_the_data_they_were_measured_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run of two days (--continue-on): --json's final_auc ({"test": 0.70}) said nothing of
    # which day's test split it measured, though the curves name each day's. Now it names it,
    # and each day's own figures are listed with their data.
    records = [
        {"kind": "train", "step": 100, "loss": 0.6, "samples_per_s": 900.0},
        {"kind": "eval", "step": 100, "split": "val", "auc": 0.61, "final": True},
        {"kind": "eval", "step": 100, "split": "test", "auc": 0.67, "final": True},
        {"kind": "pv", "step": 100, "stretch": 1, "split": "train", "auc": 0.65},
        {"kind": "eval", "step": 190, "split": "test", "auc": 0.70, "final": True},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "dataset.json").write_text(json.dumps({"path": str(tmp_path / "days" / "1")}))
    monkeypatch.chdir(tmp_path)
    single = json.loads(runner.invoke(app, ["report", str(tmp_path), "--json"]).stdout)
    # never continued: the one dataset's (RUN/dataset.json)
    assert single["final_auc"] == {"val": 0.61, "test": 0.70}
    assert single["final_auc_data"] == "days/1" and single["stretches"] == []
    bounds = ((0, 100), (100, 190))
    write_stretches(
        tmp_path,
        [Stretch(i, str(tmp_path / "days" / str(i)), "", a, b) for i, (a, b) in enumerate(bounds)],
    )
    shown = json.loads(runner.invoke(app, ["report", str(tmp_path), "--json"]).stdout)
    # day 1 evaluated no val split: day 0's val AUC is not given as the run's final one
    assert shown["final_auc"] == {"test": 0.70} and shown["final_auc_data"] == "days/1"
    assert shown["stretches"] == [
        {"data": "days/0", "first_step": 0, "last_step": 100,
         "final_auc": {"val": 0.61, "test": 0.67}, "pv_auc": {}},
        {"data": "days/1", "first_step": 100, "last_step": 190,
         "final_auc": {"test": 0.70}, "pv_auc": {"train": 0.65}},
    ]  # fmt: skip
