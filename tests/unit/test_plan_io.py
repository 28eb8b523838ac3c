"""Plan files: round trip, fingerprint checks, bad files, older files, the layout check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_requests import make_plan, make_tables
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

from shardrec.sharding.plan.plan_file import check_plan, load_plan, plan_fingerprint, save_plan
from shardrec.sharding.plan.plan_types import (
    PlanFile,
    StalePlanError,
    TableFingerprint,
)
from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan


def test_round_trip_and_sharding_plan(tmp_path: Path) -> None:
    tables = make_tables()
    cons = {
        "t_f0": {"sharding_types": ["row_wise"]},
        "t_f1": {"sharding_types": ["column_wise"], "min_partition": 8},
    }
    plan = make_plan(tables, constraints=cons)
    save_plan(plan, tmp_path / "p.json")
    loaded = load_plan(tmp_path / "p.json")
    assert loaded == plan
    assert (tmp_path / "p.json").read_bytes() == plan.to_json().encode()
    check_plan(loaded, plan_fingerprint(tables, 2, 64, "cpu"))
    sp = to_sharding_plan(loaded, tables, "sparse.ebc", 2, 2, "cpu")
    mp = sp.plan["sparse.ebc"]
    assert mp["t_f0"].sharding_type == "row_wise"
    assert [s.shard_sizes for s in mp["t_f0"].sharding_spec.shards] == [[50, 16], [50, 16]]
    assert mp["t_f1"].sharding_type == "column_wise"
    assert [s.shard_offsets for s in mp["t_f1"].sharding_spec.shards] == [[0, 0], [0, 8]]
    assert (
        str(mp["t_f1"].sharding_spec.shards[1].placement)
        == f"rank:{loaded.table('t_f1').shards[1].rank}/cpu"
    )


def test_stale_plan_says_what_differs() -> None:
    tables = make_tables()
    plan = make_plan(tables)
    other = make_tables()
    other[2] = EmbeddingBagConfig(
        name="t_f2", embedding_dim=32, num_embeddings=300, feature_names=["f2"]
    )
    other.append(
        EmbeddingBagConfig(name="t_new", embedding_dim=16, num_embeddings=5, feature_names=["new"])
    )
    with pytest.raises(StalePlanError) as e:
        check_plan(plan, plan_fingerprint(other, 4, 128, "cpu"))
    msg = str(e.value)
    assert "world size: plan 2, job 4" in msg
    assert "global batch size: plan 64, job 128" in msg
    assert "table t_f2 dim: plan 16, job 32" in msg
    assert "tables not in the plan: t_new" in msg
    fewer = make_tables()[:-1]
    with pytest.raises(StalePlanError) as e:
        check_plan(plan, plan_fingerprint(fewer, 2, 64, "cpu"))
    # As check_layout says it of a hand-edited plan: "in the plan, not in the job".
    assert str(e.value) == (
        "the plan was made for another job: tables in the plan, not in the job: "
        f"{make_tables()[-1].name} (re-run `shardrec plan`)"
    )


def test_a_plan_of_another_world_size_names_every_way_out() -> None:
    # `shardrec plan` defaults to 2 ranks, `shardrec train` to 1; a run resumed or going on with
    # its own plan (no --plan typed) plans at start-up with --plan '' (before: not named).
    tables = make_tables()
    with pytest.raises(StalePlanError) as e:
        check_plan(make_plan(tables), plan_fingerprint(tables, 1, 64, "cpu"))
    assert str(e.value) == (
        "the plan was made for another job: world size: plan 2, job 1 (train with "
        "--nproc-per-node 2, or --plan '' to plan at start-up, or re-run "
        "`shardrec plan --world-size 1`)"
    )
    with pytest.raises(StalePlanError) as e:
        check_plan(make_plan(tables), plan_fingerprint(tables, 1, 128, "cpu"))
    assert str(e.value) == (
        "the plan was made for another job: world size: plan 2, job 1; global batch size: plan "
        "64, job 128 (train with --plan '' to plan at start-up, or re-run "
        "`shardrec plan --world-size 1`)"
    )


def test_a_stale_plan_names_a_difference_shared_by_many_tables_once() -> None:
    # Data preprocessed again with another --max-ids: every table's rows differ. The line listed
    # "table t_fN rows: plan 2000, job 3000" for each of them (26 for Criteo: 1,900 characters).
    plan = make_plan(make_tables(26, dim=8), batch=64)
    other = make_tables(26, dim=16)
    other[3] = EmbeddingBagConfig(
        name="t_f3", embedding_dim=16, num_embeddings=7, feature_names=["f3"]
    )
    with pytest.raises(StalePlanError) as e:
        check_plan(plan, plan_fingerprint(other, 2, 64, "cpu"))
    assert str(e.value) == (
        "the plan was made for another job: 26 tables (t_f0, t_f1, t_f10 and 23 more) dim: plan 8, "
        "job 16; table t_f3 rows: plan 400, job 7 (re-run `shardrec plan`)"
    )


def test_a_stale_plan_whose_tables_each_changed_rows_says_so_in_one_short_entry() -> None:
    # `shardrec plan`'s proposed rows pasted into the job: each table's rows differ by its own
    # value; the line listed every table (26 entries, ~2 KB).
    plan = make_plan(make_tables(26, dim=8), batch=64)
    other = [
        EmbeddingBagConfig(
            name=c.name, embedding_dim=8, num_embeddings=10 + i, feature_names=c.feature_names
        )
        for i, c in enumerate(make_tables(26, dim=8))
    ]
    with pytest.raises(StalePlanError) as e:
        check_plan(plan, plan_fingerprint(other, 2, 64, "cpu"))
    assert str(e.value) == (
        "the plan was made for another job: 26 tables' rows (plan -> job: t_f0 100 -> 10; "
        "t_f1 200 -> 11; t_f10 1100 -> 20 and 23 more) (re-run `shardrec plan`)"
    )


def test_bad_plan_files_name_the_path(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    with pytest.raises(ValueError, match="cannot read plan file"):
        load_plan(p)
    p.write_text("{not json")
    with pytest.raises(ValueError, match=f"{p}: not a JSON plan file"):
        load_plan(p)
    p.write_text(json.dumps({"format": "something"}))
    with pytest.raises(ValueError, match="format is 'something'"):
        load_plan(p)
    good = json.loads(make_plan(make_tables()).to_json())
    good["schema_version"] = 99
    p.write_text(json.dumps(good))
    with pytest.raises(ValueError, match="schema_version 99 is not supported"):
        load_plan(p)


def test_plan_for_other_tables_is_refused_by_to_sharding_plan() -> None:
    plan = make_plan(make_tables())
    with pytest.raises(ValueError, match="missing: t_f4"):
        to_sharding_plan(plan, make_tables(5), "", 2, 2, "cpu")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("name", ["h100-2d-world4.json", "cpu-torchrec-world2.json"])
def test_plan_files_written_before_typed_fields_load_and_write_back_byte_for_byte(
    name: str,
) -> None:
    """The fingerprint, topology and estimate are dataclasses now; the file they make is
    unchanged."""
    path = FIXTURES / "plans" / name
    plan = load_plan(path)
    assert plan.to_json() == path.read_text()
    assert PlanFile.from_json(path.read_text()) == plan
    assert plan.topology is not None and plan.topology.world_size == plan.fingerprint.world_size
    assert plan.estimate is not None and [r.rank for r in plan.estimate.ranks] == list(
        range(len(plan.estimate.ranks))
    )
    assert plan.estimate.sync_every == (5 if plan.sharding_group_size else None)


def test_the_plan_fingerprint_digest_is_pinned_and_covers_every_field(tiny_dataset: Path) -> None:
    """The digest of the tables, world size, global batch and device kind: the run fixture's plan
    (written by the previous code for this dataset at dim 8) has this one, and any field changes
    it."""
    import dataclasses

    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs

    configs = build_table_configs(Manifest.load(tiny_dataset), 8)
    fingerprint = plan_fingerprint(configs, 2, 64, "cpu")
    assert fingerprint.digest == "1ccd719bea9a47d8"
    assert fingerprint == load_plan(FIXTURES / "run-killed-at-step-6" / "plan.json").fingerprint
    assert fingerprint.tables[0] == TableFingerprint(
        "t_f0", rows=50, dim=8, features=["f0"], pooling="SUM"
    )
    other = [
        plan_fingerprint(configs, 4, 64, "cpu"),
        plan_fingerprint(configs, 2, 128, "cpu"),
        plan_fingerprint(configs, 2, 64, "cuda"),
        plan_fingerprint(configs[::-1], 2, 64, "cpu"),
        plan_fingerprint(build_table_configs(Manifest.load(tiny_dataset), 4), 2, 64, "cpu"),
    ]
    for change in ({"num_embeddings": 51}, {"feature_names": ["f0", "f9"]}, {"name": "t_x"}):
        other.append(
            plan_fingerprint(
                [dataclasses.replace(configs[0], **change), *configs[1:]], 2, 64, "cpu"
            )
        )
    mean = dataclasses.replace(configs[0], pooling=PoolingType.MEAN)
    other.append(plan_fingerprint([mean, *configs[1:]], 2, 64, "cpu"))
    digests = [fingerprint.digest] + [f.digest for f in other]
    assert len(set(digests)) == len(digests) and all(len(d) == 16 for d in digests)


def test_the_sharding_types_a_plan_may_name_are_torchrecs() -> None:
    # plan_io spells them out so that reading a plan (`shardrec plan show`) needs no torchrec.
    from torchrec.distributed.types import ShardingType

    from shardrec.sharding.plan.plan_types import DATA_PARALLEL, SHARDING_TYPES

    assert len(SHARDING_TYPES) == 6 and set(SHARDING_TYPES) == {t.value for t in ShardingType} - {
        "grid_shard"
    }
    assert DATA_PARALLEL == ShardingType.DATA_PARALLEL.value


def test_plans_both_planners_make_pass_the_layout_check_and_edited_ones_are_named() -> None:
    """What `shardrec train` checks before any rank starts (trainer/job/preflight.py): a plan's
    shards must be its sharding type's layout of the job's tables, or the ranks would fail in
    torchrec (a row-wise table with one shard: IndexError) or bucket ids to the wrong rank."""
    import dataclasses

    from shardrec.embeddings.dims import TableSpec
    from shardrec.sharding.plan.plan_layout import check_layout
    from shardrec.sharding.plan.plan_types import Shard

    tables = make_tables()
    specs = [
        TableSpec(t.name, t.feature_names[0], t.num_embeddings, t.embedding_dim) for t in tables
    ]
    kinds = ("row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel")
    for i, kind in enumerate(kinds):
        for planner in ("shardrec", "torchrec"):
            cons = {
                t.name: {"sharding_types": [kind if j == i % 4 else "table_wise"]}
                for j, t in enumerate(tables)
            }
            cons[tables[i % 4].name].update({"min_partition": 8} if "column" in kind else {})
            check_layout(make_plan(tables, constraints=cons, search=planner), specs, 2)
    plan = make_plan(tables, constraints={"t_f0": {"sharding_types": ["row_wise"]}})

    def edited(name: str, shards: list[Shard], kind: str | None = None):
        t = plan.table(name)
        t = dataclasses.replace(t, shards=shards, sharding_type=kind or t.sharding_type)
        return dataclasses.replace(plan, tables=[t if p.name == name else p for p in plan.tables])

    with pytest.raises(ValueError, match=r"^table t_f0: its shards \(rank 0: rows 0\.\.100, columns "
                       r"0\.\.16\) are not a row_wise layout of its 100 x 16 weights on 2 ranks \(was "
                       r"the plan edited\? re-run `shardrec plan`\)$"):  # fmt: skip
        check_layout(edited("t_f0", [Shard(0, 0, 0, 100, 16)]), specs, 2)
    with pytest.raises(ValueError, match=r"^table t_f1: shard on rank 5, world size is 2$"):
        check_layout(edited("t_f1", [Shard(5, 0, 0, 200, 16)], "table_wise"), specs, 2)
    with pytest.raises(ValueError, match=r"^table t_f1: its shards \(rank 1: rows 0\.\.100, "):
        check_layout(edited("t_f1", [Shard(1, 0, 0, 100, 16)], "table_wise"), specs, 2)
    gone = dataclasses.replace(plan, tables=[t for t in plan.tables if t.name != "t_f3"])
    with pytest.raises(
        ValueError,
        match=r"^table t_f3: not in the plan \(was the plan edited\? re-run `shardrec plan`\)$",
    ):
        check_layout(gone, specs, 2)
    # A table the plan lists and the job has not reads as the stale plan's "in the plan, not in
    # the job", with the way out (it said "in this job's model" and no more).
    extra = dataclasses.replace(
        plan, tables=[*plan.tables, dataclasses.replace(plan.tables[0], name="t_zz")]
    )
    with pytest.raises(ValueError) as caught:
        check_layout(extra, specs, 2)
    assert str(caught.value) == (
        "table t_zz: in the plan, not in the job (was the plan edited? re-run `shardrec plan`)"
    )
