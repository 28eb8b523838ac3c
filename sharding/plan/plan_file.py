"""Plan files on disk: written atomically, read strictly (every field by type, NaN refused), and
checked against the job at hand: a stale plan is refused with a message that says what differs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardrec.dataloader.format.manifest import shown
from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.embeddings.dims import TableSpec
from shardrec.embeddings.sparse_optimizers import NAMES, state_bytes
from shardrec.sharding.machine.json_checks import (
    check_fields,
    check_plan_fields,
    expect,
    read_strict_json,
)
from shardrec.sharding.machine.topology import PRESETS, ClusterTopology
from shardrec.sharding.plan.plan_types import (
    DATA_PARALLEL,
    DEVICE_KINDS,
    PLAN_FORMAT,
    PLAN_KERNELS,
    PLAN_SCHEMA_VERSION,
    SHARDING_TYPES,
    UVM_KERNELS,
    PlanEstimate,
    PlanFile,
    PlanFingerprint,
    RankEstimate,
    StalePlanError,
    TableFingerprint,
    TablePlan,
)

if (
    TYPE_CHECKING
):  # torchrec is imported where a plan becomes torchrec's: reading one (`plan show`) needs no torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig


def _table_fingerprint(config: EmbeddingBagConfig | TableSpec) -> dict[str, Any]:
    if isinstance(config, TableSpec):  # the same table without torchrec (the checks before ranks)
        return {
            "name": config.name,
            "rows": int(config.rows),
            "dim": int(config.dim),
            "features": config.features,
            "pooling": config.pooling.upper(),
        }
    return {
        "name": config.name,
        "rows": int(config.num_embeddings),
        "dim": int(config.embedding_dim),
        "features": list(config.feature_names),
        "pooling": config.pooling.name,
    }


def plan_fingerprint(
    configs: list[EmbeddingBagConfig] | list[TableSpec],
    world_size: int,
    global_batch_size: int,
    device_kind: str,
) -> PlanFingerprint:
    """What a plan depends on; two jobs with equal fingerprints can share a plan."""
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"device kind {device_kind!r} is not one of {', '.join(DEVICE_KINDS)}")
    body = {
        "tables": [_table_fingerprint(config) for config in configs],
        "world_size": int(world_size),
        "global_batch_size": int(global_batch_size),
        "device_kind": device_kind,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return PlanFingerprint.from_dict({**body, "digest": digest})


def save_plan(plan: PlanFile, path: str | Path) -> None:
    """Write the plan as JSON under a temporary name, then rename it into place."""
    atomic_write_bytes(Path(path), plan.to_json().encode())


def load_plan(path: str | Path) -> PlanFile:
    """Read a plan file; ValueError naming the path if it is not one this shardrec reads."""
    path = Path(path)
    raw = read_strict_json(path, "plan file")  # NaN and Infinity refused, naming the key
    if not isinstance(raw, dict) or raw.get("format") != PLAN_FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(
            f"{path}: format is {shown(got)}, expected {PLAN_FORMAT!r} (make one with `shardrec plan`)"
        )
    version = raw.get("schema_version")
    if isinstance(version, bool) or version != PLAN_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {shown(version)} is not supported (this shardrec reads {PLAN_SCHEMA_VERSION})"
        )
    check_plan_fields(
        path, raw
    )  # every field by type: a wrong one is named here, not inside the ranks
    if raw.get("topology"):
        check_fields(path, raw["topology"], ClusterTopology, "topology.")
    if raw.get("estimate"):
        check_fields(path, raw["estimate"], PlanEstimate, "estimate.")
        for i, rank in enumerate(raw["estimate"]["ranks"]):
            check_fields(
                path,
                expect(path, rank, "object", f"estimate.ranks[{i}]"),
                RankEstimate,
                f"estimate.ranks[{i}].",
            )
    try:
        plan = PlanFile.from_dict(raw)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: malformed plan file: {e!r}") from None
    except ValueError as e:  # a topology whose figures cannot be (ClusterTopology's own checks)
        raise ValueError(f"{path}: {e}") from None
    names = [t.name for t in plan.tables]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:  # the trainer would take one, `plan show` shows both
        raise ValueError(f"{path}: table {twice}: listed twice (re-run `shardrec plan`)")
    for t in plan.tables:
        if t.sharding_type not in SHARDING_TYPES:
            raise ValueError(f"{path}: table {t.name}: unknown sharding_type {t.sharding_type!r}")
        if t.compute_kernel not in PLAN_KERNELS:
            raise ValueError(
                f"{path}: table {t.name}: compute_kernel {t.compute_kernel!r} is not one of "
                f"{', '.join(PLAN_KERNELS)} (re-run `shardrec plan`)"
            )
        if (t.compute_kernel == "dense") != (t.sharding_type == DATA_PARALLEL):
            # torchrec's dense kernel is data-parallel's one; a sharded table's gradients arrive
            # summed, not through DDP, and only the fused kernels update them.
            raise ValueError(
                f"{path}: table {t.name}: compute_kernel {t.compute_kernel!r} with sharding_type "
                f"{t.sharding_type!r}: a data_parallel table's kernel is dense, another's one of "
                f"{', '.join(k for k in PLAN_KERNELS if k != 'dense')} (re-run `shardrec plan`)"
            )
        if not t.shards:
            raise ValueError(f"{path}: table {t.name}: no shards")
        _check_cache(path, t, plan.fingerprint.device_kind)
    return plan


def _check_cache(path: Path, t: TablePlan, device_kind: str | None) -> None:
    """A cache only on fused_uvm_caching, with a load factor in (0, 1) and one size per shard;
    UVM kernels only on CUDA (torchrec's sharders offer them nowhere else)."""
    if t.compute_kernel in UVM_KERNELS and device_kind != "cuda":
        raise ValueError(
            f"{path}: table {t.name}: compute_kernel {t.compute_kernel} needs CUDA, the plan is for {device_kind}"
        )
    if (t.compute_kernel == "fused_uvm_caching") != (t.cache is not None):
        raise ValueError(
            f"{path}: table {t.name}: a cache goes with compute_kernel fused_uvm_caching, and only with it"
        )
    if t.cache is None:
        return
    if not 0 < t.cache.load_factor < 1:
        raise ValueError(
            f"{path}: table {t.name}: cache.load_factor = {t.cache.load_factor} must lie in (0, 1)"
        )
    if len(t.cache.rows) != len(t.shards) or len(t.cache.hit_rates) != len(t.shards):
        raise ValueError(
            f"{path}: table {t.name}: cache.rows and cache.hit_rates need one value per shard"
        )
    if t.cache.algorithm not in ("lru", "lfu"):
        raise ValueError(
            f"{path}: table {t.name}: cache.algorithm = {t.cache.algorithm!r} is not lru or lfu"
        )


def _describe_table_diff(
    planned: list[TableFingerprint], current: list[TableFingerprint]
) -> list[str]:
    old = {t.name: t for t in planned}
    new = {t.name: t for t in current}
    out = []
    missing = sorted(set(new) - set(old))
    extra = sorted(set(old) - set(new))
    if missing:
        out.append(f"tables not in the plan: {', '.join(missing)}")
    if extra:
        out.append(f"tables in the plan, not in the job: {', '.join(extra)}")
    # One entry per difference: data preprocessed again changes every table's rows alike.
    differ: dict[tuple[str, str, str], list[str]] = {}
    for name in sorted(set(old) & set(new)):
        for key in ("rows", "dim", "features", "pooling"):
            a, b = getattr(old[name], key), getattr(new[name], key)
            if a != b:
                differ.setdefault((key, str(a), str(b)), []).append(name)
    by_key: dict[str, list[tuple[str, str, list[str]]]] = {}
    for (key, a, b), names in differ.items():
        by_key.setdefault(key, []).append((a, b, names))
    for key, changes in by_key.items():
        if len(changes) > 3:  # each table its own value (rows proposed by `shardrec plan`)
            tables = sorted(n for _, _, names in changes for n in names)
            shown = "; ".join(f"{names[0]} {a} -> {b}" for a, b, names in changes[:3])
            out.append(
                f"{len(tables)} tables' {key} (plan -> job: {shown} and {len(tables) - 3} more)"
            )
            continue
        for a, b, names in changes:
            out.append(f"{_tables(names)} {key}: plan {a}, job {b}")
    return out


def _tables(names: list[str]) -> str:
    """`table C1`, `3 tables (C1, C2, C3)`, `26 tables (C1, C2, C3 and 23 more)`."""
    if len(names) == 1:
        return f"table {names[0]}"
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"{len(names)} tables ({', '.join(names[:3])}{more})"


def check_plan(plan: PlanFile, fingerprint: PlanFingerprint) -> None:
    """Raise StalePlanError listing every difference between the plan's fingerprint and the
    job's."""
    planned = plan.fingerprint
    if planned.digest == fingerprint.digest:
        return
    diffs = []
    for key in ("world_size", "global_batch_size", "device_kind"):
        if getattr(planned, key) != getattr(fingerprint, key):
            diffs.append(
                f"{key.replace('_', ' ')}: plan {getattr(planned, key)}, job {getattr(fingerprint, key)}"
            )
    diffs += _describe_table_diff(planned.tables, fingerprint.tables)
    if not diffs:  # same content, other order
        diffs.append("table order differs")
    rerun = "re-run `shardrec plan`"
    if planned.world_size != fingerprint.world_size:
        # `plan` and `train` default to other world sizes (2 and 1): name both ways out.
        rerun = f"re-run `shardrec plan --world-size {fingerprint.world_size}`"
    if planned.device_kind != fingerprint.device_kind:
        # The same command gives the same plan unless the topology changes with the machine.
        kind = fingerprint.device_kind
        presets = [name for name, p in PRESETS.items() if p.get("device_kind") == kind]
        rerun += (
            f" with `--topology auto` on the machine that trains, or a preset of its {kind} "
            f"devices (`--topology {presets[0]}`"
            + "".join(f", `{name}`" for name in presets[1:])
            + ")"
        )
    if planned.world_size != fingerprint.world_size:
        # A checkpoint reshards onto any plan, so a run resumed or going on with its own plan
        # (RUN/plan.json: no --plan the user typed to leave out) may plan at start-up instead.
        ways = [f"--nproc-per-node {planned.world_size}"] if len(diffs) == 1 else []
        ways.append("--plan '' to plan at start-up")
        rerun = f"train with {', or '.join(ways)}, or {rerun}"
    raise StalePlanError("the plan was made for another job: " + "; ".join(diffs) + f" ({rerun})")


def check_kernels_run_on(plan: PlanFile, device_kind: str) -> None:
    """ValueError, in one line, for a table whose compute kernel cannot run on `device_kind`."""
    for t in plan.tables:
        if t.compute_kernel in UVM_KERNELS and device_kind != "cuda":
            raise ValueError(
                f"table {t.name}: compute_kernel {t.compute_kernel} keeps its weights in host memory for a GPU "
                f"to read (UVM) and needs CUDA, but this job trains on {device_kind}: train on a CUDA host, or "
                "re-plan for this machine with `shardrec plan --topology auto`"
            )


def check_estimate_dense(plan: PlanFile, dense_param_bytes: int) -> None:
    """ValueError, in one line, for a plan whose memory estimate counts other dense layers than the
    job's model (`dense_param_bytes`, memory.dense_footprint): the fingerprint holds the tables,
    not `model.dense_arch`, `over_arch` or the interaction, whose parameters (and their optimizer
    state) every rank's estimate counts. Plans that recorded none are taken as they are."""
    recorded = plan.estimate.dense_param_bytes if plan.estimate is not None else 0
    if recorded and recorded != dense_param_bytes:
        from shardrec.sharding.plan.report import fmt_bytes

        raise ValueError(
            "the plan's memory estimate counts other dense layers: "
            f"{fmt_bytes(recorded)} of dense parameters by the plan, this job's model has "
            f"{fmt_bytes(dense_param_bytes)} (re-run `shardrec plan` with this job's settings)"
        )


def check_estimate_optimizer(plan: PlanFile, optimizer: str) -> None:
    """ValueError, in one line, for a plan whose memory estimate counts another sparse optimizer's
    state than `optimizer` (the fingerprint does not hold it): that figure is the run's plan.json
    and, on CUDA, what the fit check at start compares with each device's free memory. Where no
    optimizer's state on the plan's shards makes the estimate, the shards changed since it was
    made (a hand-edited layout), and the line says so. Plans whose estimate moves state elsewhere
    (UVM kernels, 2D replicas) or that record none are taken as they are."""
    if (
        plan.estimate is None
        or plan.sharding_group_size
        or any(t.compute_kernel in UVM_KERNELS for t in plan.tables)
    ):
        return
    needed = _state_by_rank(plan, optimizer)
    differ = [
        r for r in plan.estimate.ranks if not _near(needed.get(r.rank, 0.0), r.optimizer_bytes)
    ]
    if not differ:
        return
    from shardrec.sharding.plan.report import fmt_bytes

    rank, held = differ[0].rank, fmt_bytes(differ[0].optimizer_bytes)
    need = fmt_bytes(needed.get(rank, 0.0))
    if any(_estimate_counts(plan, o) for o in NAMES if o != optimizer):
        raise ValueError(
            f"the plan's memory estimate counts another sparse optimizer's state: rank {rank} "
            f"holds {held} of it by the plan, optim.sparse = {optimizer!r} needs {need} (re-run "
            "`shardrec plan` with this job's settings)"
        )
    raise ValueError(
        "the plan's memory estimate does not match its shards (edited since it was planned?): "
        f"rank {rank} holds {held} of optimizer state by the estimate, optim.sparse = "
        f"{optimizer!r} on the shards the file gives needs {need} (re-run `shardrec plan` with "
        "this job's settings; for a layout of your own, pin it with sharding.constraints and "
        "plan again)"
    )


def _state_by_rank(plan: PlanFile, optimizer: str) -> dict[int, float]:
    """Bytes of `optimizer`'s state on each rank for the plan's shards."""
    needed: dict[int, float] = {}
    for t in plan.tables:
        for s in t.shards:
            needed[s.rank] = needed.get(s.rank, 0.0) + state_bytes(optimizer, s.rows, s.cols)
    return needed


def _estimate_counts(plan: PlanFile, optimizer: str) -> bool:
    """Whether every rank's estimated optimizer state is `optimizer`'s on the plan's shards."""
    needed = _state_by_rank(plan, optimizer)
    return all(_near(needed.get(r.rank, 0.0), r.optimizer_bytes) for r in plan.estimate.ranks)


def _near(need: float, recorded: float) -> bool:
    return abs(need - recorded) <= max(1.0, 0.01 * need)
