"""Reading inputs, plain or gzip: ISA-L (python-isal) when it is installed, Python's gzip otherwise.

Decompression dominates a gzip day, and ISA-L's igzip inflates several times faster than
Python's gzip (`shardrec bench preprocess --gzip` measures it). Both decoders give the same bytes
(the output is byte-identical whichever ran), so the faster one is used when it imports;
`SHARDREC_GZIP=python` forces the fallback.

A read error is one line naming the file and what went wrong: a stream that ends early
(truncated file) or a dead stream mid-file (corrupt deflate data or a failed CRC).

Seeking (one large .gz file split across workers, gz_split.py): rapidgzip, read on one thread,
builds a seek index (GZIDX, one 32 KiB window about every 4 MiB of text) during the planning pass,
and with an index inflates through ISA-L. Its parallel mode decodes speculatively, at several
times the CPU per byte, so it is not used; indexed_gzip seeks through zlib, slower than ISA-L. A
worker imports only the windows of its own range (mini_index): the whole index of a 50 GB day
would be ~400 MB.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

try:
    from isal import igzip as _igzip
    from isal.isal_zlib import crc32
    from isal.isal_zlib import error as _IsalError
except ImportError:  # isal has no wheel for this platform: Python's gzip reads the same bytes
    _igzip = None
    _IsalError = zlib.error
    crc32 = zlib.crc32  # the same CRC-32, slower

try:
    import rapidgzip as _rapidgzip
except ImportError:  # no seek index: split ranges are reached by decoding from the start
    _rapidgzip = None

ENV = "SHARDREC_GZIP"
BACKENDS = ("isal", "python")
# What reading a gzip (or plain) input can raise; callers turn it into one line with describe_error.
READ_ERRORS: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error, _IsalError)
_STREAM_ERRORS = (zlib.error, _IsalError, gzip.BadGzipFile)


def backend() -> str:
    """The decoder open_gzip uses: isal unless SHARDREC_GZIP=python or isal is missing."""
    want = os.environ.get(ENV, "")
    if want not in ("", *BACKENDS):
        raise ValueError(f"{ENV}={want!r} is not one of {', '.join(BACKENDS)}")
    if want == "isal" and _igzip is None:
        raise ValueError(f"{ENV}=isal but isal is not installed: pip install 'isal>=1.6'")
    return "python" if want == "python" or _igzip is None else "isal"


def _in_place(cls: type) -> type:
    class Reader(cls):
        def readinto(self, b) -> int:
            # GzipFile inherits BufferedIOBase.readinto: read() into new bytes, then a copy (and a
            # fresh allocation's page faults): 1.7x the CPU of decoding into b, which this does.
            self._check_not_closed()
            return self._buffer.readinto(b)

    return Reader


_IsalReader = _in_place(_igzip.IGzipFile) if _igzip is not None else None
_PythonReader = _in_place(gzip.GzipFile)


def open_gzip(path: str | Path) -> BinaryIO:
    """A binary reader of the decompressed text of a .gz file (all its members); readinto decodes
    into the caller's buffer."""
    if backend() == "isal":
        return _IsalReader(path, "rb")
    return _PythonReader(path, "rb")


def describe_error(path: str | Path, error: BaseException, reader: BinaryIO | None = None) -> str:
    """One line for an error raised while reading `path` through `reader` (from open_gzip)."""
    if isinstance(error, EOFError):
        return f"{path}: unreadable or truncated: the gzip stream ends early ({error})"
    if not isinstance(error, _STREAM_ERRORS):
        return f"{path}: unreadable or truncated: {error}"
    where = _compressed_position(path, reader)
    if isinstance(error, gzip.BadGzipFile) and str(error).startswith("Not a gzipped file"):
        return f"{path}: unreadable: not a gzip stream{where} ({error})"
    return f"{path}: dead gzip stream mid-file{where}: corrupt data ({error}); fetch the file again"


def _compressed_position(path: str | Path, reader: BinaryIO | None) -> str:
    # Where the decoder had read to in the .gz file: the damage is at or before it (decoders read
    # ahead, so it is a bound, not the exact byte).
    try:
        pos, size = reader.fileobj.tell(), os.path.getsize(path)  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return ""
    return f" at or before compressed byte {pos:,} of {size:,}"


