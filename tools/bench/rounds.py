"""Repeated, interleaved measurement: the one harness of every benchmark that prints a ratio.

A benchmark hands it its variants (ours and the baselines, each a function that does one run's
work and returns a `Run`: how much work, in how many wall and CPU seconds). `run_rounds` runs
every variant once untimed (the warm-up: first-touch allocations, imports, compiled kernels,
the page cache), then `rounds` rounds in which each variant runs once, the order rotating from
round to round so that none always runs first or right after the same neighbour.

A ratio is the median over rounds of the same-round ratios: load from other processes drifts
over seconds, and two variants of one round saw about the same. It is printed with its spread
(the lowest and highest round) and beside the same ratio per CPU-second, the steadier figure
on a shared machine. A run shorter than `min_run_s` measures start-up and scheduler noise more
than the work: its ratio says "too small to measure" instead of a number.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

MIN_RUN_S = 0.2
"""The shortest run (median wall seconds of a variant) whose ratio is printed."""


@dataclass(frozen=True)
class Run:
    """One timed run of one variant."""

    work: float
    """Units of work done (rows, samples, MB): rates are work per second."""
    wall_s: float
    cpu_s: float
    """CPU seconds spent on it: this process's threads, or a child's whole process tree."""

    @property
    def rate(self) -> float:
        return self.work / max(self.wall_s, 1e-12)

    @property
    def cpu_rate(self) -> float:
        return self.work / max(self.cpu_s, 1e-12)


def timed(fn: Callable[[], float]) -> Run:
    """Run `fn` (it returns the work it did), timed in wall and this process's CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    work = fn()
    return Run(float(work), time.perf_counter() - wall, time.process_time() - cpu)


def run_rounds(
    variants: Mapping[str, Callable[[], Run]],
    rounds: int,
    *,
    warmup: bool = True,
    on_run: Callable[[str, int, Run], None] | None = None,
) -> dict[str, list[Run]]:
    """Each variant once untimed (unless `warmup` is False), then `rounds` interleaved rounds;
    returns each variant's runs in round order. `on_run(name, round, run)` sees every timed run
    (progress, memory watches)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(variants)
    if warmup:
        for name in names:
            variants[name]()
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run = variants[name]()
            runs[name].append(run)
            if on_run is not None:
                on_run(name, r, run)
    return runs


@dataclass(frozen=True)
class Summary:
    """One variant over its rounds."""

    rate: float
    """Median work per wall second."""
    low: float
    high: float
    cpu_rate: float
    """Median work per CPU second."""
    run_s: float
    """Median wall seconds of a run."""

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3 if k == "run_s" else 1) for k, v in asdict(self).items()}


def summarize(runs: list[Run]) -> Summary:
    rates = [r.rate for r in runs]
    return Summary(
        statistics.median(rates),
        min(rates),
        max(rates),
        statistics.median(r.cpu_rate for r in runs),
        statistics.median(r.wall_s for r in runs),
    )


@dataclass(frozen=True)
class Spread:
    """A median over rounds with the lowest and highest round."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def to_dict(self) -> dict[str, float]:
        return {
            "median": round(self.median, 3),
            "low": round(self.low, 3),
            "high": round(self.high, 3),
            "spread": round((self.high - self.low) / self.median, 3) if self.median else 0.0,
        }


@dataclass(frozen=True)
class Ratio:
    """ours / baseline over the rounds, per wall and per CPU second, or why there is no figure:
    `too_small` (the runs measure start-up more than the work), `not_compared` (the two did not do
    the same work, so their times say nothing of each other)."""

    wall: Spread | None
    cpu: Spread | None
    rounds: int
    too_small: str = ""
    not_compared: str = ""

    @property
    def median(self) -> float | None:
        return self.wall.median if self.wall is not None else None

    def text(self, per: str = "wall") -> str:
        return ratio_text(self.to_dict(), per)

    def to_dict(self) -> dict[str, Any]:
        if self.not_compared:
            return {"not_compared": self.not_compared, "rounds": self.rounds}
        if self.wall is None:
            return {"too_small": self.too_small, "rounds": self.rounds}
        out: dict[str, Any] = {**self.wall.to_dict(), "rounds": self.rounds}
        if self.cpu is not None:
            out["per_cpu_s"] = self.cpu.to_dict()
        return out


def ratio_text(r: dict[str, Any], per: str = "wall") -> str:
    """A ratio's JSON form (Ratio.to_dict) as one phrase, its `per` figure (wall or cpu) first:
    '1.64x (1.58-1.71 over 5 rounds, spread 8%); per CPU-s 1.60x (1.55-1.66)', or 'too small to
    measure (why)' or 'not compared (why)'."""
    if "not_compared" in r:
        return f"not compared ({r['not_compared']})"
    if "too_small" in r:
        return f"too small to measure ({r['too_small']})"
    wall, cpu = r, r.get("per_cpu_s")

    def head(s: dict[str, Any]) -> str:
        return (
            f"{s['median']:.2f}x ({s['low']:.2f}-{s['high']:.2f} over {r['rounds']} rounds, "
            f"spread {s['spread']:.0%})"
        )

    def tail(s: dict[str, Any]) -> str:
        return f"{s['median']:.2f}x ({s['low']:.2f}-{s['high']:.2f})"

    if per == "cpu" and cpu is not None:
        return f"{head(cpu)} per CPU-s; wall {tail(wall)}"
    return head(wall) + (f"; per CPU-s {tail(cpu)}" if cpu is not None else "")


def ratio(
    ours: list[Run],
    baseline: list[Run],
    *,
    min_run_s: float = MIN_RUN_S,
    too_small: str = "",
    not_compared: str = "",
    cpu: bool = True,
) -> Ratio:
    """Medians over rounds of ours' rate / the baseline's in the same round (both lists in round
    order). `too_small` (a reason) withholds the figure whatever the runs; so does a median run
    shorter than `min_run_s` on either side. `not_compared` (a reason: the baseline's output is
    not ours) withholds it before anything else. `cpu`: also the ratio per CPU-second (off where
    the CPU seconds are not comparable)."""
    rounds = min(len(ours), len(baseline))
    if rounds == 0:
        raise ValueError("no rounds to compare")
    if not_compared:
        return Ratio(None, None, rounds, not_compared=not_compared)
    shortest = min(statistics.median(r.wall_s for r in side) for side in (ours, baseline))
    if not too_small and shortest < min_run_s:
        too_small = f"a run took {shortest:.3f} s, under {min_run_s} s"
    if too_small:
        return Ratio(None, None, rounds, too_small)
    pairs = list(zip(ours, baseline))
    walls = Spread.of([a.rate / b.rate for a, b in pairs])
    cpus = Spread.of([a.cpu_rate / b.cpu_rate for a, b in pairs]) if cpu else None
    return Ratio(walls, cpus, rounds)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (printed beside every ratio: loaded runs read
    otherwise)."""
    return [round(v, 2) for v in os.getloadavg()]


def goal_text(value: bool | None, ratio: dict[str, Any] | None = None) -> str:
    """A goal's verdict; None: not measured, for the reason its `ratio` (where it rests on one)
    was withheld."""
    if value is not None:
        return "met" if value else "NOT met"
    return (
        "not compared"
        if ratio is not None and "not_compared" in ratio
        else "not measured (too small)"
    )
