"""Raw event rows -> batches for `shardrec predict MODEL events.parquet`, by the model's own event
spec and item maps.

The file is read and checked as preprocessing reads a log (event_log.py); each listen with at
least `min_history` earlier events of its user in the file is a sample, its history gathered from
those earlier rows exactly as the loader gathers it. A row that is not a sample (another event
type, too little history) gets no probability.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torchrec.datasets.utils import Batch

from shardrec.dataloader.events.event_batches import EventBatcher
from shardrec.dataloader.events.event_files import EventPart
from shardrec.dataloader.spec.event_spec_file import event_spec_from_dict
from shardrec.tools.preprocess.events.event_columns import EventLogError, Source
from shardrec.tools.preprocess.events.event_log import read_event_log
from shardrec.tools.preprocess.events.log_text import empty_line_among_rows, row_line


def event_row_batches(
    header: dict[str, Any],
    maps: tuple[np.ndarray, np.ndarray],
    path: Path,
    batch_size: int = 128,
) -> tuple[int, Iterator[tuple[Batch, np.ndarray]]]:
    """(rows in the file, batches of its samples with each sample's row in the file).

    Small batches: an HSTU layer's attention is batch x history^2 per head, and at 4096 samples
    of a 192-event history its buffers are fresh pages every batch (more system than user time);
    128 scored 30,790 samples in 36-39 s against 75-77 s at 4096 (2 threads, quiet machine)."""
    spec = event_spec_from_dict(header["transform"]["events_spec"], f"{path}: the model's spec")
    delimiter = "\t" if spec.format == "tsv" else ","
    empty = empty_line_among_rows(path, delimiter) if spec.format != "parquet" else None
    if empty is not None:  # as a click log's rows refuse it: one probability a line, pasted beside
        header_line = row_line(path, -1)  # the first line that holds anything
        if empty < header_line:  # as a click log refuses it: its first line is its header
            raise EventLogError(
                f"{path}:{empty}: an empty line before the header (line {header_line}): a log's "
                "first line is its header, which names its columns; remove the empty lines above it"
            )
        raise EventLogError(
            f"{path}:{empty}: an empty line among the rows, which is no row: predict writes one "
            "probability a row, which pasted beside the file's lines would be a line off from "
            "there on; remove the empty lines first"
        )
    log = read_event_log([path], spec, None, maps=maps)
    users = {t["name"]: t["rows"] for t in header["tables"]}.get("t_uid")
    if users is not None and int(log.user.max()) >= users:
        beyond = int(np.argmax(log.user >= users))  # a user (the log's users in its order)
        source = Source([path], np.array([log.rows]), csv=spec.format != "parquet")
        raise EventLogError(
            f"{source.where(int(log.row[log.offsets[beyond]]))}: {spec.events.user}: "
            f"{int(log.user[beyond])} is beyond the model's {users:,} users (0 to "
            f"{users - 1:,}), who each have a row of its user table: leave that user's events "
            "out, or score them with a model trained on a log that holds the user"
        )
    lengths = np.diff(log.offsets)
    user_of = np.repeat(np.arange(len(lengths)), lengths)
    place = np.arange(log.rows) - log.offsets[user_of]
    chosen = np.flatnonzero(log.listen & (place >= spec.history.min_history))
    part = EventPart(log.user, log.offsets, log.item, log.ts, log.action, log.organic)
    batcher = EventBatcher(spec, header["feature_names"], [part], log.artist, log.album)

    def batches() -> Iterator[tuple[Batch, np.ndarray]]:
        for lo in range(0, len(chosen), batch_size):
            mine = chosen[lo : lo + batch_size]
            anchors = (np.zeros(len(mine), np.int64), user_of[mine], place[mine])
            yield batcher.make(anchors), log.row[mine]

    return log.rows, batches()