# GZIDX (indexed_gzip's format, rapidgzip's default export), version 1: a header, then one record
# per seek point, then a window for every point whose data flag is set, in point order.
_HEADER = struct.Struct(
    "<5sBBQQIII"
)  # magic, version, flags, compressed, uncompressed, spacing, window, points
_POINT = struct.Struct("<QQBB")  # compressed offset, uncompressed offset, bits, has window
INDEX_CHUNK = 4 << 20  # text between seek points: a seek decodes at most this much before its range


def can_index() -> bool:
    """Whether planning builds seek indexes (rapidgzip installed, fast decoders not switched
    off)."""
    return _rapidgzip is not None and backend() != "python"


def open_indexing(path: str | Path) -> BinaryIO:
    """A one-thread rapidgzip reader whose index export_index writes once it has read to the end.

    It does not notice a file cut short (it returns the bytes it could inflate): the caller checks
    the gzip trailer's size (trailer_size_matches) and falls back to open_gzip."""
    return _rapidgzip.RapidgzipFile(str(path), parallelization=1, chunk_size=INDEX_CHUNK)


RAPIDGZIP_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, ValueError, OSError)


def trailer_size_matches(path: str | Path, text_bytes: int) -> bool:
    """The last member's ISIZE (its text size mod 2^32) against all text read: true for a complete
    one-member file (a cut file matches by chance with odds 2^-32); a multi-member file can
    differ."""
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return struct.unpack("<I", f.read(4))[0] == text_bytes & 0xFFFFFFFF


def export_index(reader: BinaryIO, dest: Path) -> None:
    """Write the reader's seek index to dest (temp name, fsync, rename)."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        reader.export_index(f)  # type: ignore[attr-defined]
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest)


def mini_index(index_path: str | Path, start: int, end: int) -> bytes:
    """The index of index_path with windows only for the points that text [start, end) needs.

    Every point stays (rapidgzip needs the whole chunk layout); points outside the range lose
    their window, which a reader that never seeks there does not use."""
    with open(index_path, "rb") as f:
        head = f.read(_HEADER.size)
        magic, version, _, _, _, _, window, count = _HEADER.unpack(head)
        if magic != b"GZIDX" or version != 1:
            raise ValueError(f"{index_path}: not a GZIDX version 1 index")
        points = [_POINT.unpack(f.read(_POINT.size)) for _ in range(count)]
        first = max(i for i, p in enumerate(points) if p[1] <= start)
        last = min([i for i, p in enumerate(points) if p[1] >= end] or [count - 1])
        out, windows, offset = bytearray(head), [], _HEADER.size + _POINT.size * count
        for i, (cmp, text, bits, has) in enumerate(points):
            keep = bool(has) and first <= i <= last
            out += _POINT.pack(cmp, text, bits, int(keep))
            if keep:
                f.seek(offset)
                windows.append(f.read(window))
            offset += window if has else 0
    return bytes(out) + b"".join(windows)


def open_range(path: str | Path, start: int, end: int, index_path: str = "") -> BinaryIO:
    """A reader of the decompressed text of path positioned at text byte `start`.

    With a seek index: rapidgzip from the nearest point before start (one thread). Without one:
    open_gzip, decoding and dropping the text before start."""
    if index_path and can_index():
        reader = _rapidgzip.RapidgzipFile(str(path), parallelization=1, chunk_size=INDEX_CHUNK)
        try:
            reader.import_index(io.BytesIO(mini_index(index_path, start, end)))
            reader.seek(start)
        except BaseException:
            reader.close()
            raise
        return reader
    reader = open_gzip(path)
    try:
        left, buf = start, bytearray(1 << 20)
        while left > 0:
            n = reader.readinto(memoryview(buf)[: min(left, len(buf))])
            if n == 0:
                raise EOFError(
                    f"the text ends at byte {start - left:,}, before the range's start {start:,}"
                )
            left -= n
    except BaseException:
        reader.close()
        raise
    return reader


def open_text(path: str | Path):
    """An input's text as a binary stream: decompressed where the name ends in .gz."""
    return open_gzip(path) if str(path).endswith(".gz") else open(path, "rb")
