"""Row rules of the Criteo text parser, on hand-written rows."""

from __future__ import annotations

import re

import numpy as np
import pytest

from shardrec.tools.preprocess.ids.id_maps import hash_ids
from shardrec.tools.preprocess.parse.criteo_text import (
    REASONS,
    Schema,
    describe_bad_row,
    parse_chunk,
    transform_dense,
)
from shardrec.tools.preprocess.parse.parse_fields import (
    decode_hex,
    decode_hex_generic,
    decode_int,
    decode_int_generic,
)

CRITEO = Schema()


def row(label="1", dense=None, sparse=None, delimiter="\t", strip=0) -> bytes:
    """A 40-field Criteo row; `strip` drops that many trailing fields (they must be empty)."""
    dense = dense if dense is not None else [""] * 13
    sparse = sparse if sparse is not None else [""] * 26
    fields = [label, *dense, *sparse]
    if strip:
        assert all(f == "" for f in fields[-strip:])
        fields = fields[:-strip]
    return (delimiter.join(fields) + "\n").encode()


def test_stripped_trailing_fields_are_right_padded_never_shifted():
    sparse = ["0000000a"] * 24 + ["", ""]
    full = row(dense=[str(i) for i in range(13)], sparse=sparse)
    text = (
        full
        + row(dense=[str(i) for i in range(13)], sparse=sparse, strip=1)
        + row(dense=[str(i) for i in range(13)], sparse=sparse, strip=2)
    )
    assert [len(line.split(b"\t")) for line in text.splitlines()] == [40, 39, 38]
    c = parse_chunk(text, CRITEO)
    assert c.ok.all()
    for r in range(3):
        np.testing.assert_array_equal(c.dense[r], np.arange(13))
        np.testing.assert_array_equal(c.sparse[r, :24], 10)
        assert c.sparse_missing[r].tolist() == [False] * 24 + [True, True]


def test_37_field_row_with_missing_dense_keeps_columns():
    # C24-C26 stripped; reading the row left-aligned is right, any other alignment a shift.
    text = b"0\t1\t\t3" + b"\t" * 11 + b"\t".join([b"deadbeef"] * 23) + b"\n"
    assert len(text.split(b"\t")) == 37
    c = parse_chunk(text, CRITEO)
    assert c.ok.all()
    assert c.dense[0, 0] == 1 and c.dense_missing[0, 1] and c.dense[0, 2] == 3
    assert c.sparse[0, 0] == 0xDEADBEEF and c.sparse[0, 22] == 0xDEADBEEF
    assert c.sparse_missing[0, 23:].all() and not c.sparse_missing[0, :23].any()


def test_negative_integers_and_every_transform_is_finite():
    text = row(
        dense=["-1", "-2", "-3", "0", "7", "-9223372036854775", "999999999999999999"] + [""] * 6
    )
    c = parse_chunk(text, CRITEO)
    assert c.ok.all()
    assert c.dense[0, :7].tolist() == [-1, -2, -3, 0, 7, -9223372036854775, 999999999999999999]
    for how in ("log1p", "signed-log1p", "shift-log1p", "none"):
        out = transform_dense(c.dense, c.dense_missing, how)
        assert np.isfinite(out).all(), how
    default = transform_dense(c.dense, c.dense_missing)
    assert default[0, :5].tolist() == [0.0, 0.0, 0.0, 0.0, pytest.approx(np.log1p(7.0))]
    assert default.dtype == np.float32
    signed = transform_dense(c.dense, c.dense_missing, "signed-log1p")
    assert signed[0, 0] == pytest.approx(-np.log(2.0))


def test_hex_keeps_full_32_bits_and_ids_above_2_pow_24_exactly():
    values = [
        "ffffffff",
        "80000000",
        "01000001",
        "00ffffff",
        "7FFFFFFF",
        "0000000000000001",
        "fedcba9876543210",
    ]
    text = row(sparse=values + [""] * (26 - len(values)))
    c = parse_chunk(text, CRITEO)
    assert c.ok.all()
    assert c.sparse.dtype == np.uint64
    assert c.sparse[0, :7].tolist() == [
        0xFFFFFFFF,
        0x80000000,
        2**24 + 1,
        2**24 - 1,
        0x7FFFFFFF,
        1,
        0xFEDCBA9876543210,
    ]


def test_missing_never_collides_with_zero_value():
    text = row(sparse=["00000000", ""] + [""] * 24)
    c = parse_chunk(text, CRITEO)
    assert c.sparse[0, 0] == 0 and not c.sparse_missing[0, 0]
    assert c.sparse[0, 1] == 0 and c.sparse_missing[0, 1]
    ids = hash_ids(c.sparse[0, :2], c.sparse_missing[0, :2], 1000)
    assert ids[1] == 0 and ids[0] != 0


