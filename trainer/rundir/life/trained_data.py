"""The data a run trained on, as RUN/dataset.json records it (its path, fingerprint, features and
preprocessing settings), and whether other data is that data (a resume, `eval RUN`) or was made as
it was (`eval --data`, `predict`, `--continue-on`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.format.manifest import Manifest, SparseFeature
from shardrec.dataloader.spec.event_spec_file import event_spec_from_dict
from shardrec.dataloader.spec.feature_spec import COLUMN_TYPES, CategoricalColumn, FeatureSpec
from shardrec.dataloader.spec.spec_file import sized_spec, spec_from_dict
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.life.resume_settings import show_value

SPARSE_ROLES = tuple(r for r, t in COLUMN_TYPES.items() if issubclass(t, CategoricalColumn))
"""The roles of a feature spec's columns of ids (categorical, list, sequence): its sparse features,
in the manifest's order."""


def table_rows(feature: SparseFeature) -> int | None:
    """The rows of a feature's table; None for values no table holds (an event log's timestamps
    and action bits): their largest value is no size a model depends on, and a later period of
    the same log has larger timestamps."""
    return feature.cardinality if feature.values == "ids" else None


def dataset_schema(manifest: Manifest) -> dict[str, Any]:
    """What a model trained on a dataset needs of another to score it: its features and
    cardinalities (None: no table, see table_rows)."""
    return {
        "dense": list(manifest.dense_features),
        "sparse": [[f.name, table_rows(f), f.multi_hot] for f in manifest.sparse_features],
    }


def same_feature(trained: list[Any], here: list[Any]) -> bool:
    """Whether two [name, cardinality, multi-hot] entries of dataset_schema agree; a cardinality
    of None on either side (no table; a record from before table_rows kept the largest value)
    is not compared."""
    (name, rows, multi), (name2, rows2, multi2) = trained, here
    return (name, multi) == (name2, multi2) and (rows is None or rows2 is None or rows == rows2)


def sparse_difference(
    trained: list[list[Any]], here: list[list[Any]], run_dir: Path | str
) -> tuple[str, bool]:
    """The first sparse feature (dataset_schema's entries) that the data `here` lacks, adds or
    holds otherwise than the data `run_dir` (or a model: "the model") trained on, in words ("" where
    none), and whether
    the feature is on one side only (else its rows, raw ids or multi-hot differ). A feature the
    new data lacks is named as one it adds is, not as a difference of preprocessing settings."""
    old, new = ({f[0]: f for f in features} for features in (trained, here))
    for name in [*new, *(name for name in old if name not in new)]:
        if name not in old or name not in new:
            where = "not in" if name not in old else "missing here, but in"
            return f"feature {name}: {where} the data {run_dir} trained on", True
        if not same_feature(old[name], new[name]):
            (_, rows, multi), (_, rows2, multi2) = new[name], old[name]
            if multi != multi2:
                here_, there = ("multi-hot" if m else "one-hot" for m in (multi, multi2))
            else:
                here_, there = (f"{c:,} rows" if c else "raw ids" for c in (rows, rows2))
            return f"feature {name}: {here_} here, {there} in the data {run_dir} trained on", False
    return "", False


PREPROCESSING_KEYS = (
    "mode",
    "max_ids",
    "min_count",
    "hash",
    "missing_id",
    "oov_id",
    "dense_transform",
    "dense_dtype",
    "spec_sha256",
    "raw_ids",
)
"""The manifest options that decide which id and which dense value a raw field becomes (not Criteo's
text layout: the same rows as TSV or CSV give the same dataset; a feature spec, whose hash is here,
says which column is which)."""


def preprocessing(manifest: Manifest) -> dict[str, Any]:
    """A dataset's preprocessing settings: its table sizes, hashing or vocabulary and dense
    transform. A model scores only data preprocessed as its training data was (see
    preprocessing_differences)."""
    options = manifest.options
    return {
        "cardinalities": [table_rows(f) for f in manifest.sparse_features],
        **{key: options.get(key) for key in PREPROCESSING_KEYS},
        **(event_sample_settings(manifest.events["spec"]) if manifest.kind == "events" else {}),
    }


