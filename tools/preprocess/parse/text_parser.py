"""The parser a run reads its text with: Criteo's (criteo_text.py, its compiled kernels: label,
integers, hex; the built-in spec and any spec of that shape, spec_program.criteo_schema) or a
feature spec's (spec_program.py, spec_parse.py: any columns, quoting, strings, lists), chosen once per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardrec.dataloader.spec.feature_spec import (
    FeatureSpec,
    SpecError,
)
from shardrec.tools.preprocess.parse.criteo_text import (
    ParsedChunk,
    Schema,
    describe_bad_row,
    parse_chunk,
)
from shardrec.tools.preprocess.parse.csv_scan import RowEnds
from shardrec.tools.preprocess.parse.parquet_schema import ParquetProgram, resolve_parquet
from shardrec.tools.preprocess.parse.spec_parse import (
    SpecChunk,
    describe_bad_spec_row,
    parse_spec_chunk,
)
from shardrec.tools.preprocess.parse.spec_program import (
    Program,
    criteo_schema,
    read_header,
    resolve_program,
)
from shardrec.tools.preprocess.text.lines import RowEnd, blank_bytes, check_first_line

Chunk = ParsedChunk | SpecChunk


@dataclass(frozen=True)
class TextParser:
    """Parses pieces of whole lines and names what is wrong with a malformed row (picklable)."""

    schema: Schema
    program: Program | None = None
    """A feature spec's program (spec_program); None: Criteo's parser reads `schema`."""
    column_names: tuple[str, ...] = ()
    """Criteo's parser: each field's name where a spec of its shape names them (default: label,
    I1.., C1..)."""
    parquet: ParquetProgram | None = None
    """A spec of Parquet files: their row groups are read (parquet_rows.py), not text."""

    @property
    def sparse_names(self) -> list[str]:
        """Every sparse feature, in manifest order."""
        if self.program:
            return [c.name for c in self.program.spec.sparse]
        return list(self.column_names[1 + self.schema.num_dense :] or self.schema.sparse_names)

    @property
    def dense_names(self) -> list[str]:
        """Every dense column, in manifest order."""
        if self.program:
            return [c.name for c in self.program.spec.dense]
        named = self.column_names[1 : 1 + self.schema.num_dense]
        return list(named or self.schema.dense_names)

    @property
    def num_dense(self) -> int:
        return len(self.program.spec.dense) if self.program else self.schema.num_dense

    @property
    def row_end(self) -> RowEnd | None:
        """Where a row ends, for cuts of text whose quoted fields may hold a line break (None: at
        any newline)."""
        fmt = self.program.spec.format if self.program and self.parquet is None else None
        return RowEnds(fmt.delimiter).find if fmt is not None and fmt.quoting else None

    @property
    def blank(self) -> bytes:
        """What a blank line holds besides its newline (text.lines.blank_bytes)."""
        fmt = self.program.spec.format if self.program else None
        return blank_bytes(fmt.delimiter if fmt is not None else self.schema.delimiter)

    def warm_up(self) -> None:
        """Parse one empty line: the parser's kernel is loaded from numba's cache (compiled, the
        first time ever) before a timed pass, so a one-time compile is no part of a parse rate.
        Parquet row groups are decoded by parquet_kernel.py's kernels, never by this parser."""
        if self.parquet is None:
            self.parse(memoryview(b"\n"))

    def parse(self, data: memoryview, in_quote: bool = False) -> Chunk:
        """The rows of whole lines; in_quote: the piece before `data` of the same text ended
        inside a quoted field (its chunk's ends_in_quote; Criteo's text has no quoting)."""
        if self.program:
            return parse_spec_chunk(data, self.program, in_quote)
        return parse_chunk(data, self.schema)

    def describe_bad(
        self, data: memoryview, chunk: Chunk, row: int, hint: bool = True, path: str = "FILE"
    ) -> tuple[str, str]:
        """(column name, offending value) of a malformed row; `hint`: with what preprocessing
        `path` needs, where that is known (a CSV read as Criteo's TSV)."""
        if self.program:
            return describe_bad_spec_row(data, chunk, row, self.program)
        spec = bool(self.column_names)  # a spec of Criteo's shape (choose_parser), no missing words
        name, value = describe_bad_row(data, chunk, row, self.schema, hint, path, spec)
        if self.column_names and name in self.schema.field_names:
            name = self.column_names[self.schema.field_names.index(name)]
        return name, value


def choose_parser(
    spec: FeatureSpec | None,
    spec_file: str,
    schema: Schema,
    dense_transform: str,
    files: list[Path],
    editable: bool = True,
) -> tuple[TextParser, str]:
    """How a run's tasks read its text: the parser, and the dense transform of Criteo's parser
    (a spec's own columns carry theirs).

    No spec: Criteo's parser with the schema. A spec is resolved against each file's header (every
    file must resolve the same); one of Criteo's shape still goes to Criteo's parser, its names
    kept. editable: the user can add a column to the spec (not to a model's).
    """
    if spec is None or spec.format.kind != "parquet":
        for f in files:
            check_first_line(f, spec.format.header if spec else schema.header)
    if spec is None:
        return TextParser(schema), dense_transform
    if spec.format.kind == "parquet":
        resolved = [resolve_parquet(spec, f, spec_file or "the spec") for f in files]
        for f, other in zip(files[1:], resolved[1:]):
            if not resolved[0].reads_like(other):
                raise SpecError(
                    f"{f}: its columns or their types differ from {files[0]}'s; give each its own run"
                )
        return TextParser(Schema(), resolved[0].program, parquet=resolved[0]), "log1p"
    programs = [
        resolve_program(
            spec,
            read_header(f, spec) if spec.format.header else None,
            str(f),
            spec_file or "the spec",
            editable,
        )
        for f in (files if spec.format.header else files[:1])
    ]
    for f, other in zip(files[1:], programs[1:]):
        if other.names != programs[0].names:
            raise SpecError(
                f"{f}: its header orders the columns otherwise than {files[0]}'s; give each its own run"
            )
    program = programs[0]
    criteo = criteo_schema(program)
    if criteo is not None:
        return TextParser(criteo[0], column_names=program.names), criteo[1]
    return TextParser(Schema(), program), "log1p"
