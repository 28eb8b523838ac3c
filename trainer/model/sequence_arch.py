"""A sequence model's embedding lookups: pooled bags and unpooled sequences in one module.

Bags (one-hot and list features) go through an EmbeddingBagCollection as in DLRM; the tables a
sequence feature reads go through an EmbeddingCollection, which returns one row per id (its
features' jagged embeddings). Both shard under one DistributedModelParallel.

Dedup before the all-to-all (`dedup = True`): a batch's history repeats ids (a user replays an
artist, users share popular items, the candidate is usually in the history), and every id crosses
the all-to-all twice (ids forward, gradients back). For each table, the ids of all its features
are made distinct (`torch.unique`), sent as one run in the first row of its first feature (the
other rows and features empty, the stride unchanged), and expanded back with the inverse index.
index_select's backward adds the duplicates' gradients, which the fused kernel would have added
anyway, so outputs and updates equal the plain lookup's (tests/distributed). torchrec's own
index dedup needs fbgemm's jagged_unique_indices, which has no CPU kernel in fbgemm-gpu-cpu
1.8.0; this one runs on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclass
class Jagged:
    """One feature's rows: values [ids, D] (or raw integers [ids]) and lengths [B]."""

    values: torch.Tensor
    lengths: torch.Tensor

    @property
    def offsets(self) -> torch.Tensor:
        return torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)])


def select_features(features: KeyedJaggedTensor, names: list[str]) -> KeyedJaggedTensor:
    """The named features of a batch's KeyedJaggedTensor, in that order, same stride."""
    jt = features.to_dict()
    if not names:
        return KeyedJaggedTensor.empty(values_dtype=features.values().dtype)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(names),
        values=torch.cat([jt[n].values() for n in names]),
        lengths=torch.cat([jt[n].lengths() for n in names]),
        stride=features.stride(),
    )


def table_runs(
    features: KeyedJaggedTensor, groups: list[list[str]]
) -> tuple[KeyedJaggedTensor, dict[str, torch.Tensor]]:
    """Each table's distinct ids as one run in the first row of its first feature, and per feature
    the index of each of its ids among its table's distinct ids. `groups`: the features of each
    table, as the EmbeddingCollection's configs list them."""
    jt = features.to_dict()
    stride = features.stride()
    keys, values, lengths, inverse = [], [], [], {}
    for names in groups:
        ids = [jt[n].values() for n in names]
        distinct, where = torch.unique(torch.cat(ids), return_inverse=True)
        for n, part in zip(names, torch.split(where, [len(i) for i in ids])):
            inverse[n] = part
        for i, n in enumerate(names):
            run = torch.zeros(stride, dtype=torch.long, device=distinct.device)
            if i == 0 and stride > 0:
                run[0] = distinct.numel()
            keys.append(n)
            lengths.append(run)
            values.append(distinct if i == 0 else distinct[:0])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.cat(values), lengths=torch.cat(lengths), stride=stride
    )
    return kjt, inverse


class SequenceSparseArch(nn.Module):
    """Lookups of a sequence model: `forward(features)` -> (pooled bags by feature, unpooled
    sequences by feature as Jagged). Either collection may be None (no such tables)."""

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection | None,
        embedding_collection: EmbeddingCollection | None,
        *,
        dedup: bool = False,
    ) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        self.embedding_collection = embedding_collection
        self.dedup = dedup
        self.bag_features = (
            [n for t in embedding_bag_collection.embedding_bag_configs() for n in t.feature_names]
            if embedding_bag_collection is not None
            else []
        )
        self.table_features = (
            [list(t.feature_names) for t in embedding_collection.embedding_configs()]
            if embedding_collection is not None
            else []
        )
        self.sequence_features = [n for names in self.table_features for n in names]

    def forward(
        self, features: KeyedJaggedTensor
    ) -> tuple[dict[str, torch.Tensor], dict[str, Jagged]]:
        pooled: dict[str, torch.Tensor] = {}
        if self.embedding_bag_collection is not None:
            kt = self.embedding_bag_collection(select_features(features, self.bag_features))
            pooled = kt.to_dict()
        unpooled: dict[str, Jagged] = {}
        if self.embedding_collection is not None:
            mine = select_features(features, self.sequence_features)
            jt = mine.to_dict()
            if self.dedup:
                runs, inverse = table_runs(mine, self.table_features)
                out = self.embedding_collection(runs)
                for names in self.table_features:
                    rows = out[names[0]].values()
                    for n in names:
                        unpooled[n] = Jagged(rows.index_select(0, inverse[n]), jt[n].lengths())
            else:
                out = self.embedding_collection(mine)
                for n in self.sequence_features:
                    unpooled[n] = Jagged(out[n].values(), jt[n].lengths())
        return pooled, unpooled
