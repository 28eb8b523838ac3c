"""Which rows of an exported model's tables ever trained, and what `predict` does with ids whose
rows never did.

A table row that no optimizer step changed still holds its initial random weights: an id of the
training data's range that no training row brought (a hashed value, a vocabulary value or an
event log's user first seen in a later period) is scored with noise. Export draws each table's
initial weights again (embeddings.init: seeded blocks, the same whatever the plan, the world size
or the optimizer) and compares them with the trained rows, one block at a time: nothing is counted
while training runs. The file holds one bit a row (`trained_rows.<table>`, set where the row
changed) and, in its header, the tables it holds them for; `predict` counts, per table, the
lookups that fell on rows that never trained and, where asked, scores them as a missing value.

A table with no row at its initial values either trained every row or was initialised with
another generator than export's (CUDA's: a run started on a GPU). The run records which device
kind drew its tables (RUN/initial_weights.json, the header's `initial_weights_device`): the CPU's
draws tell every table, another's none, and predict says why. A run from before that record draws
every table on one device kind too, so where another table still has a row at export's draw, it
trained every row; where none has, predict cannot tell which, and says so. Managed tables are not marked: an id
without a slot scores through their shared row by design, and a reassigned row starts from
another draw (managed/row_reset.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.util.near import name_list
from shardrec.embeddings.init import rows_at_initial_values
from shardrec.embeddings.managed.table_kinds import MAPPED_KINDS, MISSING_ROW

TRAINED_PREFIX = "trained_rows."
"""A table's bits in the model file: `trained_rows.<table>`, uint8, a row per bit (numpy's
packbits, little bit order), set where the row changed in training."""
HEADER_KEY = "trained_rows"
"""The header's list of the tables the file holds bits for (absent: exported before)."""
DRAWN_ON_KEY = "initial_weights_device"
"""The header's device kind whose generator drew the tables' initial weights, as the run recorded
it (absent: a run from before runs recorded it)."""


