"""`shardrec bench sequence`: on the synthetic Yambda-like log, the held-out window's AUC of HSTU
(configs/dlrmv4.toml) against a DLRM that pools the same history, several seeds each.

Both read the same dataset and batches (`shardrec synth --like yambda` preprocessed with
configs/yambda_events.toml): the DLRM gets the history as bags (each table mean-pooled, the
candidate's item on the history's table), the user, the crosses and the dense features (history
length, hour of day); HSTU reads the same ids in order, with their times and actions. The log's
label depends partly on the order of the history (tools/synth/yambda.py), which a pooled bag
cannot see. Each model trains with `shardrec train` on `--nproc-per-node` CPU ranks for the same
steps and seeds; the gain counts when it exceeds each model's run-to-run spread (max - min over
seeds).

One setting differs from configs/dlrmv4.toml, for both models alike: the warm-up of both rates
lasts WARMUP_FRACTION of the run instead of the reference's 200 steps. The reference's runs are
thousands of steps long; one epoch of the default log is about 460, of 60,000 rows about 130,
so its 200-step warm-up from 0 would leave half of the run, or all of it, below the set rate.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.tools.bench.proctree import run_to_end
from shardrec.tools.bench.sequence.hstu_bench import CONFIG, write_events
from shardrec.tools.console import console
from shardrec.trainer.rundir import names

POOLED_DLRM = [
    'model.arch="dlrm"',
    "model.embedding_dim=64",
    "model.dense_arch=[64, 64]",
    "model.over_arch=[128, 64, 1]",
]
"""The pooled-history baseline: DLRM's dot interaction over the same tables (pooled), the same
optimizers and rates as the HSTU run (configs/dlrmv4.toml's [optim])."""
WARMUP_FRACTION = 0.1
"""The share of a run's steps spent warming both rates up from 0 (module docstring)."""
GLOBAL_BATCH = 256
"""configs/dlrmv4.toml's train.global_batch_size: the steps of an epoch are about rows / it."""


def warmup_steps(steps: int, train_rows: int) -> int:
    """The warm-up of a run of `steps` steps (0: one epoch of `train_rows` samples)."""
    return max(1, round(WARMUP_FRACTION * (steps or math.ceil(train_rows / GLOBAL_BATCH))))


def _train(data: Path, run_dir: Path, seed: int, steps: int, nproc: int, extra: list[str]) -> float:
    """The final val AUC of one `shardrec train` run."""
    settings = [f"train.seed={seed}", "train.log_interval=1000000", *extra]
    if steps:
        settings.append(f"train.steps={steps}")
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "train",
        "--config",
        str(CONFIG),
        "--data",
        str(data),
        "--out-dir",
        str(run_dir),
        "--nproc-per-node",
        str(nproc),
        "--json",
        *[flag for s in settings for flag in ("--set", s)],
    ]
    proc = run_to_end(cmd)  # a stop ends the run's ranks too
    if proc.returncode != 0:
        raise RuntimeError(
            f"{run_dir.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    summary = json.loads((run_dir / names.SUMMARY).read_text())
    return float(summary["eval"]["val"]["auc"])


def run_quality(rows: int, seeds: int, steps: int, nproc: int) -> dict[str, Any]:
    """Train both models `seeds` times on one generated log; their val AUCs and the gain."""
    with tempfile.TemporaryDirectory() as tmp:
        data = write_events(Path(tmp), rows)
        from shardrec.dataloader.format.manifest import Manifest

        manifest = Manifest.load(data)
        warmup = f"optim.warmup_steps={warmup_steps(steps, manifest.splits['train'].rows)}"
        aucs: dict[str, list[float]] = {"hstu": [], "pooled_dlrm": []}
        for seed in range(seeds):  # interleaved: load drifts alike for both
            for name, extra in (("hstu", []), ("pooled_dlrm", POOLED_DLRM)):
                run = Path(tmp) / f"{name}-{seed}"
                aucs[name].append(_train(data, run, seed, steps, nproc, [warmup, *extra]))
    stats = {
        name: {
            "val_auc": [round(a, 5) for a in values],
            "mean": round(float(np.mean(values)), 5),
            "spread": round(float(np.max(values) - np.min(values)), 5),
        }
        for name, values in aucs.items()
    }
    gain = stats["hstu"]["mean"] - stats["pooled_dlrm"]["mean"]
    spread = max(stats["hstu"]["spread"], stats["pooled_dlrm"]["spread"])
    return {
        "rows": rows,
        "train_anchors": manifest.splits["train"].rows,
        "val_anchors": manifest.splits["val"].rows,
        "steps": steps or "one epoch",
        "seeds": seeds,
        "ranks": nproc,
        "models": stats,
        "gain": round(gain, 5),
        "largest_spread": round(spread, 5),
        "gain_exceeds_spread": bool(gain > spread),
        "worst_hstu_beats_best_dlrm": bool(min(aucs["hstu"]) > max(aucs["pooled_dlrm"])),
    }


def print_result(result: dict[str, Any]) -> None:
    console.print(
        f"synthetic Yambda-like log of {result['rows']:,} listens: {result['train_anchors']:,} "
        f"training and {result['val_anchors']:,} held-out samples; {result['steps']} steps on "
        f"{result['ranks']} CPU ranks, {result['seeds']} seeds each"
    )
    for name, s in result["models"].items():
        shown = ", ".join(f"{a:.4f}" for a in s["val_auc"])
        console.print(
            f"  {name:12s} val AUC {s['mean']:.4f} (runs {shown}; spread {s['spread']:.4f})"
        )
    verdict = "exceeds" if result["gain_exceeds_spread"] else "does NOT exceed"
    console.print(
        f"HSTU - pooled DLRM: {result['gain']:+.4f}, which {verdict} the larger run-to-run spread "
        f"({result['largest_spread']:.4f}); worst HSTU run above the best DLRM run: "
        f"{result['worst_hstu_beats_best_dlrm']}"
    )
