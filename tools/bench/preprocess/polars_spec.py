"""The baseline of `shardrec bench preprocess --like movielens|avazu`: a feature spec's
preprocessing written as a polars pipeline, doing shardrec's work so that the columns come out byte
for byte equal.

What a user would write with polars: `read_csv` (its RFC 4180 quoting) with every column read as
text, then per role: the label (0/1, or a threshold); dense values cast to numbers, missing -> 0,
the spec's transform, float32; categoricals decoded (hex, integer) or hashed from their bytes, then
hashed into ids exactly as shardrec hashes them (ids.hash_bytes and ids.hash_ids: splitmix64 over
the bytes in big-endian words of 8, then 1 + splitmix64(value) mod (rows - 1), 0 for empty);
lists split at their separator, empty values dropped, the first max_length kept, hashed the same
way, and stored as values + row offsets. String hashing runs one polars expression per 8-byte
word of the longest value (hex-encoded words parsed as integers): polars has no loop over a
string's bytes, and its own hash is not stable across versions.

A spec of Parquet files (`kind = "parquet"`) is read with `scan_parquet`, its columns typed as
stored: numbers cast, integer categoricals taken as they are, native list columns as lists (null
and empty elements dropped), the rest as above.

Run as `python -m shardrec.tools.bench.preprocess.polars_spec FILE SPEC OUT` in a child process (as
polars_pipeline.py: its own POLARS_MAX_THREADS and peak RSS). The spec must give every sparse
column a hash_size (`spec infer` does).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import Manifest, smallest_uint
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    ListColumn,
)
from shardrec.dataloader.spec.spec_file import load_spec
from shardrec.tools.bench.preprocess.polars_pipeline import child_main, polars_mix64


def _string_values(strings, max_bytes: int):
    """ids.hash_bytes of each string (a polars Series), one step per 8-byte word of the longest.

    Each step is materialised (with_columns): h feeds mix64 three times per step, so one nested
    expression would grow eightfold per word."""
    import polars as pl

    frame = pl.DataFrame({"s": strings}).select(
        hexed=pl.col("s").str.encode("hex"),
        n=pl.col("s").str.len_bytes().cast(pl.UInt64),
        h=pl.lit(0, pl.UInt64),
    )
    for k in range((max_bytes + 7) // 8):
        word = (
            pl.col("hexed")
            .str.slice(16 * k, 16)
            .str.to_integer(base=16, dtype=pl.UInt64, strict=False)
        )
        frame = frame.with_columns(
            h=pl.when(pl.col("n") > 8 * k)
            .then(polars_mix64(pl.col("h") ^ word))
            .otherwise(pl.col("h"))
        )
    return frame.select(polars_mix64(pl.col("h") ^ pl.col("n")).alias("h"))["h"]


def _ids(strings, column: CategoricalColumn):
    """Ids of a Series of raw values (null or empty: 0), as shardrec's hashing gives them."""
    import polars as pl

    if strings.dtype.is_integer():  # a Parquet integer column: the integer itself
        values = strings.cast(pl.Int64).reinterpret(signed=False)
        frame = pl.DataFrame({"v": values, "s": strings})
        dtype = {1: pl.UInt8, 2: pl.UInt16, 4: pl.UInt32, 8: pl.UInt64}[
            smallest_uint(column.hash_size - 1).itemsize
        ]
        ids = polars_mix64(pl.col("v")) % (column.hash_size - 1) + 1
        missing = pl.col("s").is_null()
        return frame.select(pl.when(missing).then(0).otherwise(ids).cast(dtype).alias("v"))[
            "v"
        ].to_numpy()
    if column.kind == "string":
        width = int(strings.str.len_bytes().max() or 0)
        values = _string_values(strings.fill_null(""), width)
    elif column.kind == "hex":
        values = strings.str.to_integer(base=16, dtype=pl.UInt64, strict=False)
    else:
        values = strings.str.to_integer(base=10, dtype=pl.Int64, strict=False).reinterpret(
            signed=False
        )
    dtype = {1: pl.UInt8, 2: pl.UInt16, 4: pl.UInt32, 8: pl.UInt64}[
        smallest_uint(column.hash_size - 1).itemsize
    ]
    frame = pl.DataFrame({"v": values, "s": strings})
    ids = polars_mix64(pl.col("v")) % (column.hash_size - 1) + 1
    missing = pl.col("s").is_null() | (pl.col("s") == "")
    return frame.select(pl.when(missing).then(0).otherwise(ids).cast(dtype).alias("v"))[
        "v"
    ].to_numpy()


