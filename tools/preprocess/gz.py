"""Reading gzip inputs: ISA-L (python-isal) when it is installed, Python's gzip otherwise.

Decompression dominates a gzip day: on a 116 MB synthetic day (362 MB of text) Python's gzip
inflates 262-274 MB/s, zlib-ng's gzip_ng 681-695 MB/s and isal's igzip 885-1,003 MB/s (readinto
of 16 MiB, one core). Both decoders give the same bytes (the output is byte-identical whichever
ran), so the faster one is used when it imports; `SHARDREC_GZIP=python` forces the fallback.

A read error is one line naming the file and what went wrong: a stream that ends early
(truncated file) or a dead stream mid-file (corrupt deflate data or a failed CRC).
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import BinaryIO

try:
    from isal import igzip as _igzip
    from isal.isal_zlib import error as _IsalError
except ImportError:  # isal has no wheel for this platform: Python's gzip reads the same bytes
    _igzip = None
    _IsalError = zlib.error

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


def open_gzip(path: str | Path) -> BinaryIO:
    """A binary reader of the decompressed text of a .gz file (all its members)."""
    if backend() == "isal":
        return _igzip.open(path, "rb")
    return gzip.open(path, "rb")


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
