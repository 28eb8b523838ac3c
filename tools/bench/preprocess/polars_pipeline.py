"""The baseline of `shardrec bench preprocess`: the same preprocessing written as a polars pipeline.

What a user would otherwise write: `read_csv` with the schema, integers filled (missing -> 0),
clamped at 0 and log1p'd into float32, hex categoricals parsed and hashed into ids exactly as
shardrec hashes them (`1 + splitmix64(value) mod (N - 1)`, 0 for a missing value; see
ids.hash_ids), and one `.npy` per column (label.npy, dense.npy [rows, num_dense], C1.npy ...).
It keeps no splits or parts: the columns hold every row in file order, which is what
shardrec's train, val and test parts hold one after the other for a Kaggle-layout file, so the
two outputs can be compared byte for byte (compare_with_dataset).

Run as `python -m shardrec.tools.bench.preprocess.polars_pipeline FILE OUT MAX_IDS` in a child
process, so that POLARS_MAX_THREADS (read once, when polars is imported) and the peak RSS are its
own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import Manifest, smallest_uint
from shardrec.dataloader.format.part_file import open_split

INSTALL_HINT = "polars is not installed: pip install 'shardrec[bench]' (or pip install polars)"
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def polars_mix64(z):
    """splitmix64's finalizer in polars expressions (UInt64 multiply wraps, as in ids.mix64)."""
    z = z ^ (z // (1 << 30))  # an unsigned floor division is the logical shift right
    z = z * _M1
    z = z ^ (z // (1 << 27))
    z = z * _M2
    return z ^ (z // (1 << 31))


def polars_preprocess(
    path: Path,
    out: Path,
    max_ids: int,
    num_dense: int = 13,
    num_sparse: int = 26,
    separator: str = "\t",
) -> int:
    """Preprocess `path` with polars into `out` (one .npy per column); returns the rows."""
    import polars as pl

    dense = [f"I{i + 1}" for i in range(num_dense)]
    sparse = [f"C{i + 1}" for i in range(num_sparse)]
    schema = {"label": pl.UInt8, **{c: pl.Int64 for c in dense}, **{c: pl.String for c in sparse}}
    id_dtype = {
        np.dtype(np.uint8): pl.UInt8,
        np.dtype(np.uint16): pl.UInt16,
        np.dtype(np.uint32): pl.UInt32,
        np.dtype(np.uint64): pl.UInt64,
    }
    id_type = id_dtype[np.dtype(smallest_uint(max_ids - 1))]

    def hashed(c: str):
        v = pl.col(c).str.to_integer(base=16, dtype=pl.UInt64, strict=False)
        ids = polars_mix64(v) % (max_ids - 1) + 1
        return pl.when(v.is_null()).then(0).otherwise(ids).cast(id_type).alias(c)

    frame = (
        pl.scan_csv(
            path, separator=separator, has_header=False, new_columns=list(schema), schema=schema
        )
        .select(
            pl.col("label"),
            *[
                pl.col(c)
                .fill_null(0)
                .clip(lower_bound=0)
                .cast(pl.Float64)
                .log1p()
                .cast(pl.Float32)
                .alias(c)
                for c in dense
            ],
            *[hashed(c) for c in sparse],
        )
        .collect()
    )
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "label.npy", frame["label"].to_numpy())
    np.save(out / "dense.npy", np.ascontiguousarray(frame.select(dense).to_numpy()))
    for c in sparse:
        np.save(out / f"{c}.npy", frame[c].to_numpy())
    return frame.height


def compare_with_dataset(dataset: Path, polars_out: Path) -> list[str]:
    """Columns whose bytes differ between a shardrec dataset (train, val, test parts in order) and
    the polars output; [] when every column is identical (dtype, shape and bytes)."""
    manifest = Manifest.load(dataset)
    names = ["label", "dense", *(f.name for f in manifest.sparse_features)]
    parts = [p for split in ("train", "val", "test") for p in open_split(dataset, split, manifest)]
    differ = []
    for name in names:
        theirs = np.load(polars_out / f"{name}.npy", mmap_mode="r")
        row, same = 0, True
        for part in parts:
            ours = {"label": part.labels, "dense": part.dense}.get(name)
            ours = part.sparse[name] if ours is None else ours
            if (
                ours.dtype != theirs.dtype
                or ours.shape[1:] != theirs.shape[1:]
                or not np.array_equal(ours, theirs[row : row + len(ours)])
            ):
                same = False
                break
            row += len(ours)
        if not same or row != len(theirs):
            differ.append(name)
    return differ


def child_main(work: Callable[[], int]) -> int:
    """A baseline child's entry: polars must import; prints the rows `work` wrote."""
    try:
        import polars  # noqa: F401
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 1
    print(work())
    return 0


def main(argv: list[str]) -> int:
    path, out, max_ids = Path(argv[0]), Path(argv[1]), int(argv[2])
    return child_main(lambda: polars_preprocess(path, out, max_ids))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
