"""`shardrec report RUN_DIR`: loss, AUC and throughput curves of a training run, as PNG."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from shardrec.tools.cli.common import fail, print_json, save_figure
from shardrec.tools.console import console, err_console
from shardrec.trainer.rundir.life.stretches import Stretch, read_stretches
from shardrec.trainer.rundir.life.trained_data import read_dataset_record
from shardrec.trainer.rundir.metrics_log import current_records, load_metrics


def _series(
    records: list[dict[str, Any]], kind: str, key: str, split: str | None = None
) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric; after a resume the later record of a step wins."""
    by_step: dict[int, float] = {}
    for r in records:
        if r.get("kind") == kind and key in r and (split is None or r.get("split") == split):
            by_step[int(r["step"])] = float(r[key])
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _eval_curves(
    records: list[dict[str, Any]], key: str, stretches: Sequence[Stretch]
) -> list[tuple[str, list[int], list[float]]]:
    """One curve of `key` per split, and for a run that went on (--continue-on) per split and
    stretch: each stretch evaluates its own data's splits, so a line from one day's test AUC to
    the next day's would read as one split's trend. Named by the stretch's data."""
    splits = sorted({r["split"] for r in records if r.get("kind") == "eval"})
    if len(stretches) < 2:
        return [(s, *_series(records, "eval", key, s)) for s in splits]
    curves = []
    for split in splits:
        steps, values = _series(records, "eval", key, split)
        for i, stretch in enumerate(stretches):
            mine = [
                (step, v) for step, v in zip(steps, values) if _stretch_of(step, stretches) == i
            ]
            label = f"{split} of {_data_name(stretch.data)}"
            curves.append((label, [s for s, _ in mine], [v for _, v in mine]))
    return curves


def _stretch_of(step: int, stretches: Sequence[Stretch]) -> int:
    """The index of the stretch an evaluation at `step` measured: the one past whose first step it
    is (the evaluation at that step ended the stretch before)."""
    return bisect.bisect_left([s.first_step for s in stretches[1:]], step)


def _data_name(path: str) -> str:
    """A stretch's data (an absolute path) as a legend names it: from the working directory where
    it is under it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """RUN/metrics.jsonl's records of the run as it stands (current_records: not those of an
    attempt killed past the checkpoint a later one resumed from). A torn last line (a run killed
    while appending it) is skipped with a warning on stderr; a bad line before the last is
    corruption: ValueError names file:line."""
    log = load_metrics(run_dir, torn="last")
    for line in log.skipped:
        err_console.print(
            f"[yellow]warning:[/] {escape(str(log.path))}:{line}: torn last record skipped (a run "
            "killed while writing it?)",
            highlight=False,
            markup=True,
            soft_wrap=True,
        )
    return current_records(log.records)


def no_loss_note(records: list[dict[str, Any]]) -> str:
    """What the train loss panel says in place of a curve when the run has no train record: a run
    stopped (by train.target_auc, say) before its first train.log_interval steps logs none."""
    steps = [int(r["step"]) for r in records if isinstance(r.get("step"), int)]
    end = f" at step {max(steps):,}" if steps else ""
    return f"none recorded before the run ended{end} (it is logged every train.log_interval steps)"


def plot_run(
    records: list[dict[str, Any]], out: Path, title: str, stretches: Sequence[Stretch] = ()
) -> dict[str, list[str]]:
    """Draw train loss, eval AUC / log loss and samples/s against the step into `out` (PNG);
    `stretches`: the run's (RUN/stretches.json), each stretch's evaluations a curve of its own.

    Returns the panels drawn, each with its curves' labels: those the run has data for, and the
    train loss panel always (with no_loss_note in place of a curve where the run logged no loss).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    # A run that went on (--continue-on) evaluated each new day before training on it: its
    # progressive validation, at the step the day began.
    pv = "pv (new data, before training on it)"
    panels = [
        ("train loss", [("train", *_series(records, "train", "loss"))]),
        (
            "AUC",
            [*_eval_curves(records, "auc", stretches), (pv, *_series(records, "pv", "auc"))],
        ),
        (
            "log loss",
            [
                *_eval_curves(records, "logloss", stretches),
                (pv, *_series(records, "pv", "logloss")),
            ],
        ),
        ("samples/s", [("train", *_series(records, "train", "samples_per_s"))]),
    ]
    panels = [(name, [c for c in curves if c[1]]) for name, curves in panels]
    panels = [(name, curves) for name, curves in panels if curves or name == "train loss"]
    if not any(curves for _, curves in panels):
        raise ValueError("the run has no train or eval records to plot")
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(8, 2.6 * len(panels)), sharex=True, squeeze=False
    )
    for ax, (name, curves) in zip(axes[:, 0], panels):
        for label, steps, values in curves:
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
        ax.set_ylabel(name)
        if not curves:
            note = no_loss_note(records)
            text = note.replace(" (", "\n(", 1)  # two lines: the panel is narrower than the note
            ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
            continue
        ax.grid(alpha=0.3)
        if len(curves) > 1 or name != "train loss":
            ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    return {name: [label for label, _, _ in curves] for name, curves in panels}


