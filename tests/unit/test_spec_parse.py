"""The feature-spec parser (spec_kernel, spec_program, spec_parse) against plain Python (the csv module, int(),
float(), ids.hash_bytes) on random rows with quoted commas and quotes, lists, integer ids from -2^63
to 2^64 - 1, floats and missing values; how a spec is matched to a file's fields; and Criteo's shape found."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    IgnoredColumn,
    LabelColumn,
    ListColumn,
    SpecError,
    criteo_spec,
)
from shardrec.dataloader.spec.text_format import TextFormat
from shardrec.tools.preprocess.ids.id_maps import hash_bytes, hash_ids
from shardrec.tools.preprocess.parse.criteo_text import REASONS, Schema, transform_dense
from shardrec.tools.preprocess.parse.spec_parse import describe_bad_spec_row, parse_spec_chunk
from shardrec.tools.preprocess.parse.spec_program import criteo_schema, resolve_program
from shardrec.tools.preprocess.parts import column_kernels
from shardrec.tools.preprocess.parts.part_columns import PartColumns, append_spec_rows, list_groups

SPEC = FeatureSpec(
    TextFormat("csv", header=True),
    (
        IgnoredColumn("id"),
        LabelColumn("rating", threshold=4),
        CategoricalColumn("user", kind="integer"),
        CategoricalColumn("site", kind="hex"),
        DenseColumn("count"),
        DenseColumn("price", type="float", transform="none"),
        CategoricalColumn("title"),
        ListColumn("genres", max_length=3, pooling="mean"),
        ListColumn("codes", kind="integer", separator=";"),
    ),
)
HEADER = [c.name for c in SPEC.columns]
WORDS = ["Comedy", "Drama", "Sci-Fi", "Film-Noir", 'say "hi"', "a, b", "Ünïcode", "x" * 20]


_EDGES = [-(2**63), -1, 0, 2**63 - 1, 2**63, 2**64 - 1]


def _integer_id(rng: np.random.Generator) -> str:
    """An integer id of any of int64's and uint64's values: small, 19 digits, past int64, an edge."""
    kind = rng.integers(0, 4)
    if kind == 0:
        return str(_EDGES[rng.integers(0, len(_EDGES))])
    if kind == 1:
        return str(rng.integers(-5, 10**12))
    if kind == 2:
        return str(rng.integers(2**63, 2**64 - 1, dtype=np.uint64, endpoint=True))
    return str(rng.integers(-(2**63), 2**63 - 1, endpoint=True))


def _random_rows(rng: np.random.Generator, n: int) -> list[list[str]]:
    rows = []
    for i in range(n):
        rows.append(
            [
                str(10**19 + i),
                str(rng.integers(1, 6)),
                _integer_id(rng) if rng.random() > 0.1 else "",
                f"{rng.integers(0, 2**32):08x}" if rng.random() > 0.1 else "",
                str(rng.integers(-3, 1000)) if rng.random() > 0.2 else "",
                f"{rng.normal(0, 100):.{rng.integers(0, 6)}f}" if rng.random() > 0.2 else "",
                str(rng.choice(WORDS)) if rng.random() > 0.1 else "",
                "|".join(rng.choice(WORDS, rng.integers(0, 5))),
                ";".join(_integer_id(rng) for _ in range(rng.integers(0, 4))),
            ]
        )
    return rows


def _csv(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def _value(text: str, kind: str) -> int:
    if kind == "string":
        return hash_bytes(text.encode())
    return int(text, 16) if kind == "hex" else int(text) & (2**64 - 1)


def test_the_compiled_parser_reads_what_python_reads() -> None:
    rows = _random_rows(np.random.default_rng(3), 400)
    program = resolve_program(SPEC, HEADER, "x.csv")
    chunk = parse_spec_chunk(_csv(rows), program)
    assert chunk.ok.all()
    one_hot = [c for c in SPEC.sparse if not isinstance(c, ListColumn)]
    for r, row in enumerate(rows):
        field = dict(zip(HEADER, row))
        assert chunk.labels[r] == (int(field["rating"]) >= 4)
        for d, column in enumerate(SPEC.dense):
            text = field[column.name]
            assert chunk.dense_missing[r, d] == (text == "")
            assert chunk.dense[r, d] == (float(text) if text else 0.0)
        for s, column in enumerate(one_hot):
            text = field[column.name]
            assert chunk.sparse_missing[r, s] == (text == "")
            assert int(chunk.sparse[r, s]) == (_value(text, column.kind) if text else 0)
        for c, column in enumerate(SPEC.lists):
            want = [_value(v, column.kind) for v in field[column.name].split(column.separator) if v]
            start, length = chunk.list_start[r, c], chunk.list_len[r, c]
            assert chunk.list_values[start : start + length].tolist() == want[: column.max_length]


def test_list_ids_are_hashed_as_one_hot_ids_are() -> None:
    rows = _random_rows(np.random.default_rng(4), 200)
    chunk = parse_spec_chunk(_csv(rows), resolve_program(SPEC, HEADER, "x.csv"))
    keep = np.arange(0, 200, 3)
    total = int(chunk.list_len[keep, 0].sum())
    out, offsets = np.empty(total, np.uint64), np.zeros(len(keep) + 1, np.int64)
    column_kernels.hash_lists_into(
        chunk.list_values, chunk.list_start, chunk.list_len, 0, keep, 97, out, offsets, 0, 0
    )
    values = np.concatenate(
        [
            chunk.list_values[s : s + n]
            for s, n in zip(chunk.list_start[keep, 0], chunk.list_len[keep, 0])
        ]
    )
    assert out.tolist() == hash_ids(values, np.zeros(total, bool), 97).tolist()
    assert offsets.tolist() == [0, *np.cumsum(chunk.list_len[keep, 0]).tolist()]


DENSE_TEXT = [
    "",
    "0",
    "-0",
    "1",
    "7",
    "-1",
    "-3",
    "-4",
    "131071",
    "131072",
    "-131072",
    "10000000000000",
]
DENSE_TEXT += ["0.5", "-0.0", "2.0", "-2.5", "1e300", "3.0e2", "-1e-300"]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # 1e300 as it is, in float16
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_dense_columns_get_transform_denses_bytes(dtype: str) -> None:
    """Looked-up log1p values (small integers) and the others (floats, large, negative, missing)
    have the bytes transform_dense gives, for every transform, in either stored dtype."""
    transforms = ("log1p", "signed-log1p", "shift-log1p", "none")
    dense = [
        DenseColumn(f"{t}-{k}", type=k, transform=t) for t in transforms for k in ("int", "float")
    ]
    spec = FeatureSpec(
        TextFormat("tsv"), (LabelColumn("y"), *dense, CategoricalColumn("c", hash_size=10))
    )
    rng = np.random.default_rng(5)
    lines = []
    for _ in range(3000):
        ints = [str(v) for v in rng.choice([*rng.integers(-9, 140000, 4), *DENSE_TEXT[:12]], 4)]
        floats = [
            str(v)
            for v in rng.choice([*rng.normal(0, 1e5, 3).round(rng.integers(0, 3)), *DENSE_TEXT], 4)
        ]
        values = [v for pair in zip(ints, floats) for v in pair]
        lines.append("\t".join(["1", *values, "x"]) + "\n")
    program = resolve_program(spec, None, "x.tsv")
    chunk = parse_spec_chunk("".join(lines).encode(), program)
    assert chunk.ok.all()
    rows = np.flatnonzero(rng.random(chunk.rows) < 0.9)
    groups, lists = list_groups(program, (10,))
    cols = PartColumns(len(rows), len(dense), dtype, groups, lists)
    append_spec_rows(cols, chunk, rows, program, dtype, (10,), None)
    want = [transform_dense(chunk.dense[rows, d], chunk.dense_missing[rows, d], c.transform, dtype) for d, c in
            enumerate(dense)]  # fmt: skip
    assert cols.dense[: len(rows)].tobytes() == np.stack(want, axis=1).tobytes()


@pytest.mark.parametrize(
    ("line", "reason", "column", "value"),
    [
        (
            '1,4,7,0000000a,1,2.5,"unclosed,a|b,1',
            "bad_quote",
            "title",
            "'\"unclosed,a|b,1' (its quote is not closed on the line: a line break inside quotes "
            "is not read)",
        ),
        ('1,4,7,0000000a,1,2.5,"t"x,a|b,1', "bad_quote", "title", """'"t"x,a|b,1'"""),
        ("1,four,7,0000000a,1,2.5,t,a|b,1", "bad_label", "rating", "'four'"),
        (
            ",4,7,0000000a,1,2.5,t,a|b,1,extra",
            "too_many_fields",
            "row",
            "10 fields, the spec has 9",
        ),
        ("1,4,7", "too_few_fields", "row", "3 fields, the spec needs at least 9 of 9"),
        ("1,4,7x,0000000a,1,2.5,t,a|b,1", "bad_integer", "user", "'7x'"),
        (
            "1,4,18446744073709551616,0000000a,1,2.5,t,a|b,1",
            "bad_integer",
            "user",
            "'18446744073709551616'",
        ),
        ("1,4,-9223372036854775809,0000000g,1,2.5,t,a|b,1", "bad_integer", "user", "'-9223"),
        ("1,4,18446744073709551615,0000000g,1,2.5,t,a|b,1", "bad_hex", "site", "'0000000g'"),
        (
            "1,4,1,0000000a,1,2.5,t,a|b,18446744073709551615;18446744073709551616",
            "bad_integer",
            "codes",
            "'18446744073709551615;18446744073709551616'",
        ),  # fmt: skip
        ("1,4,7,0000000g,1,2.5,t,a|b,1", "bad_hex", "site", "'0000000g'"),
        ("1,4,7,0000000a,1,2.5e,t,a|b,1", "bad_float", "price", "'2.5e'"),
        ("1,4,7,0000000a,1,2.5,t,a|b,1;x", "bad_integer", "codes", "'1;x'"),
        ("", "empty_row", "row", "(empty line)"),
    ],
)
def test_a_bad_row_names_its_column_and_value(
    line: str, reason: str, column: str, value: str
) -> None:
    data = f"{line}\n".encode()
    program = resolve_program(SPEC, HEADER, "x.csv")
    chunk = parse_spec_chunk(data, program)
    assert REASONS[chunk.reason[0]] == reason
    name, shown = describe_bad_spec_row(data, chunk, 0, program)
    assert name == column and shown.startswith(value)


def test_the_lines_of_a_quoted_field_with_line_breaks_are_no_rows() -> None:
    # The field's second and third lines parse as rows of the spec's 9 fields: kept, they were
    # rows the file does not hold; `"a ""x"" ` keeps the quote open (two quotes), `b"` closes it.
    good = "1,4,7,0000000a,1,2.5,t,a|b,1"
    data = f'{good}\n1,4,7,0000000a,1,2.5,"a\n0,5,8,0000000b,2,3.5,a ""x"" ,c,2\n1,4,9,0000000c,3,4.5,b",x,3\n{good}\n'
    program = resolve_program(SPEC, HEADER, "x.csv")
    chunk = parse_spec_chunk(data.encode(), program)
    reasons = [REASONS[r] if r >= 0 else "ok" for r in chunk.reason]
    assert reasons == ["ok", "bad_quote", "bad_quote", "bad_quote", "ok"]
    assert describe_bad_spec_row(data.encode(), chunk, 2, program) == (
        "row",
        """'0,5,8,0000000b,2,3.5,a ""x"" ,c,2' (a line before it left a quote open: a line """
        "break inside quotes is not read)",
    )


def test_labels_by_mapping_and_a_crlf_line_end() -> None:
    spec = FeatureSpec(
        TextFormat("tsv"), (LabelColumn("y", mapping={"yes": 1, "no": 0}), CategoricalColumn("c"))
    )
    data = b"yes\tred\r\nno\tblue\nmaybe\tred\n"
    chunk = parse_spec_chunk(data, resolve_program(spec, None, "x.tsv"))
    assert chunk.labels[:2].tolist() == [1, 0] and [REASONS[r] for r in chunk.reason[2:]] == [
        "bad_label"
    ]
    assert int(chunk.sparse[0, 0]) == hash_bytes(b"red")  # the '\r' is no part of the value


def test_columns_are_found_by_header_name_position_or_place() -> None:
    shuffled = HEADER[::-1]
    program = resolve_program(SPEC, shuffled, "x.csv")
    assert program.names == tuple(shuffled) and program.label_field == shuffled.index("rating")
    by_position = FeatureSpec(
        TextFormat("tsv"), (CategoricalColumn("b", position=1), LabelColumn("a", position=0))
    )
    assert resolve_program(by_position, None, "x.tsv").names == ("a", "b")


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            [*HEADER[:2], "usr", *HEADER[3:]],
            r"x.csv: the header has no column 'user' that s.toml names; did you mean usr\?",
        ),
        (
            [*HEADER, "extra"],
            r"x.csv: column 'extra' is in no \[\[columns\]\] of s.toml; add it with role = \"ignore\"",
        ),
        (  # before: "column 'price' is in no [[columns]] of s.toml; add it with role = "ignore"",
            # which a spec cannot (its names are unique)
            [*HEADER, "price"],
            r"x.csv: the header names 'price' 2 times \(fields 5, 9; 0 is the first\): give "
            r"'price' in s.toml the position of the field it reads, and each other one a "
            r"\[\[columns\]\] of its own with its position \(role = \"ignore\" to skip it\), as "
            r"`spec infer` does$",
        ),
    ],
)
def test_a_spec_that_does_not_fit_the_header_is_one_line(header: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        resolve_program(SPEC, header, "x.csv", "s.toml")


def test_criteos_shape_goes_to_criteos_parser() -> None:
    program = resolve_program(criteo_spec(), None, "day_0")
    assert criteo_schema(program) == (Schema(), "log1p")
    assert criteo_schema(resolve_program(SPEC, HEADER, "x.csv")) is None
    quoted = FeatureSpec(TextFormat("csv"), criteo_spec(2, 2).columns)
    assert criteo_schema(resolve_program(quoted, None, "x.csv")) is None


def test_whole_numbers_with_any_count_of_zero_decimals_read_as_integers() -> None:
    # pandas and CSV writers give an integer as 66740.0 or 66740.00 (a column with nulls): both
    # are the integer in an id, a dense int, a list's id and a label; a non-zero fraction is not.
    program = resolve_program(SPEC, HEADER, "x.csv")
    plain = parse_spec_chunk(b"1,4,66740,0000000a,15,2.5,t,a,1;-2\n", program)
    zeros = parse_spec_chunk(b"1,4.00,66740.00,0000000a,15.000,2.5,t,a,1.00;-2.0\n", program)
    assert plain.ok.all() and zeros.ok.all(), [REASONS[r] for r in zeros.reason if r >= 0]
    for name in ("labels", "sparse", "dense", "list_values", "list_len"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(zeros, name), err_msg=name)
    bad = parse_spec_chunk(b"1,4,66740.50,0000000a,15,2.5,t,a,1\n", program)
    assert REASONS[bad.reason[0]] == "bad_integer"
    assert describe_bad_spec_row(b"1,4,66740.50,0000000a,15,2.5,t,a,1\n", bad, 0, program)[0] == (
        "user"
    )
