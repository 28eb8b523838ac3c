"""The part container (dataloader/format/arrow_ipc.py, arrow_ipc_write.py): files of every column
kind and dtype read back equal with pyarrow (its full validation) and polars; streamed buffers give
the same bytes as arrays; the bytes depend on the columns and lengths only; a file is checked by
its own layout."""

from __future__ import annotations

import io

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from shardrec.dataloader.format.arrow_ipc import BLOCK, LIST, Column, FileLayout
from shardrec.dataloader.format.arrow_ipc_write import Streamed, write_file

COLUMNS = [
    Column("label", np.uint8),
    Column("dense", np.float32, BLOCK, 13),
    Column("half", np.float16, BLOCK, 3),
    *(
        Column(f"u{d.itemsize}", d)
        for d in map(np.dtype, (np.uint8, np.uint16, np.uint32, np.uint64))
    ),
    Column("signed", np.int64),
    Column("real", np.float64),
    Column("tags", np.uint32, LIST),
    Column("raw", np.uint64, LIST),
]


def _data(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    data = {
        "label": rng.integers(0, 2, rows).astype(np.uint8),
        "dense": rng.normal(size=(rows, 13)).astype(np.float32),
        "half": rng.normal(size=(rows, 3)).astype(np.float16),
        "signed": rng.integers(-(2**40), 2**40, rows),
        "real": rng.normal(size=rows),
    }
    for d in (np.uint8, np.uint16, np.uint32, np.uint64):
        data[f"u{np.dtype(d).itemsize}"] = rng.integers(0, np.iinfo(d).max, rows, dtype=d)
    for name, d in (("tags", np.uint32), ("raw", np.uint64)):
        lengths = rng.integers(0, 5, rows)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        data[name] = (offsets, rng.integers(0, np.iinfo(d).max, int(offsets[-1]), dtype=d))
    return data


def _written(layout: FileLayout, rows: int, data: dict) -> bytes:
    out = io.BytesIO()
    size, _ = write_file(out, layout, rows, data)
    assert size == len(out.getvalue())
    return out.getvalue()


@pytest.mark.parametrize("rows", [0, 1, 1001])
def test_every_column_kind_reads_back_equal_with_pyarrow_and_polars(rows: int, tmp_path):
    layout = FileLayout(COLUMNS, "shardrec", '{"a": 1}')
    data = _data(rows)
    raw = _written(layout, rows, data)
    reader = pa.ipc.open_file(pa.BufferReader(raw))
    assert reader.num_record_batches == 1 and reader.schema.metadata == {b"shardrec": b'{"a": 1}'}
    batch = reader.get_batch(0)
    batch.validate(full=True)
    assert batch.num_rows == rows and batch.schema.field("dense").type == pa.list_(
        pa.field("item", pa.float32(), nullable=False), 13
    )
    (tmp_path / "p.arrow").write_bytes(raw)
    frame = pl.read_ipc(tmp_path / "p.arrow")
    for c in COLUMNS:
        got = batch.column(c.name)
        if c.kind == BLOCK:
            want = data[c.name]
            assert np.array_equal(got.values.to_numpy().reshape(rows, c.width), want)
            assert np.array_equal(frame[c.name].to_numpy().reshape(rows, c.width), want)
        elif c.kind == LIST:
            offsets, values = data[c.name]
            assert np.array_equal(got.offsets.to_numpy(), offsets)
            assert np.array_equal(got.values.to_numpy(), values)
            assert frame[c.name].to_list() == [
                values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])
            ]
        else:
            assert np.array_equal(got.to_numpy(), data[c.name])
            assert np.array_equal(frame[c.name].to_numpy(), data[c.name])
    # the layout's own check accepts it and places every buffer
    sizes = layout.check(raw[: len(layout.head)], raw[-len(layout.foot) :], len(raw))
    assert not isinstance(sizes, str) and sizes.rows == rows and sizes.file == len(raw)
    at, length = sizes.buffers[layout.values_buffer[1]]
    start = layout.body_at + at
    assert raw[start : start + length] == data["dense"].tobytes()


def test_streamed_buffers_give_the_bytes_of_arrays():
    rows, data = 700, _data(700, seed=1)
    layout = FileLayout(COLUMNS, "k", "v")
    whole = _written(layout, rows, data)

    def pieces(array: np.ndarray, dtype) -> Streamed:
        return Streamed(
            dtype,
            array.size,
            lambda: (array.reshape(-1)[k : k + 97] for k in range(0, array.size, 97)),
        )

    streamed = {
        name: (pieces(v[0], np.int64), pieces(v[1], v[1].dtype))
        if isinstance(v, tuple)
        else pieces(v, v.dtype)
        for name, v in data.items()
    }
    assert _written(layout, rows, streamed) == whole
    assert _written(layout, rows, _data(700, seed=1)) == whole  # other buffers, same bytes


def test_lengths_that_disagree_are_refused_before_a_byte_is_written():
    layout = FileLayout(COLUMNS, "k", "v")
    data = _data(50)
    data["u4"] = data["u4"][:-1]
    out = io.BytesIO()
    with pytest.raises(ValueError, match="column u4: 49 values, expected 50"):
        write_file(out, layout, 50, data)
    assert out.getvalue() == b""


class _Writes(io.BytesIO):
    """A file that records where each write began and how long it was."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[int, int]] = []

    def write(self, data) -> int:
        self.writes.append((self.tell(), memoryview(data).nbytes))
        return super().write(data)


def test_a_file_reaches_the_disk_in_whole_aligned_pieces(monkeypatch):
    # The page cache keeps a file in folios as large as the writes that made it: a part written
    # column by column (one write a buffer, of any size) is mapped 4 KiB at a time, one written
    # in 2 MiB-aligned pieces one huge page at a time (the stream over many parts maps ~256
    # parts anew per shuffle group).
    import shardrec.dataloader.format.arrow_ipc_write as writer

    monkeypatch.setattr(writer, "WRITE_BYTES", 4096)
    layout = FileLayout(COLUMNS, "shardrec", "{}")
    rows = 3001
    data = _data(rows, seed=3)
    f = _Writes()
    size, _ = write_file(f, layout, rows, data)
    assert size > 10 * 4096
    *whole, last = f.writes
    assert all(start % 4096 == 0 and length % 4096 == 0 for start, length in whole)
    assert last[0] % 4096 == 0 and (0 < last[1] < 4096 or last[1] % 4096 == 0)
    assert sum(length for _, length in f.writes) == size
    # the same bytes as written unaligned, piece by piece
    monkeypatch.setattr(writer, "WRITE_BYTES", 1)
    assert f.getvalue() == _written(layout, rows, data)


def test_pieces_of_any_size_are_written_whole_and_in_order():
    from shardrec.dataloader.format.arrow_ipc_write import WRITE_BYTES, AlignedWrites

    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 3 * WRITE_BYTES + 12345, dtype=np.uint8).tobytes()
    cuts = np.sort(rng.integers(0, len(data), 40))
    cuts[5] = cuts[4]  # an empty piece
    f = _Writes()
    f.write(b"x" * 100)  # a file already 100 bytes in: the pieces align to the file's offsets
    out = AlignedWrites(f)
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        out.write(data[a:b])
    out.close()
    assert f.getvalue() == b"x" * 100 + data
    _, *writes = f.writes
    assert writes[0] == (100, WRITE_BYTES - 100)
    assert all(s % WRITE_BYTES == 0 and n % WRITE_BYTES == 0 for s, n in writes[1:-1])
    assert writes[-1][0] % WRITE_BYTES == 0
