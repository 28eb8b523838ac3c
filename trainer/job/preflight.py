"""Checks run before any rank starts, so that bad input ends with one clear line, not N
tracebacks."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import check_part_file
from shardrec.dataloader.spec.feature_spec import MAX_HASH_SIZE
from shardrec.embeddings.dims import DEFAULT_TABLE, job_tables, table_dims, table_specs
from shardrec.embeddings.sparse_optimizers import check_device
from shardrec.trainer.distributed.devices import (
    check_ranks_fit,
    cuda_unusable_reason,
    resolve_device_kind,
)
from shardrec.trainer.job import data_options
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.job.table_changes import table_key

if TYPE_CHECKING:
    from shardrec.sharding.plan.plan_types import PlanFile

logger = logging.getLogger(__name__)


def preflight(job: JobConfig, world_size: int, stretch_steps: int | None = None) -> str:
    """Check a resolved job against the dataset and the plan; ValueError says what is wrong.

    Args:
        stretch_steps: where the job resumes its run's current stretch, the steps that stretch
            began with (its managed tables' updates keep their spacing); None: the job's own.

    Returns: the device kind its ranks train on, "cpu" or "cuda"."""
    if world_size < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {world_size}")
    if not job.data.path:
        raise ValueError("no dataset: pass --data DIR or set data.path in the job file")
    check_batches(job, world_size)
    kind = resolve_device_kind(job.train.device)  # auto without a GPU device: no torch import
    if kind == "cuda" and not _cuda_available():
        reason = cuda_unusable_reason()
        raise ValueError(
            "train.device = 'cuda' but CUDA is not available here"
            + (
                f": {reason}"
                if reason
                else '; train on the CPU with train.device = "cpu" (or "auto")'
            )
        )
    check_ranks_fit(kind, world_size)
    check_device(job.optim.sparse, kind)
    if job.train.precision == "bf16":
        # torch only for an explicit bf16: the ranks would measure and refuse it too, N times.
        from shardrec.trainer.job.precision import check_precision

        check_precision("bf16", kind, job.train.allow_emulated_bf16)
    # The dataset as the model sees it (on-the-fly multi-hot ids resized): what the ranks will
    # build.
    loaded = Manifest.load(job.data.path)
    check_files(Path(job.data.path), loaded)
    manifest = data_options.model_manifest(loaded, job.data)
    check_against_dataset(job, manifest)
    check_update_cadence(job, manifest, stretch_steps)
    if job.sharding.plan:
        _check_plan_file(job, manifest, world_size, kind)
    else:  # the ranks plan at start under the constraints: each must hold at this world size
        check_constraints(job, manifest, world_size)
    return kind


def check_update_cadence(job: JobConfig, manifest: Manifest, stretch_steps: int | None) -> None:
    """A managed table's max_age in steps holds across the updates its default evict_every
    spaces by the steps of its stretch: those this job trains (known only with the data), or
    those the stretch it resumes began with (`stretch_steps`)."""
    steps = stretch_steps or data_options.train_steps(manifest, job.data, job.train)
    for feature, settings in job.tables.items():
        settings.check_cadence(table_key(feature), steps, resumed=stretch_steps is not None)


def check_files(directory: Path, manifest: Manifest) -> None:
    """Every part file of every split is there with its manifest size (one lstat each): a split
    read only at the first evaluation must not fail the run after its first training steps, as
    if the dataset had changed under it."""
    for split, info in manifest.splits.items():
        for part in info.parts:
            check_part_file(directory, split, part)


def _cuda_available() -> bool:
    # torch only for a CUDA job: checking a CPU job (flags, dataset, plan) imports none of it.
    import torch

    return torch.cuda.is_available()


def check_batches(job: JobConfig, world_size: int, ranks: str | None = None) -> None:
    """The training and evaluation global batches split evenly over the ranks (`ranks`: how the
    line names them; default `shardrec train`'s --nproc-per-node)."""
    for key, batch in (
        ("train.global_batch_size", job.train.global_batch_size),
        ("eval.batch_size", job.eval.batch_size),
    ):
        if batch % world_size:
            raise ValueError(
                f"{key} = {batch} does not divide by {ranks or f'--nproc-per-node {world_size}'}"
            )


def check_rank_job(job: JobConfig, world_size: int) -> None:
    """check_batches and check_against_dataset for a rank that torchrun started directly
    (`torchrun ... -m shardrec.trainer`), before it joins the group: no `shardrec train` checked
    its job, and the planner or the loader would refuse some of these jobs only later, in their
    own words and naming no setting, while the other ranks wait in a collective."""
    check_batches(job, world_size, f"WORLD_SIZE={world_size}, the job's ranks")
    check_against_dataset(job, data_options.model_manifest(Manifest.load(job.data.path), job.data))
    if job.sharding.plan:  # read by the ranks only once joined: a node's missing copy crashed them
        from shardrec.sharding.plan.plan_file import load_plan

        load_plan(job.sharding.plan)


def check_against_dataset(job: JobConfig, manifest: Manifest) -> None:
    """Splits and features the job names exist, and the train split has a step to take."""
    path, splits = job.data.path, manifest.splits
    if job.data.train_split not in splits:
        raise ValueError(
            f"{path}: no split {job.data.train_split!r} to train on (has {', '.join(splits)})"
        )
    unknown_splits = [s for s in job.data.eval_splits if s not in splits]
    if unknown_splits:
        raise ValueError(
            f"data.eval_splits names {unknown_splits[0]!r}, which {path} does not have (has {', '.join(splits)})"
        )
    # Training evaluates the splits of both lists: a name in one only was never evaluated, silently.
    never = [s for s in job.eval.during_training if s not in job.data.eval_splits]
    if never:
        raise ValueError(
            f"eval.during_training names {never[0]!r}, which data.eval_splits = "
            f"{job.data.eval_splits!r} does not: it would never be evaluated; name splits of "
            "data.eval_splits"
        )
    rows, batch = splits[job.data.train_split].rows, job.train.global_batch_size
    if job.data.tail == "drop" and rows < batch:
        raise ValueError(
            f"{path}: split {job.data.train_split!r} has {rows:,} rows, fewer than one global batch "
            f"(train.global_batch_size = {batch}) with data.tail = 'drop': no step to train"
        )
    if manifest.kind == "events" and job.data.tail == "drop":
        check_event_windows(path, manifest, job.data.train_split, batch)
    if job.model.arch == "hstu":
        check_action_bits(path, manifest, job.model.hstu_action_bits)
    try:
        table_dims(manifest, job.model.embedding_dim, job.model.dims)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    model, dense = job.model, len(manifest.dense_features)
    if model.arch == "dlrm" and dense and not model.dense_arch and dense != model.embedding_dim:
        # Without a bottom MLP the dense features meet the embeddings as they are.
        raise ValueError(
            f"model.dense_arch = []: DLRM's dot interaction needs the dense features' width "
            f"({dense} in {path}) equal to model.embedding_dim = {model.embedding_dim}; give the "
            f"bottom MLP layers ending with {model.embedding_dim}"
        )
    # A raw-id feature's table needs a raw-id kind and its rows; the job names no other feature.
    table_specs(manifest, job.model.embedding_dim, job.model.dims, job.tables)


def unbounded_shortfalls(job: JobConfig, manifest: Manifest, continuing: bool = False) -> list[str]:
    """A line for each unbounded table with fewer slots than its feature's distinct ids in the
    data's training split (the manifest's statistics; a lower bound where they were sampled): the
    ids past its slots would share row 1, and a table the job calls unbounded would be a managed
    one that never evicts. `continuing`: the run's table keeps its size on this data (a warning);
    else the job is refused with the first line."""
    path = job.data.path
    for feature, settings in job_tables(manifest, job.tables).items():
        if settings.kind != "unbounded":
            continue
        distinct = next(
            (f.stats.get("distinct_ids", 0) for f in manifest.sparse_features if f.name == feature),
            0,
        )
        if distinct <= settings.rows:
            continue
        named = feature in job.tables
        key = f"{table_key(feature if named else DEFAULT_TABLE)}.rows = {settings.rows:,}"
        key += "" if named else f" (feature {feature})"
        if continuing:
            return [
                f"{key}: this unbounded table has fewer slots than the {distinct:,} distinct "
                f"{feature} ids of {path}'s training split: ids past its slots share row 1 (a run "
                "keeps its table's size; more slots need a new run)"
            ]
        raise ValueError(
            f"{key}: an unbounded table gives every id a slot, and {path} holds {distinct:,} "
            f"distinct {feature} ids to train on: {distinct - settings.rows:,} would share row 1; "
            f'give rows >= {distinct:,} (more for the days to come), or kind = "managed" for a '
            "table that evicts"
        )
    return []


def empty_eval_splits(job: JobConfig, manifest: Manifest) -> list[str]:
    """A line naming the data.eval_splits splits that have no rows (a small input's val and test
    can be empty), if any: the ranks leave them out, and where every one is empty the run reports
    no AUC. Not refused, as a missing split is: training on such data is still training."""
    splits = manifest.splits
    empty = [s for s in job.data.eval_splits if s in splits and splits[s].rows == 0]
    if not empty:
        return []
    names = [repr(s) for s in empty]
    named = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
    if len(empty) == 1:
        said = f"split {named} (data.eval_splits) has no rows: nothing is evaluated on it"
    else:
        said = f"splits {named} (data.eval_splits) have no rows: nothing is evaluated on them"
    if len(empty) == len(job.data.eval_splits):
        said += ", and the run reports no AUC"
    return [f"{job.data.path}: {said}"]


def check_event_windows(path: str, manifest: Manifest, split: str, batch: int) -> None:
    """An event log's global batch is of one window (the loader's TemporalOrder): with tail
    "drop", at least one window of the train split must hold a batch, or the ranks start to find
    no step to take."""
    offsets = manifest.events["windows"][split]
    sizes = [b - a for a, b in zip(offsets, offsets[1:])]
    largest = max(sizes, default=0)
    if largest < batch:
        raise ValueError(
            f"train.global_batch_size = {batch} is more samples than any window of {path}'s split "
            f"{split!r} has (the largest has {largest}; {offsets[-1]:,} in {len(sizes)} windows), "
            f"so no step trains with data.tail = 'drop': set it to at most {largest}, "
            'data.tail = "pad", or longer windows ([split] window_seconds of the event spec)'
        )


def check_action_bits(path: str, manifest: Manifest, bits: int) -> None:
    """HSTU reads the low `bits` bits of each action (hstu_model's _bits): an action side sequence
    whose manifest bounds its values (an event log's pools: listen-plus 1, like 2, skip 4) with
    more bits would have the rest dropped from every token, and the run would say nothing. A click
    log's integers kept as written have no bound (2**63): their bits are the user's choice."""
    for f in manifest.sparse_features:
        if not (f.sequence and f.side_of and f.values == "integers"):
            continue
        if f.cardinality > MAX_HASH_SIZE:
            continue
        needed = (f.cardinality - 1).bit_length()
        if bits < needed:
            raise ValueError(
                f"model.hstu_action_bits = {bits} reads {bits} of the {needed} bits of {path}'s "
                f"{f.name} (values up to {f.cardinality - 1}): the others would be dropped from "
                f"every token; set it to at least {needed}"
            )


def _check_plan_file(job: JobConfig, manifest: Manifest, world_size: int, kind: str) -> None:
    # The tables as plain values (embeddings.dims): no torchrec import, so a stale plan is refused
    # in a second, not after torchrec's seconds of import.
    from shardrec.sharding.plan.constraints import broken_constraints
    from shardrec.sharding.plan.plan_file import (
        check_estimate_optimizer,
        check_kernels_run_on,
        check_plan,
        load_plan,
        plan_fingerprint,
    )
    from shardrec.sharding.plan.plan_layout import check_host_size, check_layout

    tables = table_specs(
        manifest,
        job.model.embedding_dim,
        job.model.dims,
        job.tables,
        unpooled_sequences=job.model.arch == "hstu",
    )
    plan_file = load_plan(job.sharding.plan)
    try:
        check_kernels_run_on(plan_file, kind)  # before the fingerprint: it says why and what to do
        check_plan(
            plan_file, plan_fingerprint(tables, world_size, job.train.global_batch_size, kind)
        )
        check_trainable(plan_file)
        check_layout(plan_file, tables, world_size)
        check_host_size(plan_file, world_size)  # `shardrec train` starts its ranks on one host
        check_estimate_optimizer(plan_file, job.optim.sparse)
        broken = broken_constraints(plan_file.tables, job.sharding.constraints)
    except ValueError as e:
        raise ValueError(f"{job.sharding.plan}: {e}") from None
    if broken:  # a plan may change freely (a run resumes on any), but the run's config says these
        others = len(broken) - 1
        more = f" (and {others} more table{'s' if others > 1 else ''})" if others else ""
        logger.warning(
            "%s: %s%s: the plan is followed; re-run `shardrec plan` with this job's settings to "
            "follow them",
            job.sharding.plan,
            broken[0],
            more,
        )


def check_constraints(job: JobConfig, manifest: Manifest, world_size: int) -> None:
    """Every table's sharding.constraints can hold on `world_size` local ranks (one host): the
    ranks plan at start under them, and a run resumed at another world size keeps its job's
    constraints. ValueError names the table and what to do."""
    from shardrec.sharding.plan.constraints import (
        parse_constraints,
        sharding_options,
        unsatisfiable,
    )

    tables = table_specs(
        manifest,
        job.model.embedding_dim,
        job.model.dims,
        job.tables,
        unpooled_sequences=job.model.arch == "hstu",
    )
    dims = {t.name: t.dim for t in tables}
    for name, constraint in parse_constraints(job.sharding.constraints, tables, world_size).items():
        if not sharding_options(constraint, dims[name], world_size, world_size):
            raise ValueError(unsatisfiable(name, constraint, dims[name], world_size))


def check_trainable(plan_file: PlanFile) -> None:
    """Refuse what the trainer cannot run: 2D plans (torchrec's DMPCollection, CUDA only, not wired
    in)."""
    if plan_file.sharding_group_size:
        raise ValueError(
            f"a 2D plan (sharding_group_size = {plan_file.sharding_group_size}): the trainer runs "
            "plain sharded plans only (2D needs CUDA and DMPCollection, not implemented in the trainer yet); "
            "plan without --group-size"
        )