def test_csv_with_float_integers():
    schema = Schema(delimiter=",", header=True)
    text = row(
        label="1",
        dense=["260.0", "-2.0", "0.0", "", "12"] + [""] * 8,
        sparse=["68fd1e64"] + [""] * 25,
        delimiter=",",
    )
    c = parse_chunk(text, schema)
    assert c.ok.all()
    assert c.dense[0, :5].tolist() == [260, -2, 0, 0, 12] and c.dense_missing[0, 3]
    assert c.sparse[0, 0] == 0x68FD1E64


@pytest.mark.parametrize("engine", ["compiled", "numpy"])
def test_whole_numbers_with_any_count_of_zero_decimals_are_integers(engine):
    # pandas and CSV writers give 66740 as 66740.0 or 66740.00: both are the integer, and a
    # fraction that is not zero stays refused (bad_integer).
    dense = ["66740.00", "-2.000", "0.00", "1.0", "5.000000"] + [""] * 8
    c = parse_chunk(row(dense=dense), CRITEO, engine=engine)
    assert c.ok.all(), [REASONS[r] for r in c.reason if r >= 0]
    assert c.dense[0, :5].tolist() == [66740, -2, 0, 1, 5]
    for bad in ("1.50", "1.05", ".00", "-.0", "1.0.0"):
        c = parse_chunk(row(dense=[bad] + [""] * 12), CRITEO, engine=engine)
        assert REASONS[c.reason[0]] == "bad_integer", bad


def test_crlf_line_endings():
    c = parse_chunk(
        row(sparse=[""] * 25 + ["0000abcd"]).replace(b"\n", b"\r\n")
        + row(strip=3).replace(b"\n", b"\r\n"),
        CRITEO,
    )
    assert c.ok.all()
    assert c.sparse[0, 25] == 0xABCD and c.sparse_missing[1].all()


@pytest.mark.parametrize(
    "text, reason, field, value",
    [
        (
            row(sparse=["a"] * 26)[:-1] + b"\textra\n",
            "too_many_fields",
            "row",
            "41 fields, schema has 40",
        ),
        (row(label="2"), "bad_label", "label", "'2'"),
        (row(label=""), "bad_label", "label", "''"),
        (row(dense=["12x"] + [""] * 12), "bad_integer", "I1", "'12x'"),
        (row(dense=["", "1.5"] + [""] * 11), "bad_integer", "I2", "'1.5'"),
        (row(dense=["-"] + [""] * 12), "bad_integer", "I1", "'-'"),
        (row(sparse=["", "", "zzzzzzzz"] + [""] * 23), "bad_hex", "C3", "'zzzzzzzz'"),
        (row(sparse=["12345678123456789"] + [""] * 25), "bad_hex", "C1", "'12345678123456789'"),
        (b"\n", "empty_row", "row", "(empty line)"),
        (b"1\t2\n", "too_few_fields", "row", "2 fields, schema needs at least 37 of 40"),
        (row(strip=4), "too_few_fields", "row", "36 fields, schema needs at least 37 of 40"),
        (
            row(label="x", strip=26),
            "too_few_fields",
            "row",
            "14 fields, schema needs at least 37 of 40",
        ),
    ],
)
def test_malformed_rows_are_flagged_with_field_and_value(text, reason, field, value):
    good = row(dense=["1"] * 13, sparse=["00000001"] * 26)
    data = good + text + good
    c = parse_chunk(data, CRITEO)
    assert c.ok.tolist() == [True, False, True]
    assert REASONS[c.reason[1]] == reason
    assert describe_bad_row(data, c, 1, CRITEO) == (field, value)


@pytest.mark.parametrize("engine", ["compiled", "numpy"])
def test_min_fields_bounds_right_padding(engine):
    # Only rows whose trailing empty fields were stripped (37-40 fields) are right-padded.
    text = b"".join(row(strip=k) for k in (0, 1, 2, 3, 4, 26)) + b"1\t2\n"
    c = parse_chunk(text, CRITEO, engine=engine)
    assert c.ok.tolist() == [True] * 4 + [False] * 3
    assert [REASONS[r] for r in c.reason[4:]] == ["too_few_fields"] * 3
    assert c.bad_field[4:].tolist() == [36, 14, 2]
    loose = parse_chunk(text, Schema(min_fields=2), engine=engine)
    assert loose.ok.all() and loose.dense_missing[6, 1:].all() and loose.dense[6, 0] == 2


def test_min_fields_default_and_validation():
    assert CRITEO.min_fields == 37 and Schema(num_dense=1, num_sparse=1).min_fields == 1
    assert Schema(min_fields=40).min_fields == 40
    for bad in (0, 41):
        with pytest.raises(ValueError, match="min_fields"):
            Schema(min_fields=bad)


def _random_fields(rng, n, alphabet, max_len):
    lengths = rng.integers(0, max_len + 1, n)
    chars = np.frombuffer(alphabet, np.uint8)
    return [bytes(rng.choice(chars, k)) for k in lengths]


