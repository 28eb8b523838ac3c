"""Raw Criteo-format text rows -> model inputs, with the transform an exported model records.

`shardrec predict MODEL rows.tsv` scores text that never went through `shardrec preprocess`:
the rows are parsed by the preprocessing parser (tools/preprocess/parse.py), dense values go
through the same dense transform and categoricals through the same hashing or vocabulary
(tools/preprocess/columns.map_ids), so a row gets the ids preprocessing would have given it;
with an on-the-fly multi-hot model, its one-hot ids become their index-table rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.multihot import MultiHotSpec, default_cache_dir, open_index_tables
from shardrec.tools.preprocess.columns import map_ids
from shardrec.tools.preprocess.inputs import open_text
from shardrec.tools.preprocess.parse import REASONS, Schema, describe_bad_row, parse_chunk, transform_dense
from shardrec.tools.preprocess.vocab import load_vocabularies

CHUNK_BYTES = 16 << 20
"""Text parsed at a time: bounds memory whatever the file's size."""
RawBatch = tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]
"""(dense [rows, num_dense] float32, feature -> (ids, lengths)), what trainer.inference.predict.rows_batch takes."""


class RawRows:
    """Turns text rows into model inputs with one model's transform (its header's "transform")."""

    def __init__(self, header: dict[str, Any]) -> None:
        t = header["transform"]
        if "schema" not in t or t.get("dense_transform") is None:
            raise ValueError(
                f"the model's dataset ({t.get('dataset')}) was not made by `shardrec preprocess`: "
                "no text schema or dense transform to apply to raw rows; score a preprocessed split instead"
            )
        self.schema = Schema(**t["schema"])
        self.dense_transform, self.dense_dtype = t["dense_transform"], t.get("dense_dtype") or "float32"
        self.names, self.cardinalities = list(header["feature_names"]), tuple(t["cardinalities"])
        self.vocabs = None
        if t.get("mode") == "vocab":
            if not t.get("vocab_dir") or not Path(t["vocab_dir"]).is_dir():
                raise ValueError(
                    f"vocabulary folder {t.get('vocab_dir')!r} of the model's dataset is gone: "
                    "raw rows cannot be mapped to ids without it"
                )
            self.vocabs = load_vocabularies(Path(t["vocab_dir"]), self.schema.sparse_names)
        self.tables = None
        if t.get("multihot"):
            m = t["multihot"]
            spec = MultiHotSpec(tuple(m["sizes"]), tuple(m.get("rows") or self.cardinalities), m["dist"], m["seed"])
            self.tables = open_index_tables(m.get("cache_dir") or default_cache_dir(), spec)

    def convert(
        self, data: bytes, path: Path, first_line: int, labeled: bool = True
    ) -> tuple[RawBatch, np.ndarray | None]:
        """Inputs and labels (None: `labeled` off) of the rows in `data` (whole lines); ValueError
        names a malformed row's line. Rows without a label column are parsed with a 0 put in front."""
        if not labeled:
            data = re.sub(rb"(?m)^(?=[^\n])", b"0" + self.schema.delimiter.encode(), data)
        elif first_line <= 2 and _most_fields(data, self.schema.delimiter) == self.schema.num_fields - 1:
            # Criteo strips trailing empty fields, never the label: at most one field fewer than a
            # labeled row in every row of a chunk is a file without labels, whose first integer would
            # be read as the label and every field after it shifted by one.
            raise ValueError(
                f"{path}: rows of at most {self.schema.num_fields - 1} fields, a labeled row has "
                f"{self.schema.num_fields}: no label column (as Criteo's test.txt)? score them with --no-label"
            )
        chunk = parse_chunk(data, self.schema)
        bad = np.flatnonzero(~chunk.ok)
        if bad.size:
            row = int(bad[0])
            field, value = describe_bad_row(data, chunk, row, self.schema)
            reason = REASONS[int(chunk.reason[row])]
            hint = ""
            if reason == "bad_label":
                hint = " (rows without a label column, as Criteo's test.txt? score them with --no-label)"
            elif reason == "too_many_fields" and not labeled:
                hint = " (with --no-label: the rows have a label column; leave --no-label out)"
            raise ValueError(f"{path}:{first_line + row}: {reason}: {field}: {value}{hint}")
        dense = transform_dense(chunk.dense, chunk.dense_missing, self.dense_transform, self.dense_dtype)
        mapped = map_ids(chunk, self.schema.sparse_names, self.cardinalities, self.vocabs)
        ids = {}
        for t, (name, column) in enumerate(zip(self.names, mapped.values())):
            if self.tables is not None:
                multi = self.tables.expand(t, column.astype(np.int64))
                ids[name] = (multi.reshape(-1), np.full(chunk.rows, multi.shape[1], np.int32))
            else:
                ids[name] = (column, np.ones(chunk.rows, np.int32))
        return (dense.astype(np.float32), ids), chunk.labels if labeled else None

    def read(
        self, path: Path, chunk_bytes: int = CHUNK_BYTES, labeled: bool = True
    ) -> Iterator[tuple[RawBatch, np.ndarray | None]]:
        """The file's rows, a chunk of whole lines at a time (gzip inputs too); `labeled` off: rows
        without the label column (labels None)."""
        line, rest = 1, b""
        with open_text(path) as f:
            if self.schema.header:
                f.readline()
                line += 1
            while True:
                block = f.read(chunk_bytes)
                data = rest + block
                if not block:
                    if data.strip():
                        yield self.convert(data if data.endswith(b"\n") else data + b"\n", path, line, labeled)
                    return
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    rest = data
                    continue
                data, rest = data[:cut], data[cut:]
                yield self.convert(data, path, line, labeled)
                line += data.count(b"\n")


def _most_fields(data: bytes, delimiter: str) -> int:
    """The largest number of fields of a line of `data` (whole lines)."""
    raw = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    delimiters = np.flatnonzero(raw == ord(delimiter))
    per_line = np.diff(np.searchsorted(delimiters, ends), prepend=0)
    return int(per_line.max()) + 1 if per_line.size else 0
