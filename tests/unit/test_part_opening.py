"""Opening a part stays strict however cheap it is: the bytes a layout expects for a part's shape
are kept across parts (arrow_ipc.FileLayout.expected), and so are its columns' places and
read-ahead spans (part_file._places), so a part differing from one opened before must still be
refused, and the spans read ahead must still be its own columns' rows."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import write_tiny_dataset

import shardrec.dataloader.format.part_cache as part_cache
from shardrec.dataloader.format.manifest import DatasetError
from shardrec.dataloader.format.part_cache import PartSet
from shardrec.dataloader.format.part_file import manifest_layout, open_part


def _rewrite(path: Path, at: int, value: int) -> None:
    """Put int64 `value` at byte `at` of the file, its size unchanged."""
    data = bytearray(path.read_bytes())
    struct.pack_into("<q", data, at, value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "where, refusal",
    [
        ("buffers", "its buffers are not where shardrec writes them for 30 rows"),
        ("footer", "its footer is not the one shardrec writes for its columns"),
    ],
)
def test_a_tampered_part_of_a_shape_opened_before_is_refused(tmp_path: Path, where, refusal):
    manifest = write_tiny_dataset(tmp_path, rows={"train": [30, 30]})
    layout = manifest_layout(manifest, tmp_path)
    first, second = manifest.splits["train"].parts
    open_part(tmp_path, "train", first, manifest, layout)  # its shape's bytes are kept now
    victim = tmp_path / "train" / second.name
    if where == "buffers":  # the second buffer moved 8 bytes on
        at = layout.marks["buffers"] + 16
        moved = struct.unpack_from("<q", victim.read_bytes(), at)[0] + 8
        _rewrite(victim, at, moved)
    else:  # the footer's record of the body's length
        size = victim.stat().st_size
        _rewrite(victim, size - len(layout.foot) + layout.foot_body_at, 1 << 20)
    with pytest.raises(DatasetError, match=f"{second.name}: not the part the manifest describes: "):
        open_part(tmp_path, "train", second, manifest, layout)
    with pytest.raises(DatasetError, match=refusal):
        open_part(tmp_path, "train", second, manifest, layout)
    open_part(tmp_path, "train", first, manifest, layout)  # the good one still opens


def test_a_truncated_part_of_a_shape_opened_before_is_refused(tmp_path: Path):
    manifest = write_tiny_dataset(tmp_path, rows={"train": [30, 30]})
    layout = manifest_layout(manifest, tmp_path)
    first, second = manifest.splits["train"].parts
    open_part(tmp_path, "train", first, manifest, layout)
    victim = tmp_path / "train" / second.name
    victim.write_bytes(victim.read_bytes()[:-8])
    with pytest.raises(DatasetError, match=f"{second.name}: .* bytes on disk, manifest says"):
        open_part(tmp_path, "train", second, manifest, layout)


def _column_spans(part, start: int, rows: int) -> list[tuple[int, int]]:
    """The spans a shuffle group reads ahead, from the part's arrays: rows [start, start + rows)
    of the labels, dense and one-hot ids, then of each list's offsets (one more)."""
    one_hot = [c for name, c in part.sparse.items() if name not in part.offsets]
    columns = [(c, rows) for c in [part.labels, part.dense, *one_hot]]
    columns += [(o, rows + 1) for o in part.offsets.values()]
    return [
        (c.ctypes.data + start * c.strides[0], count * c.strides[0])
        for c, count in columns
        if c.size
    ]


def test_the_spans_read_ahead_are_each_parts_own_columns_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Parts of two shapes (40 and 33 rows), lists among the features: the read-ahead of the next
    # shuffle group must ask for the rows the gathers will read, part by part.
    manifest = write_tiny_dataset(tmp_path, rows={"train": [40, 40, 33]}, multi_hot=("f1",))
    asked: list[list[tuple[int, int]]] = []
    monkeypatch.setattr(
        part_cache, "read_ahead_spans", lambda spans, probe: asked.append(list(spans))
    )
    parts = PartSet(tmp_path, "train", manifest)
    wanted = [(0, 5, 20), (1, 0, 40), (2, 30, 3), (0, 39, 1)]
    parts.warm(wanted)
    expected = [_column_spans(parts[i], start, rows) for i, start, rows in wanted]
    assert asked == expected
    assert len(expected[0]) == 1 + 1 + 3 + 1  # labels, dense, one-hot ids, the list's offsets
    assert all(n > 0 for spans in asked for _, n in spans)
