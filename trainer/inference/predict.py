"""Scoring with an exported model (trainer.inference.export) in one process: no torchrun, no process
group.

The model is rebuilt unsharded from the file's header (the same build_model as training) and
its weights loaded from the file; inputs are a preprocessed split (read with the loader, as
evaluation reads it) or arrays of ids and dense values that the caller made from raw rows
with the header's transform (tools/preprocess/raw_rows.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.format.manifest import Manifest, SparseFeature
from shardrec.dataloader.loader import NO_SHUFFLE, Delivery, build_loader
from shardrec.dataloader.multihot.multihot_tables import MultiHotOption, already_multi_hot
from shardrec.embeddings.managed.maps import ManagedMaps, build_maps
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.embeddings.tables import POOLING_TYPES, build_ebc
from shardrec.trainer.inference.export import ID_MAP_PREFIX, ITEM_MAPS
from shardrec.trainer.inference.file_header import header_preprocessing
from shardrec.trainer.inference.model_file import (
    VOCAB_PREFIX,
    check_digest,
    read_header,
    reads_raw_rows,
)
from shardrec.trainer.inference.shared_row import SharedRowLookups, shared_row_lookups
from shardrec.trainer.inference.trained_rows import TRAINED_PREFIX, TrainedRows, trained_rows
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.precision import resolve_precision
from shardrec.trainer.loop.managed_ids import remap_batch
from shardrec.trainer.model.hstu_model import HSTUModel, build_hstu_model
from shardrec.trainer.model.models import RecModel, build_model
from shardrec.trainer.rundir.life import trained_data


@dataclass
class ExportedModel:
    """An exported model, ready to score: the unsharded RecModel (or HSTUModel) and the file's
    header; an event-log model also carries its item maps (artist, album of each item)."""

    model: RecModel | HSTUModel
    header: dict[str, Any]
    item_maps: tuple[np.ndarray, np.ndarray] | None = None
    maps: ManagedMaps | None = None
    """Its raw-id tables' id maps (None: it has none), read only: an id without a slot scores
    through the shared row, a missing one through row 0."""
    trained: TrainedRows | None = None
    """Which rows of its tables trained, and the lookups scored on those that did not (None: the
    file was exported before it recorded them)."""
    shared: SharedRowLookups | None = None
    """The ids its managed tables scored through their shared row (None: it has none)."""

    @property
    def feature_names(self) -> list[str]:
        return list(self.header["feature_names"])


def load_exported(path: Path) -> ExportedModel:
    """Rebuild the model of a file written by `shardrec export` and load its weights (CPU)."""
    from safetensors.torch import load_file

    header = read_header(path)
    check_digest(path)
    tables = [
        EmbeddingBagConfig(
            name=t["name"],
            embedding_dim=t["dim"],
            num_embeddings=t["rows"],
            feature_names=list(t["features"]),
            pooling=POOLING_TYPES[t.get("pooling", "sum")],  # written only where not sum
        )
        for t in header["tables"]
    ]
    config = ModelConfig(**header["model"])
    if config.arch == "hstu":
        features = [SparseFeature(**f) for f in header["sparse_features"]]
        model: RecModel | HSTUModel = build_hstu_model(
            config, tables, features, len(header["dense_features"]), device="cpu"
        )
    else:
        model = build_model(
            config,
            build_ebc(tables, "cpu"),
            header["feature_names"],
            len(header["dense_features"]),
            dense_device="cpu",
            precision=resolve_precision(header["precision"], "cpu"),
        )
    tensors = load_file(str(path))
    items = {
        k[len(ITEM_MAPS) :]: tensors.pop(k).numpy()
        for k in list(tensors)
        if k.startswith(ITEM_MAPS)
    }
    maps = _id_maps(header, tensors, path)
    # The vocabularies are raw rows' (tools/preprocess/raw_rows.py reads them) and the trained-row
    # bits predict's counts' (trained_rows.py): neither is the model's.
    weights = {
        k: v
        for k, v in tensors.items()
        if not k.startswith((ID_MAP_PREFIX, VOCAB_PREFIX, TRAINED_PREFIX))
    }
    _check_weights(path, weights, model.state_dict())
    trained = trained_rows(header, tensors, path)
    model.load_state_dict(weights, strict=True)
    model.eval()
    item_maps = (items["artist"], items["album"]) if items else None
    return ExportedModel(
        model,
        header,
        item_maps=item_maps,
        maps=maps,
        trained=trained,
        shared=shared_row_lookups(maps),
    )


def _check_weights(
    path: Path, weights: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> None:
    """ValueError (one line, naming the tensor) unless the file's tensors are the ones its header's
    model has, shape for shape: a file whose weights and header disagree is not scored."""
    redo = "the file's header does not describe its weights: export the run again"
    for name, want in expected.items():
        got = weights.get(name)
        if got is None:
            raise ValueError(f"{path}: no tensor {name}, which its header's model has; {redo}")
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError(
                f"{path}: tensor {name} is {list(got.shape)}, its header's model needs "
                f"{list(want.shape)}; {redo}"
            )
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise ValueError(f"{path}: tensor {extra[0]} is not in its header's model; {redo}")


def _id_maps(header: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path):
    """The raw-id tables of a model file as read-only maps (None: it has none)."""
    raw = {
        t["features"][0]: (t["name"], TableSettings(kind=t["kind"], rows=t["slots"]))
        for t in header["tables"]
        if t.get("kind", "static") != "static"
    }
    if not raw:
        return None
    maps = build_maps(raw)
    for feature, table in maps.tables.items():
        if table.idmap is None:
            continue
        keys = tensors.get(ID_MAP_PREFIX + feature)
        if keys is None or keys.numel() != table.idmap.rows:
            raise ValueError(
                f"{path}: no id map of {table.idmap.rows} slots for the managed table of {feature}"
            )
        table.idmap.slot_key[:] = keys.numpy().view(np.uint64)
        table.idmap.rebuild_index()
    return maps


@torch.no_grad()
def score_batches(
    model: RecModel,
    batches: Iterator[Batch],
    maps: ManagedMaps | None = None,
    trained: TrainedRows | None = None,
    shared: SharedRowLookups | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) of every real row of `batches` (padding rows, label < 0, left
    out); `maps` turn raw ids into rows first (read only), `shared` counting the ids they had no
    slot for; `trained` counts the lookups of rows that never trained (and scores them as missing
    values where it is asked to)."""
    probs, labels = [], []
    for batch in batches:
        if maps is not None:
            batch = remap_batch(maps, batch, None)
            if shared is not None:
                shared.count(batch)
        if trained is not None:
            batch = trained.look(batch)
        logits = model(batch.dense_features, batch.sparse_features)
        keep = batch.labels >= 0
        probs.append(torch.sigmoid(logits[keep].double()).numpy())
        labels.append(batch.labels[keep].numpy())
    if not probs:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(probs), np.concatenate(labels)


