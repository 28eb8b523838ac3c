"""The compiled (numba) kernels that turn a Parquet row group's Arrow columns into the values a
feature spec's text parser would have produced from the same rows (spec_kernel.py), reading
Arrow's raw buffers: validity bitmaps (bit `offset + i`), int32 or int64 offsets, the bytes of
strings, the values of integers, a list's offsets and its child's.

The decoders are the text parser's own (spec_kernel.categorical_value), so a string, a hex string
or an integer gives the same 64-bit value, hence the same id, read from Parquet as read from CSV.
A null or empty value is missing (id 0; a raw id's is MISSING_KEY), as an empty field is; a list's
null or empty elements are skipped, as a list field's empty values are.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import njit
from shardrec.tools.preprocess.parse.spec_kernel import (
    BAD_FLOAT,
    BAD_INTEGER,
    BAD_LABEL,
    categorical_value,
)
from shardrec.tools.preprocess.parse.spec_values import hash_string


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _valid(bitmap, i):
    """Bit i of an Arrow validity bitmap (an empty bitmap: every value is valid)."""
    return len(bitmap) == 0 or ((bitmap[i >> 3] >> (i & 7)) & 1) == 1


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _bad(reason, bad_field, r, code, field):
    if reason[r] < 0:  # the first bad field of a row is the one reported
        reason[r], bad_field[r] = code, field


@njit(cache=True, nogil=True, boundscheck=False)
def strings_into(
    offsets, data, bitmap, at, n, kind, out, missing, col, r0, reason, bad_field, field
):
    """Rows r0 .. r0 + n of one-hot column `col` from n string values (Arrow index at + i)."""
    for i in range(n):
        r, j = r0 + i, at + i
        s, e = np.int64(offsets[j]), np.int64(offsets[j + 1])
        if not _valid(bitmap, j) or s == e:
            out[r, col], missing[r, col] = np.uint64(0), True
            continue
        v, code = categorical_value(data, s, e, kind, False)
        out[r, col], missing[r, col] = v, False
        if code >= 0:
            _bad(reason, bad_field, r, code, field)


@njit(cache=True, nogil=True, boundscheck=False)
def dictionary_into(
    indices, bitmap, at, n, values, absent, codes, out, missing, col, r0, reason, bad_field, field
):  # fmt: skip
    """Rows r0 .. r0 + n of one-hot column `col` from n dictionary indices: the dictionary's
    entries were decoded once (values, absent: null or empty, codes: a reason or -1), each row
    takes its entry's."""
    for i in range(n):
        r, j = r0 + i, at + i
        if not _valid(bitmap, j):
            out[r, col], missing[r, col] = np.uint64(0), True
            continue
        d = indices[j]
        out[r, col], missing[r, col] = values[d], absent[d]
        if codes[d] >= 0:
            _bad(reason, bad_field, r, codes[d], field)


@njit(cache=True, nogil=True, boundscheck=False)
def mark_bad_entries(indices, bitmap, at, n, codes, r0, reason, bad_field, field):
    """Rows r0 .. r0 + n whose dictionary entry did not decode (codes[entry] >= 0) are malformed."""
    for i in range(n):
        j = at + i
        if _valid(bitmap, j) and codes[indices[j]] >= 0:
            _bad(reason, bad_field, r0 + i, codes[indices[j]], field)


@njit(cache=True, nogil=True, boundscheck=False)
def gather_entry_ids(entry_ids, indices, bitmap, at, rows, out, j, offset):
    """out[j, offset + k] = entry_ids[indices[at + rows[k]]]: a dictionary column's ids, each
    distinct value hashed once. A null row takes the last entry, the missing value's id (0, or a
    raw id's MISSING_KEY), as an empty field's."""
    null = len(entry_ids) - 1
    if len(bitmap) == 0:
        for k in range(len(rows)):
            out[j, offset + k] = entry_ids[indices[at + rows[k]]]
        return
    for k in range(len(rows)):
        i = at + rows[k]
        # A null's index is read too (Arrow keeps its slot, of any value) and set aside by
        # arithmetic, not a branch: a branch on nulls mispredicts at Criteo's rates of them
        # (measured: 6.9 against 4.5 ms for 23 columns of 131 K rows).
        valid = np.int64((bitmap[i >> 3] >> (i & 7)) & 1)
        out[j, offset + k] = entry_ids[np.int64(indices[i]) * valid + null * (1 - valid)]


