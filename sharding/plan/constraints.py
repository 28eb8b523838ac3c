"""Per-table planning constraints from the job file's `[sharding.constraints]`.

Keys follow torchrec's ParameterConstraints (`sharding_types`, `compute_kernels`,
`min_partition`, `pooling_factors`) plus `ranks`: the ranks a table's shards may use. A sequence
model's unpooled tables (pooling NONE) are limited to the types torchrec's EmbeddingCollection
builds, with or without a constraint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardrec.dataloader.util.near import name_list
from shardrec.embeddings.dims import WIDTH_MULTIPLE
from shardrec.sharding.plan.plan_types import SEQUENCE_SHARDING_TYPES, SHARDING_TYPES, UNPOOLED

if TYPE_CHECKING:  # torch-free: `shardrec train` checks constraints before torch is imported
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from shardrec.embeddings.dims import TableSpec

COMPUTE_KERNELS = ("fused", "dense")
KEYS = ("sharding_types", "compute_kernels", "min_partition", "pooling_factors", "ranks")


@dataclass(frozen=True)
class TableConstraint:
    sharding_types: tuple[str, ...] = SHARDING_TYPES
    compute_kernels: tuple[str, ...] = ()
    """Empty: the job's compute kernel (data-parallel tables always use dense)."""
    min_partition: int = 0
    """Narrowest column shard of column-wise types (0: 4 columns, or the whole table)."""
    pooling_factors: tuple[float, ...] = ()
    """Ids per sample for each feature of the table; overrides the dataset's statistics."""
    ranks: tuple[int, ...] = ()
    """Ranks the table's shards may use (empty: all)."""


def _list_of(table: str, key: str, value: Any, kind: type) -> tuple:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(
            f"sharding.constraints.{table}.{key} = {value!r} must be a non-empty list of {kind.__name__}"
        )
    return tuple(value)


def parse_constraints(
    raw: dict[str, dict[str, Any]] | None,
    configs: list[EmbeddingBagConfig] | list[TableSpec],
    world_size: int,
) -> dict[str, TableConstraint]:
    """Validate the job's constraints against the tables (by name); ValueError names the table and
    key."""
    by_name = {config.name: config for config in configs}
    # A TableSpec's pooling is the manifest's word ("none"), a torchrec config's a PoolingType.
    unpooled = {
        c.name
        for c in configs
        if (c.pooling if isinstance(c.pooling, str) else c.pooling.name).upper() == UNPOOLED
    }
    out: dict[str, TableConstraint] = {
        name: TableConstraint(sharding_types=SEQUENCE_SHARDING_TYPES) for name in unpooled
    }
    for name, fields in (raw or {}).items():
        if name not in by_name:
            close = [
                known for known in by_name if known.lower() == name.lower() or known == f"t_{name}"
            ]
            hint = (
                f" (did you mean {close[0]}?)"
                if close
                else f" (tables: {name_list(sorted(by_name))})"
            )
            raise ValueError(f"sharding.constraints.{name}: unknown table {name!r}{hint}")
        if not isinstance(fields, dict):
            raise ValueError(f"sharding.constraints.{name} = {fields!r} must be a table of keys")
        unknown = sorted(set(fields) - set(KEYS))
        if unknown:
            raise ValueError(
                f"sharding.constraints.{name}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})"
            )
        kw: dict[str, Any] = {}
        if "sharding_types" in fields:
            kw["sharding_types"] = _list_of(name, "sharding_types", fields["sharding_types"], str)
            bad = [s for s in kw["sharding_types"] if s not in SHARDING_TYPES]
            if bad:
                raise ValueError(
                    f"sharding.constraints.{name}.sharding_types: {bad[0]!r} is not one of {', '.join(SHARDING_TYPES)}"
                )
            bad = [s for s in kw["sharding_types"] if s not in SEQUENCE_SHARDING_TYPES]
            if name in unpooled and bad:
                raise ValueError(
                    f"sharding.constraints.{name}.sharding_types: {bad[0]!r} is not built for a "
                    f"sequence model's table (torchrec's EmbeddingCollection builds "
                    f"{', '.join(SEQUENCE_SHARDING_TYPES)})"
                )
        elif name in unpooled:
            kw["sharding_types"] = SEQUENCE_SHARDING_TYPES
        if "compute_kernels" in fields:
            kw["compute_kernels"] = _list_of(
                name, "compute_kernels", fields["compute_kernels"], str
            )
            bad = [k for k in kw["compute_kernels"] if k not in COMPUTE_KERNELS]
            if bad:
                raise ValueError(
                    f"sharding.constraints.{name}.compute_kernels: {bad[0]!r} "
                    f"is not one of {', '.join(COMPUTE_KERNELS)}"
                )
        if "min_partition" in fields:
            mp = fields["min_partition"]
            if not isinstance(mp, int) or isinstance(mp, bool) or mp <= 0:
                raise ValueError(
                    f"sharding.constraints.{name}.min_partition = {mp!r} must be a positive integer"
                )
            kw["min_partition"] = mp
        if "pooling_factors" in fields:
            pf = _list_of(
                name,
                "pooling_factors",
                [float(v) if isinstance(v, int) else v for v in fields["pooling_factors"]]
                if isinstance(fields["pooling_factors"], list)
                else fields["pooling_factors"],
                float,
            )
            if any(not math.isfinite(v) or v <= 0 for v in pf):
                raise ValueError(
                    f"sharding.constraints.{name}.pooling_factors = {list(pf)!r}: each must be a "
                    "positive number (ids a sample looks up in the table)"
                )
            kw["pooling_factors"] = pf
        if "ranks" in fields:
            ranks = _list_of(name, "ranks", fields["ranks"], int)
            bad = [r for r in ranks if not 0 <= r < world_size]
            if bad:
                raise ValueError(
                    f"sharding.constraints.{name}.ranks: rank {bad[0]} is outside world size {world_size}"
                )
            kw["ranks"] = tuple(sorted(set(ranks)))
        kernels, types = kw.get("compute_kernels", ()), kw.get("sharding_types", ())
        if kernels and set(kernels) == {"dense"} and set(types) != {"data_parallel"}:
            raise ValueError(
                f"sharding.constraints.{name}.compute_kernels: 'dense' is the kernel of "
                'data-parallel tables only; add sharding_types = ["data_parallel"], or use '
                "'fused' for a sharded table"
            )
        if kernels and "dense" not in kernels and set(types) == {"data_parallel"}:
            raise ValueError(
                f"sharding.constraints.{name}.compute_kernels = {list(kernels)!r}: a data-parallel "
                "table's kernel is 'dense'; drop compute_kernels, or allow a sharded type in "
                "sharding_types for the fused kernel"
            )
        out[name] = TableConstraint(**kw)
    return out


