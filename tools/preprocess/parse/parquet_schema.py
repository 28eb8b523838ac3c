"""A Parquet file resolved by a feature spec (`[format] kind = "parquet"`): the file recognised by
its magic bytes, its columns found by name and their Arrow types checked against what each spec
column's role takes (parquet_rows.py's module doc lists them), and the string categoricals read as
dictionaries chosen from its first row group (the module doc there says why)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    LabelColumn,
    ListColumn,
    SpecError,
)
from shardrec.tools.preprocess.parse import spec_kernel as k
from shardrec.tools.preprocess.parse.spec_program import Program, resolve_program

PARQUET_MAGIC = b"PAR1"


def is_parquet(path: Path) -> bool:
    """Whether the file starts with Parquet's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def kind_of(t) -> str:
    """integer, float, bool, string, list-string, list-integer, or the type's own name."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        return "string"
    if pa.types.is_large_binary(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = kind_of(t.value_type)
        return f"list-{inner}" if inner in ("string", "integer") else f"list of {t.value_type}"
    return str(t)


FLOAT_EXACT_BITS = {16: 11, 32: 24, 64: 53}
"""By a float's width, the power of two below which it holds every integer (its significand's
bits): from there on neighbouring integers share one float, so a whole number there may be an id
that was rounded as it became a float (float32 holds 16777217 as 16777216.0)."""


def float_bits(t) -> int | None:
    """The bit width of an Arrow float type (a dictionary's values'; None: not a float)."""
    import pyarrow as pa

    t = t.value_type if pa.types.is_dictionary(t) else t
    return t.bit_width if pa.types.is_floating(t) else None


def float_width(path: Path, name: str) -> int | None:
    """float_bits of a Parquet file's column `name` (None: no such float column, or the file no
    longer reads)."""
    try:
        return float_bits(read_parquet_schema(path).field(name).type)
    except (SpecError, KeyError):
        return None


_NUMBERS = "integers, floats or booleans"
ID_KINDS = {"integer", "float"}
"""The Arrow kinds an integer categorical reads (_allowed)."""


def _ids_of_numbers(c) -> bool:
    """A one-hot categorical of kind integer: read from integers or from floats alike."""
    return (
        isinstance(c, CategoricalColumn) and not isinstance(c, ListColumn) and c.kind == "integer"
    )


def _allowed(c) -> tuple[set[str], str]:
    """(Arrow kinds a spec column takes, in words)."""
    if isinstance(c, LabelColumn):
        if c.mapping:
            return {"string"}, "a string column (its values are the mapping's keys)"
        if c.threshold is not None:
            return {"integer", "float", "bool"}, _NUMBERS
        return {"integer", "float", "bool"}, (
            "0/1 as integers, booleans or floats (a string column wants a mapping of its two "
            'values, such as mapping = { "yes" = 1, "no" = 0 }: `shardrec spec infer` '
            "proposes it)"
        )
    if isinstance(c, DenseColumn):
        return {"integer", "float", "bool"}, _NUMBERS
    if isinstance(c, ListColumn):
        if c.kind == "integer":
            return {"list-integer"}, "a list of integers"
        return {"list-string"}, "a list of strings"
    if isinstance(c, CategoricalColumn):
        if c.kind == "integer":
            return ID_KINDS, (
                'an integer column, or floats of whole numbers (kind = "string" hashes text)'
            )
        return {"string"}, "a string column" + (" of hex digits" if c.kind == "hex" else "")
    return set(), ""


@dataclass(frozen=True, eq=False)
class ParquetProgram:
    """A spec resolved against a Parquet file's columns (picklable: sent to workers)."""

    program: Program
    kinds: tuple[str, ...]
    """Each field's Arrow kind (kind_of)."""
    dictionary: tuple[str, ...] = ()
    """String categoricals read as dictionaries (parquet_rows.py's module doc)."""
    unsigned: tuple[str, ...] = ()
    """Integer columns (lists too) of unsigned 64-bit values: their raw ids are shown unsigned."""
    nulls: tuple[str, ...] = ()
    """Columns of nulls only (Arrow's null type, as pandas writes a column of None): every value
    missing (parquet_rows.read_row_groups casts them to their spec column's type)."""

    def reads_like(self, other: ParquetProgram) -> bool:
        """Whether another file's columns are this one's, of the same kinds (a column of nulls
        only in either takes the other's kind; an integer categorical's ids are the same read
        from integers or from floats, as pandas writes the part of a log that has nulls)."""
        if other.program.names != self.program.names:
            return False
        ids = {c.name for c in self.program.spec.columns if _ids_of_numbers(c)}
        pairs = zip(self.program.names, self.kinds, other.kinds)
        return all(
            a == b or n in self.nulls or n in other.nulls or (n in ids and {a, b} <= ID_KINDS)
            for n, a, b in pairs
        )

    @property
    def columns(self) -> list[str]:
        """The file's columns the spec uses (ignored ones are not read)."""
        return [n for n, r in zip(self.program.names, self.program.role) if r != k.IGNORE]


