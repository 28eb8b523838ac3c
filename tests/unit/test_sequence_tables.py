"""A sequence model's tables: which features share one, which are looked up unpooled, the CPU
correction of fbgemm's dense unpooled kernel, and what the planner makes of them."""

from __future__ import annotations

import pytest
import torch

from shardrec.dataloader.format.manifest import Manifest, SparseFeature, SplitInfo
from shardrec.embeddings.dims import table_specs


def _manifest() -> Manifest:
    def feature(name, rows, **kw):
        return SparseFeature(name, rows, "uint32", multi_hot=kw.pop("multi_hot", False), **kw)

    return Manifest(
        dense_features=["d0"],
        sparse_features=[
            feature("uid", 37),
            feature("hist_item", 50, multi_hot=True, sequence=True, table="item", pooling="mean"),
            feature("hist_artist", 23, multi_hot=True, sequence=True, side_of="hist_item"),
            feature(
                "hist_ts",
                2**40,
                multi_hot=True,
                sequence=True,
                side_of="hist_item",
                values="timestamps",
            ),
            feature("cand_item", 50, table="item"),
        ],
        splits={"train": SplitInfo()},
    )


def test_features_that_name_a_table_share_it_and_a_sequence_model_looks_it_up_unpooled():
    manifest = _manifest()
    pooled = {t.name: t for t in table_specs(manifest, 16)}
    assert list(pooled) == ["t_uid", "t_item", "t_hist_artist"]  # timestamps have no table
    assert pooled["t_item"].features == ["hist_item", "cand_item"]
    assert pooled["t_item"].pooling == "mean" and pooled["t_hist_artist"].pooling == "sum"
    unpooled = {t.name: t.pooling for t in table_specs(manifest, 16, unpooled_sequences=True)}
    assert unpooled == {"t_uid": "sum", "t_item": "none", "t_hist_artist": "none"}


def test_shared_tables_must_agree_on_rows_and_take_their_width_from_the_first_feature():
    manifest = _manifest()
    manifest.sparse_features[4].cardinality = 51
    with pytest.raises(ValueError, match="hist_item, cand_item share table item but have"):
        table_specs(manifest, 16)
    with pytest.raises(ValueError, match="model.dims.cand_item: cand_item reads table item"):
        table_specs(_manifest(), 16, {"cand_item": 8})


def test_a_shared_table_pools_as_its_lists_say_and_lists_that_disagree_are_refused():
    """A one-id feature first no longer decides: its table pooled a list that averages by sum."""

    def manifest(*features: SparseFeature) -> Manifest:
        return Manifest(dense_features=[], sparse_features=list(features), splits={})

    movie = SparseFeature("movie", 50, "uint32")
    watched = SparseFeature("watched", 50, "uint32", multi_hot=True, pooling="mean", table="movie")
    (table,) = table_specs(manifest(movie, watched), 8)
    assert table.features == ["movie", "watched"] and table.pooling == "mean"
    tags = SparseFeature("tags", 50, "uint32", multi_hot=True)
    liked = SparseFeature("liked", 50, "uint32", multi_hot=True, pooling="mean", table="tags")
    with pytest.raises(ValueError) as refused:
        table_specs(manifest(tags, liked), 8)
    assert str(refused.value) == (
        "features tags (sum), liked (mean) share table tags but pool it differently: a table "
        "pools one way; give them one pooling in the spec"
    )


