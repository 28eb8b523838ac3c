"""Looking inside a preprocessed dataset: statistics tables, decoded rows, frequency plots."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format.integrity import check_list_rows, id_out_of_range, label_not_binary
from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.tools.cli.common import save_figure

SHARE_HEADERS = {
    "top1_share": "lookups on top 1% of table rows",
    "top10_share": "lookups on top 10% of table rows",
}
"""Column headers of the shares: of the table's rows (its cardinality), not of its distinct ids; a
table that few ids touch has them all in its top 1%."""

logger = logging.getLogger(__name__)
EVENT_ROWS = 65536
"""Anchors of an event-log dataset whose dense features `data stats` describes."""


def split_table(manifest: Manifest, directory: Path) -> list[dict[str, Any]]:
    """Rows and parts per split; of an event-log dataset, its samples (anchors: the rows), the
    windows they are cut in, and the event parts every split reads (a split has no parts)."""
    if manifest.kind == "events":
        from shardrec.dataloader.events.event_files import events_info

        info = events_info(manifest, directory)
        return [
            {"split": s, "rows": split.rows, "windows": len(info.windows[s]) - 1}
            | {"event parts": len(info.parts)}
            for s, split in manifest.splits.items()
        ]
    return [
        {"split": s, "rows": info.rows, "parts": len(info.parts)}
        for s, info in manifest.splits.items()
    ]


def feature_table(manifest: Manifest) -> list[dict[str, Any]]:
    """One record per sparse feature: cardinality, dtype and the planner statistics; a statistic
    one feature lacks is NaN there (and the column's integers floats), as the table of records
    `data stats --json` has always printed."""
    rows = [
        {
            "feature": f.name,
            # an event log's timestamps side a sequence with no table of their own
            "cardinality": f.cardinality if f.values != "timestamps" else None,
            "dtype": f.dtype,
            "multi_hot": f.multi_hot,
            # a one-hot feature of an event log (its statistics are the history's): one id
            **({"mean_ids_per_sample": 1.0, "p95_ids_per_sample": 1.0} if not f.multi_hot else {}),
            **f.stats,
        }
        for f in manifest.sparse_features
    ]
    keys = list(dict.fromkeys(k for row in rows for k in row))
    for key in keys:
        if all(key in row for row in rows):
            continue
        whole = all(
            isinstance(r[key], int) and not isinstance(r[key], bool) for r in rows if key in r
        )
        for row in rows:
            row[key] = float(row[key]) if key in row and whole else row.get(key, float("nan"))
    return [{k: row[k] for k in keys} for row in rows]


def dense_table(
    directory: Path, manifest: Manifest, split: str = "train", max_rows: int = 1_000_000
) -> list[dict[str, Any]]:
    """Mean / std (n - 1) / min / max of each transformed dense feature over up to max_rows rows
    (an event-log dataset: of its first anchors, EVENT_ROWS at most, as the loader makes them):
    the sums of numpy's pairwise summation over each column, as pandas' describe() computed them
    (no pandas: its import alone took most of `data stats`' second)."""
    if manifest.kind == "events":
        values = _event_dense(directory, manifest, split, max_rows)
    else:
        values = _stored_dense(directory, manifest, split, max_rows)
    out = []
    n = len(values)
    for j, name in enumerate(manifest.dense_features):
        column = np.ascontiguousarray(values[:, j])
        mean = column.sum() / n if n else float("nan")
        std = np.sqrt(((column - mean) ** 2).sum() / (n - 1)) if n > 1 else float("nan")
        low, high = (column.min(), column.max()) if n else (float("nan"), float("nan"))
        out.append(
            {"feature": name, "mean": float(mean), "std": float(std), "min": float(low),
             "max": float(high)}
        )  # fmt: skip
    return out


def _stored_dense(directory: Path, manifest: Manifest, split: str, max_rows: int) -> np.ndarray:
    parts = open_split(directory, split, manifest) if split in manifest.splits else []
    taken, left = [], max_rows
    for p in parts:
        if left <= 0:
            break
        taken.append(np.asarray(p.dense[:left], dtype=np.float64))
        left -= len(taken[-1])
    return np.concatenate(taken) if taken else np.zeros((0, len(manifest.dense_features)))


def _event_dense(directory: Path, manifest: Manifest, split: str, max_rows: int) -> np.ndarray:
    from shardrec.dataloader.events.event_batches import EventBatcher, EventSource

    source = EventSource(directory, split, manifest)
    first = tuple(column[: min(max_rows, EVENT_ROWS)] for column in source.timeline)
    return EventBatcher.of(source).make(first).dense_features.numpy().astype(np.float64)


def dataset_stats(directory: Path) -> dict[str, Any]:
    """Everything `data stats` shows, as plain data."""
    manifest = Manifest.load(directory)
    return {
        "splits": split_table(manifest, directory),
        "skipped": dict(manifest.skipped),
        "lists_cut": dict(manifest.lists_cut),
        "features": feature_table(manifest),
        "dense": dense_table(directory, manifest),
        "options": manifest.options,
    }


def head_rows(directory: Path, n: int = 5, split: str = "train") -> list[dict[str, Any]]:
    """The first n rows of a split, decoded: label, transformed dense values, sparse ids (of an
    event-log dataset: its first anchors in the loader's order, their history gathered)."""
    manifest = Manifest.load(directory)
    if manifest.kind == "events":
        return _event_rows(directory, manifest, n, split)
    signed = raw_integer_features(manifest, directory)
    out: list[dict[str, Any]] = []
    for part in open_split(directory, split, manifest):
        for r in range(min(n - len(out), part.rows)):
            row: dict[str, Any] = {"label": int(part.labels[r])}
            if row["label"] > 1:  # shown as it is, it would pass for a label
                raise DatasetError(label_not_binary(part, r, row["label"]))
            row.update({name: float(v) for name, v in zip(manifest.dense_features, part.dense[r])})
            for feat in manifest.sparse_features:
                if feat.multi_hot:
                    off = part.offsets[feat.name]
                    start, end = off[r : r + 1], off[r + 1 : r + 2]
                    check_list_rows(part, feat.name, np.array([r]), start, end)
                    row[feat.name] = [int(x) for x in part.sparse[feat.name][off[r] : off[r + 1]]]
                else:
                    row[feat.name] = int(part.sparse[feat.name][r])
                ids = row[feat.name] if feat.multi_hot else [row[feat.name]]
                if feat.raw:  # 64-bit ids as they are; the empty field's value shown empty
                    if not feat.multi_hot and row[feat.name] == MISSING_KEY:
                        row[feat.name] = None
                    elif feat.name in signed:
                        row[feat.name] = _signed(row[feat.name])
                    continue
                if any(
                    i >= feat.cardinality for i in ids
                ):  # shown as it is, it would pass for a real id
                    raise DatasetError(id_out_of_range(part, feat.name, r, max(ids)))
            out.append(row)
        if len(out) >= n:
            break
    return out


def _event_rows(directory: Path, manifest: Manifest, n: int, split: str) -> list[dict[str, Any]]:
    from shardrec.dataloader.events.event_batches import EventBatcher, EventSource

    source = EventSource(directory, split, manifest)
    rows = min(n, len(source.timeline[0]))
    if not rows:
        return []
    batch = EventBatcher.of(source).make(tuple(column[:rows] for column in source.timeline))
    jt = batch.sparse_features.to_dict()
    out = []
    for r in range(rows):
        row: dict[str, Any] = {"label": int(batch.labels[r])}
        row.update(zip(manifest.dense_features, map(float, batch.dense_features[r])))
        for name, values in jt.items():
            start = int(values.lengths()[:r].sum())
            kept = values.values()[start : start + int(values.lengths()[r])].tolist()
            row[name] = kept if manifest.feature(name).multi_hot else kept[0]
        out.append(row)
    return out


def json_ids(rows: list[dict[str, Any]], manifest: Manifest) -> list[dict[str, Any]]:
    """head_rows' rows for JSON: a raw-id feature's ids (64-bit, preprocess --raw-ids) as decimal
    strings, since JSON readers hold numbers as doubles (jq, JavaScript: 8312711846037992141 reads
    as 8312711846037992000); every id of such a column, that its type not depend on the value.
    Other ids stay numbers."""
    raw = [f.name for f in manifest.sparse_features if f.raw]
    if not raw:
        return rows

    def text(v: Any) -> Any:
        return [str(x) for x in v] if isinstance(v, list) else None if v is None else str(v)

    return [{k: text(v) if k in raw else v for k, v in row.items()} for row in rows]


def head_fields(manifest: Manifest, directory: Path) -> list[tuple[str, str]]:
    """(key in head_rows' rows, name shown) of each field, in the order of the text's columns where
    the dataset's spec is known: the label as its column and rule (`label: rating >= 4`), lists with
    their pooling."""
    from shardrec.dataloader.spec.feature_spec import LabelColumn, ListColumn, SpecError
    from shardrec.dataloader.spec.spec_file import manifest_spec
    from shardrec.tools.preprocess.infer.label_infer import exact

    try:
        spec = manifest_spec(manifest, directory)
    except SpecError:
        spec = None
    if spec is None:
        return [(n, n) for n in ["label", *manifest.dense_features, *manifest.feature_names]]
    out = []
    for c in spec.columns:
        if isinstance(c, LabelColumn):
            rule = (
                f" >= {exact(c.threshold)}"
                if c.threshold is not None
                else " (mapped)"
                if c.mapping
                else ""
            )
            out.append(("label", f"label: {c.name}{rule}"))
        elif isinstance(c, ListColumn):
            out.append((c.name, f"{c.name} (list, {c.pooling})"))
        elif c.role != "ignore":
            out.append((c.name, c.name))
    return out


def raw_hex_widths(manifest: Manifest, directory: Path) -> dict[str, int]:
    """Raw-id features read from hex text (Criteo's categoricals, a spec's `kind = "hex"`) -> the
    digits to show their ids with, as the log wrote them: 8 for Criteo's, as many as needed for a
    spec's (16 for a column of 64-bit ids: column_hex_width). Other features keep their
    integers."""
    from shardrec.dataloader.spec.feature_spec import SpecError
    from shardrec.dataloader.spec.spec_file import manifest_spec

    try:
        spec = manifest_spec(manifest, directory)
    except SpecError:
        return {}
    if spec is None:
        return {}
    width = 0 if "spec" in manifest.options else 8
    raw = {f.name for f in manifest.sparse_features if f.raw}
    return {
        c.name: width for c in spec.columns if getattr(c, "kind", "") == "hex" and c.name in raw
    }


def raw_integer_features(manifest: Manifest, directory: Path) -> set[str]:
    """Raw-id features read from decimal integers (a spec's `kind = "integer"`): preprocessing
    stored them in two's complement, and a log's -1 is shown as -1, not as 2^64 - 1; but for those
    of a Parquet uint64 column, shown unsigned (the manifest's `unsigned`)."""
    from shardrec.dataloader.spec.feature_spec import SpecError
    from shardrec.dataloader.spec.spec_file import manifest_spec

    try:
        spec = manifest_spec(manifest, directory)
    except SpecError:
        return set()
    raw = {f.name for f in manifest.sparse_features if f.raw and not f.unsigned}
    if spec is None:
        return set()
    return {c.name for c in spec.columns if getattr(c, "kind", "") == "integer" and c.name in raw}


def _signed(value: Any) -> Any:
    """A uint64 id (or a list of them) as the int64 it was written as."""
    if isinstance(value, list):
        return [_signed(v) for v in value]
    return value - (1 << 64) if value >= 1 << 63 else value


def column_hex_width(width: int, values: list[Any]) -> int:
    """The digits a raw hex id column is shown with: 16 where one of its ids needs more than 32
    bits (a 64-bit id written in hex is 16 digits, its leading zeros included: the width is not
    kept, and an id of 15 digits would match nothing in the log), else `width`."""
    ids = [v for x in values if x is not None for v in (x if isinstance(x, list) else [x])]
    return 16 if any(v >= 1 << 32 for v in ids) else width


def shown_value(value: Any, hex_width: int | None) -> str:
    """A head row's value as the table shows it: 4 decimals for a dense value, a raw hex id in hex
    (hex_width: its digits; None: not one), an empty field as None."""
    if isinstance(value, float):
        return f"{value:.4f}"
    if hex_width is None or value is None:
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(f"{v:0{hex_width}x}" for v in value) + "]"
    return f"{value:0{hex_width}x}"


def plot_frequencies(directory: Path, out_png: Path, split: str = "train") -> None:
    """Log-log curves of lookups per id against id rank, one line per feature."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on training machines
    import matplotlib.pyplot as plt

    # Compiled kernels: imported here, so `data stats` without --plot loads no numba.
    from shardrec.tools.preprocess.parts.feature_stats import frequency_curves

    manifest = Manifest.load(directory)
    open_split(directory, split, manifest)  # the columns' layout checked before they are read
    try:
        curves = frequency_curves(directory, manifest, split)
    except ValueError as e:  # an id outside its table: `data verify` names the file and row
        raise DatasetError(
            f"{directory}: {e}; `shardrec data verify {directory}` names the file and row"
        ) from None
    fig, ax = plt.subplots(figsize=(9, 6))
    for name, counts in curves.items():
        if len(counts):
            ax.loglog(np.arange(1, len(counts) + 1), counts, label=name, linewidth=1)
    ax.set_xlabel("id rank (hottest first)")
    ax.set_ylabel(f"lookups in {split}")
    ax.set_title(f"{directory}: id frequency per feature")
    ax.legend(ncol=4, fontsize="x-small")
    fig.tight_layout()
    save_figure(fig, out_png, dpi=100)
