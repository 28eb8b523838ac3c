"""Evaluation as MLPerf schedules it, and the stop at a target AUC.

MLPerf DLRMv2 evaluates every fixed fraction of an epoch (0.05: 20 times) and ends the run
once validation AUC reaches the target (0.80275); its figures are the time and the samples
it took to get there. DLRMv4 evaluates every ROUND(0.001 x FLOOR(train samples / global
batch)) steps, and skips the evaluations before a share of the epoch that depends on the global
batch (eval.skip_until_fraction). `EvalSchedule` says at which steps training evaluates (every
eval.interval_steps, and every eval.every_epoch_fraction of an epoch counted from the epoch's
first step, from the skip point on); `TargetTracker` watches the evaluations and records the
first that reaches train.target_auc.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any


@dataclass(frozen=True)
class EvalSchedule:
    interval_steps: int
    """Every N global steps (0: off)."""
    epoch_steps: int
    """Every N steps counted from each epoch's first step (0: off)."""
    skip_until_step: int = 0
    """Scheduled evaluations before this global step are skipped (DLRMv4's skip_eval_epoch_pct)."""

    @classmethod
    def of(
        cls,
        interval_steps: int,
        every_epoch_fraction: float,
        train_rows: int,
        global_batch_size: int,
        rounding: str = "floor",
        skip_until_fraction: float = 0.0,
    ) -> EvalSchedule:
        """The schedule for eval.interval_steps and eval.every_epoch_fraction over a training split
        of `train_rows`: every floor(fraction * rows / global batch) steps, MLPerf DLRMv2's
        FLOOR(TOTAL_TRAINING_SAMPLES / (GLOBAL_BATCH_SIZE * NUM_EVAL)), exact (0.05 is 1/20, not the
        float just above it); with `rounding` "round", DLRMv4's ROUND(fraction * FLOOR(rows /
        global batch)). Evaluations wait until CEIL(skip_until_fraction * rows / global batch)."""
        skip = math.ceil(Fraction(repr(skip_until_fraction)) * train_rows / global_batch_size)
        if every_epoch_fraction <= 0:
            return cls(interval_steps, 0, skip)
        steps = fraction_steps(every_epoch_fraction, train_rows, global_batch_size, rounding)
        return cls(interval_steps, max(1, steps), skip)

    def due(self, step: int, epoch_start: int) -> bool:
        """Whether training evaluates after `step` (of the epoch that began at `epoch_start`)."""
        if step < self.skip_until_step:
            return False
        return bool(
            (self.interval_steps and step % self.interval_steps == 0)
            or (self.epoch_steps and (step - epoch_start) % self.epoch_steps == 0)
        )

    def next_after(self, step: int, epoch_start: int) -> int | None:
        """The first evaluation step after `step` (None when the schedule is empty)."""
        step = max(step, self.skip_until_step - 1)
        candidates = []
        if self.interval_steps:
            candidates.append((step // self.interval_steps + 1) * self.interval_steps)
        if self.epoch_steps:
            candidates.append(
                epoch_start + ((step - epoch_start) // self.epoch_steps + 1) * self.epoch_steps
            )
        return min(candidates) if candidates else None


def fraction_steps(
    every_epoch_fraction: float, train_rows: int, global_batch_size: int, rounding: str = "floor"
) -> int:
    """The steps between evaluations that eval.every_epoch_fraction asks for (EvalSchedule.of);
    0 where the fraction is less than a step of this data, which the schedule makes every step."""
    fraction = Fraction(repr(every_epoch_fraction))
    if rounding == "round":
        return round(fraction * (train_rows // global_batch_size))
    return math.floor(fraction * train_rows / global_batch_size)


def fraction_below_a_step(
    every_epoch_fraction: float, train_rows: int, global_batch_size: int, rounding: str = "floor"
) -> str | None:
    """The warning for an eval.every_epoch_fraction that is less than one step of this data (so
    the run evaluates after every step), or None."""
    if every_epoch_fraction <= 0:
        return None
    if fraction_steps(every_epoch_fraction, train_rows, global_batch_size, rounding) > 0:
        return None
    return (
        f"eval.every_epoch_fraction = {every_epoch_fraction} is less than one step of "
        f"{train_rows:,} training samples in global batches of {global_batch_size} (a step is "
        f"{global_batch_size / train_rows:.3g} of the epoch): the run evaluates after every step; "
        "raise it, or set eval.interval_steps instead"
    )


@dataclass
class TargetTracker:
    """The first evaluation whose AUC on `split` reaches `target` (target 0: never)."""

    target: float
    split: str | None
    """The split the target is for: val when training evaluates it, else the first evaluated."""
    global_batch_size: int
    start: float = field(default_factory=time.perf_counter)
    """Wall-clock origin of time-to-target: training's start in this process (evaluations count)."""
    reached: dict[str, Any] | None = None
    last: tuple[int, dict[str, dict[str, Any]]] | None = None
    """(step, results) of the latest evaluation."""

    @classmethod
    def for_splits(cls, target: float, splits: list[str], global_batch_size: int) -> TargetTracker:
        split = "val" if "val" in splits else (splits[0] if splits else None)
        return cls(target, split, global_batch_size)

    def check(
        self, step: int, results: dict[str, dict[str, Any]], train_seconds: float
    ) -> dict[str, Any] | None:
        """Note an evaluation; returns the target record the first time it reaches the target."""
        self.last = (step, results)
        if not self.target or self.reached is not None or self.split not in results:
            return None
        auc = results[self.split]["auc"]
        if not auc >= self.target:  # NaN (one class only) never reaches it
            return None
        self.reached = {
            "kind": "target",
            "step": step,
            "split": self.split,
            "auc": auc,
            "target_auc": self.target,
            "time_to_target_s": round(time.perf_counter() - self.start, 3),
            "train_seconds_to_target": round(train_seconds, 3),
            "samples_to_target": step * self.global_batch_size,
        }
        return self.reached

    def summary(self) -> dict[str, Any]:
        """The summary's target fields (None where no target was set or reached)."""
        r = self.reached or {}
        return {
            "target_auc": self.target or None,
            "target_reached": bool(r) if self.target else None,
            "steps_to_target": r.get("step"),
            "time_to_target_s": r.get("time_to_target_s"),
            "samples_to_target": r.get("samples_to_target"),
        }
