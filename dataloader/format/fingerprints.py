"""A dataset's fingerprints: what a run records of the data it trained on, to refuse resuming,
continuing or evaluating on other data.

`dataset_fingerprint` covers every part's name, rows and checksum (an event log's: every file's,
and its event spec's sample settings); `split_fingerprint` one split's parts (the loader's stream
state). A dataset rewritten by `shardrec data upgrade` keeps the fingerprints of the dataset it
was (`upgrade_record`), so runs trained on the old layout resume on the new one;
`older_fingerprints` are the forms an earlier shardrec recorded.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from shardrec.dataloader.format.manifest import Manifest

EVENT_SAMPLE_KEYS = ("played_ratio_min", "history", "crosses", "split")
"""The keys of an event spec's plain data (the manifest's copy) that decide its samples."""


def _event_files(events: dict[str, Any]) -> list[Any]:
    """(name, rows, sha256) of every file an event-log dataset's manifest lists (its parts, item
    maps and timelines: EventsInfo.files' order, timelines by split), as plain data; an entry
    that is no object as it is (the loader refuses such a manifest in its own words)."""
    timelines = events.get("timelines")
    timelines = [timelines[k] for k in sorted(timelines)] if isinstance(timelines, dict) else []
    entries = [*(events.get("parts") or []), events.get("items"), *timelines]
    return [
        [e.get("name"), e.get("rows"), e.get("sha256")] if isinstance(e, dict) else e
        for e in entries
    ]


def _content_fingerprint(
    manifest: Manifest, event_spec: bool = True, event_files: bool = True
) -> str:
    content: dict[str, Any] = {
        "dense": manifest.dense_features,
        "sparse": [(f.name, f.cardinality, f.multi_hot) for f in manifest.sparse_features],
        "splits": {
            name: [(p.name, p.rows, p.sha256) for p in split.parts]
            for name, split in sorted(manifest.splits.items())
        },
    }
    if event_spec and manifest.kind == "events":
        # An event log's samples are made when the batch is: the same features and sizes under
        # another spec are other samples. These are EventSpec.sample_settings' values, as the
        # manifest keeps the spec (EventSpec.to_dict: every key written).
        spec = manifest.events.get("spec", {})
        content["event_spec"] = {k: spec.get(k) for k in EVENT_SAMPLE_KEYS}
    if event_files and manifest.kind == "events":
        # Its events are in its own files, not in the splits' parts (it has none): the same spec
        # and sizes over other events are other samples.
        content["event_files"] = _event_files(manifest.events)
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _split_content_fingerprint(manifest: Manifest, split: str) -> str:
    h = hashlib.sha256()
    for p in manifest.splits[split].parts:
        h.update(f"{p.name}:{p.rows}:{p.bytes}:{p.sha256};".encode())
    return h.hexdigest()


def dataset_fingerprint(manifest: Manifest) -> str:
    """sha256 over what the model sees of a dataset: features, cardinalities, every part's rows and
    checksum, and an event log's sample settings (its event spec's label, history, crosses and
    split) and every file's rows and checksum (what a run records: it resumes only on the same
    data). An upgraded dataset whose parts are still the ones the upgrade wrote keeps the
    fingerprint of the layout it came from."""
    own = _content_fingerprint(manifest)
    old = manifest.upgraded_from
    if (
        old
        and old.get("fingerprint_as_upgraded") == own
        and isinstance(old.get("fingerprint"), str)
    ):
        return old["fingerprint"]
    return own


def older_fingerprints(manifest: Manifest) -> tuple[str, ...]:
    """The forms of `dataset_fingerprint` a run may have recorded of this dataset before, newest
    first: an event log's without its files' checksums (before the fingerprint covered them), and
    without its event spec either (before it covered that); none for a click log's. A form is the
    check of its time: a run that recorded one cannot tell the events it trained on."""
    if manifest.kind != "events":
        return ()
    return (
        _content_fingerprint(manifest, event_files=False),
        _content_fingerprint(manifest, event_spec=False, event_files=False),
    )


def split_fingerprint(manifest: Manifest, split: str) -> str:
    """sha256 over one split's parts (the loader's stream state records it), kept through an
    upgrade as `dataset_fingerprint` is."""
    own = _split_content_fingerprint(manifest, split)
    old = manifest.upgraded_from.get("splits", {}).get(split)
    if (
        isinstance(old, dict)
        and old.get("as_upgraded") == own
        and isinstance(old.get("fingerprint"), str)
    ):
        return old["fingerprint"]
    return own


def upgrade_record(
    manifest: Manifest, old_version: int, fingerprint: str, splits: dict[str, str]
) -> dict[str, Any]:
    """`Manifest.upgraded_from` for a dataset upgraded from `old_version` whose old fingerprints
    were these: its own as they are now, with the old ones they stand for."""
    return {
        "schema_version": old_version,
        "fingerprint": fingerprint,
        "fingerprint_as_upgraded": _content_fingerprint(manifest),
        "splits": {
            s: {"fingerprint": fp, "as_upgraded": _split_content_fingerprint(manifest, s)}
            for s, fp in sorted(splits.items())
        },
    }
