"""The tables of a dataset as plain values (name, feature, rows, width), the width checked against
it.

Kept free of torch and torchrec: the trainer's start-up checks and `shardrec export` call it,
where importing torchrec would cost seconds (tables.py makes torchrec's configs of them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardrec.dataloader.format.manifest import Manifest, SparseFeature
from shardrec.embeddings.managed.table_kinds import RAW_KINDS, TableSettings

WIDTH_MULTIPLE = 4
"""Table widths, and column shards' widths, are a multiple of this: fbgemm's kernels need it, and
torchrec asserts it inside every rank building a fused table (the planners cut no other widths)."""


def check_width(key: str, dim: int) -> None:
    """ValueError naming `key` for an embedding width fbgemm's kernels cannot take."""
    if dim % WIDTH_MULTIPLE:
        raise ValueError(
            f"{key} = {dim}: fbgemm's embedding kernels take widths that are a multiple of "
            f"{WIDTH_MULTIPLE}, such as {-(-dim // WIDTH_MULTIPLE) * WIDTH_MULTIPLE}"
        )


def table_name(feature: str) -> str:
    return f"t_{feature}"


@dataclass(frozen=True)
class TableSpec:
    """One table of one sparse feature (or of several that share it); `pooling` is the feature's
    ("sum", or "mean" for a spec's list column), "none" for a sequence model's unpooled table."""

    name: str
    feature: str
    rows: int
    dim: int
    pooling: str = "sum"
    shared: tuple[str, ...] = ()
    """Other features that read this table (an event log's candidate item reads the history's)."""
    kind: str = "static"
    """The table's kind (embeddings.managed.table_kinds): static, or a raw-id feature's managed,
    hashed or unbounded table of `rows` = its slots + 2."""

    @property
    def features(self) -> list[str]:
        return [self.feature, *self.shared]


UNPOOLED = "none"
"""A table's pooling when a sequence model looks it up unpooled (torchrec's EmbeddingCollection)."""


def id_features(manifest: Manifest) -> list:
    """The sparse features whose values are table rows (timestamps and raw integers have none)."""
    return [f for f in manifest.sparse_features if f.values == "ids"]


def table_dims(
    manifest: Manifest, embedding_dim: int, dims: dict[str, int] | None = None
) -> dict[str, int]:
    """Embedding width of each sparse feature's table: `dims` where it names the feature, else
    `embedding_dim`.

    Args:
        manifest: the dataset's manifest.
        embedding_dim: width of every table unless `dims` names another for its feature.
        dims: feature name -> embedding width (the job's `model.dims`).

    Raises:
        ValueError: `dims` names a feature the dataset does not have.
    """
    dims = dims or {}
    unknown = sorted(set(dims) - set(manifest.feature_names))
    if unknown:
        raise ValueError(
            f"model.dims names features the dataset does not have: {', '.join(unknown)}"
        )
    return {feat.name: dims.get(feat.name, embedding_dim) for feat in manifest.sparse_features}


DEFAULT_TABLE = "*"
"""The `[tables."*"]` section: the settings of every raw-id feature the job file does not name."""


def job_tables(
    manifest: Manifest, tables: Mapping[str, TableSettings] | None
) -> dict[str, TableSettings]:
    """The job's `[tables.FEATURE]` settings, each raw-id feature it does not name given the
    `[tables."*"]` ones (if any)."""
    out = dict(tables or {})
    default = out.pop(DEFAULT_TABLE, None)
    if default is not None:
        for feat in manifest.sparse_features:
            if feat.raw and feat.name not in out:
                out[feat.name] = default
    return out