def read_parquet_schema(path: Path):
    """The file's Arrow schema (SpecError: not a Parquet file pyarrow can read)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except Exception as e:  # pyarrow's ArrowInvalid and OSError: not a Parquet file it can read
        raise SpecError(f"{path}: not a readable Parquet file ({e})") from None


def resolve_parquet(
    spec: FeatureSpec, path: Path, spec_name: str = "the spec", schema=None
) -> ParquetProgram:
    """Each spec column's field in the file, checked against its Arrow type (SpecError names the
    file, the column, its type and what the spec needs). schema: the columns to resolve against
    (default: the file's own)."""
    if schema is None:
        schema = read_parquet_schema(path)
    names = list(schema.names)
    if any(c.position is not None for c in spec.columns):
        raise SpecError(f"{spec_name}: a Parquet file's columns are found by name; remove position")
    program = resolve_program(spec, names, str(path), spec_name)
    kinds = tuple(kind_of(schema.field(n).type) for n in program.names)
    nulls = []
    for c in spec.columns:
        f = program.names.index(c.name)
        want, words = _allowed(c)
        if kinds[f] == "null" and want and not isinstance(c, LabelColumn):
            # Every value missing, as a column of the spec's type with nulls only reads (the same
            # bytes); its kind matches any other file's (ParquetProgram.reads_like).
            nulls.append(c.name)
            continue
        if want and kinds[f] not in want:
            raise SpecError(
                f"{path}: column {c.name!r} is {schema.field(c.name).type} in the Parquet file; "
                f"{spec_name} makes it a {c.role}"
                + (f" of kind {c.kind}" if isinstance(c, CategoricalColumn) else "")
                + f", which needs {words}"
                + (
                    "; cast it to float64 where the file is written"
                    if "decimal" in kinds[f]
                    else ""
                )
            )
    unsigned = tuple(n for n in program.names if _uint64(schema.field(n).type))
    repeating = _repeating(path, spec, nulls)
    return ParquetProgram(program, kinds, repeating, unsigned, tuple(nulls))


def _uint64(t) -> bool:
    """An Arrow uint64 type, or a list or dictionary of it."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return pa.types.is_uint64(t)


def _repeating(path: Path, spec: FeatureSpec, nulls: list[str] | tuple = ()) -> tuple[str, ...]:
    """The string categoricals whose dictionary in the file's first row group holds under a
    quarter of its rows (read as dictionaries: parquet_rows.py's module doc). A column chunk without
    a dictionary page (written plain) is read plain.

    Only the first rows are decoded where that settles it: read as a dictionary, a batch carries
    its chunk's whole dictionary page (~0.01 CPU-s, where decoding the row group took ~0.17 on a
    Criteo-shaped file). A page near its writer's size limit (1 MB in pyarrow and parquet-mr) may
    have filled up, after which the writer wrote the rest plain, values the page does not hold:
    those columns' dictionaries are counted over the whole row group, as pyarrow builds them.
    `nulls`: columns of nulls only, which hold no values to read as a dictionary."""
    import pyarrow.parquet as pq

    names = [
        c.name
        for c in spec.sparse
        if not isinstance(c, ListColumn) and c.kind != "integer" and c.name not in nulls
    ]
    f = pq.ParquetFile(path, read_dictionary=names)
    if not names or f.metadata.num_row_groups == 0:
        return ()
    group = f.metadata.row_group(0)
    paged = {group.column(i).path_in_schema for i in range(group.num_columns)
             if group.column(i).has_dictionary_page}  # fmt: skip
    names = [n for n in names if n in paged]
    if not names or group.num_rows == 0:
        return ()
    batch = next(f.iter_batches(DICTIONARY_PROBE_ROWS, [0], names, use_threads=False))
    pages = {n: batch.column(n).dictionary for n in names}
    entries = {n: len(page) for n, page in pages.items()}
    full = [n for n, page in pages.items() if page.nbytes >= FULL_PAGE_BYTES]
    if full:
        table = f.read_row_group(0, columns=full, use_threads=False)
        entries.update({n: sum(len(a.dictionary) for a in table.column(n).chunks) for n in full})
    return tuple(n for n in names if entries[n] * 4 < group.num_rows)


DICTIONARY_PROBE_ROWS = 1024
"""The rows _repeating decodes of a file's first row group."""
FULL_PAGE_BYTES = 1 << 19
"""A dictionary page of this many bytes or more may have filled up (_repeating)."""