@njit(cache=True, nogil=True, boundscheck=False)
def first_entry_row(wanted, indices, bitmap, at, rows):
    """The first k whose row at + rows[k] is valid and takes an entry marked in `wanted`, or -1."""
    for k in range(len(rows)):
        i = at + rows[k]
        if _valid(bitmap, i) and wanted[indices[i]]:
            return k
    return -1


@njit(cache=True, nogil=True, boundscheck=False)
def numbers_into(values, bitmap, at, n, out, missing, col, r0, reason, bad_field, field, integral):
    """Rows r0 .. r0 + n of dense column `col` from n numbers, as float64 (a null: 0.0, missing):
    one pass over Arrow's buffers, as the text parser writes a dense field. A NaN or an infinity
    makes its row malformed (bad_float), as `nan` or `inf` in a text field does: a log transform
    would have stored it as 0 or infinity. integral (a `type = "int"` column): a float with a
    fraction, or beyond +-2^63, makes its row malformed (bad_integer), as `1.5` in text does."""
    for i in range(n):
        r, j = r0 + i, at + i
        # A null's value is read too (Arrow keeps its slot, of any value) and replaced by a
        # select, not a branch on nulls (measured: 4.6 against 2.6 ms for Criteo's 13 columns of
        # 131 K rows); only a bad value, which is rare, is one.
        ok = _valid(bitmap, j)
        v = np.float64(values[j])
        out[r, col], missing[r, col] = (v if ok else 0.0), not ok
        fraction = integral and (v != np.floor(v) or abs(v) >= 2.0**63)
        if ok and (not np.isfinite(v) or fraction):
            out[r, col], missing[r, col] = 0.0, True
            _bad(reason, bad_field, r, BAD_INTEGER if np.isfinite(v) else BAD_FLOAT, field)


@njit(cache=True, nogil=True, boundscheck=False)
def integers_into(values, bitmap, at, n, out, missing, col, r0):
    """Rows r0 .. r0 + n of one-hot column `col` from n integers: the value's 64 bits (a negative
    one in two's complement, as the text parser stores `-5`)."""
    for i in range(n):
        r, j = r0 + i, at + i
        if _valid(bitmap, j):
            out[r, col], missing[r, col] = np.uint64(np.int64(values[j])), False
        else:
            out[r, col], missing[r, col] = np.uint64(0), True


@njit(cache=True, nogil=True, boundscheck=False)
def float_ids_into(
    values, bitmap, at, n, exact, out, missing, col, r0, reason, bad_field, field
):  # fmt: skip
    """integers_into for a float column of ids (pandas writes an integer column that has nulls
    as float64): a whole number below `exact` in magnitude (the column's type's bound,
    parquet_schema.FLOAT_EXACT_BITS: 2^53 for float64, 2^24 for float32, 2^11 for float16) is the
    integer it is, the id an integer column of it (or CSV's `66740.0`) gives; a fraction, a NaN,
    an infinity or a value at or past `exact`, where distinct ids may have been rounded to one
    float, makes its row malformed (bad_integer), as `1.5` in a text id field does."""
    for i in range(n):
        r, j = r0 + i, at + i
        if not _valid(bitmap, j):
            out[r, col], missing[r, col] = np.uint64(0), True
            continue
        v = np.float64(values[j])
        if np.isfinite(v) and v == np.floor(v) and abs(v) < exact:
            out[r, col], missing[r, col] = np.uint64(np.int64(v)), False
        else:
            out[r, col], missing[r, col] = np.uint64(0), True
            _bad(reason, bad_field, r, BAD_INTEGER, field)