def table_specs(
    manifest: Manifest,
    embedding_dim: int,
    dims: dict[str, int] | None = None,
    tables: Mapping[str, TableSettings] | None = None,
    *,
    unpooled_sequences: bool = False,
) -> list[TableSpec]:
    """One table per sparse feature of ids, in manifest order; features that name one `table`
    share it (named by the first). Its cardinality sizes it (at least one row), or for a raw-id
    feature its `tables` settings (the job's `[tables.FEATURE]`: slots + 2 rows), and `table_dims`
    gives its width.

    Args:
        tables: the job's `[tables.FEATURE]` settings of raw-id features.
        unpooled_sequences: a sequence model's tables: a table that a sequence feature reads is
            looked up unpooled ("none"); otherwise it pools as its first feature says.
    Raises:
        ValueError: features that share a table disagree on its rows, or `model.dims` names a
            feature that is not its table's first; (naming tables.FEATURE) a raw-id feature
            without a raw-id kind, a raw-id kind for a feature whose ids are rows, settings for a
            feature the dataset does not have.
    """
    widths = table_dims(manifest, embedding_dim, dims)
    settings = job_tables(manifest, tables)
    unknown = sorted(set(settings) - set(manifest.feature_names))
    if unknown:
        raise ValueError(
            f"tables.{unknown[0]}: the dataset has no feature {unknown[0]!r} "
            f"(its features: {', '.join(manifest.feature_names[:8])}"
            f"{', ...' if len(manifest.feature_names) > 8 else ''})"
        )
    tableless = [f for f in manifest.sparse_features if f.name in settings and f.values != "ids"]
    if tableless:
        raise ValueError(
            f"tables.{tableless[0].name}: feature {tableless[0].name} has no table (its values are "
            f"{tableless[0].values}, kept as written)"
        )
    groups: dict[str, list] = {}
    for feat in id_features(manifest):
        groups.setdefault(feat.table or feat.name, []).append(feat)
    out = []
    for key, feats in groups.items():
        first = feats[0]
        rows = {f.name: f.cardinality for f in feats}
        if len(set(rows.values())) > 1:
            raise ValueError(
                f"features {', '.join(rows)} share table {key} but have {sorted(set(rows.values()))} rows"
            )
        if len(feats) > 1 and any(f.raw for f in feats):
            # A raw-id table's id map serves one feature: remapping a second one is not built.
            raise ValueError(
                f"features {', '.join(rows)} share table {key}, and raw ids (--raw-ids) need a "
                "table of their own: preprocess them without --raw-ids, or give each its own table"
            )
        for f in feats[1:]:
            if dims and f.name in dims:
                raise ValueError(
                    f"model.dims.{f.name}: {f.name} reads table {key} of feature {first.name}; "
                    f"set model.dims.{first.name}"
                )
            if tables and f.name in tables:
                raise ValueError(
                    f"tables.{f.name}: {f.name} reads table {key} of feature {first.name}; "
                    f"set [tables.{first.name}]"
                )
        own = settings.get(first.name) or TableSettings()
        sequence = any(f.sequence for f in feats)
        pooling = _shared_pooling(key, feats)
        out.append(
            TableSpec(
                table_name(key),
                first.name,
                _rows(first, own),
                widths[first.name],
                UNPOOLED if unpooled_sequences and sequence else pooling,
                shared=tuple(f.name for f in feats[1:]),
                kind=own.kind,
            )
        )
    return out


def _shared_pooling(key: str, feats: list[SparseFeature]) -> str:
    """The pooling of a table its features read: that of its lists (a feature of one id a row
    pools the same either way, so a candidate's item may read a history that averages); lists
    that pool it differently are refused, as one table pools one way for every feature."""
    lists = {f.name: f.pooling for f in feats if f.multi_hot}
    if len(set(lists.values())) > 1:
        raise ValueError(
            f"features {', '.join(f'{n} ({p})' for n, p in lists.items())} share table {key} "
            "but pool it differently: a table pools one way; give them one pooling in the spec"
        )
    return next(iter(lists.values()), feats[0].pooling)


def _rows(feat: SparseFeature, settings: TableSettings) -> int:
    key = f"tables.{feat.name}"
    if feat.raw and settings.kind not in RAW_KINDS:
        raise ValueError(
            f"{key}.kind = {settings.kind!r}: feature {feat.name} holds raw ids (preprocessed with "
            f'--raw-ids); give it a [{key}] with kind = "managed" (or hashed, unbounded) and rows'
        )
    if not feat.raw and settings.kind in RAW_KINDS:
        raise ValueError(
            f"{key}.kind = {settings.kind!r}: feature {feat.name} holds table rows, not raw ids; "
            f"preprocess it with --raw-ids {feat.name} for a {settings.kind} table"
        )
    if feat.raw and not settings.rows:
        raise ValueError(
            f"{key}.rows: not given; a {settings.kind} table needs its slots (`shardrec plan "
            "--data DIR --config JOB` proposes them)"
        )
    return settings.table_rows if feat.raw else max(1, feat.cardinality)