def multihot_of(header: dict[str, Any]) -> MultiHotOption | None:
    """The on-the-fly multi-hot option the model was trained with, if any."""
    option = header["transform"].get("multihot")
    if not option:
        return None
    rows = option.get("rows")
    return MultiHotOption(
        sizes=tuple(option["sizes"]),
        rows=tuple(rows) if rows else None,
        dist=option["dist"],
        seed=option["seed"],
        cache_dir=option.get("cache_dir") or None,
    )


SPLIT_BATCH = 8192
"""Rows of a preprocessed split scored at a time by default."""
SEQUENCE_BATCH = 128
"""The same for an HSTU model: its attention holds batch x history^2 scores per head and layer
(measured at configs/dlrmv4.toml's sizes, two layers: ~310 MiB at 128 samples, ~2.0 GiB at
1,024; SPLIT_BATCH would need ~16 GB), and raw event rows are scored 128 at a time too."""


def split_batch(header: dict[str, Any]) -> int:
    """score_split's rows at a time when the user gives none: fewer for a sequence model."""
    return SEQUENCE_BATCH if header["model"].get("arch") == "hstu" else SPLIT_BATCH


def score_split(
    exported: ExportedModel, dataset: Path, split: str, batch_size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) of a preprocessed split, in the split's row order; `batch_size`
    rows at a time (default: split_batch's)."""
    batch_size = batch_size or split_batch(exported.header)
    multihot = multihot_of(exported.header)
    multi = already_multi_hot(Manifest.load(dataset), dataset) if multihot else None
    if multi is not None:
        why, source = multi
        raise ValueError(
            f"{why}, and the model makes its multi-hot ids from one-hot ones (trained with "
            "data.multihot_sizes): score "
            + ("the one-hot dataset it was copied from" if source else "a one-hot dataset")
            + ", or raw rows"
        )
    loader = build_loader(
        dataset,
        split,
        global_batch_size=batch_size,
        rank=0,
        world_size=1,
        shuffle=NO_SHUFFLE,
        tail="pad",
        delivery=Delivery(num_workers=0),
        multihot=multihot,
    )
    missing = [n for n in exported.feature_names if n not in loader.feature_names]
    if missing:
        raise ValueError(
            f"{dataset}: no feature {missing[0]} that the model reads (has {', '.join(loader.feature_names[:4])}, ...)"
        )
    check_preprocessing(exported.header, Manifest.load(dataset), dataset)
    return score_batches(
        exported.model, iter(loader), exported.maps, exported.trained, exported.shared
    )


def _listed(names: list[str]) -> str:
    """'none', 'a, b, c' or 'a, b, c, ... (13)'."""
    if not names:
        return "none"
    return ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:3])}, ... ({len(names)})"


