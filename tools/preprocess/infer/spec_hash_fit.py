"""The hash size `spec infer` proposes, checked against the values its sample saw.

Preprocess gives a categorical value the id 1 + mix64(v) mod (hash_size - 1) (ids/id_maps.hash_ids),
v being the value's 64 bits: a string's hash (id_maps.hash_bytes, spec_values.hash_string in Python),
a hex string's number, an integer's two's complement. Values that land on one id are one feature to
the model, and nothing says so. Twice a column's distinct values (column_infer.hash_size's estimate)
still merges some: 8 genres in 16 rows put Children's and Romance on one id. A column of few values
gets a table without that at no cost: where the sample saw (nearly) all of a column's values, the
size proposed is the smallest from the estimate up at which they get ids of their own, looked for
up to SEARCH_FACTOR times the estimate. A column of many values has no such size within reach (n
values need about n^2 rows), and one whose sample saw only some of its values would meet the unseen
ones at any size: there the estimate stays, and the comment says how many values seen share an id.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import numpy as np

from shardrec.dataloader.util.splitmix import mix64
from shardrec.tools.preprocess.ids.id_maps import hash_bytes
from shardrec.tools.preprocess.parse.parse_fields import ID_RANGE, MAX_ID_DIGITS

SEARCH_FACTOR = 8
MAX_CHECKED = 100_000
"""Distinct values above which no ids are computed (Python hashes each value: about a second)."""
_WORK = 50_000_000
"""Ids computed in the search at most (size x values); beyond it the search gives up."""
_MASK = (1 << 64) - 1
_HEX = frozenset("0123456789abcdefABCDEF")
_INTEGER = re.compile(rf"-?[0-9]{{1,{MAX_ID_DIGITS}}}")
_ZERO_FRACTION = re.compile(r"(?<=.)\.0+$")


def value_bits(text: str, kind: str) -> int | None:
    """The 64 bits preprocess hashes for the value `text` of a column of `kind` (hex, integer or
    string); None for a value it refuses (a malformed row: it gets no id)."""
    if kind == "string":
        return hash_bytes(text.encode())
    if kind == "hex":
        return int(text, 16) if 0 < len(text) <= 16 and all(c in _HEX for c in text) else None
    # integer: parse_kernel.decode_id's rule ('260.0', '260.00' too); a negative one wraps
    digits = _ZERO_FRACTION.sub("", text)
    if not _INTEGER.fullmatch(digits) or not ID_RANGE[0] <= int(digits) <= ID_RANGE[1]:
        return None
    return int(digits) & _MASK


def _first_free(mixed: np.ndarray, low: int, high: int) -> int | None:
    """The smallest size in [low, high] at which the mixed values get distinct ids, or None."""
    n = len(mixed)
    low = max(low, n + 1)  # n values need n ids besides the empty value's 0
    if low > high:
        return None
    # A size of h rows leaves them all apart with probability about exp(-n(n-1) / 2(h-1)); where
    # the whole range expects no such size, it is not searched (it would cost n x range ids).
    expected = (high - low + 1) * math.exp(-n * (n - 1) / (2 * (high - 1)))
    if expected < 1e-3:
        return None
    block = max(1, min(high - low + 1, 4_000_000 // n))
    for start in range(low, high + 1, block):
        if (start - low) * n > _WORK:
            return None
        sizes = np.arange(start, min(start + block, high + 1), dtype=np.uint64)
        ids = np.sort(mixed[None, :] % (sizes[:, None] - np.uint64(1)), axis=1)
        apart = ~(ids[:, 1:] == ids[:, :-1]).any(axis=1)
        if apart.any():
            return int(sizes[int(apart.argmax())])
    return None


def fit_hash_size(
    values: Iterable[str], kind: str, proposal: int, complete: bool
) -> tuple[int, str]:
    """(hash_size, what to add to the column's comment) for a column of `kind` whose sample holds
    `values` (list items one by one), `proposal` being the size from the estimate (module doc).
    complete: the sample holds (nearly) all the column's values; where it does not, the values
    still unseen would share ids at any size within reach, so none is looked for. The comment part
    is empty where the proposal already gives each value seen its own id."""
    distinct = set(values)
    if len(distinct) > MAX_CHECKED:
        return proposal, ""
    bits = [b for b in (value_bits(v, kind) for v in distinct) if b is not None]
    if len(bits) < 2:
        return proposal, ""
    mixed = mix64(np.array(bits, dtype=np.uint64))
    shared = _shared(mixed, proposal)
    if not shared:
        return proposal, ""
    size = _first_free(mixed, proposal, SEARCH_FACTOR * proposal) if complete else None
    if size is not None:
        return size, (
            f"; hash_size {size:,}, not {proposal:,}: at {proposal:,}, {shared:,} of the values "
            "seen would share an id, at this one each has its own"
        )
    return proposal, (
        f"; {shared:,} of the {len(bits):,} values seen share an id with another at this "
        "hash_size (a larger one makes fewer)"
    )


def _shared(mixed: np.ndarray, size: int) -> int:
    """How many of the values get an id that another one gets too, at `size` rows."""
    _, counts = np.unique(mixed % np.uint64(size - 1), return_counts=True)
    return int(counts[counts > 1].sum())
