"""Lines of an input's text: counted (a whole file, a byte range of a plain file), a header's end,
where the text ends (blank lines that end a file are no rows), byte ranges of a plain file cut
just after a newline, lines cut into fields as csv reads them, and lines that are no text refused.

A blank line holds nothing but spaces, tabs and carriage returns, save the delimiter (blank_bytes):
pandas' read_csv skips such a line, and reads a line of tabs in a TSV file as a row of empty
fields. Those that end a file (a hand-written file's last newline doubled, `echo >> file`, a last
line of spaces) are left out of its text: no line, no malformed row, no place in a split; so a
file gives the dataset it gives without them, whichever reader takes it (plain ranges, a whole .gz
file, a .gz file cut into ranges). A blank line with rows after it is a malformed row, as any line
that holds no row."""

from __future__ import annotations

import csv
import io
import mmap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shardrec.dataloader.util.jit import AVAILABLE, njit
from shardrec.tools.preprocess.text.gz import READ_ERRORS, describe_error, open_text

_CR = "\ue000"  # a private-use character: a carriage return crosses csv as it


def blank_bytes(delimiter: str) -> bytes:
    """What a blank line may hold besides its newline: spaces, tabs and carriage returns, but the
    delimiter (one byte)."""
    return b" \t\r".replace(delimiter.encode(), b"")


TSV_BLANK = blank_bytes("\t")
"""A blank line's bytes in Criteo's tab-separated text."""


def csv_fields(text: str, delimiter: str, quoting: int = csv.QUOTE_MINIMAL) -> list[list[str]]:
    """The fields of each line of `text`, as csv reads them; a carriage return inside a field is
    data, as the compiled parsers keep it (csv itself refuses one outside quotes)."""
    # csv's default limit is 128 KiB a field, and it raised past it (a traceback); the compiled
    # parsers read a field of any length, and so must the messages and `spec infer` that use this.
    if csv.field_size_limit() < len(text):
        csv.field_size_limit(len(text))
    rows = csv.reader(io.StringIO(text.replace("\r", _CR)), delimiter=delimiter, quoting=quoting)
    return [[field.replace(_CR, "\r") for field in row] for row in rows]