def test_a_raw_id_feature_gets_its_managed_table_beside_a_sequence_model_s_unpooled_ones():
    """Managed tables (raw ids) and sequence tables in one job: each keeps its own kind and pooling,
    a managed sequence table is reset in the EmbeddingCollection, and a shared table refuses raw
    ids (its one id map would serve one feature only)."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    from shardrec.embeddings.managed.table_kinds import TableSettings
    from shardrec.trainer.loop.managed_ids import ManagedIds

    manifest = _manifest()
    manifest.sparse_features[0] = SparseFeature("uid", 0, "uint64", ids="raw")
    manifest.sparse_features[2].ids, manifest.sparse_features[2].cardinality = "raw", 0
    tables = {
        "uid": TableSettings(kind="managed", rows=10),
        "hist_artist": TableSettings(kind="hashed", rows=7),
    }
    specs = {t.name: t for t in table_specs(manifest, 16, None, tables, unpooled_sequences=True)}
    assert {n: (t.kind, t.pooling, t.rows) for n, t in specs.items()} == {
        "t_uid": ("managed", "sum", 12),
        "t_item": ("static", "none", 50),
        "t_hist_artist": ("hashed", "none", 9),
    }
    with pytest.raises(ValueError, match="tables.hist_artist.kind = 'static': feature hist_artist"):
        table_specs(manifest, 16, None, {"uid": tables["uid"]})
    with pytest.raises(ValueError, match="^tables.hist_ts: feature hist_ts has no table"):
        table_specs(manifest, 16, None, {**tables, "hist_ts": TableSettings()})
    shared = _manifest()
    shared.sparse_features[4].ids = "raw"
    with pytest.raises(ValueError, match="share table item, and raw ids .* need a table of their"):
        table_specs(shared, 16)

    def config(name, pooling):
        return EmbeddingBagConfig(
            name=name, embedding_dim=4, num_embeddings=9, feature_names=[name], pooling=pooling
        )

    ids = ManagedIds(None, [], None, ebc_path="m.ebc", ec_path="m.ec", seed=0, group=None)  # type: ignore[arg-type]
    assert ids.weight_fqn(config("t_a", PoolingType.SUM)) == "m.ebc.embedding_bags.t_a.weight"
    assert ids.weight_fqn(config("t_b", PoolingType.NONE)) == "m.ec.embeddings.t_b.weight"


def test_manifest_writes_sequence_fields_only_where_set_and_refuses_unknown_values(tmp_path):
    manifest = _manifest()
    written = [f.to_dict() for f in manifest.sparse_features]
    assert "sequence" not in written[0] and "table" not in written[0]
    assert written[2]["side_of"] == "hist_item" and written[3]["values"] == "timestamps"
    manifest.save(tmp_path)
    assert Manifest.load(tmp_path).sparse_features == manifest.sparse_features
    manifest.sparse_features[3].values = "floats"
    manifest.save(tmp_path)
    with pytest.raises(ValueError, match=r"sparse_features\[3\].values is 'floats', expected one"):
        Manifest.load(tmp_path)


def _dense_kernel():
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        DenseTableBatchedEmbeddingBagsCodegen,
    )

    # Two tables of 10 x 8, the first read by two features (a history and its candidate).
    return DenseTableBatchedEmbeddingBagsCodegen(
        [(10, 8), (6, 8)], feature_table_map=[0, 0, 1], pooling_mode=PoolingMode.NONE, use_cpu=True
    )


def test_fbgemm_cpu_dense_kernel_still_pools_unpooled_lookups():
    """The bug unpooled_cpu.py corrects: when this fails, fbgemm returns rows, and the correction can
    go."""
    from shardrec.sharding.torchrec.unpooled_cpu import UPSTREAM_FORWARD

    kernel = _dense_kernel()
    ids, offsets = torch.tensor([1, 2, 3, 4, 5, 0, 5]), torch.tensor([0, 2, 3, 3, 6, 6, 7])
    assert UPSTREAM_FORWARD(kernel, ids, offsets).shape != (7, 8)


def test_unpooled_rows_reads_each_id_of_its_own_table_and_refuses_one_outside_it():
    from shardrec.sharding.torchrec.unpooled_cpu import install

    install()
    kernel = _dense_kernel()
    # B = 2 samples per feature: hist (ids 1,2 | 3), cand (- | 4,5), table 1 (0 | 5).
    ids, offsets = torch.tensor([1, 2, 3, 4, 5, 0, 5]), torch.tensor([0, 2, 3, 3, 5, 6, 7])
    weights = kernel.split_embedding_weights()
    out = kernel(ids, offsets)
    expect = torch.cat([weights[0][[1, 2, 3, 4, 5]], weights[1][[0, 5]]])
    assert torch.equal(out, expect)
    out.sum().backward()
    assert kernel.weights.grad.view(-1, 8)[[1, 2, 3, 4, 5, 10, 15]].eq(1).all()
    with pytest.raises(IndexError, match="id 6 of feature 2 is outside its table of 6 rows"):
        kernel(torch.tensor([1, 2, 3, 4, 5, 0, 6]), offsets)


def _configs():
    from shardrec.embeddings.tables import build_table_configs

    return build_table_configs(_manifest(), 16, unpooled_sequences=True)


def test_a_sequence_tables_constraint_may_not_ask_for_types_torchrec_cannot_build():
    from shardrec.sharding.plan.constraints import parse_constraints

    parsed = parse_constraints({}, _configs(), 2)
    assert parsed["t_item"].sharding_types == (
        "data_parallel",
        "table_wise",
        "column_wise",
        "row_wise",
    )
    assert "t_uid" not in parsed
    with pytest.raises(
        ValueError, match="t_item.sharding_types: 'table_row_wise' is not built for"
    ):
        parse_constraints({"t_item": {"sharding_types": ["table_row_wise"]}}, _configs(), 2)


def test_planner_prices_unpooled_outputs_per_id_and_plan_show_marks_sequence_tables():
    from shardrec.sharding.plan.report import tables_table
    from shardrec.sharding.planner import plan_tables
    from shardrec.sharding.search.request import DatasetStatistics, PlanRequest

    stats = {
        "hist_item": {"mean_ids_per_sample": 40.0},
        "hist_artist": {"mean_ids_per_sample": 40.0},
    }
    plan = plan_tables(
        PlanRequest(_configs(), 2, 2, 256, "cpu", statistics=DatasetStatistics(stats=stats))
    )
    types = {t.name: t.sharding_type for t in plan.tables}
    assert types["t_item"] in ("data_parallel", "table_wise", "column_wise", "row_wise")
    # The item table serves the history (40 ids) and the candidate (1).
    assert plan.estimate.ids_per_sample["t_item"] == 41.0
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(tables_table(plan))
    text = console.export_text()
    line = next(row for row in text.splitlines() if "t_item" in row)
    assert " seq " in line and " 41 " in line
    assert " bag " in next(row for row in text.splitlines() if "t_uid" in row)


def test_unpooled_output_bytes_grow_with_ids_per_sample():
    from shardrec.sharding.cost.comms import Workload, table_comm_bytes
    from shardrec.sharding.plan.plan_types import Shard, TablePlan

    w = Workload(global_batch_size=64, world_size=2)
    table_wise = TablePlan("t", "table_wise", "fused", [Shard(0, 0, 0, 100, 16)])
    pooled = table_comm_bytes(table_wise, 100, 16, 10.0, w, 2)["all_to_all"]
    unpooled = table_comm_bytes(table_wise, 100, 16, 10.0, w, 2, unpooled=True)["all_to_all"]
    # Rank 0 holds it: rank 1's 32 samples come back as 10 rows each, and their gradients go back.
    out_pooled, out_unpooled = 32 * 16 * 4, 32 * 10 * 16 * 4
    assert unpooled[0] - pooled[0] == out_unpooled - out_pooled
    assert unpooled[1] - pooled[1] == out_unpooled - out_pooled


def test_a_nan_loss_of_hstu_names_the_table_or_layer_where_it_began():
    """HSTU's forward flags each stage as DLRM's does: a NaN in the item table is named as the
    history's embeddings, one in an STU layer's weights as that layer."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from shardrec.embeddings.tables import build_table_configs
    from shardrec.trainer.job.model_section import ModelConfig
    from shardrec.trainer.loop.steps import LossWindow, NonFiniteLossError
    from shardrec.trainer.model.hstu_model import build_hstu_model
    from shardrec.trainer.model.objective import TrainModule

    manifest = _manifest()
    config = ModelConfig(
        arch="hstu", embedding_dim=8, hstu_qk_dim=4, hstu_v_dim=4, hstu_hidden=8, hstu_dropout=0.0
    )
    torch.manual_seed(0)
    tables = build_table_configs(manifest, 8, unpooled_sequences=True)
    model = build_hstu_model(config, tables, manifest.sparse_features, 1, device="cpu")
    module = TrainModule(model, 2, 1)
    module.eval()  # no dropout
    lengths = {"uid": [1, 1], "hist_item": [3, 2], "hist_artist": [3, 2], "hist_ts": [3, 2]}
    values = {
        "uid": [4, 9],
        "hist_item": [1, 2, 3, 5, 6],
        "hist_artist": [0, 1, 2, 3, 4],
        "hist_ts": [10, 20, 30, 15, 25],
    }
    keys = [*lengths, "cand_item"]
    lengths["cand_item"], values["cand_item"] = [1, 1], [7, 8]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor([v for k in keys for v in values[k]]),
        lengths=torch.tensor([n for k in keys for n in lengths[k]]),
    )
    batch = Batch(torch.rand(2, 1), kjt, torch.tensor([0, 1]))

    def report() -> str:
        window = LossWindow(0, model.finite_stages(["d0"]))
        _, (loss_sum, _, labels, finite) = module(batch)
        assert len(finite) == len(window.stages)
        window.add(loss_sum, (labels >= 0).sum(), finite)
        with pytest.raises(NonFiniteLossError) as e:
            window.report(1)
        return str(e.value)

    item = model.sparse_arch.embedding_collection.embeddings["t_item"].weight
    with torch.no_grad():
        item[2] = float("nan")
    assert "first in the embeddings of hist_item (its table's weights)" in report()
    with torch.no_grad():
        item[2] = 0.0
        model.layers[1].uvqk.fill_(float("inf"))
    assert "first in STU layer 1, from finite inputs" in report()