def marked_tables(header: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """The tables (their position among the model's tables, and their header entry) whose rows
    export marks: all but managed ones."""
    return [
        (index, t)
        for index, t in enumerate(header["tables"])
        if t.get("kind", "static") not in MAPPED_KINDS
    ]


def bits_shape(table: dict[str, Any]) -> tuple[int]:
    return ((table["rows"] + 7) // 8,)


def trained_bits(
    weight: torch.Tensor, index: int, table: dict[str, Any], seed: int
) -> torch.Tensor:
    """A table's bits for the model file: which of its rows differ from their initial weights."""
    config = EmbeddingBagConfig(
        name=table["name"],
        embedding_dim=table["dim"],
        num_embeddings=table["rows"],
        feature_names=list(table["features"]),
    )
    changed = ~rows_at_initial_values(weight, index, config, seed).numpy()
    return torch.from_numpy(np.packbits(changed, bitorder="little"))


@dataclass
class TrainedRows:
    """An exported model's trained rows, and the lookups predict counted against them."""

    bits: dict[str, np.ndarray]
    """Table -> its bits, for the tables with at least one row at its initial values."""
    unknown: list[str]
    """Tables whose rows predict cannot tell: drawn on another device than the CPU, or (a run
    that did not record it) every row of every table changed."""
    table_of: dict[str, str]
    """Feature -> its table, for the marked tables' features."""
    missing_row: dict[str, int | None]
    """Feature -> the row an untrained id is scored as with `as_missing` (None: left out, as an
    empty value of a list is)."""
    events: dict[str, list[str]] = field(default_factory=dict)
    """Feature of a sequence with sides -> the sequence's features (it and its sides), whose
    values at a position are one event's: an id left out takes that event's other values along."""
    as_missing: bool = False
    """Score an id on a row that never trained as the feature's missing value."""
    has_missing: bool = True
    """Whether its features have a missing value to score such an id as (an event log's have
    none: its users and items are rows of their tables)."""
    drawn_on: str | None = None
    """The device kind that drew the tables' initial weights (None: the run did not record it)."""
    lookups: dict[str, int] = field(default_factory=dict)
    untrained: dict[str, int] = field(default_factory=dict)
    still_untrained: dict[str, int] = field(default_factory=dict)
    """With `as_missing`, table -> its untrained lookups scored on a missing value's row that
    never trained either (no training row held that feature's missing value)."""

    def untrained_ids(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Whether each id's row of `table` never trained."""
        rows = ids.astype(np.int64, copy=False)
        return ((self.bits[table][rows >> 3] >> (rows & 7).astype(np.uint8)) & 1) == 0

    def look(self, batch: Batch) -> Batch:
        """Count the lookups of the batch's real rows (label >= 0); with `as_missing`, the batch
        with each untrained id scored as its feature's missing value."""
        kjt = batch.sparse_features
        keys, offsets = kjt.keys(), kjt.offset_per_key()
        values = kjt.values().numpy()
        lengths = kjt.lengths().numpy().reshape(len(keys), -1)
        real = (batch.labels >= 0).numpy()
        ids = {key: values[offsets[i] : offsets[i + 1]] for i, key in enumerate(keys)}
        untrained: dict[str, np.ndarray] = {}
        for i, key in enumerate(keys):
            table = self.table_of.get(key)
            if table is None:
                continue
            counted = np.repeat(real, lengths[i])
            self.lookups[table] = self.lookups.get(table, 0) + int(counted.sum())
            if table in self.bits:
                untrained[key] = self.untrained_ids(table, ids[key])
                n = int((untrained[key] & counted).sum())
                self.untrained[table] = self.untrained.get(table, 0) + n
                if self._missing_row_untrained(key, table):
                    self.still_untrained[table] = self.still_untrained.get(table, 0) + n
        if not self.as_missing:
            return batch
        scored = [
            self._as_missing(key, ids[key], lengths[i], untrained) for i, key in enumerate(keys)
        ]
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.from_numpy(
                np.concatenate([v for v, _ in scored]).astype(np.int64, copy=False)
            ),
            lengths=torch.from_numpy(
                np.concatenate([n for _, n in scored]).astype(np.int32, copy=False)
            ),
        )
        return Batch(
            dense_features=batch.dense_features, sparse_features=sparse, labels=batch.labels
        )

    def _missing_row_untrained(self, key: str, table: str) -> bool:
        """Whether `as_missing` scores the feature's untrained ids on a row that never trained
        either: its missing value's, which no training row held."""
        row = self.missing_row[key]
        return (
            self.as_missing
            and row is not None
            and bool(self.untrained_ids(table, np.array([row]))[0])
        )

    def _as_missing(
        self, key: str, ids: np.ndarray, length: np.ndarray, untrained: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """A feature's ids and lengths with its untrained ids as its missing row, or left out;
        a sequence's position leaves with every side's value of it (they stay one event each)."""
        row = self.missing_row.get(key)
        if key in untrained and row is not None:
            ids = np.where(untrained[key], row, ids)
        gone = [
            untrained[k]
            for k in self.events.get(key, [key])
            if k in untrained and self.missing_row[k] is None and untrained[k].any()
        ]
        if not gone:
            return ids, length
        kept = ~np.logical_or.reduce(gone)
        owner = np.repeat(np.arange(len(length)), length)
        return ids[kept], np.bincount(owner[kept], minlength=len(length))

    def summary(self) -> dict[str, dict[str, int | None]]:
        """Table -> its lookups and those on rows that never trained (None: cannot tell); with
        `as_missing`, also those still scored on such a row (`still_untrained`)."""
        counts: dict[str, dict[str, int | None]] = {}
        for table, n in self.lookups.items():
            known = table in self.bits
            counts[table] = {
                "lookups": n,
                "untrained": self.untrained.get(table, 0) if known else None,
            }
            if self.as_missing:
                counts[table]["still_untrained"] = (
                    self.still_untrained.get(table, 0) if known else None
                )
        return counts


def trained_rows(
    header: dict[str, Any], tensors: dict[str, torch.Tensor], path: Path
) -> TrainedRows | None:
    """A model file's trained rows, its `trained_rows.*` tensors taken out of `tensors` (None: a
    file exported before they were written); ValueError (one line) for a table's bits missing or
    of another size."""
    found = {k: tensors.pop(k) for k in list(tensors) if k.startswith(TRAINED_PREFIX)}
    if HEADER_KEY not in header:
        return None
    bits, unknown, table_of, missing_row = {}, [], {}, {}
    for _, t in marked_tables(header):
        name = TRAINED_PREFIX + t["name"]
        if name not in found or tuple(found[name].shape) != bits_shape(t):
            raise ValueError(
                f"{path}: no tensor {name} of {bits_shape(t)[0]:,} bytes, which its header's "
                "table has; export the run again"
            )
        packed = found[name].numpy()
        bits[t["name"]] = packed
        if np.unpackbits(packed, count=t["rows"], bitorder="little").all():
            unknown.append(t["name"])
        for feature in t["features"]:
            table_of[feature] = t["name"]
            missing_row[feature] = _missing_row(header, t, feature)
    drawn_on = header.get(DRAWN_ON_KEY)
    if drawn_on is not None:  # the run's record decides: export repeats the CPU's draws only
        unknown = [] if drawn_on == "cpu" else list(bits)
    elif len(unknown) < len(bits):
        # Every table of a run is drawn on one device kind, at its first start: a table with a row
        # still at export's draw says the draws were the CPU's, so a table with none trained whole.
        unknown = []
    for name in unknown:
        del bits[name]
    log = bool(header["transform"].get("events_spec"))
    return TrainedRows(
        bits,
        unknown,
        table_of,
        missing_row,
        _sequence_events(header),
        has_missing=not log,
        drawn_on=drawn_on,
    )


def _sequence_events(header: dict[str, Any]) -> dict[str, list[str]]:
    """Each feature of a sequence with sides (the feature spec's `side_of`) -> the sequence's
    features: a history's ids and its times, actions or other ids, one event a position."""
    sequences: dict[str, list[str]] = {}
    for feature in header.get("sparse_features", []):
        if feature.get("side_of"):
            sequences.setdefault(feature["side_of"], [feature["side_of"]]).append(feature["name"])
    return {name: features for features in sequences.values() for name in features}


def _missing_row(header: dict[str, Any], table: dict[str, Any], feature: str) -> int | None:
    """The row a value the model does not know is scored through, as preprocessing gives it: a
    vocabulary's out-of-vocabulary row; in hashing mode an empty field's row (one id a row) or,
    in a list, none (its empty values are left out); a raw-id table's missing row."""
    if table.get("kind", "static") != "static":
        return MISSING_ROW
    transform = header["transform"]
    if transform.get("oov_id") is not None:
        return int(transform["oov_id"])
    missing = transform.get("missing_id")
    return None if feature in header["multi_hot"] or missing is None else int(missing)


def untrained_lines(trained: TrainedRows | None, model: str) -> list[str]:
    """What predict says of the lookups it scored on rows that never trained: one line per
    table that had any, a line for the tables it cannot tell, a line for a file that cannot."""
    if trained is None:
        return [
            f"{model}: exported before model files recorded which rows trained: can't tell "
            "whether lookups fell on rows that never trained (export the run again to know)"
        ]
    counts = trained.summary()
    hit = {t: c for t, c in counts.items() if c["untrained"]}
    lines = []
    if hit:
        untrained = sum(c["untrained"] or 0 for c in hit.values())
        told = [t for t in counts if t in trained.bits]
        lookups = sum(counts[t]["lookups"] for t in told)
        scored = "scored with those weights" + (
            " (--untrained-as-missing scores them as missing values)" if trained.has_missing else ""
        )
        if trained.as_missing:
            scored = "scored as their feature's missing value (--untrained-as-missing)"
        lines.append(
            f"{untrained:,} of {lookups:,} lookups fell on rows that never trained (at their "
            f"initial random weights), in {len(hit)} of {len(told)} tables; {scored}:"
        )
        lines += [
            f"  {t}: {c['untrained']:,} of {c['lookups']:,} ({c['untrained'] / c['lookups']:.1%})"
            for t, c in hit.items()
        ]
        still = [t for t in hit if trained.still_untrained.get(t)]
        if still:
            lines.append(
                f"{sum(trained.still_untrained[t] for t in still):,} of them still scored with "
                f"initial random weights ({name_list(still, 4)}): their feature's missing value "
                "never occurred in training, so its row never trained either"
            )
    unknown = [t for t in counts if t in trained.unknown]
    if unknown:
        why = (
            "none of their rows is at its initial weights (every row trained, or the run drew "
            "them on a GPU, whose draws export does not repeat)"
        )
        if trained.drawn_on is not None:
            why = (
                f"the run drew their initial weights on {trained.drawn_on}, whose draws export "
                "does not repeat on the CPU"
            )
        lines.append(
            f"can't tell which lookups of {name_list(unknown, 4)} fell on rows that never trained: "
            + why
        )
    return lines