def check_text(path: Path, line: bytes, number: int) -> None:
    """ValueError for line `number` of `path` holding a NUL byte, which no line of CSV or TSV text
    holds: UTF-16 text (a spreadsheet's "Unicode text") or a binary file; or for a first line
    that never ends but holds a carriage return: lines that end in '\\r' alone (classic Mac OS
    text), which would be read as one line, one malformed row."""
    if number == 1 and not line.endswith(b"\n") and b"\r" in line.rstrip(b"\r"):
        raise ValueError(
            f"{path}: its lines end in a carriage return ('\\r') alone, not a newline, so the "
            f"file reads as one line; convert them first (tr '\\r' '\\n' < {path} > "
            f"{path.stem}-lf{path.suffix})"
        )
    if b"\x00" not in line:
        return
    if number == 1 and line[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ValueError(
            f"{path}: UTF-16 text; shardrec reads UTF-8: convert it first "
            f"(iconv -f UTF-16 -t UTF-8 {path} > {path.stem}-utf8{path.suffix})"
        )
    raise ValueError(f"{path}:{number}: a NUL byte: not CSV or TSV text (a binary file?)")


def check_first_line(path: Path, header: bool, limit: int = 1 << 20) -> None:
    """check_text of the file's first line (its first `limit` bytes, where it is longer), and
    ValueError for a UTF-8 byte-order mark before a first line that is a row (no `header`): its
    first field would read the mark as part of its value. A file that cannot be read is left to
    the reader that reports it."""
    try:
        with open_text(path) as f:
            line = f.readline(limit)
    except READ_ERRORS:
        return
    check_text(path, line, 1)
    if not header and line.startswith(b"\xef\xbb\xbf"):
        gz, plain = path.suffix == ".gz", Path(path.name.removesuffix(".gz"))
        out = f"{plain.stem}-nobom{plain.suffix}{'.gz' if gz else ''}"
        sed = "sed '1s/^\\xEF\\xBB\\xBF//'"
        command = f"zcat {path} | {sed} | gzip > {out}" if gz else f"{sed} {path} > {out}"
        raise ValueError(
            f"{path}: starts with a UTF-8 byte-order mark, and its first line is a row (no "
            f"header): the mark would be read into that row's first field; remove it first "
            f"({command})"
        )


def count_lines(
    path: Path, skip_header: bool, blank: bytes = TSV_BLANK, block: int = 1 << 24
) -> int:
    """Physical lines (a last line without a newline counts) after any header, less the blank
    lines that end the file (blank: blank_bytes)."""
    lines = kept = 0
    last, end = b"\n", TextEnd(blank)
    try:
        f = open_text(path)
    except READ_ERRORS as e:
        raise ValueError(describe_error(path, e)) from e
    with f:
        try:
            while b := f.read(block):
                if (keep := end.feed(b, 0, len(b))) >= 0:
                    kept = lines + b.count(b"\n", 0, keep)
                lines += b.count(b"\n")
                last = b[-1:]
        except READ_ERRORS as e:  # described while open: the message says how far the decoder got
            raise ValueError(describe_error(path, e, f)) from e
    if last != b"\n" and not end.last_line_blank():
        kept = lines + 1
    return max(kept - (1 if skip_header else 0), 0)


def blank_tail(data, lo: int, hi: int, blank: bytes = TSV_BLANK) -> int:
    """Where the blank lines (of `blank` bytes: blank_bytes) that end data[lo:hi] start (hi: its
    last line is not blank). data[lo] starts a line; the last line may lack its newline."""
    end, p = hi, hi - 1 if hi > lo and data[hi - 1] == 10 else hi
    while True:  # p: where the content of the line before `end` ends
        q = p
        while q > lo and data[q - 1] in blank:
            q -= 1
        if q > lo and data[q - 1] != 10:  # a byte of a row
            return end
        end = q
        if q == lo:
            return end
        p = q - 1


class TextEnd:
    """Where text fed in consecutive pieces ends, less the blank lines that end it: each piece
    says where the last line in it that is not blank ends."""

    def __init__(self, blank: bytes = TSV_BLANK) -> None:
        self.blank = blank
        self.open_blank = True  # the line the pieces so far end in is blank so far

    def _blank_line(self, data, lo: int, p: int) -> bool:
        # Whether the line that ends at the newline data[p] is blank; it may start in a piece before.
        q = p
        while q > lo and data[q - 1] in self.blank:
            q -= 1
        return self.open_blank if q == lo else data[q - 1] == 10

    def feed(self, data: bytes | bytearray, lo: int, hi: int) -> int:
        """One past the newline of the last line that is not blank in data[lo:hi] (an index of
        data), or -1 where none ends in it."""
        found, q = -1, hi
        while (p := data.rfind(b"\n", lo, q)) >= 0:
            if not self._blank_line(data, lo, p):
                found = p + 1
                break
            q = p
        last = data.rfind(b"\n", lo, hi)
        rest = bytes(data[last + 1 if last >= 0 else lo : hi])
        self.open_blank = (last >= 0 or self.open_blank) and not rest.translate(None, self.blank)
        return found

    def last_line_blank(self) -> bool:
        """Of text whose last line has no newline: whether that line is blank."""
        return self.open_blank


def text_end(path: Path, begin: int, blank: bytes = TSV_BLANK, window: int = 1 << 16) -> int:
    """Where the text of a plain file that starts at `begin` ends, less the blank lines that end
    it (begin: none but blank lines; blank: blank_bytes)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        while True:
            lo = max(begin, size - window)
            f.seek(lo)
            end = blank_tail(f.read(size - lo), 0, size - lo, blank) + lo
            # Lines that reach back to the window's start were judged as if it started a line.
            if lo == begin or end > lo:
                return end
            window *= 4


def header_end(path: Path) -> int:
    with open(path, "rb") as f:
        line = f.readline()
    return len(line)


# Where a row ends in text whose quoted fields hold line breaks (parse.csv_scan.RowEnds.find):
# (data, start, target) -> (one past the row's newline or -1, ...).
RowEnd = Callable[[np.ndarray, int, int], tuple[int, int, bool]]


def chunk_bounds(
    path: Path, chunk_bytes: int, begin: int, row_end: RowEnd | None = None, end: int = -1
) -> list[tuple[int, int]]:
    """Byte ranges of about `chunk_bytes` of bytes [begin, end) (end -1: the file's end), each cut
    just after a newline; with `row_end`, just after the newline that ends a row (never inside a
    quoted field)."""
    size = path.stat().st_size if end < 0 else end
    if row_end is not None:
        return _row_bounds(path, chunk_bytes, begin, row_end, size)
    bounds, start = [], begin
    with open(path, "rb") as f:
        while start < size:
            cut = start + chunk_bytes
            if cut >= size:
                bounds.append((start, size))
                break
            f.seek(cut)
            while True:
                block = f.read(1 << 16)
                if not block:
                    cut = size
                    break
                nl = block.find(b"\n")
                if nl >= 0:
                    cut += nl + 1
                    break
                cut += len(block)
            cut = min(cut, size)
            bounds.append((start, cut))
            start = cut
    return bounds


def _row_bounds(
    path: Path, chunk_bytes: int, begin: int, row_end: RowEnd, size: int
) -> list[tuple[int, int]]:
    if begin >= size:
        return []
    bounds, start = [], begin
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        data = np.frombuffer(mm, dtype=np.uint8)
        try:
            while start + chunk_bytes < size:
                cut = row_end(data, start, start + chunk_bytes)[0]
                cut = size if cut < 0 else min(cut, size)
                bounds.append((start, cut))
                start = cut
            if start < size:
                bounds.append((start, size))
        finally:
            del data  # the mapping cannot close while a view of it is alive
    return bounds


def count_range_lines(path: Path, start: int, end: int, block: int = 1 << 24) -> int:
    """Newlines in bytes [start, end) of a plain file (memory-mapped: no copies)."""
    if end <= start:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        data = np.frombuffer(mm, dtype=np.uint8)
        try:
            if AVAILABLE:  # one compiled pass, no [block] bool temporary
                n = int(count_newlines(data[start:end]))
            else:
                n = sum(
                    int(np.count_nonzero(data[a : min(a + block, end)] == 10))
                    for a in range(start, end, block)
                )
        finally:
            # The mapping cannot close while a view of it is alive: on a Ctrl-C mid-count too,
            # else its BufferError replaced the KeyboardInterrupt (a traceback, exit 1).
            del data
    return n


def byte_at(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(1)


@njit(cache=True, nogil=True, boundscheck=False)
def count_newlines(buf):
    """Rows in a piece: one pass, no temporary array (numpy's `buf == 10` allocates one)."""
    n = 0
    for i in range(len(buf)):
        n += buf[i] == 10
    return n
