"""`shardrec bench plan`: shardrec's search against torchrec's default planner, same run, same cost models.

Every case plans one table set on one topology with torchrec's planner and with shardrec's
search twice: priced by shardrec's cost model, and priced by torchrec's own estimators.
Ratios compare estimated step time of the slowest rank (below 1: shardrec's plan is faster):
under shardrec's cost model (shardrec-model plan vs torchrec's plan), and under torchrec's
estimators (torchrec-priced shardrec plan vs torchrec's plan, i.e. the two searches on
torchrec's own objective). torchrec's planner takes
minutes beyond ~100 tables x 16 ranks on 2 cores, so its side of the suite stays below that;
the 1,000-table x 1,024-rank case runs shardrec only, to measure planning time at scale.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from shardrec.tools.cli.common import console, fail, print_json


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


def run_case(case: Case) -> dict:
    from shardrec.sharding.cost import evaluate
    from shardrec.sharding.request import SearchRequest
    from shardrec.sharding.search import search_plan
    from shardrec.sharding.topology import build_topology
    from shardrec.sharding.torchrec_planner import torchrec_plan
    from shardrec.tools.bench.torchrec_score import torchrec_score

    ts = _table_set(case.table_set)
    topo = build_topology(case.preset, case.world_size)
    t0 = time.perf_counter()
    request = SearchRequest(configs=ts.configs, topology=topo, global_batch_size=case.global_batch_size, pooling=ts.pooling)
    ours = search_plan(request)
    ours_s = time.perf_counter() - t0
    ours_cost = evaluate(ours, ts.configs, ts.pooling, topo, case.global_batch_size)
    row = {"case": case.name, "tables": len(ts.configs), "ranks": case.world_size, "shardrec_s": round(ours_s, 3),
           "shardrec_ms": ours_cost.max_step_s * 1e3, "shardrec_fits": not ours_cost.shortfall()}
    if not case.torchrec:
        return row
    t0 = time.perf_counter()
    try:
        theirs = torchrec_plan(request)
    except Exception as e:  # torchrec's PlannerError: no plan within memory
        row["torchrec_error"] = str(e).splitlines()[0]
        return row
    row["torchrec_s"] = round(time.perf_counter() - t0, 3)
    theirs_cost = evaluate(theirs, ts.configs, ts.pooling, topo, case.global_batch_size)
    row["torchrec_ms"] = theirs_cost.max_step_s * 1e3
    row["torchrec_fits"] = not theirs_cost.shortfall()
    row["ratio_shardrec_model"] = ours_cost.max_step_s / theirs_cost.max_step_s
    # The same search priced by torchrec's estimators, against torchrec's plan on torchrec's objective.
    t0 = time.perf_counter()
    ours_tr = search_plan(request, cost_model="torchrec")
    row["shardrec_torchrec_model_s"] = round(time.perf_counter() - t0, 3)
    a = torchrec_score(ours_tr, ts.configs, topo, case.global_batch_size, ts.pooling)
    b = torchrec_score(theirs, ts.configs, topo, case.global_batch_size, ts.pooling)
    c = torchrec_score(ours, ts.configs, topo, case.global_batch_size, ts.pooling)
    row["ratio_torchrec_model"] = a / b if a is not None and b else None
    row["ratio_shardrec_plan_under_torchrec_model"] = c / b if c is not None and b else None
    row["shardrec_torchrec_model_fits"] = not evaluate(ours_tr, ts.configs, ts.pooling, topo, case.global_batch_size).shortfall()
    return row


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def bench_plan(
    only: Annotated[Optional[str], typer.Option(help="Run only the cases whose name contains this text.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Cost of shardrec's plans vs torchrec's default planner (ratio < 1: shardrec faster), and both run times."""
    from rich.progress import Progress
    from rich.table import Table

    cases = [c for c in CASES if only is None or only in c.name]
    if not cases:
        fail(f"--only {only!r} matches no case (cases: {', '.join(c.name for c in CASES)})")
    rows = []
    with Progress(console=console, transient=True, disable=json_out) as progress:
        task = progress.add_task("planning", total=len(cases))
        for case in cases:
            progress.update(task, description=case.name)
            rows.append(run_case(case))
            progress.advance(task)
    result = {
        "cases": rows,
        "geomean_ratio_shardrec_model": _geomean([r.get("ratio_shardrec_model") for r in rows]),
        "geomean_ratio_torchrec_model": _geomean([r.get("ratio_torchrec_model") for r in rows]),
        "worst_ratio_shardrec_model": max((r["ratio_shardrec_model"] for r in rows if "ratio_shardrec_model" in r), default=None),
        "worst_ratio_torchrec_model": max((r["ratio_torchrec_model"] for r in rows if r.get("ratio_torchrec_model")), default=None),
        "geomean_ratio_shardrec_plan_under_torchrec_model": _geomean([r.get("ratio_shardrec_plan_under_torchrec_model") for r in rows]),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    if json_out:
        print_json(result)
        return
    t = Table(title="shardrec plan vs torchrec EmbeddingShardingPlanner (max-rank step estimate; ratio < 1: shardrec faster)")
    t.caption = ("ms: estimated slowest-rank step (shardrec model); ratio: shardrec / torchrec under shardrec's "
                 "model and under torchrec's estimators; s: planner run time")
    for col in ("case", "tables", "ranks", "ours ms", "trec ms", "ratio ours", "ratio trec", "ours s", "trec s", "fit"):
        t.add_column(col, justify="right")
    for r in rows:
        fmt = lambda v, f="{:.3f}": "-" if v is None else f.format(v)  # noqa: E731
        t.add_row(r["case"], str(r["tables"]), str(r["ranks"]), fmt(r["shardrec_ms"]), fmt(r.get("torchrec_ms")),
                  fmt(r.get("ratio_shardrec_model")), fmt(r.get("ratio_torchrec_model")),
                  fmt(r["shardrec_s"], "{:.2f}"), fmt(r.get("torchrec_s"), "{:.2f}"),
                  "yes" if r["shardrec_fits"] and r.get("torchrec_fits", True) else "NO")
    console.print(t)
    g1, g2 = result["geomean_ratio_shardrec_model"], result["geomean_ratio_torchrec_model"]
    g3 = result["geomean_ratio_shardrec_plan_under_torchrec_model"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    console.print(f"geomean ratio under shardrec's cost model: {fmt(g1)} (worst {fmt(result['worst_ratio_shardrec_model'])})")
    console.print(f"geomean ratio under torchrec's estimators, shardrec's search priced by them: {fmt(g2)} "
                  f"(worst {fmt(result['worst_ratio_torchrec_model'])}); shardrec-model plans rated by torchrec: {fmt(g3)}")
    console.print(f"peak RSS {result['peak_rss_gib']:.2f} GiB; ms are estimated max-rank step times, s are planner run times")


def _reality_plans(configs, topo, batch, pooling) -> dict[str, list]:
    """Distinct placements of the same tables: ours, torchrec's, and deliberately different ones."""
    from shardrec.sharding import layouts
    from shardrec.sharding.request import SearchRequest
    from shardrec.sharding.search import search_plan
    from shardrec.sharding.torchrec_planner import torchrec_plan

    W = topo.world_size
    request = SearchRequest(configs=configs, topology=topo, global_batch_size=batch, pooling=pooling)
    return {
        "shardrec": search_plan(request),
        "torchrec": torchrec_plan(request),
        "all row-wise": [layouts.row_wise(config, W, "fused") for config in configs],
        "all column-wise": [layouts.column_wise(config, list(range(W)), "fused") for config in configs],
        "all on rank 0": [layouts.table_wise(config, 0, "fused") for config in configs],
        "all data-parallel": [layouts.data_parallel(config, W) for config in configs],
    }


def bench_plan_reality(
    world_size: Annotated[int, typer.Option(help="Local gloo ranks.")] = 2,
    max_rows: Annotated[int, typer.Option(help="Rows per table (the demo caps ids at 50,000).")] = 50_000,
    dim: Annotated[int, typer.Option(help="Embedding width.")] = 16,
    global_batch_size: Annotated[int, typer.Option(help="Samples per step over all ranks.")] = 2048,
    steps: Annotated[int, typer.Option(help="Timed steps per plan.")] = 8,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Run a few distinct plans of the demo-sized model on CPU: does the cost model order them like the clock does,
    and do its memory estimates bound what ranks hold? Calibrates this machine first."""
    from rich.table import Table

    from shardrec.sharding import suites
    from shardrec.tools.bench.calibrate import calibrate
    from shardrec.sharding.cost import evaluate
    from shardrec.sharding.plan_io import PLAN_SCHEMA_VERSION, PlanFile, plan_fingerprint
    from shardrec.tools.bench.reality import kendall_tau, measure_plans
    from shardrec.sharding.topology import PRESETS, ClusterTopology

    if world_size < 2 or global_batch_size % world_size:
        fail(f"--world-size must be >= 2 and divide --global-batch-size ({world_size}, {global_batch_size})")
    profile = calibrate("cpu", world_size)
    values = {k: v for k, v in PRESETS["cpu-gloo"].items() if k != "local_world_size"}
    values.update(profile["measured"])
    topo = ClusterTopology(name="cpu-gloo (calibrated)", world_size=world_size, local_world_size=world_size, **values)
    ts = suites.criteo_dlrmv2(dim)
    configs = [suites.table_config(i, min(c.num_embeddings, max_rows), dim) for i, c in enumerate(ts.configs)]
    pooling = {config.name: 1.0 for config in configs}  # one-hot, as the demo's data
    plans = _reality_plans(configs, topo, global_batch_size, pooling)
    fp = plan_fingerprint(configs, world_size, global_batch_size, "cpu")
    texts = [PlanFile(PLAN_SCHEMA_VERSION, fp, placed).to_json() for placed in plans.values()]
    measured = measure_plans(configs, texts, world_size=world_size, local_batch=global_batch_size // world_size, steps=steps)
    rows = []
    for (name, placed), m in zip(plans.items(), measured):
        cost = evaluate(placed, configs, pooling, topo, global_batch_size)
        est_mem = [int(x) for x in cost.memory_bytes]
        rows.append({"plan": name, "estimated_ms": cost.max_step_s * 1e3, "measured_ms": m.step_s * 1e3,
                     "estimated_memory_bytes": est_mem, "measured_memory_bytes": m.memory_bytes,
                     "memory_bounded": all(a >= b for a, b in zip(est_mem, m.memory_bytes))})
    tau = kendall_tau([r["estimated_ms"] for r in rows], [r["measured_ms"] for r in rows])
    result = {"kendall_tau": tau, "same_order": tau == 1.0, "profile": profile["measured"], "plans": rows}
    if json_out:
        print_json(result)
        return
    t = Table(title=f"{len(configs)} tables x {dim}, {world_size} CPU ranks, batch {global_batch_size}: estimate vs clock")
    for col in ("plan", "estimated ms", "measured ms", "est. MiB (max rank)", "held MiB (max rank)", "bound"):
        t.add_column(col, justify="right")
    for r in sorted(rows, key=lambda r: r["estimated_ms"]):
        t.add_row(r["plan"], f"{r['estimated_ms']:.2f}", f"{r['measured_ms']:.2f}",
                  f"{max(r['estimated_memory_bytes']) / 2**20:.1f}", f"{max(r['measured_memory_bytes']) / 2**20:.1f}",
                  "yes" if r["memory_bounded"] else "NO")
    console.print(t)
    console.print(f"rank agreement (Kendall tau) between estimated and measured step time: {tau:.2f} (1: same order)")


def register(app: typer.Typer) -> None:
    app.command("plan")(bench_plan)
    app.command("plan-reality")(bench_plan_reality)
