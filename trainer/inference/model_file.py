"""The exported model file's identity and header, torch-free: `shardrec predict` reads the header
and checks its input against it before torch is imported (a file in another format is refused in
well under a second, not after torch's and torchrec's seconds of start-up).

A model file is safetensors: 8 bytes (little-endian length N), N bytes of JSON (each tensor's
dtype, shape and byte range, and `__metadata__`), then the tensors' bytes. shardrec's header is
JSON in `__metadata__["shardrec"]` (export.py writes it), and `__metadata__["shardrec_sha256"]`
the file's own digest: a model file changed after export (a copy cut short, a byte flipped) is
refused, not scored.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any, BinaryIO

FORMAT = "shardrec-model"
FORMAT_VERSION = 1
META_KEY = "shardrec"
VOCAB_PREFIX = "vocab."
"""A vocabulary-mode model's vocabularies in the file: `vocab.<feature>.values` (the kept values,
sorted) and `vocab.<feature>.ids` (each one's id), uint32 or uint64, as preprocessing wrote them
(tools/preprocess/ids/vocab.py: `.work/vocab/<feature>.values.npy`, `.ids.npy`)."""
MAX_HEADER_BYTES = 100 << 20
"""safetensors' own limit on its JSON header."""
DIGEST_KEY = "shardrec_sha256"
"""`__metadata__` key: the sha256 of the whole file as written with this value as UNSEALED (its
header and every tensor's bytes). A file exported before it has none and is read unchecked."""
UNSEALED = "0" * 64
REDO = "export the run again (or copy the file again)"


def _digest_field(digest: str) -> bytes:
    """DIGEST_KEY's entry as json.dumps(separators=(",", ":")) writes it in the header."""
    return f'"{DIGEST_KEY}":"{digest}"'.encode()


class SealingWriter:
    """Writes a model file (its 8-byte length and header, holding DIGEST_KEY as UNSEALED, then
    the tensors' bytes) through sha256; `seal` then writes the digest into the header."""

    def __init__(self, f: BinaryIO, layout: bytes) -> None:
        self.f, self.at = f, layout.rindex(_digest_field(UNSEALED))
        self.digest = hashlib.sha256()
        self.write(layout)

    def write(self, data: bytes | memoryview) -> None:
        self.digest.update(data)
        self.f.write(data)

    def seal(self) -> None:
        self.f.seek(self.at)
        self.f.write(_digest_field(self.digest.hexdigest()))


def _safetensors_layout(path: Path) -> tuple[dict[str, Any], int]:
    """The file's JSON header and the bytes before its tensors; ValueError naming why it is not
    a safetensors file."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"a header of {size:,} bytes")
            text = f.read(size)
        if len(text) < size:
            raise ValueError("its header is cut short")
        layout = json.loads(text)
    except OSError as e:
        raise ValueError(f"cannot read it: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("its header is not JSON") from None
    if not isinstance(layout, dict):
        raise ValueError("its header is not a JSON object")
    return layout, 8 + size


def _tensor_bytes(layout: dict[str, Any]) -> int | None:
    """The bytes the header's tensors end at (None: entries safetensors itself would refuse)."""
    try:
        return max(
            (int(t["data_offsets"][1]) for k, t in layout.items() if k != "__metadata__"),
            default=0,
        )
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def read_header(path: Path, complete: bool = True) -> dict[str, Any]:
    """The shardrec header of a model file; ValueError if it is not one, or (`complete`) if the
    file is not as long as its header says: a copy cut short or added to is not scored."""
    try:
        layout, start = _safetensors_layout(path)
    except ValueError as e:
        raise ValueError(f"{path}: not a safetensors model file ({e})") from None
    end = _tensor_bytes(layout)
    size = path.stat().st_size
    if complete and end is not None and start + end != size:
        raise ValueError(
            f"{path}: {size:,} bytes, its header describes {start + end:,}: the file was cut "
            f"short or added to after export; {REDO}"
        )
    meta = layout.get("__metadata__") or {}
    meta = meta if isinstance(meta, dict) else {}
    if META_KEY not in meta:
        raise ValueError(
            f"{path}: a safetensors file without a shardrec header (not made by `shardrec export`)"
        )
    try:
        header = json.loads(meta[META_KEY])
    except (TypeError, json.JSONDecodeError):
        raise ValueError(f"{path}: its shardrec header is not JSON") from None
    if (
        not isinstance(header, dict)
        or header.get("format") != FORMAT
        or header.get("format_version") != FORMAT_VERSION
    ):
        shown = header if not isinstance(header, dict) else header.get("format")
        version = header.get("format_version") if isinstance(header, dict) else None
        raise ValueError(
            f"{path}: format {shown!r} version {version!r}, this shardrec reads {FORMAT!r} "
            f"version {FORMAT_VERSION}"
        )
    return header


def reads_raw_rows(header: dict[str, Any]) -> bool:
    """Whether the model of this header can read raw rows: its data recorded a feature spec, or
    Criteo's text schema and dense transform (data from `shardrec data import-npy` has neither,
    only arrays of ids)."""
    transform = header.get("transform") or {}
    return bool(transform.get("spec")) or (
        "schema" in transform and transform.get("dense_transform") is not None
    )


def check_digest(path: Path) -> None:
    """ValueError (one line) unless the file's bytes are those `shardrec export` sealed: a model
    file changed since would score other probabilities without a word."""
    layout, start = _safetensors_layout(path)
    want = (layout.get("__metadata__") or {}).get(DIGEST_KEY)
    if want is None:  # exported before files held their digest
        return
    digest = hashlib.sha256()
    with path.open("rb") as f:
        head = f.read(start)
        field = _digest_field(str(want))
        digest.update(
            head.replace(field, _digest_field(UNSEALED)) if head.count(field) == 1 else b""
        )
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    if digest.hexdigest() != want:
        raise ValueError(
            f"{path}: its bytes do not match the sha256 its header records: the file changed "
            f"after export; {REDO}"
        )
