"""Synthetic click logs in Criteo's text format, with a hidden model so learning is measurable.

Rows look like Criteo Kaggle's `train.txt`: a 0/1 label, 13 integer columns and 26
categorical columns of 8-character hex, tab-separated, with empty fields for missing values.
The quirks of the real data are reproduced on purpose: skewed (Zipf) ids, ids above 2^31,
negative values in I2, rows whose trailing empty fields were stripped. Labels are drawn
from a logistic model of the features, so a model that learns reaches a known AUC.

Text is assembled as byte matrices with numpy (no per-row Python), so gigabytes can be
written for benchmarks.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# With this module, not at the first draw: a Ctrl-C landing in numpy.random's first import is
# lost (its Cython modules swallow the KeyboardInterrupt as they register with abc), and synth and
# bench preprocess ran on to their end.
import numpy.random  # noqa: F401

from shardrec.dataloader.util.files import atomic_path

NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
SPARSE_NAMES = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_PAD = 0  # a byte that never occurs in text: marks "no character here"
# Real Criteo rows lose at most 3 trailing empty fields; the parser rejects shorter rows by default.
MAX_STRIPPED_FIELDS = 3
_CHUNK_ROWS = 1 << 17


@dataclass(frozen=True)
class SynthSpec:
    """The hidden world a synthetic dataset is drawn from; fixed by the seed."""

    seed: int
    vocab: np.ndarray  # [26] distinct values per categorical
    zipf_a: np.ndarray  # [26] skew of each categorical
    missing: np.ndarray  # [26 + 13] probability that a field is empty
    scramble: np.ndarray  # [26] odd multipliers: id rank -> 32-bit value
    weights: list[np.ndarray]  # per categorical, logit weight of each id rank
    dense_beta: np.ndarray  # [13]
    bias: float

    @classmethod
    def from_seed(
        cls, seed: int, max_vocab: int = 100_000, vocab: list[int] | None = None
    ) -> SynthSpec:
        """vocab: distinct values per categorical (e.g. Criteo 1TB's shape); drawn from the seed if
        None."""
        rng = np.random.default_rng([seed, 0x5EED])
        drawn = np.minimum(
            np.round(np.exp(rng.uniform(np.log(4), np.log(max_vocab), NUM_SPARSE))), max_vocab
        )
        vocab = np.asarray(vocab if vocab is not None else drawn, dtype=np.int64)
        if vocab.shape != (NUM_SPARSE,) or (vocab < 1).any():
            raise ValueError(f"vocab must hold {NUM_SPARSE} positive counts, got {vocab.tolist()}")
        zipf_a = rng.uniform(1.05, 1.4, NUM_SPARSE)
        missing = np.concatenate(
            [rng.choice([0.0, 0.0, 0.05, 0.3], NUM_SPARSE), rng.choice([0.0, 0.1, 0.4], NUM_DENSE)]
        )
        scramble = rng.integers(1, 2**31, NUM_SPARSE, dtype=np.int64) * 2 + 1
        # A third of the categoricals carry the signal; the rest are noise the model must ignore.
        informative = rng.random(NUM_SPARSE) < 0.35
        weights = [
            rng.normal(0.0, 0.9 if informative[f] else 0.0, int(vocab[f]))
            for f in range(NUM_SPARSE)
        ]
        dense_beta = rng.normal(0.0, 0.25, NUM_DENSE)
        return cls(seed, vocab, zipf_a, missing, scramble, weights, dense_beta, bias=-1.4)


def _zipf_ranks(rng: np.random.Generator, n: int, vocab: int, a: float) -> np.ndarray:
    cdf = np.cumsum(1.0 / np.arange(1, vocab + 1) ** a)
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(n)), vocab - 1)


def draw_rows(
    spec: SynthSpec, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Draw n rows. Returns labels [n], dense ints [n,13], dense missing mask,
    categorical 32-bit values [n,26] (uint64) and categorical missing mask."""
    dense = np.floor(rng.lognormal(1.0, 1.5, (n, NUM_DENSE))).astype(np.int64)
    # I2 (column 1) really holds -1, -2 and -3 in Criteo.
    neg = rng.random(n) < 0.08
    dense[neg, 1] = -rng.integers(1, 4, int(neg.sum()))
    dense_missing = rng.random((n, NUM_DENSE)) < spec.missing[NUM_SPARSE:]
    ranks = np.stack(
        [_zipf_ranks(rng, n, int(spec.vocab[f]), spec.zipf_a[f]) for f in range(NUM_SPARSE)], axis=1
    )
    sparse_missing = rng.random((n, NUM_SPARSE)) < spec.missing[:NUM_SPARSE]
    logit = np.full(n, spec.bias)
    for f in range(NUM_SPARSE):
        logit += np.where(sparse_missing[:, f], 0.0, spec.weights[f][ranks[:, f]])
    x = np.log1p(np.maximum(dense, 0)) - 1.0
    logit += np.where(dense_missing, 0.0, x) @ spec.dense_beta
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    values = (
        (ranks.astype(np.uint64) + np.uint64(1)) * spec.scramble.astype(np.uint64)
    ) & np.uint64(0xFFFFFFFF)
    return labels, dense, dense_missing, values, sparse_missing


def int_bytes(values: np.ndarray, missing: np.ndarray, float_suffix: bool) -> np.ndarray:
    """Decimal text of each value as a [n, width] byte matrix, _PAD where no character."""
    absval = np.abs(values)
    ndigits = np.maximum(1, np.floor(np.log10(np.maximum(absval, 1))).astype(np.int64) + 1)
    width = int(ndigits.max()) if len(values) else 1
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (absval[:, None] // powers) % 10 + ord("0")
    digits[np.arange(width)[None, :] < (width - ndigits)[:, None]] = _PAD
    sign = np.where(values < 0, ord("-"), _PAD)[:, None]
    parts = [sign, digits]
    if float_suffix:
        parts.append(np.tile(np.array([ord("."), ord("0")]), (len(values), 1)))
    out = np.concatenate(parts, axis=1).astype(np.uint8)
    out[missing] = _PAD
    return out


def _hex_bytes(values: np.ndarray, missing: np.ndarray) -> np.ndarray:
    shifts = np.arange(28, -4, -4, dtype=np.uint64)
    out = _HEX[((values[:, None] >> shifts) & np.uint64(0xF)).astype(np.int64)]
    out[missing] = _PAD
    return out


def format_rows(
    labels: np.ndarray,
    dense: np.ndarray,
    dense_missing: np.ndarray,
    values: np.ndarray,
    sparse_missing: np.ndarray,
    delimiter: str = "\t",
    float_ints: bool = False,
    strip_trailing: np.ndarray | None = None,
) -> bytes:
    """Render rows as Criteo text. `strip_trailing[i]` drops row i's trailing empty fields,
    at most 3 of them (as Criteo's files: rows of 37-40 fields, which the parser accepts)."""
    n = len(labels)
    sep = np.full((n, 1), ord(delimiter), dtype=np.uint8)
    cols = [np.full((n, 1), ord("0"), dtype=np.uint8) + labels[:, None].astype(np.uint8)]
    for j in range(NUM_DENSE):
        cols += [sep, int_bytes(dense[:, j], dense_missing[:, j], float_ints)]
    sep_positions = []
    for f in range(NUM_SPARSE):
        sep_positions.append(sum(c.shape[1] for c in cols))
        cols += [sep.copy(), _hex_bytes(values[:, f], sparse_missing[:, f])]
    if strip_trailing is not None:
        # A separator goes when every field after it is empty (as Criteo's raw rows have it).
        trailing_empty = np.flip(
            np.cumprod(np.flip(sparse_missing, axis=1), axis=1), axis=1
        ).astype(bool)
        for f in range(max(0, NUM_SPARSE - MAX_STRIPPED_FIELDS), NUM_SPARSE):
            cols[1 + 2 * NUM_DENSE + 2 * f][trailing_empty[:, f] & strip_trailing, 0] = _PAD
    cols.append(np.full((n, 1), ord("\n"), dtype=np.uint8))
    matrix = np.concatenate(cols, axis=1)
    return matrix[matrix != _PAD].tobytes()


def header(delimiter: str = ",") -> bytes:
    return (delimiter.join(["label", *DENSE_NAMES, *SPARSE_NAMES]) + "\n").encode()


def write_file(
    path: Path,
    rows: int,
    spec: SynthSpec,
    stream_seed: int,
    csv: bool = False,
    strip_prob: float = 0.3,
    gzip_level: int | None = None,
) -> int:
    """Write `rows` rows to `path` (gzip if it ends in .gz); returns bytes of text written.

    gzip_level: compress through ISA-L (when installed) at this level (0-3), much faster than
    Python's gzip at its default level 9 (None), which makes other bytes of the same text.
    The file appears only when complete: it is written under a temporary name and renamed; an
    error or a Ctrl-C removes the temporary.
    """
    rng = np.random.default_rng([spec.seed, stream_seed])
    written = 0
    # Not synced (a benchmark's gigabytes): the rename alone keeps a half file from its name.
    with (
        atomic_path(path, fsync=False) as tmp,
        open_out(tmp, path.suffix == ".gz", gzip_level, name=path.name) as out,
    ):
        if csv:
            written += out.write(header(","))
        for start in range(0, rows, _CHUNK_ROWS):
            n = min(_CHUNK_ROWS, rows - start)
            labels, dense, dmiss, values, smiss = draw_rows(spec, rng, n)
            strip = None if csv else rng.random(n) < strip_prob
            text = format_rows(
                labels,
                dense,
                dmiss,
                values,
                smiss,
                "," if csv else "\t",
                float_ints=csv,
                strip_trailing=strip,
            )
            written += out.write(text)
    return written


@contextmanager
def open_out(path: Path, gz: bool, level: int | None, name: str = "") -> Iterator[Any]:
    """`path` opened for writing, through gzip where `gz`. The gzip header holds `name` (the
    file's final name: `path` is its temporary) and no time, so that a seed writes the same bytes
    on every run, as gzip -n does."""
    with open(path, "wb") as raw:
        if not gz:
            yield raw
            return
        if level is None:
            out = gzip.GzipFile(name, "wb", fileobj=raw, mtime=0)
        else:
            try:
                from isal import igzip
            except ImportError:
                out = gzip.GzipFile(name, "wb", max(level, 1), fileobj=raw, mtime=0)
            else:
                out = igzip.IGzipFile(name, "wb", level, fileobj=raw, mtime=0)
        with out:
            yield out


def write_dataset(
    out_dir: Path,
    rows: int,
    seed: int,
    days: int = 0,
    csv: bool = False,
    gz: bool = False,
    max_vocab: int = 100_000,
) -> list[Path]:
    """Write a Kaggle-style `train.txt` (days=0) or 1TB-style `day_0` .. `day_{days-1}`."""
    spec = SynthSpec.from_seed(seed, max_vocab=max_vocab)
    suffix = (".csv" if csv else "") + (".gz" if gz else "")
    if days <= 0:
        paths = [(out_dir / f"train{'.csv' if csv else '.txt'}{'.gz' if gz else ''}", rows)]
    else:
        per_day = [rows // days + (1 if d < rows % days else 0) for d in range(days)]
        paths = [(out_dir / f"day_{d}{suffix}", n) for d, n in enumerate(per_day)]
    for i, (path, n) in enumerate(paths):
        write_file(path, n, spec, stream_seed=i, csv=csv)
    return [p for p, _ in paths]
