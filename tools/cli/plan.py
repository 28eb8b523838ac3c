"""`shardrec plan`: decide where every embedding table lives and write the plan file."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.cli import plan_files
from shardrec.tools.cli.common import check_out_file, counted, fail, print_json, write_out
from shardrec.tools.console import console

plan_app = typer.Typer(
    help="Plan how embedding tables are sharded; writes a plan file `shardrec train --plan` uses.",
    invoke_without_command=True,
    # `plan` plans by itself; `calibrate` and `show` are optional subcommands.
    subcommand_metavar="[COMMAND [ARGS]...]",
)


def _load_job(config: Path | None, data: Path | None, overrides: list[str]):
    from shardrec.dataloader.format.manifest import DatasetError, Manifest
    from shardrec.embeddings.dims import job_tables
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.trainer.job.data_options import model_manifest, train_steps
    from shardrec.trainer.job.flags import dataset_error, job_from_flags
    from shardrec.trainer.job.planning import one_slot_where_unset

    try:
        job = job_from_flags(config, data, None, None, overrides)  # --data: as train takes it
    except ValueError as e:
        fail(str(e))
    if not job.data.path:
        fail("no dataset: pass --data DIR or set data.path in the job file")
    directory = Path(job.data.path)
    try:
        # The tables as training sees them (on-the-fly multi-hot ids have their index tables' rows).
        manifest = model_manifest(Manifest.load(directory), job.data)
        filled, unset = one_slot_where_unset(manifest, job.tables)
        job = job.with_changes(tables=filled)
        configs = build_table_configs(
            manifest,
            job.model.embedding_dim,
            job.model.dims,
            job.tables,
            unpooled_sequences=job.model.arch == "hstu",
        )
        steps = train_steps(manifest, job.data, job.train)
        tables = job_tables(manifest, job.tables)
    except (DatasetError, ValueError) as e:
        fail(dataset_error(job, str(e), "--data" if data else None))
    from shardrec.sharding.search.request import DatasetStatistics

    return (
        unset,
        job,
        directory,
        configs,
        DatasetStatistics.from_manifest(manifest),
        _dense(job, configs, manifest),
        steps,
        tables,
    )


def _dense(job, configs, manifest):
    """The dense layers of the job's model, counted on the meta device (what every rank holds
    besides tables)."""
    from shardrec.sharding.machine.memory import dense_footprint
    from shardrec.trainer.model.train_module import build_meta_model

    try:
        model = build_meta_model(job.model, configs, manifest)
    except ValueError as e:
        fail(str(e))
    return dense_footprint(model, job.optim.dense)


@plan_app.callback()
def plan(
    ctx: typer.Context,
    data: Annotated[
        Path | None, typer.Option(help="Dataset directory (default: data.path of the job file).")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="Job file (TOML).")] = None,
    world_size: Annotated[int, typer.Option(min=1, help="Ranks to plan for.")] = 2,
    out: Annotated[Path | None, typer.Option(help="Plan file to write.")] = None,
    topology: Annotated[
        str,
        typer.Option(
            help="auto (this machine: its CUDA devices, their count and free memory, else cpu-gloo) "
            "or a preset: cpu-gloo, a100, h100, h200."
        ),
    ] = "auto",
    local_world_size: Annotated[
        int, typer.Option(min=0, help="Ranks per host (0: the preset's).")
    ] = 0,
    memory_gib: Annotated[
        float, typer.Option(min=0.0, help="Memory per rank in GiB (0: the preset's).")
    ] = 0.0,
    profile: Annotated[
        Path | None, typer.Option(help="Calibration profile from `shardrec plan calibrate`.")
    ] = None,
    search: Annotated[
        str, typer.Option(help="shardrec (ours) or torchrec (torchrec's planner).")
    ] = "shardrec",
    simulate: Annotated[
        bool,
        typer.Option(
            "--simulate",
            help="Show bytes per step for 8 ... 4,096 ranks (row-wise, table-wise, 2D) instead of planning.",
        ),
    ] = False,
    group_size: Annotated[
        int,
        typer.Option(
            min=-1,
            help="2D sharding group size (torchrec DMPCollection, CUDA): 0 none, -1 pick the fastest.",
        ),
    ] = 0,
    sync_every: Annotated[
        int, typer.Option(min=1, help="2D: steps between the replicas' weight all-reduce.")
    ] = 1,
    frequency_batches: Annotated[
        int,
        typer.Option(
            min=0,
            help="CUDA, tables past HBM: global batches whose ids size the UVM caches (0: one epoch).",
        ),
    ] = 2000,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Override a job setting, KEY as section.key (e.g. train.seed=1); repeat for several.",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the plan summary and per-rank estimate as JSON.")
    ] = False,
) -> None:
    """Plan the tables of a dataset + job file for a topology; print a report and write --out."""
    if ctx.invoked_subcommand is not None:
        return
    from shardrec.sharding.machine.topology import PRESETS

    if (
        topology != "auto" and topology not in PRESETS
    ):  # before the planner's imports (torchrec: seconds)
        fail(f"--topology {topology}: not one of auto, {', '.join(PRESETS)}")
    check_out_file(out, f"plan{world_size}.json")
    if local_world_size and world_size % local_world_size:
        fail(f"--local-world-size {local_world_size} does not divide --world-size {world_size}")
    if sync_every != 1 and not group_size and not simulate:  # it steers 2D replicas only
        fail(
            f"--sync-every {sync_every} is for 2D sharding: give --group-size too (-1: the fastest)"
        )
    from shardrec.sharding.plan.plan_file import save_plan
    from shardrec.sharding.plan.plan_types import PlanDoesNotFitError
    from shardrec.sharding.planner import SEARCHES, plan_tables
    from shardrec.trainer.job.planning import plan_request, plan_topology, propose_row_budgets

    if search not in SEARCHES:  # a usage error (exit 2), said with the flag as typed
        raise typer.BadParameter(
            f"{search!r} is not one of {', '.join(SEARCHES)}", param_hint="'--search'"
        )
    unset, job, directory, configs, statistics, dense, steps, tables = _load_job(
        config, data, set_ or []
    )
    if simulate:
        _simulate(configs, statistics.stats, job, world_size, sync_every, json_out)
        return
    batch = job.train.global_batch_size
    if batch % world_size:  # said by the key and the flag as given, not the planner's words
        fail(
            job.located(
                f"train.global_batch_size = {batch} does not divide by --world-size {world_size}"
            )
        )
    try:
        topo = plan_topology(
            topology, world_size, local_world_size, memory_gib, profile, job.train.device
        )
        request = plan_request(
            configs,
            statistics,
            train=job.train,
            sharding=job.sharding,
            optim=job.optim,
            world_size=world_size,
            local_world_size=topo.local_world_size,
            device_kind=topo.device_kind,
            topology=topo,
            dense=dense,
            sharding_group_size=group_size,
            sync_every=sync_every,
            tables=tables,
            stretch_steps=steps,
        )
        start = time.perf_counter()
        try:
            result = plan_tables(request, search=search)
        except PlanDoesNotFitError:
            if topo.device_kind != "cuda" or search != "shardrec":
                raise
            # Past HBM: UVM caches are sized by the data's id frequencies, counted only now they are
            # needed.
            measured = _with_frequencies(
                statistics, directory, job, configs, frequency_batches, json_out
            )
            request = dataclasses.replace(request, statistics=measured)
            result = plan_tables(request, search=search)
        budgets = propose_row_budgets(request, result, tables, job.train, steps, search)
        seconds = time.perf_counter() - start  # the proposals' plans too
    except ValueError as e:
        fail(job.located(str(e)))
    if unset:  # the plan is of one slot a table: only the proposals are worth showing
        _print_plan_to_come(budgets, tables, unset, config, json_out)
    if out is not None:
        write_out(out, "plan", lambda: save_plan(result, out))
    shown = (
        topo.name
        if topology == topo.name
        else f"{topology}: {topo.name}, memory from the {topo.memory_source}"
    )
    _print_plan(result, shown, sync_every, seconds, out, json_out, budgets, tables)


def _with_frequencies(statistics, directory: Path, job, configs, batches: int, quiet: bool):
    """The statistics with each table's id-frequency curve, counted on the job's own loader
    stream."""
    from shardrec.tools.measure.id_stream import measure_curves

    status = console.status("tables past HBM: counting id frequencies", spinner="dots")
    with status if not quiet else contextlib.nullcontext():
        curves = measure_curves(directory, job, configs, batches)
    return dataclasses.replace(statistics, frequencies=curves)


def _print_plan(
    result,
    topology: str,
    sync_every: int,
    seconds: float,
    out: Path | None,
    json_out: bool,
    budgets: list | None = None,
    tables: dict | None = None,
) -> None:
    from shardrec.sharding.plan.report import placements, ranks_table, summary, tables_table

    world_size = result.fingerprint.world_size
    if json_out:
        print_json(
            {
                **summary(result),
                "seconds": round(seconds, 3),
                "out": str(out) if out else None,
                **placements(result),
                **({"row_budgets": [dataclasses.asdict(b) for b in budgets]} if budgets else {}),
            }
        )
        return
    console.print(tables_table(result))
    console.print(ranks_table(result))
    if budgets:
        _print_budgets(budgets, tables or {})
    if result.sharding_group_size:
        console.print(
            f"2D: sharding groups of {result.sharding_group_size} ranks, {world_size // result.sharding_group_size} "
            f"replicas synchronised every {sync_every} step(s); ranks above are group ranks (DMPCollection, CUDA only)"
        )
    where = f", wrote {out}" if out else ""
    console.print(
        f"planned {len(result.tables)} tables for {counted(world_size, 'rank')} ({topology}) in {seconds:.2f} s{where}"
    )


def _print_plan_to_come(budgets: list, tables: dict, unset: list[str], config, json_out) -> None:
    """The proposed rows of a job whose raw-id tables give none, then one line saying that the
    plan comes once the job file has them (the plan of one slot a table would be refused)."""
    given = f"no rows given, so no plan was made; put {{}} in {config or 'the job file'}"
    if not budgets:  # a dataset without its raw ids' counts (preprocessed before they were kept)
        fail(
            f"{', '.join(unset)}: {given.format('rows')} (the data has no id counts to propose them)"
        )
    if json_out:
        print_json({"row_budgets": [dataclasses.asdict(b) for b in budgets], "out": None})
    else:
        _print_budgets(budgets, tables)
    fail(f"{', '.join(unset)}: {given.format('the proposed rows')} and run `shardrec plan` again")


def _print_budgets(budgets: list, tables: dict) -> None:
    """The managed tables' proposed row budgets, and the job file lines that set them."""
    from shardrec.sharding.plan.report import budgets_table
    from shardrec.trainer.job.planning import budget_lines

    console.print(budgets_table(budgets))
    console.print(
        'in the job file (a named table takes nothing from [tables."*"]: each line is its whole '
        "settings, the proposed rows in them):\n" + budget_lines(budgets, tables),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _simulate(configs, stats, job, world_size: int, sync_every: int, json_out: bool) -> None:
    from shardrec.sharding.cost.simulate import simulate, simulation_table
    from shardrec.sharding.plan.constraints import parse_constraints
    from shardrec.sharding.planner import pooling_factors

    try:
        pooling = pooling_factors(
            configs, stats, parse_constraints(job.sharding.constraints, configs, world_size)
        )
    except ValueError as e:
        fail(job.located(str(e)))
    per_rank = max(1, job.train.global_batch_size // world_size)
    rows = simulate(configs, pooling, per_rank, [2**k for k in range(3, 13)], sync_every=sync_every)
    if json_out:
        print_json(
            {
                "per_rank_batch": per_rank,
                "sync_every": sync_every,
                "rows": [r.__dict__ for r in rows],
            }
        )
        return
    console.print(simulation_table(rows, len(configs), per_rank))
    console.print(
        f"2D: row-wise inside each group, replicas all-reduce their weights every {sync_every} step(s)"
    )


def register(app: typer.Typer) -> None:
    plan_app.command("calibrate")(plan_files.calibrate_cmd)
    plan_app.command("show")(plan_files.show_cmd)
    app.add_typer(plan_app, name="plan")
