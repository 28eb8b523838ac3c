"""Field values of feature-spec text, compiled (numba): a string's 64-bit hash and a decimal number.

String hashing, `hash_string` (id_maps.hash_bytes is the same function in Python): the bytes in
words of 8 (big-endian, the last one shorter), h = mix64(h ^ word) from h = 0, then
mix64(h ^ length), mix64 being ids/id_maps.py's splitmix64 finalizer; ids then come from that
value exactly as from a hex one (1 + mix64(value) mod (rows - 1)).

A word for a missing value (`[format] missing`, such as `NA`), `is_missing`: a field of its bytes;
`missing_hint`: what a malformed row's message adds where a number is such a word the key lacks
(dataloader.spec.missing_words, as an event log's refusal adds it).
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.spec.missing_words import missing_word_hint
from shardrec.dataloader.util.jit import njit
from shardrec.dataloader.util.splitmix import mix64_scalar

_S8 = np.uint64(8)
_POW10 = np.array([10.0**k for k in range(23)])


@njit(cache=True, nogil=True, boundscheck=False)
def hash_string(buf, s, e, escaped):
    """The value of bytes buf[s:e]; with `escaped`, each `""` counts as one `"` (a quoted CSV
    field)."""
    if escaped:
        return _hash_escaped(buf, s, e)
    h, k = np.uint64(0), s
    while k + 8 <= e:  # whole words: eight loads LLVM folds into one load and a byte swap
        w = np.uint64(0)
        p = np.uint64(k)  # unsigned: no negative-index fix-ups between the loads
        for t in range(8):
            w = (w << _S8) | np.uint64(buf[p + np.uint64(t)])
        h, k = mix64_scalar(h ^ w), k + 8
    if k < e:
        w = np.uint64(0)
        while k < e:
            w, k = (w << _S8) | np.uint64(buf[k]), k + 1
        h = mix64_scalar(h ^ w)
    return mix64_scalar(h ^ np.uint64(e - s))


@njit(cache=True, nogil=True, boundscheck=False)
def _hash_escaped(buf, s, e):
    """hash_string of a quoted field's value in which each `""` stands for one `"`."""
    h, w, nb, total = np.uint64(0), np.uint64(0), 0, 0
    k = s
    while k < e:
        c = buf[k]
        k += 1
        if c == 34 and k < e and buf[k] == 34:
            k += 1
        w = (w << _S8) | np.uint64(c)
        nb += 1
        total += 1
        if nb == 8:
            h, w, nb = mix64_scalar(h ^ w), np.uint64(0), 0
    if nb:
        h = mix64_scalar(h ^ w)
    return mix64_scalar(h ^ np.uint64(total))


@njit(cache=True, nogil=True, boundscheck=False)
def decode_float(buf, s, e, point):
    """(value, ok) of a decimal number: sign, digits, the decimal point (the byte `point`: '.', or
    ',' for a spec's `decimal = ","`), digits, exponent. Correctly rounded for up to 15
    significant digits and exponents within +-22 (Clinger's fast path); else within an ulp."""
    i, neg = s, False
    if i < e and (buf[i] == 45 or buf[i] == 43):
        neg, i = buf[i] == 45, i + 1
    mant, digits, exp10, seen = np.int64(0), 0, 0, False
    while i < e and 48 <= buf[i] <= 57:
        if digits < 18:
            mant = mant * 10 + (buf[i] - 48)
            digits += mant > 0
        else:
            exp10 += 1
        seen, i = True, i + 1
    if i < e and buf[i] == point:
        i += 1
        while i < e and 48 <= buf[i] <= 57:
            if digits < 18:
                mant = mant * 10 + (buf[i] - 48)
                digits += mant > 0
                exp10 -= 1
            seen, i = True, i + 1
    if not seen:
        return 0.0, False
    if i < e and (buf[i] == 101 or buf[i] == 69):
        i += 1
        eneg = i < e and buf[i] == 45
        if i < e and (buf[i] == 45 or buf[i] == 43):
            i += 1
        if i >= e:
            return 0.0, False
        ev = 0
        while i < e and 48 <= buf[i] <= 57:
            ev = min(ev * 10 + (buf[i] - 48), 100000)
            i += 1
        exp10 += -ev if eneg else ev
    if i != e:
        return 0.0, False
    v = float(mant)
    if mant < (1 << 53) and 0 <= exp10 <= 22:
        v = v * _POW10[exp10]
    elif mant < (1 << 53) and -22 <= exp10 < 0:
        v = v / _POW10[-exp10]
    elif mant != 0:
        v = v * 10.0**exp10
    if v == np.inf:  # a value beyond float64 is no model input
        return 0.0, False
    return (-v if neg else v), True


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def is_missing(buf, s, e, words, starts):
    """Whether buf[s:e] is one of the spec's words for a missing value ([format] missing): word t
    is words[starts[t] : starts[t + 1]] (none: starts holds one 0)."""
    n = e - s
    for t in range(len(starts) - 1):
        a = starts[t]
        if starts[t + 1] - a == n:
            u = 0
            while u < n and buf[s + u] == words[a + u]:
                u += 1
            if u == n:
                return True
    return False


def missing_hint(value: str, reason: str, missing: tuple[str, ...]) -> str:
    """What a number or hex field that does not decode (`reason`) adds to its message where it is
    a word for a missing value that the spec's `missing` lacks: the key that reads it as one."""
    if reason not in ("bad_integer", "bad_float", "bad_hex"):
        return ""
    return missing_word_hint(value, missing)
