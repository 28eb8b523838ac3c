"""The exported model file's identity and header, torch-free: `shardrec predict` reads the header
and checks its input against it before torch is imported (a file in another format is refused in
well under a second, not after torch's and torchrec's seconds of start-up).

A model file is safetensors: 8 bytes (little-endian length N), N bytes of JSON (each tensor's
dtype, shape and byte range, and `__metadata__`), then the tensors' bytes. shardrec's header is
JSON in `__metadata__["shardrec"]` (export.py writes it).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

FORMAT = "shardrec-model"
FORMAT_VERSION = 1
META_KEY = "shardrec"
VOCAB_PREFIX = "vocab."
"""A vocabulary-mode model's vocabularies in the file: `vocab.<feature>.values` (the kept values,
sorted) and `vocab.<feature>.ids` (each one's id), uint32 or uint64, as preprocessing wrote them
(tools/preprocess/ids/vocab.py: `.work/vocab/<feature>.values.npy`, `.ids.npy`)."""
MAX_HEADER_BYTES = 100 << 20
"""safetensors' own limit on its JSON header."""


def _safetensors_metadata(path: Path) -> dict[str, str]:
    """The file's `__metadata__`; ValueError naming why it is not a safetensors file."""
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
    meta = layout.get("__metadata__") or {}
    return meta if isinstance(meta, dict) else {}


def read_header(path: Path) -> dict[str, Any]:
    """The shardrec header of a model file; ValueError if it is not one."""
    try:
        meta = _safetensors_metadata(path)
    except ValueError as e:
        raise ValueError(f"{path}: not a safetensors model file ({e})") from None
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
