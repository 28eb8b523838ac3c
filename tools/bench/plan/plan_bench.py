"""`shardrec bench plan`: shardrec's search against torchrec's default planner, same run, same
memory.

Every case plans one table set on one topology with torchrec's EmbeddingShardingPlanner and with
shardrec's search, both keeping the same share of each rank's memory free (15% by default,
torchrec's default margin: torchrec through a FixedPercentageStorageReservation in place of its
heuristic, shardrec by planning for the memory left). Ratios compare the estimated step time of
the slowest rank (below 1: shardrec's plan is faster). The headline is the plan `shardrec plan`
writes against torchrec's, both priced by the cost model that predicts measured step times better
on the case's kind of machine (`bench plan-reality` decides; `--profile` with its verdict, else
planner.DEFAULT_COST_MODEL) and the one `shardrec plan` searched with; CPU cases also train both
plans on local ranks and give the measured ratio (interleaved rounds after a warm-up round, the
median of same-round ratios with its spread: tools/bench/rounds.py). Secondary lines: both
searches under each model (the two models disagree, and each search wins on its own). torchrec's planner takes
minutes beyond ~100 tables x 16 ranks on 2 cores, so its side of the suite stays below that;
the 1,000-table x 1,024-rank case runs shardrec only, to measure planning time at scale.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from shardrec.tools.bench.rounds import Run, ratio, ratio_text
from shardrec.tools.console import console


@dataclass(frozen=True)
class Case:
    name: str
    table_set: str
    preset: str
    world_size: int
    global_batch_size: int
    torchrec: bool = True


CASES = (
    Case("criteo26/h100x8", "criteo26", "h100", 8, 65536),
    Case("criteo26/h100x16", "criteo26", "h100", 16, 65536),
    Case("criteo26/a100x32", "criteo26", "a100", 32, 65536),
    Case("random40-s0/a100x4", "random:0:40", "a100", 4, 16384),
    Case("random60-s1/h100x8", "random:1:60", "h100", 8, 32768),
    Case("random80-s2/h100x16", "random:2:80", "h100", 16, 65536),
    Case("random100-s3/h200x8", "random:3:100", "h200", 8, 32768),
    Case("random50-s4/cpu-gloo x2", "random:4:50:1e6", "cpu-gloo", 2, 4096),
    Case("prod1000[:100]/h100x8", "prod:100", "h100", 8, 32768),
    Case("prod1000/h100x1024", "prod:1000", "h100", 1024, 1048576, torchrec=False),
)


def _table_set(spec: str):
    from shardrec.sharding import suites

    if spec == "criteo26":
        return suites.criteo_dlrmv2()
    kind, *args = spec.split(":")
    if kind == "random":
        return suites.random_tasks(int(args[0]), int(args[1]), *(float(a) for a in args[2:]))
    full = suites.production_like(1000)
    return full if int(args[0]) == 1000 else suites.subset(full, int(args[0]))


MEASURE_STEPS = 8
"""Timed steps of each plan per round in the CPU cases (after one untimed step)."""
MEASURE_ROUNDS = 3
"""Interleaved rounds of the two plans, after one more as the warm-up."""
RESERVE = 0.15
"""Share of each rank's memory both planners keep free: torchrec's default planner margin."""


def _torchrec_side(request, reserve: float, row: dict) -> list | None:
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    from shardrec.sharding.torchrec.torchrec_planner import torchrec_plan

    t0 = time.perf_counter()
    try:
        # The same fixed share as ours, in place of torchrec's heuristic (15% + dense + KJT inputs).
        theirs = torchrec_plan(request, FixedPercentageStorageReservation(reserve))
    except Exception as e:  # torchrec's PlannerError: no plan within memory
        row["torchrec_error"] = str(e).splitlines()[0]
        return None
    row["torchrec_s"] = round(time.perf_counter() - t0, 3)
    return theirs


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run_case(
    case: Case, reserve: float = RESERVE, cost_model: str = "", measure: bool = True
) -> dict:
    """Plan one case with both planners (each keeping `reserve` of every rank's memory free) and
    price both plans; the headline prices the plan `shardrec plan` writes (searched on `cost_model`,
    "": the device kind's default) and torchrec's with that model; CPU cases also train both
    (`measure`)."""
    from dataclasses import replace

    from shardrec.sharding.cost.cost_model import evaluate
    from shardrec.sharding.machine.topology import build_topology
    from shardrec.sharding.planner import DEFAULT_COST_MODEL, priced_by
    from shardrec.sharding.search.request import SearchRequest
    from shardrec.sharding.search.shardrec_search import search_plan
    from shardrec.tools.bench.plan.torchrec_score import torchrec_score

    ts = _table_set(case.table_set)
    # Both keep `reserve` free: shardrec through the topology, torchrec through its reservation.
    topo = replace(build_topology(case.preset, case.world_size), reserve_fraction=reserve)
    request = SearchRequest(
        configs=ts.configs,
        topology=topo,
        global_batch_size=case.global_batch_size,
        pooling=ts.pooling,
    )
    t0 = time.perf_counter()
    ours = search_plan(request)
    ours_s = time.perf_counter() - t0
    ours_cost = evaluate(ours, ts.configs, ts.pooling, topo, case.global_batch_size)
    row = {
        "case": case.name,
        "tables": len(ts.configs),
        "ranks": case.world_size,
        "shardrec_s": round(ours_s, 3),
        "shardrec_ms": ours_cost.max_step_s * 1e3,
        "shardrec_fits": not ours_cost.shortfall(),
    }
    if not case.torchrec:
        return row
    theirs = _torchrec_side(request, reserve, row)
    if theirs is None:
        return row
    theirs_cost = evaluate(theirs, ts.configs, ts.pooling, topo, case.global_batch_size)
    row.update(torchrec_ms=theirs_cost.max_step_s * 1e3, torchrec_fits=not theirs_cost.shortfall())
    row["ratio_shardrec_model"] = ours_cost.max_step_s / theirs_cost.max_step_s
    # Headline: shardrec's search run on torchrec's objective and torchrec's plan, both priced by
    # torchrec's estimators, so neither search is judged by a cost model it was tuned to.
    t0 = time.perf_counter()
    ours_on_tr = search_plan(request, problem=priced_by(request, "torchrec"))
    row["shardrec_torchrec_model_s"] = round(time.perf_counter() - t0, 3)
    row["shardrec_torchrec_model_fits"] = not evaluate(
        ours_on_tr, ts.configs, ts.pooling, topo, case.global_batch_size
    ).shortfall()
    score = lambda plan: torchrec_score(plan, ts.configs, topo, case.global_batch_size, ts.pooling)  # noqa: E731
    theirs_tr, ours_tr, default_tr = score(theirs), score(ours_on_tr), score(ours)
    row.update(
        shardrec_torchrec_ms=None if ours_tr is None else ours_tr * 1e3,
        torchrec_torchrec_ms=None if theirs_tr is None else theirs_tr * 1e3,
    )
    row["ratio_torchrec_estimators"] = _ratio(ours_tr, theirs_tr)
    # Secondary: the plan shardrec's own cost model searches as torchrec's estimators rate it.
    row["ratio_default_plan_torchrec_estimators"] = _ratio(default_tr, theirs_tr)
    # Headline: the plan `shardrec plan` writes (searched on the better predictor) against
    # torchrec's, both priced by that predictor.
    # Which model is better is measured (a --profile's verdict) or, without one, not known.
    row["cost_model_source"] = "profile" if cost_model else "default"
    row["cost_model"] = cost_model = cost_model or DEFAULT_COST_MODEL[topo.device_kind]
    written = ours if cost_model == "shardrec" else ours_on_tr
    row["ratio_headline"] = (
        row["ratio_shardrec_model"]
        if cost_model == "shardrec"
        else row["ratio_torchrec_estimators"]
    )
    if measure and topo.device_kind == "cpu":
        _measure_both(row, ts, written, theirs, case)
    return row


def _measure_both(row: dict, ts, written, theirs, case: Case) -> None:
    """Train the written plan and torchrec's on local CPU ranks: the slowest rank's step of each."""
    from shardrec.sharding.plan.plan_file import plan_fingerprint
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile
    from shardrec.tools.bench.plan.reality import measure_plans

    fp = plan_fingerprint(ts.configs, case.world_size, case.global_batch_size, "cpu")
    texts = [PlanFile(PLAN_SCHEMA_VERSION, fp, placed).to_json() for placed in (written, theirs)]
    ours_m, theirs_m = measure_plans(
        ts.configs,
        texts,
        world_size=case.world_size,
        local_batch=case.global_batch_size // case.world_size,
        steps=MEASURE_STEPS,
        rounds=MEASURE_ROUNDS + 1,
        pooling=ts.pooling,
    )
    # The first round is the warm-up (a fresh process's one-off costs), the rest are the rounds.
    ours_s, theirs_s = ours_m.round_step_s[1:], theirs_m.round_step_s[1:]
    row.update(
        measured_shardrec_ms=statistics.median(ours_s) * 1e3,
        measured_torchrec_ms=statistics.median(theirs_s) * 1e3,
    )
    # torchrec's rate over ours is our step time over theirs: below 1, shardrec's plan is faster.
    measured = ratio(_runs(theirs_s), _runs(ours_s), cpu=False)
    row["measured"] = measured.to_dict()
    row["ratio_measured"] = measured.median


def _runs(step_s: list[float]) -> list[Run]:
    """Each round's mean step as a run of MEASURE_STEPS steps (the ranks' CPU time not kept)."""
    return [Run(MEASURE_STEPS, s * MEASURE_STEPS, 0.0) for s in step_s]


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


RATIOS = (
    "ratio_headline",
    "ratio_torchrec_estimators",
    "ratio_shardrec_model",
    "ratio_default_plan_torchrec_estimators",
    "ratio_measured",
)


def _summary(rows: list[dict], reserve: float) -> dict:
    result: dict = {
        "cases": rows,
        "reserve": reserve,
        "reservation": f"both planners keep {reserve:.0%} of each rank's memory free "
        f"(torchrec: FixedPercentageStorageReservation({reserve}); shardrec: "
        f"plans for {1 - reserve:.0%} of the memory)",
    }
    for key in RATIOS:
        values = [r[key] for r in rows if r.get(key) is not None]
        name = key.removeprefix("ratio_")
        result[f"geomean_ratio_{name}"] = _geomean(values)
        result[f"worst_ratio_{name}"] = max(values, default=None)
        result[f"cases_ratio_{name}"] = len(values)
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return result


def print_plan_table(result: dict) -> None:
    from rich.table import Table

    t = Table(
        title="shardrec plan vs torchrec EmbeddingShardingPlanner (slowest-rank step; ratio < 1: shardrec faster)"
    )
    t.caption = (
        "model: the cost model the case is priced by (--profile's measured verdict, else the default); "
        "ratio: the plan `shardrec plan` writes / torchrec's "
        "under it; meas.: the same, trained (CPU cases); trec, own: shardrec's search on each model vs torchrec's "
        "plan, under torchrec's estimators and shardrec's cost model; s: planner run time"
    )
    for col in ("case", "model", "ratio", "meas.", "trec", "own", "ours s", "trec s", "fit"):
        t.add_column(col, justify="right")
    fmt = lambda v, f="{:.3f}": "-" if v is None else f.format(v)  # noqa: E731
    for r in result["cases"]:
        t.add_row(
            r["case"],
            r.get("cost_model", "-"),
            fmt(r.get("ratio_headline")),
            "small" if "too_small" in r.get("measured", {}) else fmt(r.get("ratio_measured")),
            fmt(r.get("ratio_torchrec_estimators")),
            fmt(r.get("ratio_shardrec_model")),
            fmt(r["shardrec_s"], "{:.2f}"),
            fmt(r.get("torchrec_s"), "{:.2f}"),
            "yes" if r["shardrec_fits"] and r.get("torchrec_fits", True) else "NO",
        )
    console.print(t)
    for r in result["cases"]:
        if "measured" in r:  # the trained ratio with its spread (rounds.py)
            console.print(
                f"{r['case']} trained, shardrec's step / torchrec's: {ratio_text(r['measured'])}",
                highlight=False,
            )
    g = lambda k: fmt(result[f"geomean_ratio_{k}"])  # noqa: E731
    w = lambda k: fmt(result[f"worst_ratio_{k}"])  # noqa: E731
    n = lambda k: result[f"cases_ratio_{k}"]  # noqa: E731
    console.print(f"{result['reservation']}")
    for key, label in (
        ("torchrec_estimators", "shardrec's search on torchrec's estimators, under them"),
        ("shardrec_model", "shardrec's search on its cost model, under it"),
        (
            "default_plan_torchrec_estimators",
            "shardrec's search on its cost model, under torchrec's estimators",
        ),
    ):
        console.print(f"  also {label}: geomean {g(key)} (worst {w(key)}, {n(key)} cases)")
    if n("measured"):
        console.print(
            f"  measured on CPU ranks: geomean {g('measured')} (worst {w('measured')}, {n('measured')} cases)"
        )
    console.print(f"peak RSS {result['peak_rss_gib']:.2f} GiB")
    # The headline last, where the eye lands.
    console.print(
        f"headline (the plan `shardrec plan` writes vs torchrec's, {_priced_by(result['cases'])}): "
        f"geomean {g('headline')}, worst {w('headline')}, {n('headline')} cases",
        soft_wrap=True,  # one line, whatever the terminal's width: scripts read the last line
    )


def _priced_by(cases: list[dict]) -> str:
    """What priced the headline: the better predictor only where a profile measured which it is."""
    priced = [r for r in cases if "ratio_headline" in r]
    sources = {r["cost_model_source"] for r in priced}
    if sources == {"profile"}:
        return "priced by the better predictor, as --profile measured it"
    if sources == {"default"}:
        models = " and ".join(sorted({f"{r['cost_model']}'s" for r in priced}))
        return f"priced by {models} cost model, the default: no --profile measured which is better"
    return "priced by --profile's measured better predictor where it applies, else the default"


def profile_verdict(profile: Path | None) -> tuple[str, str]:
    """(device kind, cost model) a calibration profile's `cost_model` verdict is for ("", "" without
    one)."""
    from shardrec.sharding.machine.json_checks import read_strict_json
    from shardrec.sharding.machine.topology import load_profile

    if profile is None:
        return "", ""
    winner = load_profile(profile).get("cost_model", "")
    raw = read_strict_json(profile, "calibration profile")
    return (raw.get("device_kind", "cpu") if winner else ""), winner


def run_plan_bench(
    cases: list[Case],
    reserve: float,
    profile: Path | None,
    measure: bool,
    show_progress: bool = True,
) -> dict:
    """Plan every case with both planners, keeping `reserve` of each rank's memory free, each case
    priced by the better predictor (`profile`'s verdict for its kind of machine; without one, the
    default model); the summary."""
    from rich.progress import Progress

    kind, winner = profile_verdict(profile)
    rows = []
    with Progress(console=console, transient=True, disable=not show_progress) as progress:
        task = progress.add_task("planning", total=len(cases))
        for case in cases:
            progress.update(task, description=case.name)
            device_kind = "cpu" if case.preset == "cpu-gloo" else "cuda"
            rows.append(run_case(case, reserve, winner if device_kind == kind else "", measure))
            progress.advance(task)
    return _summary(rows, reserve)
