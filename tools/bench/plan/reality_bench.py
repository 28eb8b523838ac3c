"""`shardrec bench plan-reality`: train a spread of plans on local CPU ranks and hold both cost
models and the memory estimate against the clock and each rank's measured peak.

Per plan (reality_plans.py: both planners' and deliberately different or bad ones, at least 12)
the bench prices the plan with shardrec's cost model and with torchrec's estimators, estimates
each rank's memory (cost.PlanCost.memory_bytes), then trains it for real (reality.py) and
measures the slowest rank's step time and each rank's peak resident set growth. It reports, for
each cost model, the rank agreement with the measured step times (Kendall tau) and the median
relative error, and for the memory estimate each rank's error. The model that orders the plans
better is the one `shardrec plan` should search with on this kind of machine: `--profile-out`
writes it, with the fitted framework memory, into a calibration profile `shardrec plan --profile`
reads. Plans whose estimate does not fit this host's available memory are not run (and say so).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from shardrec.embeddings.managed.map_memory import id_map_bytes
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.tools.console import console

GiB = 2**30
LARGE_ROWS, LARGE_DIM = 3_000_000, 32
"""--large: 2.28 GiB of tables (Criteo's 26 capped at 3 M rows, 32 wide): a balanced plan holds
>= 1 GiB per rank on 2 ranks; all data-parallel needs ~14 GiB on the host."""


def _setup(
    world_size: int, max_rows: int, dim: int, num_tables: int, batch: int, profile: Path | None
):
    """(topology, tables, dense footprint, measured profile figures) of the case."""
    from shardrec.embeddings.tables import build_ebc
    from shardrec.sharding import suites
    from shardrec.sharding.machine.memory import dense_footprint
    from shardrec.sharding.machine.topology import (
        PRESETS,
        PROFILE_KEYS,
        ClusterTopology,
        load_profile,
    )
    from shardrec.tools.bench.plan.reality import NUM_DENSE, RealityModel
    from shardrec.tools.measure.calibrate import calibrate
    from shardrec.trainer.job.model_section import ModelConfig
    from shardrec.trainer.model.models import build_model

    measured = load_profile(profile) if profile else calibrate("cpu", world_size)["measured"]
    measured = {
        k: v for k, v in measured.items() if k in PROFILE_KEYS
    }  # not a verdict of an earlier run
    values = {k: v for k, v in PRESETS["cpu-gloo"].items() if k != "local_world_size"}
    values.update(measured)
    topo = ClusterTopology(
        name="cpu-gloo (calibrated)", world_size=world_size, local_world_size=world_size, **values
    )
    # Criteo's 26 cardinalities (DLRMv2's), capped: a few small tables, many at the cap.
    cardinalities = list(suites.DLRMV2_ROWS[:num_tables]) + [max_rows] * max(
        0, num_tables - len(suites.DLRMV2_ROWS)
    )
    configs = [
        suites.table_config(i, min(rows, max_rows), dim) for i, rows in enumerate(cardinalities)
    ]
    spec = RealityModel()
    model = build_model(
        ModelConfig(
            embedding_dim=dim, dense_arch=[*spec.dense_arch, dim], over_arch=list(spec.over_arch)
        ),
        build_ebc(configs),
        [c.feature_names[0] for c in configs],
        NUM_DENSE,
        dense_device="meta",
    )
    return topo, configs, dense_footprint(model, spec.dense_optimizer), measured


MANAGED = TableSettings(kind="managed", rows=1, evict_every=4)
"""The managed tables of `--managed N`: lru, admission after 2 sightings, an update every 4 steps
(each step brings new ids: the maps' waiting ids stay full, their misses as many as a window
holds)."""


def managed_settings(configs, count: int) -> dict[str, TableSettings]:
    """The `count` largest tables as managed tables of their rows (slots = rows - 2)."""
    largest = sorted(configs, key=lambda c: (-c.num_embeddings, c.name))[:count]
    return {
        c.feature_names[0]: dataclasses.replace(MANAGED, rows=c.num_embeddings - 2) for c in largest
    }


def _estimates(name, source, placed, request, batch: int) -> dict[str, Any]:
    from shardrec.sharding.cost.cost_model import evaluate
    from shardrec.tools.bench.plan.torchrec_score import torchrec_score

    cost = evaluate(
        placed,
        request.configs,
        request.pooling,
        request.topology,
        batch,
        request.optimizer,
        dense=request.dense,
    )
    theirs = torchrec_score(
        placed, request.configs, request.topology, batch, request.pooling, request.optimizer
    )
    return {
        "plan": name,
        "source": source,
        "shardrec_ms": cost.max_step_s * 1e3,
        "torchrec_ms": None if theirs is None else theirs * 1e3,
        "estimated_memory_bytes": [int(x) for x in cost.memory_bytes],
    }


def _rel(est: float, meas: float) -> float:
    return (est - meas) / meas if meas else 0.0


def judge_models(rows: list[dict]) -> dict[str, Any]:
    """Kendall tau and median relative error of each model on the plans both priced; the winner
    orders the plans better (ties: the smaller median error)."""
    from shardrec.tools.bench.plan.reality import kendall_tau

    both = [r for r in rows if r.get("measured_ms") and r["torchrec_ms"] is not None]
    out: dict[str, Any] = {"plans": len(both)}
    for model in ("shardrec", "torchrec"):
        est = [r[f"{model}_ms"] for r in both]
        meas = [r["measured_ms"] for r in both]
        out[model] = {
            "kendall_tau": kendall_tau(est, meas) if both else None,
            "median_relative_error": statistics.median(abs(_rel(e, m)) for e, m in zip(est, meas))
            if both
            else None,
        }
    score = lambda m: (out[m]["kendall_tau"] or -2.0, -(out[m]["median_relative_error"] or 0.0))  # noqa: E731
    out["winner"] = max(("shardrec", "torchrec"), key=score)
    return out


def judge_memory(rows: list[dict], framework_bytes: float) -> dict[str, Any]:
    """Per-rank relative errors of the memory estimate, overall and where a rank holds >= 1 GiB, and
    the framework figure that would centre them (the median residual plus the model's own)."""
    errors, large, residuals = [], [], []
    for r in rows:
        for est, meas in zip(r["estimated_memory_bytes"], r.get("measured_memory_bytes") or []):
            errors.append(_rel(est, meas))
            residuals.append(meas - est)
            if meas >= GiB:
                large.append(_rel(est, meas))
    summary = lambda xs: {  # noqa: E731
        "ranks": len(xs),
        "max_abs_error": max((abs(x) for x in xs), default=None),
        "median_abs_error": statistics.median(abs(x) for x in xs) if xs else None,
        "within_10pct": sum(abs(x) <= 0.10 for x in xs),
    }
    fitted = (
        max(0.0, framework_bytes + statistics.median(residuals)) if residuals else framework_bytes
    )
    return {
        "all_ranks": summary(errors),
        "ranks_at_least_1gib": summary(large),
        "fitted_framework_bytes": fitted,
    }


def _runnable(rows: list[dict], limit_bytes: float) -> None:
    """Mark plans whose estimate (all ranks run on this host) exceeds `limit_bytes`, 0: 80% of the
    memory available now."""
    from shardrec.sharding.machine.hardware import available_memory_bytes

    limit = limit_bytes or (available_memory_bytes() or 0) * 0.8
    for r in rows:
        need = sum(r["estimated_memory_bytes"])
        if need > limit:
            r["skipped"] = (
                f"needs {need / GiB:.1f} GiB on this host, over the {limit / GiB:.1f} GiB limit"
            )


def run_reality(
    *,
    world_size: int,
    max_rows: int,
    dim: int,
    num_tables: int,
    global_batch_size: int,
    steps: int,
    rounds: int,
    profile: Path | None = None,
    memory_limit_bytes: float = 0,
    managed_tables: int = 0,
) -> dict[str, Any]:
    """Plan, price, train and judge (see the module docstring); the result as a dict.
    `managed_tables`: the N largest tables are managed tables of the same rows (their id maps on
    every rank, in the estimate and in the measurement: MANAGED)."""
    from shardrec.sharding.plan.plan_file import plan_fingerprint
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile
    from shardrec.sharding.search.request import SearchRequest
    from shardrec.tools.bench.plan.reality import measure_plans
    from shardrec.tools.bench.plan.reality_plans import reality_plans

    topo, configs, dense, measured = _setup(
        world_size, max_rows, dim, num_tables, global_batch_size, profile
    )
    pooling = {c.name: 1.0 for c in configs}  # one-hot batches, as the demo's data
    managed = managed_settings(configs, managed_tables)
    if managed:
        window = global_batch_size // world_size * MANAGED.evict_every
        maps = sum(id_map_bytes(s, window, world_size) for s in managed.values())
        dense = dataclasses.replace(dense, id_map_bytes=maps)
    request = SearchRequest(
        configs=configs,
        topology=topo,
        global_batch_size=global_batch_size,
        pooling=pooling,
        dense=dense,
    )
    plans = reality_plans(request)
    rows = [
        _estimates(name, source, placed, request, global_batch_size)
        for name, (source, placed) in plans.items()
    ]
    _runnable(rows, memory_limit_bytes)
    run = [r for r in rows if "skipped" not in r]
    fp = plan_fingerprint(configs, world_size, global_batch_size, "cpu")
    texts = [PlanFile(PLAN_SCHEMA_VERSION, fp, plans[r["plan"]][1]).to_json() for r in run]
    local_batch = global_batch_size // world_size
    measured_plans = measure_plans(
        configs,
        texts,
        world_size=world_size,
        local_batch=local_batch,
        steps=steps,
        rounds=rounds,
        managed=managed or None,
    )
    for r, m in zip(run, measured_plans):
        r.update(
            measured_ms=m.step_s * 1e3,
            measured_memory_bytes=m.memory_bytes,
            memory_error=[
                round(_rel(e, x), 4) for e, x in zip(r["estimated_memory_bytes"], m.memory_bytes)
            ],
            held_memory_bytes=m.held_bytes,
            phase_bytes=m.phase_bytes,
        )
    table_bytes = sum(c.num_embeddings * c.embedding_dim * 4 for c in configs)
    maps = (
        f", {len(managed)} managed ({dense.id_map_bytes / GiB:.2f} GiB of id maps per rank)"
        if managed
        else ""
    )
    return {
        "case": f"{len(configs)} tables x {dim} (<= {max_rows:,} rows, {table_bytes / GiB:.2f} GiB"
        f"{maps}), {world_size} CPU ranks, batch {global_batch_size}",
        "profile": measured,
        "cost_models": judge_models(run),
        "memory": judge_memory(run, topo.memory.framework_bytes),
        "memory_model": vars(topo.memory),
        "measured_memory": "per rank, growth of the process's peak resident set (VmHWM) over building, "
        "sharding and training the plan (dense layers and optimizers included); held: its weights and optimizer state",
        "plans": rows,
    }


def _fmt(value: float | None, spec: str = "{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def print_reality(result: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"{result['case']}: estimates vs measurement")
    t.caption = (
        "ms: slowest rank's step, estimated by shardrec's cost model (ours) and torchrec's estimators (trec), and "
        "measured; MiB per rank: estimate / measured peak RSS growth (error)"
    )
    for col in ("plan", "ours ms", "trec ms", "meas. ms", "MiB per rank: est / measured (error)"):
        t.add_column(col, justify="left" if col.startswith(("plan", "MiB")) else "right")
    for r in result["plans"]:
        if "skipped" in r:
            t.add_row(
                r["plan"],
                _fmt(r["shardrec_ms"]),
                _fmt(r["torchrec_ms"]),
                "-",
                f"not run: {r['skipped']}",
            )
            continue
        per_rank = "; ".join(
            f"{e / 2**20:,.1f} / {m / 2**20:,.1f} ({err:+.0%})"
            for e, m, err in zip(
                r["estimated_memory_bytes"], r["measured_memory_bytes"], r["memory_error"]
            )
        )
        t.add_row(
            r["plan"],
            _fmt(r["shardrec_ms"]),
            _fmt(r["torchrec_ms"]),
            _fmt(r["measured_ms"]),
            per_rank,
        )
    console.print(t)
    mem, cm = result["memory"], result["cost_models"]
    for key, label in (
        ("all_ranks", "every rank"),
        ("ranks_at_least_1gib", "ranks holding >= 1 GiB"),
    ):
        m = mem[key]
        if m["ranks"]:
            console.print(
                f"memory estimate, {label}: {m['within_10pct']} of {m['ranks']} within 10%, median error "
                f"{m['median_abs_error']:.1%}, worst {m['max_abs_error']:.1%}"
            )
    console.print(
        f"framework memory that centres the errors: {mem['fitted_framework_bytes'] / 2**20:,.1f} MiB per rank"
    )
    for model, label in (
        ("shardrec", "shardrec's cost model"),
        ("torchrec", "torchrec's estimators"),
    ):
        console.print(
            f"{label}: Kendall tau {_fmt(cm[model]['kendall_tau'])} with measured step times, median relative "
            f"error {_fmt(cm[model]['median_relative_error'], '{:.0%}')} ({cm['plans']} plans)"
        )
    console.print(f"better predictor on this machine: {cm['winner']}")


def write_profile(result: dict[str, Any], path: Path) -> None:
    """A calibration profile: this run's measured figures, the winning cost model and the fitted
    memory figure."""
    from shardrec.tools.measure.calibrate import PROFILE_FORMAT, save_profile

    measured = {
        k: v
        for k, v in result["profile"].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    cm = result["cost_models"]
    profile = {
        "format": PROFILE_FORMAT,
        "device_kind": "cpu",
        "measured": measured,
        "cost_model": {
            "winner": cm["winner"],
            "evidence": f"bench plan-reality: {result['case']}",
            **{m: cm[m] for m in ("shardrec", "torchrec")},
            "plans": cm["plans"],
        },
        "memory": {"framework_bytes": result["memory"]["fitted_framework_bytes"]},
    }
    save_profile(profile, path)