def test_fast_decoders_agree_with_generic_ones():
    rng = np.random.default_rng(0)
    for alphabet, max_len, fast, slow in (
        (b"0123456789-.", 11, decode_int, decode_int_generic),
        (b"0123456789", 9, decode_int, decode_int_generic),
        (b"0123456789abcdefABCDEFg", 10, decode_hex, decode_hex_generic),
        (b"0123456789abcdef", 8, decode_hex, decode_hex_generic),
    ):
        fields = _random_fields(rng, 3000, alphabet, max_len)
        text = b"\t".join(fields) + b"\n"
        buf = np.frombuffer(text, np.uint8)
        ends = np.cumsum([len(f) + 1 for f in fields]) - 1
        starts = ends - np.array([len(f) for f in fields])
        v1, b1 = fast(buf, starts, ends)
        if fast is decode_int:
            from shardrec.tools.preprocess.parse.parse_fields import strip_point_zero

            ends = strip_point_zero(buf, starts, ends)
        v2, b2 = slow(buf, starts, ends)
        np.testing.assert_array_equal(b1, b2)
        np.testing.assert_array_equal(v1[~b1], v2[~b2])
        # Spot-check against Python's own parsing.
        for f, v, b in zip(fields, v1, b1):
            if not b and f:
                base = 10 if fast is decode_int else 16
                text_value = re.sub(rb"(?<=.)\.0+$", b"", f) if base == 10 else f
                assert int(text_value, base) == int(v)


def _fuzz_text(rng: np.random.Generator, rows: int, schema: Schema) -> bytes:
    pieces = [
        b"0",
        b"1",
        b"",
        b"-3",
        b"260.0",
        b"260.00",
        b"0.000",
        b"7.50",
        b"12",
        b"0000abcd",
        b"ffffffff",
        b"x",
        b"-",
        b"1.5",
        b"123456789012345678901",
        b"0123456789abcdef0",
        b"\r",
        b"AbCd",
        b".0",
        b"2",
        # fmt: skip
        b"0000zbcd",
        b"ABCDEF01",
        b"\xe90000000",
        b"1234567-",
        b"@0000000",
        b"0000000G",
    ]
    lines = []
    for _ in range(rows):
        n = int(rng.integers(0, schema.num_fields + 3))
        fields = [pieces[k] for k in rng.integers(0, len(pieces), n)]
        if rng.random() < 0.6:  # mostly plausible rows, so good rows get compared too
            fields = [b"1"] + [b"7"] * schema.num_dense + [b"00c0ffee"] * schema.num_sparse
            fields = fields[: schema.num_fields - int(rng.integers(0, 4))]
            for k in rng.integers(0, len(fields), int(rng.integers(0, 2))):
                fields[k] = pieces[int(rng.integers(0, len(pieces)))]
        ending = b"\r\n" if rng.random() < 0.1 else b"\n"
        lines.append(schema.delimiter.encode().join(fields) + ending)
    return b"".join(lines)


@pytest.mark.parametrize("delimiter", ["\t", ","])
def test_compiled_and_numpy_parsers_agree_on_random_and_malformed_rows(delimiter):
    schema = Schema(num_dense=3, num_sparse=4, delimiter=delimiter)
    text = _fuzz_text(np.random.default_rng(1), 3000, schema)
    a, b = parse_chunk(text, schema, engine="compiled"), parse_chunk(text, schema, engine="numpy")
    for name in ("reason", "bad_field", "row_start", "row_end"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    ok = a.ok
    assert 0.2 < ok.mean() < 0.9  # both kinds of rows occur
    assert (a.reason == REASONS.index("too_few_fields")).sum() > 100
    for name in ("labels", "dense", "dense_missing", "sparse", "sparse_missing"):
        np.testing.assert_array_equal(getattr(a, name)[ok], getattr(b, name)[ok], err_msg=name)
    for r in np.flatnonzero(~ok)[:50]:
        assert describe_bad_row(text, a, r, schema) == describe_bad_row(text, b, r, schema)


def test_uncompiled_kernel_gives_the_same_rows():
    # The pure-Python body of the kernel is what runs if numba is missing.
    from shardrec.tools.preprocess.parse import parse_kernel

    schema = Schema(num_dense=3, num_sparse=4)
    text = _fuzz_text(np.random.default_rng(2), 200, schema)
    expected = parse_chunk(text, schema, engine="numpy")
    kernel = getattr(parse_kernel.parse_rows, "py_func", parse_kernel.parse_rows)
    buf = np.frombuffer(text, np.uint8)
    rows = expected.rows
    out = [
        np.empty(rows, np.uint8),
        np.empty((rows, 3), np.int64),
        np.empty((rows, 3), bool),
        np.empty((rows, 4), np.uint64),
        np.empty((rows, 4), bool),
        np.empty(rows, np.int8),
        # fmt: skip
        np.empty(rows, np.int16),
        np.empty(rows, np.int64),
        np.empty(rows, np.int64),
    ]
    assert kernel(buf, *parse_kernel.value_tables("\t"), 3, 4, schema.min_fields, *out) == rows
    np.testing.assert_array_equal(out[5], expected.reason)
    ok = expected.ok
    np.testing.assert_array_equal(out[3][ok], expected.sparse[ok])
    np.testing.assert_array_equal(out[1][ok], expected.dense[ok])
