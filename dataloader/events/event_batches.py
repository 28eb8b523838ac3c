"""Anchors -> torchrec Batches: an event-log split opened for reading, and the batch of any list of
its timeline rows.

A sample's features, as the manifest lists them (tools/preprocess/events/event_dataset.py):
`uid` and the crosses (one id each), `hist_item` with its sides `hist_artist`, `hist_album`,
`hist_ts` (seconds) and `hist_action` (bits), gathered from the user's events before the anchor
(history_kernels.py), then `cand_item`, `cand_artist`, `cand_album` of the anchor; dense
log(1 + events before it) and the sine and cosine of its hour of day; label 1 for a listen-plus.
Everything is a function of the anchor and the files, so any rank makes any batch alike.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.events import event_files
from shardrec.dataloader.events.history_kernels import (
    LISTEN_PLUS,
    gather_histories,
    xxh64_rows,
)
from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.dataloader.spec.event_spec import EventSpec
from shardrec.dataloader.spec.event_spec_file import event_spec_from_dict
from shardrec.dataloader.util.jit import njit

PAD_LABEL = -1.0


@njit(cache=True, nogil=True)
def fill_jagged(pos, lengths, starts, src, out):
    """out[starts[i] + j] = src[pos[i, j]] for j < lengths[i]: rows of a batch's histories."""
    for i in range(pos.shape[0]):
        s = starts[i]
        for j in range(lengths[i]):
            out[s + j] = src[pos[i, j]]


class EventSource:
    """One split of an event-log dataset, mapped: its users' parts, the item maps, its timeline."""

    def __init__(self, directory: str | Path, split: str, manifest: Manifest | None = None) -> None:
        self.directory = Path(directory)
        self.manifest = manifest or Manifest.load(self.directory)
        if self.manifest.kind != event_files.EVENTS_KIND:
            raise DatasetError(f"{self.directory}: not an event-log dataset")
        self.info = event_files.events_info(self.manifest, self.directory)
        if split not in self.info.timelines:
            raise DatasetError(
                f"{self.directory}: no split {split!r} (has {', '.join(self.info.timelines) or 'none'})"
            )
        self.split = split
        self.spec: EventSpec = event_spec_from_dict(
            self.info.spec, f"{self.directory}: events.spec"
        )
        self.parts = [event_files.open_part(self.directory, p) for p in self.info.parts]
        self.artist, self.album = event_files.open_items(self.directory, self.info.items)
        maps = {"artist": self.artist, "album": self.album}
        event_files.check_table_ids(self.directory, self.manifest, self.parts, maps)
        event_files.check_actions(self.directory, self.manifest, self.parts)
        self.timeline = event_files.open_timeline(self.directory, self.info.timelines[split])
        self.window_offsets = tuple(self.info.windows[split])
        self.feature_names = self.manifest.feature_names
        h = hashlib.sha256()
        for entry in (*self.info.parts, self.info.items, self.info.timelines[split]):
            h.update(f"{entry.name}:{entry.sha256};".encode())
        self.fingerprint = h.hexdigest()
        """Identifies the stream's data (a loader state of another dataset is refused)."""