def column_splits(dim: int, min_partition: int, max_shards: int) -> list[int]:
    """Shard counts k > 1 that split `dim` into equal blocks of >= min_partition columns, a multiple
    of 4."""
    floor = max(min_partition, WIDTH_MULTIPLE)
    return [
        k
        for k in range(2, min(dim, max_shards) + 1)
        if dim % k == 0 and dim // k >= floor and (dim // k) % WIDTH_MULTIPLE == 0
    ]


def sharding_options(
    constraint: TableConstraint, dim: int, world_size: int, local_world_size: int
) -> list[tuple[str, int]]:
    """(sharding type, column shards: 1 where it cuts no columns) of every way the constraint
    allows a table of `dim` columns on `world_size` ranks, `local_world_size` a host: column-wise
    types cut into equal blocks of at least min_partition columns, no more blocks than the ranks
    allowed (the placement may still put several on one rank, as torchrec allows); row-wise and
    data-parallel need every rank allowed, the table-wise-within-a-host types a whole host;
    data-parallel also a kernel constraint that allows 'dense', its one kernel."""
    allowed = set(constraint.ranks) or set(range(world_size))
    hosts = [
        host
        for host in range(max(1, world_size // local_world_size))
        if all(host * local_world_size + local in allowed for local in range(local_world_size))
    ]
    kernels_exclude_dense = bool(constraint.compute_kernels) and (
        "dense" not in constraint.compute_kernels
    )
    out: list[tuple[str, int]] = []
    for sharding_type in constraint.sharding_types:
        if sharding_type == "table_wise":
            out.append((sharding_type, 1))
        elif sharding_type in ("column_wise", "table_column_wise"):
            if sharding_type == "table_column_wise" and not hosts:
                continue
            limit = len(allowed) if sharding_type == "column_wise" else local_world_size
            out += [(sharding_type, k) for k in column_splits(dim, constraint.min_partition, limit)]
        elif sharding_type == "data_parallel" and kernels_exclude_dense:
            continue  # its one kernel is dense (torchrec's DP sharder offers no other)
        elif sharding_type in ("row_wise", "data_parallel") and len(allowed) == world_size:
            out.append((sharding_type, 1))
        elif sharding_type == "table_row_wise" and hosts:
            out.append((sharding_type, 1))
    return out


def unsatisfiable(name: str, constraint: TableConstraint, dim: int, world_size: int) -> str:
    """The line for a table whose constraint no sharding type satisfies, with what to do."""
    return (
        f"sharding.constraints.{name}: no sharding type satisfies the constraint "
        f"(sharding_types {list(constraint.sharding_types)}, ranks {list(constraint.ranks) or 'all'}, "
        f"min_partition {constraint.min_partition}, embedding_dim {dim}, world size {world_size}); "
        "change or drop it for this world size (--set 'sharding.constraints={}' drops them all; "
        "a run resumes under any constraints)"
    )


def broken_constraints(plan_tables: list[Any], raw: dict[str, dict[str, Any]] | None) -> list[str]:
    """What a plan's tables (plan_types.TablePlan) do against the job's own constraints (`raw`,
    sharding.constraints), one phrase per broken table: "t_f0 is table_wise ... (sharding_types
    ['row_wise'])"; a table the plan lacks is check_layout's to refuse."""
    broken = []
    tables = {t.name: t for t in plan_tables}
    for name, fields in (raw or {}).items():
        t = tables.get(name)
        if t is None or not isinstance(fields, dict):
            continue
        types = fields.get("sharding_types") or list(SHARDING_TYPES)
        kernels = fields.get("compute_kernels") or []
        ranks = fields.get("ranks") or []
        narrowest = min((s.cols for s in t.shards), default=0)
        why = []
        if t.sharding_type not in types:
            why.append(("sharding_types", types, t.sharding_type))
        if kernels and t.compute_kernel not in kernels:
            why.append(("compute_kernels", kernels, t.compute_kernel))
        if ranks and any(s.rank not in ranks for s in t.shards):
            why.append(("ranks", ranks, "on ranks " + ",".join(str(s.rank) for s in t.shards)))
        minimum = fields.get("min_partition") or 0
        if "column" in t.sharding_type and minimum and narrowest < minimum:
            why.append(("min_partition", minimum, f"cut into {narrowest}-column shards"))
        for key, wanted, got in why[:1]:
            broken.append(
                f"table {name} is {got} in the plan, not as the job's sharding.constraints.{name} "
                f"asks ({key} {wanted})"
            )
    return broken
