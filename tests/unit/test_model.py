"""DLRM and DCNv2 over an unsharded EmbeddingBagCollection: shapes, features read by name."""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.trainer.job.config import ModelConfig
from shardrec.trainer.model.models import build_model


def _ebc(dims=(4, 4, 4)) -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=d, num_embeddings=10, feature_names=[f"f{i}"]
        )
        for i, d in enumerate(dims)
    ]
    return EmbeddingBagCollection(tables=tables)


DLRM = ModelConfig(arch="dlrm", embedding_dim=4, dense_arch=[8, 4], over_arch=[8, 1])


def _kjt(keys, batch=5) -> KeyedJaggedTensor:
    lengths = torch.tensor([1, 2, 0, 1, 1] * len(keys))[: batch * len(keys)]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.randint(0, 10, (int(lengths.sum()),)), lengths=lengths
    )


def test_dlrm_gives_one_logit_per_sample_and_reads_features_by_name() -> None:
    torch.manual_seed(0)
    model = build_model(DLRM, _ebc(), ["f0", "f1", "f2"], 3)
    dense = torch.randn(5, 3)
    kjt = _kjt(["f0", "f1", "f2"])
    out = model(dense, kjt)
    assert out.shape == (5,)
    # The same features in another key order give the same logits.
    perm = kjt.permute([2, 0, 1])
    assert torch.allclose(model(dense, perm), out)
    # 3 embeddings + the dense vector: 6 pairwise dots, plus the dense vector itself.
    assert model.interaction.out_features(4) == 4 + 6


def test_dcnv2_takes_mixed_widths_and_dlrm_refuses_them() -> None:
    dcn = ModelConfig(
        arch="dcnv2", dense_arch=[8, 6], over_arch=[8, 1], dcn_layers=2, dcn_low_rank=3
    )
    model = build_model(dcn, _ebc((4, 8, 2)), ["f0", "f1", "f2"], 3)
    assert model(torch.randn(5, 3), _kjt(["f0", "f1", "f2"])).shape == (5,)
    assert model.interaction.out_features(6) == 6 + 4 + 8 + 2
    with pytest.raises(ValueError, match="embedding width"):
        build_model(DLRM, _ebc((4, 8, 2)), ["f0", "f1", "f2"], 3)
    with pytest.raises(ValueError, match="no embedding table serves feature"):
        build_model(DLRM, _ebc(), ["f0", "f1", "f9"], 3)