class EventBatcher:
    """Makes the Batch of anchors: each given as (part, user row in the part, event place)."""

    def __init__(
        self,
        spec: EventSpec,
        feature_names: list[str],
        parts: list[event_files.EventPart],
        artist: np.ndarray,
        album: np.ndarray,
        where: str = "the event-log dataset",
    ) -> None:
        self.feature_names, self.parts = list(feature_names), parts
        self.where = where
        """The dataset, as a refusal names it."""
        self.artist, self.album = artist, album
        h = spec.history
        self.last_n = h.length if h.strategy == "last_n" else 0
        self.per_pool = h.per_pool
        self.width = max(1, h.length if self.last_n else 3 * h.per_pool)
        self.scan = h.scan
        self.crosses = spec.crosses
        self.sides = [n for n in ("artist", "album") if f"hist_{n}" in self.feature_names]

    @classmethod
    def of(cls, source: EventSource) -> EventBatcher:
        return cls(
            source.spec,
            source.feature_names,
            source.parts,
            source.artist,
            source.album,
            f"{source.directory} ({source.split})",
        )

    def _check_anchors(self, part_ids: np.ndarray, users: np.ndarray, places: np.ndarray) -> None:
        """DatasetError (one line) for an anchor outside its part's users or its user's events:
        a timeline or part file that disagrees with its manifest, read before it indexes anything."""
        for k in range(len(part_ids)):
            p, u, e = int(part_ids[k]), int(users[k]), int(places[k])
            if 0 <= p < len(self.parts):
                offsets = self.parts[p].offsets
                if 0 <= u < len(offsets) - 1 and 0 <= e < int(offsets[u + 1] - offsets[u]):
                    continue
            raise DatasetError(
                f"{self.where}: a timeline anchor (part {p}, user {u}, event {e}) lies outside the "
                "users' events: a file disagrees with its manifest; `shardrec data verify` names it"
            )

    def _check_items(
        self,
        cand_item: np.ndarray,
        hist_item: np.ndarray,
        starts: np.ndarray,
        anchors: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        """DatasetError (one line) for an item id past the item maps (a changed byte of a part's
        item column), before the maps are indexed with it: one max per batch."""
        items = len(self.artist)
        if max(cand_item.max(initial=0), hist_item.max(initial=0)) < items:
            return
        if cand_item.max() >= items:
            k = int(np.argmax(cand_item >= items))
            value, where = int(cand_item[k]), "at"
        else:
            j = int(np.argmax(hist_item >= items))
            k = int(np.searchsorted(starts, j, "right")) - 1
            value, where = int(hist_item[j]), "in the history of"
        p, u, e = (int(a[k]) for a in anchors)
        raise DatasetError(
            f"{self.where}: item {value} {where} the anchor (part {p}, user {u}, event {e}) is "
            f"outside the item maps' {items} items: a file disagrees with its manifest; "
            "`shardrec data verify` names it"
        )

    def make(
        self, anchors: tuple[np.ndarray, np.ndarray, np.ndarray], real: int | None = None
    ) -> Batch:
        """The batch of these anchors (part, user, place); rows from `real` on are padding
        (label -1)."""
        part_ids, users, places = (np.asarray(a).astype(np.int64) for a in anchors)
        n = len(part_ids)
        bad = part_ids.size and (part_ids.min() < 0 or part_ids.max() >= len(self.parts))
        for p in np.unique(part_ids) if not bad else ():
            mine = part_ids == p
            offsets = self.parts[int(p)].offsets
            u, e = users[mine], places[mine]
            if u.min() < 0 or u.max() >= len(offsets) - 1:
                bad = True
                break
            bad = bool((e < 0).any() or (e >= offsets[u + 1] - offsets[u]).any())
            if bad:
                break
        if bad:
            self._check_anchors(part_ids, users, places)
        anchor = np.empty(n, np.int64)
        uid = np.empty(n, np.int64)
        pos = np.zeros((n, self.width), np.int64)
        lengths = np.zeros(n, np.int64)
        for p in np.unique(part_ids):
            mine = np.flatnonzero(part_ids == p)
            part = self.parts[int(p)]
            first = part.offsets[users[mine]]
            anchor[mine] = first + places[mine]
            uid[mine] = part.uid[users[mine]]
            sub_pos = np.zeros((len(mine), self.width), np.int64)
            sub_len = np.zeros(len(mine), np.int64)
            gather_histories(
                anchor[mine],
                first,
                part.action,
                self.scan,
                self.per_pool,
                self.last_n,
                sub_pos,
                sub_len,
            )
            pos[mine], lengths[mine] = sub_pos, sub_len
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        total = int(lengths.sum())
        hist = {k: np.empty(total, np.int64) for k in ("item", "ts", "action")}
        cand_item, t_anchor, organic, action = (np.empty(n, np.int64) for _ in range(4))
        for p in np.unique(part_ids):
            mine = np.flatnonzero(part_ids == p)
            part = self.parts[int(p)]
            for k, column in (("item", part.item), ("ts", part.ts), ("action", part.action)):
                fill_jagged(pos[mine], lengths[mine], starts[mine], column, hist[k])
            a = anchor[mine]
            cand_item[mine], t_anchor[mine] = part.item[a], part.ts[a]
            organic[mine], action[mine] = part.organic[a], part.action[a]
        self._check_items(cand_item, hist["item"], starts, (part_ids, users, places))
        hour = (t_anchor // 3600) % 24
        keys = {
            "uid": uid,
            "item": cand_item,
            "artist": self.artist[cand_item].astype(np.int64),
            "album": self.album[cand_item].astype(np.int64),
            "hour": hour,
            "organic": organic,
        }
        one = {"uid": uid}
        for cross in self.crosses:
            ids = np.empty(n, np.uint64)
            xxh64_rows(np.stack([keys[k] for k in cross.keys], axis=1), 0, cross.size, ids)
            one[cross.name] = ids.astype(np.int64)
        seq = {"hist_item": hist["item"], "hist_ts": hist["ts"], "hist_action": hist["action"]}
        cand = {"cand_item": cand_item}
        for side in self.sides:
            table = self.artist if side == "artist" else self.album
            seq[f"hist_{side}"] = table[hist["item"]].astype(np.int64)
            cand[f"cand_{side}"] = keys[side]
        values, lens = [], []
        for name in self.feature_names:
            if name in seq:
                values.append(seq[name])
                lens.append(lengths)
            else:
                values.append((one | cand)[name])
                lens.append(np.ones(n, np.int64))
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=list(self.feature_names),
            values=torch.from_numpy(np.concatenate(values)),
            lengths=torch.from_numpy(np.concatenate(lens)),
        )
        angle = 2 * math.pi * hour / 24
        dense = np.stack([np.log1p(places), np.sin(angle), np.cos(angle)], axis=1)
        labels = (action == LISTEN_PLUS).astype(np.float32)
        if real is not None:
            labels[real:] = PAD_LABEL
        return Batch(
            dense_features=torch.from_numpy(dense.astype(np.float32)),
            sparse_features=kjt,
            labels=torch.from_numpy(labels),
        )
