"""A NaN or infinite loss names where it began, first in forward order: a dense input (the data),
a table's embeddings, or a dense layer (the training), from flags the step computes on the device
without a sync."""

from __future__ import annotations

import pytest
import torch
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.loop.steps import LossWindow, NonFiniteLossError
from shardrec.trainer.model.models import all_finite, build_model, finite_stages
from shardrec.trainer.model.objective import TrainModule

FEATURES, DENSE = ["f0", "f1"], ["I1", "I2", "I3"]


def _module() -> TrainModule:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=10, feature_names=[f])
        for i, f in enumerate(FEATURES)
    ]
    config = ModelConfig(arch="dlrm", embedding_dim=4, dense_arch=[8, 4], over_arch=[8, 1])
    model = build_model(config, EmbeddingBagCollection(tables=tables), FEATURES, len(DENSE))
    return TrainModule(model, 4, 1)


def _batch(dense: torch.Tensor) -> Batch:
    n = len(dense)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES,
        values=torch.arange(n * len(FEATURES)) % 10,
        lengths=torch.ones(n * len(FEATURES), dtype=torch.int64),
    )
    return Batch(dense_features=dense, sparse_features=kjt, labels=torch.tensor([0, 1, 0, 1]))


def _report(module: TrainModule, batches: list[Batch]) -> str:
    window = LossWindow(0, finite_stages(DENSE, FEATURES))
    for batch in batches:
        _, (loss_sum, _, labels, finite) = module(batch)
        window.add(loss_sum, (labels >= 0).sum(), finite)
    with pytest.raises(NonFiniteLossError) as e:
        window.report(len(batches))
    return str(e.value)


def test_a_nan_loss_names_the_dense_input_that_held_it_and_sends_to_the_data() -> None:
    good = torch.rand(4, 3)
    bad = good.clone()
    bad[2, 1] = float("-inf")
    line = _report(_module(), [_batch(good), _batch(bad)])
    assert line.startswith(
        "step 2: the loss is NaN or infinite on 1 rank(s), first in the dense input I2: the data "
        "holds NaN or infinity; stopped without saving"
    ), line
    assert "learning rate" not in line and "lower" not in line


def test_a_nan_loss_names_the_first_layer_whose_output_was_not_finite() -> None:
    module = _module()
    table = module.model.sparse_arch.embedding_bag_collection.embedding_bags["t1"].weight
    batch = _batch(torch.rand(4, 3))  # f1 reads ids 4-7
    with torch.no_grad():
        table[5] = float("nan")
    line = _report(module, [batch])
    assert "first in the embeddings of f1 (its table's weights), from finite inputs" in line, line
    assert line.endswith("lower optim.sparse_lr?"), line
    with torch.no_grad():
        table[5] = 0.0
        module.model.over_arch[1].weight.fill_(float("inf"))
    line = _report(module, [batch])
    assert "first in the over arch (over_arch), from finite inputs" in line, line
    assert line.endswith("lower optim.dense_lr?"), line


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_one_pass_finite_flag_equals_isfinite_all(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    for bad in [None, float("nan"), float("inf"), float("-inf")]:
        for shape in [(7, 5), (1, 3), (0, 3), (4, 0), (9,)]:
            values = torch.randn(shape, generator=generator).to(dtype)
            if bad is not None and values.numel():
                values.view(-1)[values.numel() // 2] = bad
            assert torch.equal(all_finite(values), torch.isfinite(values).all())
            if len(shape) == 2:
                assert torch.equal(all_finite(values, dim=0), torch.isfinite(values).all(dim=0))