def _dense(column: DenseColumn):
    import polars as pl

    missing = pl.col(column.name).is_null()
    x = pl.col(column.name).cast(pl.Float64, strict=False).fill_null(0.0)
    out = {
        "log1p": x.clip(lower_bound=0).log1p(),
        "signed-log1p": x.sign() * x.abs().log1p(),
        "shift-log1p": pl.when(missing).then(0.0).otherwise((x.clip(lower_bound=-3) + 3).log1p()),
        "none": x,
    }[column.transform]
    return out.cast(pl.Float32).alias(column.name)


def polars_spec_preprocess(path: Path, spec: FeatureSpec, out: Path) -> int:
    """Preprocess `path` by `spec` with polars into `out` (one .npy per column, offsets for
    lists)."""
    import polars as pl

    fmt = spec.format
    if fmt.kind == "parquet":
        frame = pl.scan_parquet(path)
    else:
        frame = pl.scan_csv(
            path,
            separator=fmt.delimiter,
            has_header=fmt.header,
            new_columns=None if fmt.header else [c.name for c in spec.columns],
            quote_char='"' if fmt.quoting else None,
            infer_schema=False,
        )
    label = spec.label
    y = pl.col(label.name)
    y = (y.cast(pl.Float64) >= label.threshold) if label.threshold is not None else y.cast(pl.Int64)
    columns = [y.cast(pl.UInt8).alias("label"), *(_dense(d) for d in spec.dense)]
    for c in spec.sparse:
        if isinstance(c, ListColumn) and fmt.kind == "parquet":
            kept = pl.element().is_not_null()
            if c.kind != "integer":
                kept = kept & (pl.element() != "")
            items = pl.col(c.name).fill_null([]).list.eval(pl.element().filter(kept))
            columns.append(items.list.head(c.max_length).alias(c.name))
        elif isinstance(c, ListColumn):
            items = (
                pl.col(c.name)
                .fill_null("")
                .str.split(c.separator)
                .list.eval(pl.element().filter(pl.element() != ""))
            )
            columns.append(items.list.head(c.max_length).alias(c.name))
        else:
            columns.append(pl.col(c.name))
    result = frame.select(columns).collect()
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "label.npy", result["label"].to_numpy())
    np.save(
        out / "dense.npy",
        np.ascontiguousarray(result.select([d.name for d in spec.dense]).to_numpy()),
    )
    for c in spec.sparse:
        if isinstance(c, ListColumn):
            lengths = result[c.name].list.len().to_numpy()
            np.save(
                out / f"{c.name}.offsets.npy",
                np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            )
            np.save(out / f"{c.name}.npy", _ids(result[c.name].explode().drop_nulls(), c))
        else:
            np.save(out / f"{c.name}.npy", _ids(result[c.name], c))
    return result.height


def compare_jagged(dataset: Path, polars_out: Path) -> list[str]:
    """Columns whose values differ between a shardrec dataset (train, val, test in order) and the
    polars output, lists compared as values and row lengths; [] when all are equal."""
    manifest = Manifest.load(dataset)
    parts = [p for s in ("train", "val", "test") for p in open_split(dataset, s, manifest)]

    def column(part, name):
        return {"label": part.labels, "dense": part.dense}.get(name, part.sparse.get(name))

    differ = []
    for name in ["label", "dense", *manifest.feature_names]:
        ours = np.concatenate([column(p, name) for p in parts])
        theirs = np.load(polars_out / f"{name}.npy")
        same = ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
        if (polars_out / f"{name}.offsets.npy").is_file():
            lengths = np.concatenate([np.diff(p.offsets[name]) for p in parts])
            same = same and np.array_equal(
                lengths, np.diff(np.load(polars_out / f"{name}.offsets.npy"))
            )
        if not same:
            differ.append(name)
    return differ


def main(argv: list[str]) -> int:
    path, spec, out = Path(argv[0]), load_spec(argv[1]), Path(argv[2])
    return child_main(lambda: polars_spec_preprocess(path, spec, out))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
