"""shardrec.embeddings: table specs from a manifest, plan-independent initial weights, the sparse
optimizer fused into the named tables, and table weights found by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from shardrec.dataloader.format.manifest import Manifest, SparseFeature
from shardrec.embeddings.dims import table_dims
from shardrec.embeddings.init import INIT_BLOCK_ROWS, _fill_rows, init_embedding_weights
from shardrec.embeddings.optim import (
    attach_fused_optimizer,
    replicated_table_optimizer,
    replicated_table_params,
)
from shardrec.embeddings.tables import build_ebc, build_table_configs, table_weight_fqn


def test_one_table_per_sparse_feature_with_its_width(tiny_dataset: Path) -> None:
    manifest = Manifest.load(tiny_dataset)
    tables = build_table_configs(manifest, 8, {"f1": 4})
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.feature_names) for t in tables] == [
        ("t_f0", 50, 8, ["f0"]),
        ("t_f1", 300, 4, ["f1"]),
        ("t_f2", 7, 8, ["f2"]),
        ("t_f3", 1000, 8, ["f3"]),
    ]
    assert table_dims(manifest, 8) == {"f0": 8, "f1": 8, "f2": 8, "f3": 8}
    with pytest.raises(
        ValueError, match="^model.dims names features the dataset does not have: C1, zz$"
    ):
        build_table_configs(manifest, 8, {"zz": 4, "C1": 4})


def test_a_mean_pooled_list_feature_gives_the_mean_of_its_ids_embeddings() -> None:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    features = [
        SparseFeature("genres", 12, "uint8", multi_hot=True, pooling="mean"),
        SparseFeature("tags", 12, "uint8", multi_hot=True),
    ]
    tables = build_table_configs(Manifest([], features, {}), 4)
    assert [t.pooling.name for t in tables] == ["MEAN", "SUM"]
    ebc = build_ebc(tables, "cpu")
    rows = [[3, 5, 11], [], [7]]  # a row's ids; an empty list pools to zeros
    lengths = torch.tensor([len(r) for r in rows] * 2)
    values = torch.tensor([i for r in rows for i in r] * 2)
    pooled = ebc(KeyedJaggedTensor.from_lengths_sync(["genres", "tags"], values, lengths)).to_dict()
    weights = {f: ebc.embedding_bags[f"t_{f}"].weight.detach() for f in ("genres", "tags")}
    for i, ids in enumerate(rows):
        mean = weights["genres"][ids].mean(0) if ids else torch.zeros(4)
        total = weights["tags"][ids].sum(0)
        torch.testing.assert_close(pooled["genres"][i].detach(), mean)
        torch.testing.assert_close(pooled["tags"][i].detach(), total)


def _table(rows: int = 20_000, dim: int = 4) -> EmbeddingBagConfig:
    return EmbeddingBagConfig(
        name="t_a", embedding_dim=dim, num_embeddings=rows, feature_names=["a"]
    )


def test_initial_weights_are_drawn_on_the_device_of_the_shard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shard on a GPU is filled by CUDA's generator there, not drawn on the host and copied."""
    made_on = []
    real = torch.Generator

    def generator(device: torch.device | None = None) -> torch.Generator:
        made_on.append(device)  # None: torch's default, the host
        return real(device=device or "cpu")

    monkeypatch.setattr(torch, "Generator", generator)
    table = _table(rows=INIT_BLOCK_ROWS + 10)
    _fill_rows(torch.empty(INIT_BLOCK_ROWS + 10, table.embedding_dim), 0, 0, 1, table, seed=7)
    assert made_on == [torch.device("cpu")] * 2  # one per block, on the weights' device


def test_initial_weights_are_pinned_and_do_not_depend_on_the_cut() -> None:
    table = _table()
    whole = torch.empty(table.num_embeddings, table.embedding_dim)
    _fill_rows(whole, 0, 0, 1, table, seed=7)
    # Values of the first implementation (trainer/model/build.py): a checkpoint-free resume or an
    # old run compared against a new one relies on them staying bit-identical.
    assert whole[0].tolist() == [
        -0.004842731636017561,
        -0.0006000682478770614,
        0.003440378000959754,
        0.004373742733150721,
    ]
    assert whole[INIT_BLOCK_ROWS].tolist() == [
        -0.005718188360333443,
        0.006018022075295448,
        0.0059361751191318035,
        0.004212789703160524,
    ]
    # A shard straddling a block boundary, cut by columns too, holds exactly the whole table's
    # values.
    shard = torch.empty(300, 2)
    _fill_rows(shard, INIT_BLOCK_ROWS - 100, 1, 1, table, seed=7)
    assert torch.equal(shard, whole[INIT_BLOCK_ROWS - 100 : INIT_BLOCK_ROWS + 200, 1:3])


def test_init_fills_every_table_of_a_model_by_its_weight_name() -> None:
    tables = [
        _table(10),
        EmbeddingBagConfig(name="t_b", embedding_dim=4, num_embeddings=30, feature_names=["b"]),
    ]
    ebc = build_ebc(tables, "cpu")
    model = torch.nn.ModuleDict({"ebc": ebc})
    init_embedding_weights(model, tables, seed=3, ebc_path="ebc")
    expected = torch.empty(30, 4)
    _fill_rows(expected, 0, 0, 1, tables[1], seed=3)
    assert torch.equal(ebc.embedding_bags["t_b"].weight.detach(), expected)
    assert table_weight_fqn("", "t_b") == "embedding_bags.t_b.weight"
    assert table_weight_fqn("ebc", "t_b") in dict(model.named_parameters())


def test_fused_optimizer_goes_to_the_named_tables_only_and_the_rest_are_found_by_name() -> None:
    tables = [
        EmbeddingBagConfig(name=f"t_{c}", embedding_dim=4, num_embeddings=10, feature_names=[c])
        for c in "abc"
    ]
    ebc = build_ebc(tables, "cpu")
    model = torch.nn.ModuleDict({"ebc": ebc, "dense": torch.nn.Linear(2, 2)})
    attach_fused_optimizer(ebc, ["t_b"], optimizer="rowwise_adagrad", lr=0.1, eps=1e-8)
    fused = dict(in_backward_optimizer_filter(model.named_parameters(), include=True))
    assert list(fused) == ["ebc.embedding_bags.t_b.weight"]
    replicated = replicated_table_params(model, tables, "ebc")
    assert {fqn: name for fqn, (name, _) in replicated.items()} == {
        "ebc.embedding_bags.t_a.weight": "t_a",
        "ebc.embedding_bags.t_c.weight": "t_c",
    }
    optimizer = replicated_table_optimizer(
        [p for _, p in replicated.values()], optimizer="rowwise_adagrad", lr=0.1, eps=1e-8
    )
    assert isinstance(optimizer, RowWiseAdagrad) and optimizer.defaults["lr"] == 0.1
    sgd = replicated_table_optimizer(
        [ebc.embedding_bags["t_a"].weight], optimizer="sgd", lr=0.5, eps=1e-8
    )
    assert isinstance(sgd, torch.optim.SGD)  # sgd takes no eps


def test_attach_with_no_fused_table_marks_nothing() -> None:
    ebc = build_ebc([_table(10)], "cpu")
    attach_fused_optimizer(ebc, [], optimizer="sgd", lr=0.1, eps=1e-8)
    assert list(in_backward_optimizer_filter(ebc.named_parameters(), include=True)) == []
