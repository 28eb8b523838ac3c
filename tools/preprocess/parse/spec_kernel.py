"""The compiled (numba) row parser of feature-spec text: any columns, CSV quoting, strings, lists.

One pass over the bytes, no per-row Python, in the style of parse_kernel (whose integer and hex
decoders it shares). Each field of a row is scanned once (csv_scan.scan_field: RFC 4180 quotes
when the spec quotes: a quoted field may hold the delimiter, `""` is one quote; each line of one
with a newline inside is a malformed row, none read as a row of its own), then decoded by its
column's role, given per field index as small arrays (spec_program.Program):

- label: `0`/`1`, a number compared with a threshold, or a value looked up in a mapping (by its
  string hash);
- dense: an integer (parse_kernel's rules) or a float, into float64, with a missing mask;
- categorical: hex or integer (parse_kernel's decode_hex and decode_id: -2^63 to 2^64 - 1, as the
  64 bits a Parquet int64 or uint64 column holds), or the field's bytes hashed
  (spec_values.hash_string), into uint64 with a missing mask;
- list: the field cut at its separator, each non-empty value decoded as a categorical, the first
  `max_length` appended to one flat array with each row's start and length; a side sequence
  keeps position by position with its primary: its value where the primary has none is dropped
  with it (a value the side cannot hold makes the row malformed there too), and no value where
  the primary has one makes the row malformed (side_length);
- ignore: scanned past.

A field (or a list's value) that is one of the spec's words for a missing value (`[format]
missing`, such as `NA`) reads as an empty one.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import njit
from shardrec.tools.preprocess.parse.csv_scan import line_end, scan_field
from shardrec.tools.preprocess.parse.parse_kernel import (
    decode_hex,
    decode_id,
    decode_int,
    hex8_swar,
    int_swar,
    whole_int,
)
from shardrec.tools.preprocess.parse.spec_values import decode_float, hash_string, is_missing

# Roles per field, and decoders (kind) per field.
IGNORE, LABEL, DENSE, CATEGORICAL, LIST = 0, 1, 2, 3, 4
HEX, INTEGER, STRING = 0, 1, 2  # categorical and list kinds
INT, FLOAT = 0, 1  # dense kinds
BINARY, THRESHOLD, MAPPING = 0, 1, 2  # label modes
# Reason codes as in parse.REASONS (the Criteo parser's six, then the spec parser's own).
(
    EMPTY_ROW,
    TOO_MANY_FIELDS,
    TOO_FEW_FIELDS,
    BAD_LABEL,
    BAD_INTEGER,
    BAD_HEX,
    BAD_FLOAT,
    BAD_QUOTE,
    SIDE_LENGTH,
) = range(9)
KEEP_LAST, RAW = 1, 2  # list field flags: a sequence keeps its last values; integers as written


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def categorical_value(buf, s, e, kind, escaped):
    """(value, reason) of one non-empty categorical value; reason -1 when it decodes. The Parquet
    reader's string values go through it too (parquet_kernel)."""
    if kind == STRING:
        return hash_string(buf, s, e, escaped), -1
    if kind == HEX:
        if e - s == 8:  # the usual width: one 64-bit word, not a branch per digit (~37 -> ~5 ns)
            v, ok = hex8_swar(buf, s)
            if ok:
                return v, -1
        v, ok = decode_hex(buf, s, e)  # and where the word is not 8 hex digits, which decide
        return v, (-1 if ok else BAD_HEX)
    v, ok = decode_id(buf, s, e)
    return np.uint64(v), (-1 if ok else BAD_INTEGER)


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _label(buf, s, e, escaped, mode, threshold, keys, values, point):
    """(label, ok) of a non-empty label field."""
    if mode == BINARY:
        v, ok = decode_int(buf, s, e)
        if not ok:
            v, ok = whole_int(buf, s, e)
        return np.uint8(v), ok and (v == 0 or v == 1)
    if mode == THRESHOLD:
        x, ok = decode_float(buf, s, e, point)
        return np.uint8(x >= threshold), ok
    h = hash_string(buf, s, e, escaped)
    for k in range(len(keys)):
        if keys[k] == h:
            return values[k], True
    return np.uint8(0), False


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _list_value(buf, a, b, kind, escaped, raw):
    """(value, reason) of the non-empty list value buf[a:b]; raw: an integer kept as written (a
    negative one is bad_integer)."""
    if raw:
        w, ok = decode_int(buf, a, b)
        if not ok:
            w, ok = whole_int(buf, a, b)
        good = ok and w >= 0
        return (np.uint64(w) if good else np.uint64(0)), (-1 if good else BAD_INTEGER)
    return categorical_value(buf, a, b, kind, escaped)


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _list(buf, s, e, kind, sep, max_length, escaped, out, pos, keep_last, raw, words, starts):
    """Append a list field's first (keep_last: last) max_length values to out[pos:], an empty one
    and a word for a missing value (words, starts: is_missing's) skipped; (count, reason, values in
    the field, positions in it: its values and the skipped ones)."""
    skip, total = 0, 0
    if keep_last:
        a = s
        while a <= e:
            b = a
            while b < e and buf[b] != sep:
                b += 1
            if b > a and not is_missing(buf, a, b, words, starts):
                total += 1
            a = b + 1
        skip = max(0, total - max_length)
    count, reason, a, seen, slots = 0, -1, s, 0, 0
    while a <= e:
        b = a
        while b < e and buf[b] != sep:
            b += 1
        slots += 1
        if b > a and not is_missing(buf, a, b, words, starts):
            if seen >= skip and count < max_length:
                if pos + count >= len(out):  # the caller's bound fell short
                    return count, -2, seen, slots
                v, r = _list_value(buf, a, b, kind, escaped, raw)
                out[pos + count] = v
                count += 1
                if r >= 0 and reason < 0:
                    reason = r
            seen += 1
        a = b + 1
    return count, reason, seen, slots