def check_preprocessing(header: dict[str, Any], manifest: Manifest, dataset: Path) -> None:
    """ValueError (one line) unless `dataset` has the model's dense features and was preprocessed
    as its training data was: other hashing, table sizes or dense transform give other inputs,
    and scores of them would be wrong without a word."""
    here, trained = list(manifest.dense_features), list(header["dense_features"])
    if here != trained:
        raise ValueError(
            f"{dataset}: dense features {_listed(here)}, the model reads {_listed(trained)}; "
            "score data preprocessed with the spec the model's training data was, or raw rows"
        )
    trained_on = _expansion(header["transform"].get("materialised_multihot"))
    here_on = _expansion(manifest.options.get("multihot"))
    if trained_on != here_on:
        raise ValueError(
            f"{dataset}: {_ids_words(here_on)}, the model was trained on "
            f"{_ids_words(trained_on)}; score data made as its training data was, or raw rows"
        )
    # Raw rows only where the model can read them (not a model of imported arrays).
    raw = ", or score its raw rows (the model applies them)" if reads_raw_rows(header) else ""
    redo = f"preprocess it with the training data's settings{raw}"
    names, rows = header["feature_names"], header["transform"]["cardinalities"]
    if len(names) == len(rows):  # a feature on one side only, by name, not as two lists of rows
        trained = [[n, c, n in header["multi_hot"]] for n, c in zip(names, rows)]
        here = trained_data.dataset_schema(manifest)["sparse"]
        said, one_side = trained_data.sparse_difference(trained, here, "the model")
        if one_side:
            raise ValueError(f"{dataset}: {said}; {redo}")
        if said and header["transform"].get("events_spec"):  # no setting makes them the model's
            raise ValueError(
                f"{dataset}: {said}; an event log's tables are as large as its users and items: "
                "score the raw events it was made from, which the model reads by its own tables"
            )
    differs = trained_data.preprocessing_differences(
        header_preprocessing(header),
        trained_data.preprocessing(manifest),
        (header["transform"].get("spec"), manifest.options.get("spec")),
    )
    if differs:
        raise ValueError(
            f"{dataset}: preprocessed with other settings than the model's training data ({differs}); "
            f"{redo}"
        )


def _expansion(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """A materialised multi-hot expansion's settings (sizes, rows, dist, seed); None: one-hot."""
    return {k: spec[k] for k in ("sizes", "rows", "dist", "seed")} if spec else None


def _ids_words(expansion: dict[str, Any] | None) -> str:
    if expansion is None:
        return "one-hot ids"
    return f"multi-hot ids (sizes {expansion['sizes'][:3]}..., seed {expansion['seed']})"


def rows_batch(
    dense: np.ndarray, ids: dict[str, tuple[np.ndarray, np.ndarray]], feature_names: list[str]
) -> Batch:
    """A Batch of rows from arrays: dense [rows, num_dense] and, per feature, (ids, lengths)."""
    values = torch.from_numpy(np.concatenate([ids[n][0].astype(np.int64) for n in feature_names]))
    lengths = torch.from_numpy(np.concatenate([ids[n][1].astype(np.int32) for n in feature_names]))
    sparse = KeyedJaggedTensor.from_lengths_sync(keys=feature_names, values=values, lengths=lengths)
    rows = dense.shape[0]
    return Batch(
        dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
        sparse_features=sparse,
        labels=torch.zeros(rows, dtype=torch.int64),
    )