def event_sample_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The sample settings (EventSpec.sample_settings) of an event spec as a manifest or a model
    file keeps it."""
    return event_spec_from_dict(spec, "the dataset's event spec").sample_settings()


def preprocessing_differences(
    trained: dict[str, Any], here: dict[str, Any], specs: tuple[Any, Any] = (None, None)
) -> str:
    """The settings that differ, "key: A in training, B here, ..." ("" when none): of a list, its
    first differing element. A cardinality of None (no table) is not compared. specs: the two
    feature specs (as manifests keep them), where known: their first difference is said in place
    of their SHA-256s."""
    diffs, raw = [], _raw_id_features(trained, here)
    for key in dict.fromkeys([*trained, *here]):
        a, b = trained.get(key), here.get(key)
        if key == "spec_sha256" and a != b and all(specs):
            if _unsized(specs[0], raw) == _unsized(specs[1], raw):
                continue  # the specs differ only in raw-id columns' hash_size
            if said := spec_difference(*specs, raw):
                diffs.append(f"spec {said}")
                continue
        if key == "cardinalities" and isinstance(a, list) and isinstance(b, list):
            a, b = _tables_only(a, b)
        if key == "max_ids" and isinstance(a, list) and isinstance(b, list):
            a, b = ([None if i in raw else n for i, n in enumerate(x)] for x in (a, b))
        if key.startswith("[") and key not in trained:
            continue  # an event spec's setting that a record from before them does not keep
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            key, a, b = f"{key}[{i}]", a[i], b[i]
        diffs.append(f"{key}: {show_value(a)} in training, {show_value(b)} here")
    return ", ".join(diffs)


def spec_difference(trained: Any, here: Any, raw: frozenset[int] = frozenset()) -> str:
    """The first setting in which two feature specs (as manifests and model files keep them)
    differ: "column 'C14': kind: 'string' in training, 'integer' here", a column on one side
    only, else "[format] delimiter: ..."; "" where either is unknown or none differs. raw: the
    sparse columns (by position) of raw ids on both sides, whose hash_size is not compared."""
    if not trained or not here:
        return ""
    trained, here = _unsized(trained, raw), _unsized(here, raw)
    a, b = (spec_from_dict(s, "a recorded spec") for s in (trained, here))
    theirs = {c.name: c for c in b.columns}
    for column in a.columns:  # the columns first: theirs are what make the ids
        other = theirs.pop(column.name, None)
        if other is None:
            return f"column {column.name!r}: in training, not here"
        if column != other:
            return f"column {column.name!r}: {_first_field(column, other)}"
    if theirs:
        return f"column {next(iter(theirs))!r}: here, not in training"
    return "[format] " + _first_field(a.format, b.format) if a.format != b.format else ""


def _raw_id_features(trained: dict[str, Any], here: dict[str, Any]) -> frozenset[int]:
    """The sparse features (by position) of raw ids on both sides (table rows 0): kept as the ids
    they are written as, never hashed, so their hash size (a spec's hash_size, --max-ids), which
    `spec infer` proposes anew from each day, changes no byte of the data."""
    a, b = trained.get("cardinalities"), here.get("cardinalities")
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return frozenset()
    return frozenset(i for i, (x, y) in enumerate(zip(a, b)) if x == 0 and y == 0)


def _unsized(spec: Any, raw: frozenset[int]) -> Any:
    """A feature spec (as manifests keep it) without the hash_size of its `raw` sparse columns (by
    position among its categorical, list and sequence columns), but where a hashed column reads
    one's table (`table`: the spec gives both one hash_size, and the hashed one's is its rows)."""
    if not raw or not isinstance(spec, dict) or not isinstance(spec.get("columns"), list):
        return spec
    sparse = [c for c in spec["columns"] if isinstance(c, dict) and c.get("role") in SPARSE_ROLES]
    read = {c.get("table") for i, c in enumerate(sparse) if i not in raw}
    unsized = {id(c) for i, c in enumerate(sparse) if i in raw and c.get("name") not in read}
    columns = [
        {k: v for k, v in c.items() if k != "hash_size"} if id(c) in unsized else c
        for c in spec["columns"]
    ]
    return {**spec, "columns": columns}


def recorded_spec(record: dict[str, Any]) -> dict[str, Any] | None:
    """The feature spec of the data a run recorded (RUN/dataset.json): the record's copy, else
    (a record from before it kept one) read from its manifest where that data is still at its
    path, unchanged; None otherwise (or for data of no spec)."""
    if isinstance(record.get("spec"), dict):
        return record["spec"]
    manifest = data_at_path(record)
    return manifest.options.get("spec") if manifest is not None else None


def data_at_path(record: dict[str, Any]) -> Manifest | None:
    """The manifest of the data a run recorded where it is still at its path, unchanged (None:
    gone, moved, or other data there now)."""
    try:
        manifest = Manifest.load(Path(record["path"]))
    except (KeyError, TypeError, OSError, ValueError):  # gone, moved, or not a dataset now
        return None
    return manifest if dataset_fingerprint(manifest) == record.get("fingerprint") else None


def run_data_spec(run_dir: Path) -> tuple[FeatureSpec | None, dict[str, Any]] | None:
    """(the feature spec of the data a run trained on last, as preprocessing applied it; the
    dataset record it comes from) for `shardrec spec show RUN`: RUN/dataset.json keeps the spec
    when the data is gone. The spec is None where the record holds none (Criteo's built-in
    columns, or a record from before it kept one, of data no longer at its path); None: no run
    directory (no readable RUN/dataset.json)."""
    record = read_dataset_record(run_dir)
    if record is None:
        return None
    recorded = recorded_spec(record)
    if recorded is None:
        return None, record
    where = f"{Path(run_dir) / names.DATASET_RECORD}: spec"
    return sized_spec(spec_from_dict(recorded, where), record.get("preprocessing", {})), record


def _first_field(a: Any, b: Any) -> str:
    """ "key: A in training, B here" of the first field two spec dataclasses differ in (their role
    where they are columns of two roles)."""
    if type(a) is not type(b):
        return f"role: {show_value(a.role)} in training, {show_value(b.role)} here"
    key = next(f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name))
    return f"{key}: {show_value(getattr(a, key))} in training, {show_value(getattr(b, key))} here"


def spec_differences(record: dict[str, Any], manifest: Manifest) -> str:
    """The event-spec settings (EventSpec.sample_settings) in which `manifest`'s samples differ
    from those of the data a run recorded (RUN/dataset.json), preprocessing_differences' way; ""
    when none differ, for a click log, or for a record that keeps none."""
    if manifest.kind != "events":
        return ""
    trained = {k: v for k, v in record.get("preprocessing", {}).items() if k.startswith("[")}
    here = {k: v for k, v in preprocessing(manifest).items() if k.startswith("[")}
    return preprocessing_differences(trained, here) if trained else ""


def recorded_data(record: dict[str, Any], manifest: Manifest) -> bool:
    """Whether `manifest` is the dataset a run recorded: its fingerprint, or a form recorded
    before an event log's covered its files or its spec (fingerprints.older_fingerprints; then the
    spec settings the record keeps, if any, must be the dataset's: a record from before them
    cannot tell, and is taken at its word, as it was then)."""
    recorded = record.get("fingerprint")
    if recorded == dataset_fingerprint(manifest):
        return True
    return recorded in older_fingerprints(manifest) and not spec_differences(record, manifest)


def _tables_only(a: list[Any], b: list[Any]) -> tuple[list[Any], list[Any]]:
    """Two lists of cardinalities with None where either has none (a feature without a table)."""
    if len(a) != len(b):
        return a, b
    keep = [x is not None and y is not None for x, y in zip(a, b)]
    return [x if k else None for x, k in zip(a, keep)], [y if k else None for y, k in zip(b, keep)]


def dataset_record(path: str, manifest: Manifest, given: str | None = None) -> bytes:
    """The bytes of RUN/dataset.json for this dataset: its absolute `path`, the path as the user
    typed it (`given`), its fingerprint, schema and preprocessing settings, and its feature spec
    where it has one (recorded_spec: the data may be gone when the run goes on)."""
    spec = manifest.options.get("spec")
    record = {
        "path": path,
        "given": given if given is not None else path,
        "fingerprint": dataset_fingerprint(manifest),
        "schema": dataset_schema(manifest),
        "preprocessing": preprocessing(manifest),
        **({"spec": spec} if isinstance(spec, dict) else {}),
    }
    return (json.dumps(record, indent=2) + "\n").encode()


def read_dataset_record(run_dir: Path) -> dict[str, Any] | None:
    """RUN/dataset.json (None: a run from before dataset records, or a torn file)."""
    try:
        record = json.loads((Path(run_dir) / names.DATASET_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
