"""A CSV/TSV file of an event log (or an item map) as pyarrow's reader takes it: its text less the
blank lines that end it, plain or compressed. And what it holds when pyarrow cannot read it, said
in one line: a binary file (Parquet, most often) given as text, text given as Parquet, or the line
whose field count is not the header's. pyarrow's own message has no line number and echoes the
line's bytes; these read the file again, on the error path only.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shardrec.tools.preprocess.text.lines import TextEnd, blank_bytes, text_end

HEAD_BYTES = 1 << 16
"""Bytes looked at for a NUL byte: text logs have none."""
_FIELD_COUNT = re.compile(r"Expected (\d+) columns, got (\d+)")


def _stream(path: Path):
    import pyarrow as pa

    # As pyarrow's CSV reader opens a path: a .gz (.bz2, ...) name is read decompressed.
    return pa.input_stream(str(path), compression="detect")


@contextmanager
def text_before_blank_lines(path: Path, delimiter: str) -> Iterator:
    """`path` as pyarrow's CSV reader takes it, less the blank lines (spaces, tabs) that end its
    text: the click-log readers take such lines as no rows (text.lines.text_end), pyarrow refused
    the last as a row of one field. A plain file's bytes before them are mapped, not copied; a
    compressed one (.gz, .bz2, .lz4, .zst) is read as it decompresses. A blank line between rows
    stays a refusal. One reader a use: a reader is used up."""
    import pyarrow as pa

    try:
        pa.Codec.detect(str(path))
    except (TypeError, ValueError):  # no compression's extension: plain text
        compressed = False
    else:
        compressed = True
    if compressed:
        with _stream(path) as stream:
            yield BeforeBlankLines(stream, blank_bytes(delimiter))
    else:
        end = text_end(path, 0, blank_bytes(delimiter))
        yield str(path) if end == path.stat().st_size else _mapped(path, end)


def _mapped(path: Path, end: int):
    import pyarrow as pa

    return pa.BufferReader(pa.memory_map(str(path)).read_buffer(end))


class BeforeBlankLines(io.RawIOBase):
    """A stream's bytes less the blank lines that end them: the bytes after the last line that is
    not blank are held back until a line that is not blank follows (they are then rows, and a
    blank line among them is refused as the plain file's is) or the stream ends (dropped)."""

    def __init__(self, stream, blank: bytes, block: int = 1 << 20) -> None:
        self._stream, self._end, self._block = stream, TextEnd(blank), block
        self._held = bytearray()
        self._out, self._at = memoryview(b""), 0
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._at == len(self._out) and not self._done:
            data = self._stream.read(self._block)
            if not data:  # a last line without its newline that is not blank ends the text
                self._done = True
                out = b"" if self._end.last_line_blank() else bytes(self._held)
            elif (keep := self._end.feed(data, 0, len(data))) < 0:
                self._held += data
                continue
            else:
                out = bytes(self._held) + data[:keep]
                self._held = bytearray(data[keep:])
            self._out, self._at = memoryview(out), 0
        n = min(len(b), len(self._out) - self._at)
        b[:n] = self._out[self._at : self._at + n]
        self._at += n
        return n


def _head(path: Path) -> bytes | None:
    """The first HEAD_BYTES of `path` (decompressed as the CSV reader reads it); None when it
    cannot be read (the reader says why)."""
    import pyarrow as pa

    try:
        with _stream(path) as stream:
            return stream.read(HEAD_BYTES)
    except (OSError, pa.ArrowException):
        return None


def is_text(path: Path) -> bool:
    """Whether `path` holds text (something, and no NUL byte in its head): a CSV/TSV file given
    where Parquet was expected."""
    head = _head(path)
    return bool(head) and not head.startswith(b"PAR1") and b"\0" not in head


def binary_content(path: Path) -> str | None:
    """ "a Parquet file" or "binary data (a NUL byte at byte N)" when `path` is no text file; None
    for text (or a file that cannot be read: the reader says why)."""
    head = _head(path)
    if head is None:
        return None
    if head.startswith(b"PAR1"):
        return "a Parquet file"
    nul = head.find(b"\0")
    return None if nul < 0 else f"binary data (a NUL byte at byte {nul})"


def field_count_line(path: Path, kind: str, error: Exception) -> str | None:
    """`FILE:LINE: expected N fields, got M (...)` for pyarrow's "Expected N columns, got M" error,
    the line found by reading the file again as pyarrow reads it (one row a line, quotes kept
    within it, empty lines skipped); None for any other error."""
    found = _FIELD_COUNT.search(str(error))
    if found is None:
        return None
    expected = int(found[1])
    delimiter = "\t" if kind == "tsv" else ","
    with _stream(path) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
        for number, line in enumerate(text, start=1):
            line = line.rstrip("\r\n")
            if number == 1 or not line:
                continue
            if line.count(delimiter) + 1 == expected and '"' not in line:
                continue  # the common line, without csv's parsing
            got = len(next(csv.reader([line], delimiter=delimiter)))
            if got != expected:
                what = "tab" if kind == "tsv" else "comma"
                return (
                    f"{path}:{number}: expected {expected} fields, got {got} (as many as the "
                    f"header's columns, line 1; quote a value that holds a {what})"
                )
    return None


def _lines(path: Path, chunk: int = 1 << 24) -> Iterator:
    """(bytes, starts, ends) of the file's lines as pyarrow's reader reads the file, a chunk read
    at a time: a numpy array of a chunk's bytes and where each line in it starts and ends (its
    newline; the last line without a newline too). At numpy's speed, not Python's per line."""
    import numpy as np

    tail = b""  # the bytes of the line that goes on into the next chunk
    with _stream(path) as stream:
        while data := stream.read(chunk):
            data = tail + data
            text = np.frombuffer(data, np.uint8)
            ends = np.flatnonzero(text == ord("\n"))
            yield text, np.concatenate(([0], ends[:-1] + 1)), ends
            tail = data[ends[-1] + 1 :] if len(ends) else data
    if tail:
        yield np.frombuffer(tail, np.uint8), np.array([0]), np.array([len(tail)])


def _holding(text, starts, ends, blank: bytes = b"\r"):
    """Whether each line holds a byte that is not one of `blank` (a carriage return: a line of
    none is empty, as pyarrow reads it)."""
    import numpy as np

    held = ~np.isin(text, np.frombuffer(blank + b"\n", np.uint8))
    count = np.concatenate(([0], np.cumsum(held)))
    return count[ends] > count[starts]


def row_line(path: Path, row: int, chunk: int = 1 << 24) -> int:
    """The line (from 1) that holds row `row` (from 0, after the header) of a CSV/TSV file, found
    as pyarrow's reader finds its rows: one a line, empty lines (`\\r\\n` too) none, before the
    header too; without them a row after an empty line was named by the line before it. Reads the
    file again: for messages only."""
    import numpy as np

    wanted = row + 2  # lines that are not empty up to the row's: the header's, rows 0 to `row`
    lines = full = 0
    for text, starts, ends in _lines(path, chunk):
        counts = full + np.cumsum(_holding(text, starts, ends))
        hit = int(np.searchsorted(counts, wanted))
        if hit < len(ends):
            return lines + hit + 1
        lines, full = lines + len(ends), int(counts[-1]) if len(ends) else full
    return row + 2


def empty_line_among_rows(path: Path, delimiter: str, chunk: int = 1 << 24) -> int | None:
    """The first empty line (from 1) of a CSV/TSV file that a line of a row follows (None: none):
    pyarrow's reader reads it as no row, so each row after it is a line further down the file
    than its place among the rows says. Blank lines that end the file are none of its text."""
    import numpy as np

    lines, empty = 0, None
    for text, starts, ends in _lines(path, chunk):
        after = 0  # the chunk's lines a row must be among, after the empty line found
        if empty is None:
            blank = np.flatnonzero(~_holding(text, starts, ends))
            if len(blank):
                empty, after = lines + int(blank[0]) + 1, int(blank[0]) + 1
        if empty is not None:
            # Only here, where an empty line waits: the common file has none.
            rows = _holding(text, starts[after:], ends[after:], blank_bytes(delimiter))
            if rows.any():
                return empty
        lines += len(ends)
    return None


def arrow_message(error: Exception, limit: int = 200) -> str:
    """pyarrow's message, shown on one line: no control bytes, at most `limit` characters."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join(str(error).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."
