"""What an exported model file says about itself (its `__metadata__["shardrec"]`): the model
config, the tables and their features, the dense features and the dataset's feature transform
(hashing or vocabulary, dense transform, text schema, multi-hot option), made from the run's job
and its dataset's manifest; and the preprocessing settings read back from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.manifest import Manifest
from shardrec.embeddings.dims import job_tables, table_specs
from shardrec.trainer.inference.eval_request import run_config, run_dataset
from shardrec.trainer.inference.model_file import FORMAT, FORMAT_VERSION
from shardrec.trainer.job import data_options
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.job.precision import resolve_precision
from shardrec.trainer.rundir.life import trained_data

TRANSFORM_KEYS = (*trained_data.PREPROCESSING_KEYS, "schema", "spec")
"""Manifest options that say how raw rows became the dataset's ids and dense values: the settings a
model is checked against, and the text layout predict reads raw rows by (the header is written with
sorted keys)."""


def feature_transform(manifest: Manifest, dataset: Path, data: Any) -> dict[str, Any]:
    """How raw rows become this model's inputs: the dataset's preprocessing options, the
    per-feature id ranges, the vocabulary folder (vocabulary mode) and the multi-hot option."""
    options = manifest.options
    materialised = options.get("multihot")  # a `data multihot` dataset: its spec and source
    one_hot = Path(materialised["source"]) if materialised else Path(dataset)
    vocab = one_hot / ".work" / "vocab"
    option = data_options.multihot_option(data)
    transform = {
        **{k: options.get(k) for k in TRANSFORM_KEYS if k in options},
        "cardinalities": [f.cardinality for f in manifest.sparse_features],
        "vocab_dir": str(vocab.resolve())
        if options.get("mode") == "vocab" and vocab.is_dir()
        else None,
        "multihot": None
        if option is None
        else {**dataclasses.asdict(option), "cache_dir": str(option.cache_dir or "")},
        "dataset": str(Path(dataset).resolve()),
    }
    if materialised:
        transform["materialised_multihot"] = _materialised(materialised)
    return transform


def _materialised(spec: dict[str, Any]) -> dict[str, Any]:
    """A materialised multi-hot dataset's expansion, as predict repeats it on raw rows: the spec
    (sizes, rows, dist, seed) and the one-hot table sizes its source's ids were hashed into (None
    when the source dataset is gone: raw rows then cannot be scored)."""
    source = Path(spec["source"])
    try:
        cardinalities = [f.cardinality for f in Manifest.load(source).sparse_features]
    except (OSError, ValueError):  # gone or unreadable: predict says so for raw rows only
        cardinalities = None
    return {
        **{k: spec[k] for k in ("sizes", "rows", "dist", "seed")},
        "source": str(source.resolve()),
        "one_hot_cardinalities": cardinalities,
    }


def header_preprocessing(header: dict[str, Any]) -> dict[str, Any]:
    """The preprocessing settings of a model file's training data (trained_data.preprocessing's shape),
    read back from its feature transform."""
    transform = header["transform"]
    events = transform.get("events_spec")
    return {
        "cardinalities": transform["cardinalities"],
        **{key: transform.get(key) for key in trained_data.PREPROCESSING_KEYS},
        **(trained_data.event_sample_settings(events) if events else {}),
    }


def model_header(run_dir: Path, step: int, data: Path | None = None) -> dict[str, Any]:
    """What the model file says about itself (its `__metadata__["shardrec"]`); `data`: the run's
    dataset where it is now, when it moved (checked as `eval --data` checks it)."""
    config = run_config(run_dir)
    raw = run_dataset(run_dir, config, data, use="export")
    header = describe_model(config, raw, data)
    return {**header, "source": {"run_dir": str(Path(run_dir).resolve()), "step": step}}


def describe_model(config: JobConfig, raw: Manifest, dataset: Path | None = None) -> dict[str, Any]:
    """The header of a model of this job on this dataset (raw: its manifest as preprocessing wrote
    it; dataset: where it is, default the job's data.path), less the run it came from: format,
    model config, tables and their features, the feature transform."""
    seen = data_options.model_manifest(raw, config.data)
    tables = table_specs(
        seen,
        config.model.embedding_dim,
        config.model.dims,
        config.tables,
        unpooled_sequences=config.model.arch == "hstu",
    )
    settings = job_tables(seen, config.tables)
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": dataclasses.asdict(config.model),
        # What the model computed in (auto resolved on this machine's CPU): what scoring uses.
        "precision": resolve_precision(config.train.precision, "cpu"),
        "tables": [
            {"name": t.name, "features": t.features, "rows": t.rows, "dim": t.dim}
            # pooling only where it is not sum, as the manifest writes it, and the kind of a raw-id
            # feature's table only: other models keep their bytes
            | ({} if t.pooling == "sum" else {"pooling": t.pooling})
            | ({} if t.kind == "static" else {"kind": t.kind, "slots": settings[t.feature].rows})
            for t in tables
        ],
        "feature_names": seen.feature_names,
        "multi_hot": [f.name for f in seen.sparse_features if f.multi_hot],
        "dense_features": list(seen.dense_features),
        # The data `raw` was read from: with --data, the job's data.path is the old place, gone or
        # holding other data (its vocabulary is not the one the model's ids came from).
        "transform": feature_transform(raw, Path(dataset or config.data.path), config.data),
    }
    described = [f.to_dict() for f in seen.sparse_features]
    if raw.kind == "events" or any(f.sequence or f.table for f in seen.sparse_features):
        # What each feature is to a sequence model (its roles), and how events become samples.
        header["sparse_features"] = described
    if raw.kind == "events":
        header["transform"]["events_spec"] = raw.events["spec"]
    return header
