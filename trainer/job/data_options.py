"""What the job's data settings mean for the loaders and the tables: how batches are handed
over, the on-the-fly multi-hot option (data.multihot_*) and the dataset as the model sees it.

Shared by training (trainer.loop.train_job) and `shardrec eval` / `export`
(trainer.inference.evaluate, trainer.inference.export), so that the three build the same tables and
read the same ids.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from shardrec.dataloader.format.manifest import POOLING_STAT, Manifest
from shardrec.dataloader.multihot.multihot_tables import MultiHotOption
from shardrec.trainer.job.sections import DataConfig, TrainConfig

if (
    TYPE_CHECKING
):  # the loader imports torch; checking a job's data (`shardrec eval`'s request) needs none
    from shardrec.dataloader.loader import Delivery


def train_steps(manifest: Manifest, data: DataConfig, train: TrainConfig) -> int:
    """The steps a job trains on this data: train.steps, or its epochs over the train split."""
    rows, batch = manifest.splits[data.train_split].rows, train.global_batch_size
    per_epoch = rows // batch if data.tail == "drop" else -(-rows // batch)
    return train.total_steps(per_epoch)


def delivery(data: DataConfig, device_kind: str) -> Delivery:
    """How the job's loaders hand batches over: data.num_workers threads, batches pinned for a
    CUDA job only (the step moves them; pinning in a CPU job would make a CUDA context on GPU 0)."""
    from shardrec.dataloader.loader import Delivery

    return Delivery(num_workers=data.num_workers, pin_memory=device_kind == "cuda")


def multihot_option(data: DataConfig) -> MultiHotOption | None:
    """build_loader's `multihot` for these settings (None: the ids as stored)."""
    if not data.multihot_sizes:
        return None
    return MultiHotOption(
        sizes=tuple(data.multihot_sizes),
        rows=tuple(data.multihot_rows) if data.multihot_rows else None,
        dist=data.multihot_dist,
        seed=data.multihot_seed,
        cache_dir=data.multihot_cache or None,
    )


def model_manifest(manifest: Manifest, data: DataConfig) -> Manifest:
    """The dataset as the model sees it: with on-the-fly multi-hot ids, each feature has its
    index table's rows (the embedding table's size) and is multi-hot where its size exceeds 1.

    ValueError when the dataset has no sparse feature (no table to train), or the sizes or rows do
    not give one value per sparse feature.
    """
    if not manifest.sparse_features:  # the planner's search and the model need a table
        raise ValueError(
            f"{data.path}: no categorical or list feature, so no embedding table to train: its spec "
            "gives every column the role label, dense or ignore; give the columns of ids (users, "
            'items, ...) role = "categorical" (kind = "integer" for numbers) and preprocess again'
        )
    sizes, rows = data.multihot_sizes, data.multihot_rows
    if not sizes:
        return manifest
    names = manifest.feature_names
    if len(sizes) != len(names):
        raise ValueError(
            f"data.multihot_sizes has {len(sizes)} values for {len(names)} sparse features of "
            f"{data.path} ({', '.join(names[:3])}, ...): give one per feature"
        )
    for feat in manifest.sparse_features:
        if feat.multi_hot and "spec" in manifest.options:
            raise ValueError(
                f"data.multihot_sizes: feature {feat.name} of {data.path} is a list column of its feature spec, "
                "with each row's own ids: multi-hot ids are drawn for one-hot features only; "
                "leave data.multihot_sizes empty (--set 'data.multihot_sizes=[]')"
            )
        if feat.multi_hot:
            raise ValueError(
                f"data.multihot_sizes: feature {feat.name} of {data.path} is already multi-hot "
                "(multi-hot ids are made from one-hot ones)"
            )
    table_rows = rows or [f.cardinality for f in manifest.sparse_features]
    # Every sample gets exactly its feature's size of ids: the planner's pooling factor (it read
    # the stored one-hot features' 1 and planned DLRMv2's tables as one-hot, ~half the lookups).
    features = [
        dataclasses.replace(
            f,
            cardinality=int(r),
            multi_hot=s > 1,
            stats={**f.stats, POOLING_STAT: float(s), "p95_ids_per_sample": float(s)},
        )
        for f, s, r in zip(manifest.sparse_features, sizes, table_rows)
    ]
    return dataclasses.replace(manifest, sparse_features=features)