@njit(cache=True, nogil=True, boundscheck=False)
def _side_list(buf, s, e, ps, pe, sep, psep, kind, skip, escaped, out, pos, raw, words, starts):
    """_list for a side sequence whose primary buf[ps:pe] (separator psep) skipped a value: the
    side's value at each position the primary skipped is dropped with it (read all the same: a
    bad one is the row's reason), and the others from the skip-th on appended to out[pos:];
    (count, reason): side_length where the primary has a value and the side none, or either has
    more positions."""
    count, reason, a, pa, seen = 0, -1, s, ps, 0
    while a <= e and pa <= pe:
        b, pb = a, pa
        while b < e and buf[b] != sep:
            b += 1
        while pb < pe and buf[pb] != psep:
            pb += 1
        if pb > pa and not is_missing(buf, pa, pb, words, starts):
            if b == a or is_missing(buf, a, b, words, starts):
                return count, SIDE_LENGTH
            if seen >= skip:
                if pos + count >= len(out):  # the caller's bound fell short
                    return count, -2
                v, r = _list_value(buf, a, b, kind, escaped, raw)
                out[pos + count] = v
                count += 1
                if r >= 0 and reason < 0:
                    reason = r
            seen += 1
        elif b > a and not is_missing(buf, a, b, words, starts):
            # Dropped with its item, but read: a value the side cannot hold is a malformed row
            # beside a missing item as beside a present one.
            _, r = _list_value(buf, a, b, kind, escaped, raw)
            if r >= 0 and reason < 0:
                reason = r
        a, pa = b + 1, pb + 1
    return count, (SIDE_LENGTH if a <= e or pa <= pe else reason)


@njit(cache=True, nogil=True)
def _fields_of(role, kind, r, kd):
    """Field indexes of role r and kind kd (any kind for -1), in order."""
    out, n = np.empty(len(role), np.int64), 0
    for f in range(len(role)):
        if role[f] == r and (kd < 0 or kind[f] == kd):
            out[n], n = f, n + 1
    return out[:n]


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _short_int(buf, s, e):
    """(value, ok) of the integer buf[s:e] (non-empty), as parse_kernel.decode_int reads it; 1-7
    digits decoded as one 64-bit word (int_swar), anything else by decode_int."""
    neg = buf[s] == 45
    d = s + 1 if neg else s
    if 0 < e - d < 8 and d + 8 <= len(buf):
        v, m = int_swar(buf, d)
        if m == e - d:
            return (-v if neg else v), True
    return decode_int(buf, s, e)