def _aucs(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """{split: AUC} of these records, the later of a split's winning; NaN (a split whose labels
    are of one class) is no JSON number: None."""
    return {r["split"]: round(r["auc"], 4) if r["auc"] == r["auc"] else None for r in records}


def final_figures(
    records: list[dict[str, Any]], stretches: Sequence[Stretch], dataset: dict[str, Any] | None
) -> dict[str, Any]:
    """`--json`'s figures, each with the data it was measured on, as the curves name it: each
    stretch of a run that went on (--continue-on) evaluated its own data's splits, so a final AUC
    without its data's name reads as the first day's. `dataset`: RUN/dataset.json (the data of a
    run never continued; None where the run has none).

    Returns final_auc ({split: AUC} of the final evaluations of the newest stretch that made
    any), final_auc_data (that stretch's data) and stretches (each stretch's data, steps, final
    AUC and progressive validation AUC; empty for a run never continued)."""
    finals = [r for r in records if r.get("kind") == "eval" and r.get("final")]
    per_stretch = [
        {
            "data": _data_name(s.data),
            "first_step": s.first_step,
            "last_step": s.last_step,
            "final_auc": _aucs([r for r in finals if _stretch_of(int(r["step"]), stretches) == i]),
            "pv_auc": _aucs(
                [r for r in records if r.get("kind") == "pv" and r.get("stretch") == i]
            ),
        }
        for i, s in enumerate(stretches)
    ]
    newest = next((s for s in reversed(per_stretch) if s["final_auc"]), None)
    if newest is not None:
        final, data = newest["final_auc"], newest["data"]
    else:  # a run never continued: its one dataset (a continued one's finals lie in a stretch)
        final = _aucs(finals)
        path = dataset.get("path") if dataset else None
        data = _data_name(str(path)) if final and path else None
    return {"final_auc": final, "final_auc_data": data, "stretches": per_stretch}


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `shardrec train`.")],
    out: Annotated[
        Path | None, typer.Option(help="PNG to write (default RUN_DIR/curves.png).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Draw a run's loss, AUC and throughput curves (metrics.jsonl) into a PNG."""
    try:
        records = read_records(run_dir)
        target = out or run_dir / "curves.png"
        panels = plot_run(records, target, str(run_dir), read_stretches(run_dir))
    except ValueError as e:
        fail(f"{run_dir}: {e}" if str(run_dir) not in str(e) else str(e))
    empty = [] if _series(records, "train", "loss")[0] else ["train loss"]
    result = {
        "png": str(target),
        "panels": list(panels),
        "curves": panels,
        "empty_panels": empty,
        "records": len(records),
        **final_figures(records, read_stretches(run_dir), read_dataset_record(run_dir)),
    }
    if json_out:
        print_json(result)
    else:
        shown = [f"{p}: {no_loss_note(records)}" if p in empty else p for p in panels]
        console.print(
            f"wrote {target} ({', '.join(shown)}; {len(records)} records)",
            highlight=False,
            soft_wrap=True,
        )


def register(app: typer.Typer) -> None:
    app.command()(report)