@njit(cache=True, nogil=True, boundscheck=False)
def string_lists_into(
    list_offsets, list_bitmap, at, n, offsets, data, bitmap, child_at, kind, max_length,
    out, pos, start, length, total, col, r0, reason, bad_field, field,
):  # fmt: skip
    """Rows r0 .. r0 + n of list column `col` from n lists of strings: each row's first
    max_length non-empty values appended to out[pos:], and in total[r, col] the non-empty values
    it holds (more than max_length: a list cut); returns the next free position."""
    for i in range(n):
        r, j = r0 + i, at + i
        start[r, col], count, held = pos, 0, 0
        if _valid(list_bitmap, j):
            k, end = np.int64(list_offsets[j]), np.int64(list_offsets[j + 1])
            while k < end and count < max_length:
                c = child_at + k
                s, e = np.int64(offsets[c]), np.int64(offsets[c + 1])
                k += 1
                if not _valid(bitmap, c) or s == e:
                    continue
                v, code = categorical_value(data, s, e, kind, False)
                if code >= 0:
                    _bad(reason, bad_field, r, code, field)
                out[pos] = v
                pos, count = pos + 1, count + 1
            held = count + _string_values(offsets, bitmap, child_at, k, end)
        length[r, col], total[r, col] = count, held
    return pos


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _string_values(offsets, bitmap, child_at, begin, end):
    """The non-empty strings among entries begin .. end (those a list cut leaves out)."""
    m = 0
    for k in range(begin, end):
        c = child_at + k
        if _valid(bitmap, c) and offsets[c + 1] > offsets[c]:
            m += 1
    return m


@njit(cache=True, nogil=True, boundscheck=False)
def integer_lists_into(
    list_offsets, list_bitmap, at, n, values, bitmap, child_at, max_length,
    out, pos, start, length, total, col, r0,
):  # fmt: skip
    """string_lists_into for lists of integers (null elements skipped)."""
    for i in range(n):
        r, j = r0 + i, at + i
        start[r, col], count, held = pos, 0, 0
        if _valid(list_bitmap, j):
            k, end = np.int64(list_offsets[j]), np.int64(list_offsets[j + 1])
            while k < end and count < max_length:
                c = child_at + k
                k += 1
                if not _valid(bitmap, c):
                    continue
                out[pos] = np.uint64(np.int64(values[c]))
                pos, count = pos + 1, count + 1
            held = count
            for rest in range(k, end):  # a list cut: the values it leaves out
                if _valid(bitmap, child_at + rest):
                    held += 1
        length[r, col], total[r, col] = count, held
    return pos


@njit(cache=True, nogil=True, boundscheck=False)
def number_labels_into(
    values, bitmap, at, n, threshold, use_threshold, labels, r0, reason, bad_field, field
):  # fmt: skip
    """Labels of n numbers: 1 where >= threshold (use_threshold), else the value, which must be
    0 or 1; a null, a NaN or an infinity (as a text label's `nan`) or another value makes its row
    malformed."""
    for i in range(n):
        r, j = r0 + i, at + i
        v = np.float64(values[j])
        if use_threshold:
            labels[r] = 1 if v >= threshold else 0
        else:
            labels[r] = 1 if v == 1.0 else 0
        wrong = not np.isfinite(v) or (not use_threshold and v != 0.0 and v != 1.0)
        if not _valid(bitmap, j) or wrong:
            labels[r] = 0
            _bad(reason, bad_field, r, BAD_LABEL, field)


@njit(cache=True, nogil=True, boundscheck=False)
def mapped_labels_into(
    offsets, data, bitmap, at, n, keys, values, labels, r0, reason, bad_field, field
):
    """Labels of n string values looked up (by their string hash) in a spec's label mapping; a
    null or unlisted value makes its row malformed."""
    for i in range(n):
        r, j = r0 + i, at + i
        labels[r] = 0
        if not _valid(bitmap, j):
            _bad(reason, bad_field, r, BAD_LABEL, field)
            continue
        h = hash_string(data, np.int64(offsets[j]), np.int64(offsets[j + 1]), False)
        found = False
        for k in range(len(keys)):
            if keys[k] == h:
                labels[r], found = values[k], True
                break
        if not found:
            _bad(reason, bad_field, r, BAD_LABEL, field)
