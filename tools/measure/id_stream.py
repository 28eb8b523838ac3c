"""The ids every table sees, global batch by global batch, in the order training reads them.

The loader of the job's train split at world size 1 yields each global batch whole (the union of
every rank's slice, dataloader/loader.py), shuffled with the job's seed and, with on-the-fly
multi-hot (data.multihot_*), expanded as training expands it. `shardrec plan` counts these ids
into each table's frequency curve (sharding/cost/hit_rates.py) to size UVM caches; `bench hitrate`
replays them through exact caches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost.hit_rates import FrequencyCurve, curve_from_counts

FLUSH_IDS = 1 << 23
"""Ids of one table buffered before they are counted (a bincount over the table's rows each
time)."""


def table_batches(
    data_dir: Path, job, configs: list[EmbeddingBagConfig], max_batches: int = 0
) -> Iterator[dict[str, np.ndarray]]:
    """Per global batch of the train split, table name -> its ids (int64), at most `max_batches` (0:
    all)."""
    from shardrec.dataloader.loader import Delivery, ShuffleSpec, build_loader
    from shardrec.trainer.job.data_options import multihot_option

    loader = build_loader(
        data_dir,
        job.data.train_split,
        global_batch_size=job.train.global_batch_size,
        rank=0,
        world_size=1,
        shuffle=ShuffleSpec(enabled=job.data.shuffle, seed=job.train.fixed_seed),
        tail=job.data.tail,
        delivery=Delivery(num_workers=0, pin_memory=False),
        multihot=multihot_option(job.data),
    )
    feature_table = {config.feature_names[0]: config.name for config in configs}
    for index, batch in enumerate(loader):
        if max_batches and index >= max_batches:
            return
        kjt = batch.sparse_features
        values = kjt.values().numpy()
        ends = np.cumsum(kjt.length_per_key())
        starts = ends - np.asarray(kjt.length_per_key())
        yield {
            feature_table[key]: values[start:end]
            for key, start, end in zip(kjt.keys(), starts, ends)
            if key in feature_table
        }


def count_batches(data_dir: Path, job, max_batches: int = 0) -> int:
    """Global batches one epoch of the train split yields (at most `max_batches`, 0: no limit)."""
    from shardrec.dataloader.format.manifest import Manifest

    rows = Manifest.load(data_dir).splits[job.data.train_split].rows
    full = (
        rows // job.train.global_batch_size
        if job.data.tail == "drop"
        else -(-rows // job.train.global_batch_size)
    )
    return min(full, max_batches) if max_batches else full


def measure_curves(
    data_dir: Path,
    job,
    configs: list[EmbeddingBagConfig],
    max_batches: int = 0,
    to_epoch: bool = True,
) -> dict[str, FrequencyCurve]:
    """Each table's id-frequency curve over the first `max_batches` global batches (0: one epoch);
    `to_epoch`: scaled to a whole epoch (the stream a one-epoch run's caches see), else the
    curve of exactly the batches read."""
    rows = {config.name: config.num_embeddings for config in configs}
    counts = {name: np.zeros(n, dtype=np.int64) for name, n in rows.items()}
    buffers: dict[str, list[np.ndarray]] = {name: [] for name in rows}
    seen = 0
    for batch in table_batches(data_dir, job, configs, max_batches):
        seen += 1
        for name, ids in batch.items():
            buffers[name].append(ids)
            if sum(len(b) for b in buffers[name]) >= FLUSH_IDS:
                counts[name] += np.bincount(np.concatenate(buffers[name]), minlength=rows[name])
                buffers[name] = []
    for name, pending in buffers.items():
        if pending:
            counts[name] += np.bincount(np.concatenate(pending), minlength=rows[name])
    scale = count_batches(data_dir, job) / seen if seen and to_epoch else 1.0
    return {
        name: _scaled(curve_from_counts(counts[name], rows[name], seen), scale)
        for name in rows
        if seen
    }


def _scaled(curve: FrequencyCurve, scale: float) -> FrequencyCurve:
    if scale == 1.0:
        return curve
    lookups = tuple(x * scale for x in curve.lookups)
    return FrequencyCurve(
        curve.rows, lookups, curve.table_rows, curve.batches * scale, curve.head_ids
    )
