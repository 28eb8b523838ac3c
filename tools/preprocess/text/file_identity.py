"""An input file as a rerun knows it: its name, size, modification time and a sampled digest of
its content. A rerun reuses the work done on its inputs (a preprocessing run's finished tasks, a
reference-npy run's parsed days) only where they are the same; a file replaced by another of the
same size and time (`cp -p`, `rsync -t`, `touch -r`) differs in its digest.

The digest reads a few MiB however large the file (SAMPLED_BYTES), so that a rerun of unchanged
inputs never reads them whole: ~15 ms for a 1 GB file in the page cache, a few dozen seeks on a
cold disk. It samples: a change that falls only between the samples and keeps the size and time
(an edit in place, its time set back) is not seen.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SAMPLE_KEY = "sample_sha256"
"""An input's sampled digest in a run record (absent from records written before it)."""
_EDGE = 1 << 20  # the first and last MiB: a header, the last rows
_BLOCK = 64 << 10
_BLOCKS = 32  # evenly spaced between the edges
SAMPLED_BYTES = 2 * _EDGE + _BLOCKS * _BLOCK
"""The most bytes sampled_sha256 reads; a file no larger is read whole."""


def sampled_sha256(path: Path) -> str:
    """sha256 of the file's size, its first and last MiB and 32 evenly spaced 64 KiB blocks
    between them (of the whole file where it is no larger than SAMPLED_BYTES)."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        h = hashlib.sha256(f"{size}\0".encode())
        if size <= SAMPLED_BYTES:
            spans = [(0, size)]
        else:
            step = (size - 2 * _EDGE) // _BLOCKS
            middle = [(_EDGE + i * step + (step - _BLOCK) // 2, _BLOCK) for i in range(_BLOCKS)]
            spans = [(0, _EDGE), *middle, (size - _EDGE, _EDGE)]
        for offset, length in spans:
            f.seek(offset)
            h.update(f.read(length))
    return h.hexdigest()


def file_identity(path: Path) -> dict:
    """What a run record holds of an input: name, bytes, mtime_ns and its sampled digest."""
    st = path.stat()
    return {
        "name": path.name,
        "bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        SAMPLE_KEY: sampled_sha256(path),
    }


def as_recorded(old: object, new: list[dict]) -> list[dict]:
    """The inputs `new` as a record without digests (an older shardrec's, `old`) holds them, so
    that it still matches the same files: each entry of `new` whose counterpart in `old` has no
    digest loses its own."""
    if not isinstance(old, list) or len(old) != len(new):
        return new
    return [
        n
        if not isinstance(o, dict) or SAMPLE_KEY in o
        else {k: v for k, v in n.items() if k != SAMPLE_KEY}
        for o, n in zip(old, new)
    ]


def input_difference(old: object, new: list[dict]) -> str:
    """The first input that differs between a record's inputs and this run's, in words:
    `train.txt: 1,234 bytes, now 5,678`, `train.txt: other content of the same size and time`."""
    old = old if isinstance(old, list) else []
    if len(old) != len(new):
        return f"{len(old)} input files, now {len(new)}"
    for was, now in zip(old, new):
        was = was if isinstance(was, dict) else {}
        if was.get("name") != now["name"]:
            return f"{was.get('name')}, now {now['name']}"
        if was.get("bytes") != now["bytes"]:
            return f"{now['name']}: {was.get('bytes', 0):,} bytes, now {now['bytes']:,}"
        if was.get("mtime_ns") != now.get("mtime_ns"):
            return f"{now['name']}: modified since"
        if was != now:
            return f"{now['name']}: other content of the same size and modification time"
    return "another record"


def changed_input(files: list[Path], recorded: list[dict]) -> str:
    """The first of `files` that is no longer as `recorded` (their file_identity when the run
    began), in input_difference's words; "" where each is the same."""
    now = [file_identity(f) for f in files]
    return "" if now == recorded else input_difference(recorded, now)