@njit(cache=True, nogil=True, boundscheck=False)
def parse_spec_rows(
    buf, delim, quoting, point, nmin, role, slot, kind, seps, max_lengths, label_field, label_mode, threshold,
    keys, values, labels, dense, dmiss, sparse, smiss, lvalues, lstart, llen, ltotal, reason, bad_field, row_start,
    row_end, flags, primary, still_open, words, starts,
):  # fmt: skip
    """Fill the per-row arrays (sized to the newlines in buf) and the flat list values; returns
    (rows, list values written, whether the last line leaves a quote open). role/slot/kind/seps/
    max_lengths hold one entry per field index, and so do flags (KEEP_LAST: a sequence keeps its
    last values; RAW: integers kept as written) and primary (a side sequence's primary field, -1
    for others: both have as many positions, the side a value at each the primary has one).
    still_open: the text before buf (an earlier piece of the same text) left a quote open, so
    buf's first lines are inside that field. words, starts: the words for a missing value
    (is_missing), read as an empty field and an empty list value.
    ltotal: beside llen (the values kept), the values each row's list field holds: more than its
    max_length is a list cut (TaskResult.lists_cut).

    Each row is cut into its fields first (start, end, escaped: a few entries that stay in L1),
    then decoded one kind of column at a time: a loop over the integer columns, one over the hex,
    one over the hashed strings, each without the branches of the others (one loop over every
    field with all of them inside ran at a third of the speed); labels, floats and lists share one.
    """
    n, nf, row, i, pos = len(buf), len(role), 0, 0, 0
    ints, hexes = _fields_of(role, kind, DENSE, INT), _fields_of(role, kind, CATEGORICAL, HEX)
    int_ids, strings = (
        _fields_of(role, kind, CATEGORICAL, INTEGER),
        _fields_of(role, kind, CATEGORICAL, STRING),
    )
    floats, lists = _fields_of(role, kind, DENSE, FLOAT), _fields_of(role, kind, LIST, -1)
    sides = lists[primary[lists] >= 0]  # decoded after every primary (which they follow)
    others = np.sort(np.concatenate((np.array([label_field]), floats, lists[primary[lists] < 0])))
    others = np.concatenate((others, sides))
    fs, fe, fx = np.zeros(nf, np.int64), np.zeros(nf, np.int64), np.zeros(nf, np.bool_)
    totals, slots = np.zeros(nf, np.int64), np.zeros(nf, np.int64)
    given = len(starts) > 1
    while i < n:
        row_start[row] = i
        ur = np.uint64(row)
        f, a, quote_bad = 0, i, -1
        inside = still_open  # the line is in that field: no row of its own, malformed at field nf
        if inside:
            j, odd = line_end(buf, i)
            still_open, quote_bad = not odd, nf
        while not inside:  # the row's fields; one with a bad quote is no value (row malformed)
            s, e, j, escaped, qbad = scan_field(buf, a, delim, quoting)
            if qbad and quote_bad < 0:
                quote_bad = f
            still_open = qbad and e == j  # its quote not closed at the newline
            if f < nf:
                fs[f], fe[f], fx[f] = s, (s if qbad else e), escaped
                if given and is_missing(buf, s, e, words, starts):
                    fe[f] = s  # read as an empty field: missing
            f += 1
            if buf[j] == 10:
                break
            a = j + 1
        for g in range(f, nf):  # the fields a short row lacks are missing (right-padding)
            fs[g], fe[g] = 0, 0
        label_ok, first_bad, code = False, nf, -1
        for t in range(len(others)):
            g = others[t]
            s, e, r, k, bad = (
                fs[g],
                fe[g],
                role[g],
                np.uint64(slot[g]),
                -1,
            )  # unsigned: no negative-index fix-ups
            if r == LABEL:
                if e > s:
                    labels[row], label_ok = _label(
                        buf, s, e, fx[g], label_mode, threshold, keys, values, point
                    )
            elif r == DENSE:
                dmiss[ur, k] = e == s
                x, ok = (0.0, True) if e == s else decode_float(buf, s, e, point)
                dense[ur, k] = x
                bad = -1 if ok else BAD_FLOAT
            else:
                lstart[ur, k], p = pos, primary[g]
                if p < 0 or totals[p] == slots[p]:
                    cnt, bad, totals[g], slots[g] = _list(
                        buf, s, e, kind[g], seps[g], max_lengths[g], fx[g], lvalues, pos,
                        flags[g] & KEEP_LAST, flags[g] & RAW, words, starts,
                    )  # fmt: skip
                else:  # a side whose primary skipped a value: its positions kept in step
                    cnt, bad = _side_list(
                        buf, s, e, fs[p], fe[p], seps[g], seps[p], kind[g],
                        max(0, totals[p] - max_lengths[g]), fx[g], lvalues, pos, flags[g] & RAW,
                        words, starts,
                    )  # fmt: skip
                    totals[g], slots[g] = totals[p], slots[p]
                if bad == -2:
                    return row, -1, still_open
                llen[ur, k], ltotal[ur, k] = cnt, totals[g]
                pos += cnt
            if bad >= 0 and g < first_bad:
                first_bad, code = g, bad
        for t in range(len(sides)):  # a side sequence has a value where its primary has one
            g, p = sides[t], primary[sides[t]]
            if (totals[g] != totals[p] or slots[g] != slots[p]) and g < first_bad:
                first_bad, code = g, SIDE_LENGTH
        for t in range(len(ints)):
            g = ints[t]
            s, e, k = fs[g], fe[g], np.uint64(slot[g])
            v, ok = _short_int(buf, s, e) if e > s else (0, True)
            if not ok:  # `15.00`: a whole number with a fraction of zeros (rare)
                v, ok = whole_int(buf, s, e)
            dense[ur, k], dmiss[ur, k] = float(v), e == s
            if not ok and g < first_bad:
                first_bad, code = g, BAD_INTEGER
        for t in range(len(hexes)):
            g = hexes[t]
            s, e, k = fs[g], fe[g], np.uint64(slot[g])
            h, ok = np.uint64(0), True
            if e - s == 8:  # the usual width: one 64-bit word (ends at or before the newline)
                h, ok = hex8_swar(buf, s)
            if e > s and (e - s != 8 or not ok):
                h, ok = decode_hex(buf, s, e)
            sparse[ur, k], smiss[ur, k] = h, e == s
            if not ok and g < first_bad:
                first_bad, code = g, BAD_HEX
        wide = len(int_ids)  # the first integer id decode_int refused: one past int64, or bad
        for t in range(len(int_ids)):
            g = int_ids[t]
            s, e, k = fs[g], fe[g], np.uint64(slot[g])
            v, ok = _short_int(buf, s, e) if e > s else (0, True)
            sparse[ur, k], smiss[ur, k] = np.uint64(v), e == s
            if not ok and wide == len(int_ids):
                wide = t
        # Those from it on again by decode_id, outside that loop: a call of it inside the loop made
        # the parse of a spec of integer ids ~6% slower, every id within int64 as they mostly are.
        for t in range(wide, len(int_ids)):
            g = int_ids[t]
            s, e, k = fs[g], fe[g], np.uint64(slot[g])
            if e > s:
                v, ok = decode_id(buf, s, e)
                sparse[ur, k] = np.uint64(v)
                if not ok and g < first_bad:
                    first_bad, code = g, BAD_INTEGER
        for t in range(len(strings)):
            g = strings[t]
            s, e, k = fs[g], fe[g], np.uint64(slot[g])
            sparse[ur, k], smiss[ur, k] = (
                (hash_string(buf, s, e, fx[g]) if e > s else np.uint64(0)),
                e == s,
            )
        row_end[row] = j
        empty = j == i or (j - i == 1 and buf[i] == 13)
        reason[row], bad_field[row] = _row_reason(
            empty,
            quote_bad,
            f > nf,
            f < nmin,
            f,
            label_ok,
            label_field,
            first_bad if code >= 0 else -1,
            code,
            nf,
        )
        if reason[row] >= 0:
            labels[row] = 0
        row += 1
        i = j + 1
    return row, pos, still_open


@njit(cache=True, nogil=True, inline="always")
def _row_reason(
    empty, quote_bad, too_many, too_few, fields, label_ok, label_field, first_bad, code, nf
):
    """(reason, first bad field) of a row, (-1, -1) for a good one; the order of parse.REASONS but
    for a quote, which comes first (the fields after it cannot be counted)."""
    if empty:
        return EMPTY_ROW, -1
    if quote_bad >= 0:
        return BAD_QUOTE, quote_bad
    if too_many:
        return TOO_MANY_FIELDS, nf
    if too_few:
        return TOO_FEW_FIELDS, fields
    if not label_ok:
        return BAD_LABEL, label_field
    if first_bad >= 0:
        return code, first_bad
    return -1, -1
