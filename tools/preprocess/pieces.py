"""What a task does with one piece of text, whichever parser reads it: parse, describe a bad row,
append the kept rows to a part (vocab_count.py counts values for the vocabularies).

Two parsers: Criteo's (criteo_text.py, its kernels: label, integers, hex; the built-in spec and any
spec of that shape, spec_parse.criteo_schema) and the feature-spec parser (spec_parse.py: any
columns, quoting, strings, lists). `TaskOptions.program` says which: None for Criteo's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import PartInfo
from shardrec.tools.preprocess.ids.id_maps import Vocabulary
from shardrec.tools.preprocess.ids.vocab import DEFAULT_MEMORY_MB
from shardrec.tools.preprocess.parse.criteo_text import (
    ParsedChunk,
    Schema,
    describe_bad_row,
    parse_chunk,
)
from shardrec.tools.preprocess.parse.spec_parse import (
    Program,
    SpecChunk,
    describe_bad_spec_row,
    parse_spec_chunk,
)
from shardrec.tools.preprocess.parts.part_columns import (
    PartColumns,
    append_rows,
    append_spec_rows,
    id_groups,
    list_groups,
)


@dataclass(frozen=True)
class TaskOptions:
    """What every task of one run shares (picklable, sent to worker processes)."""

    out: str
    schema: Schema
    chunk_bytes: int
    cardinalities: tuple[
        int, ...
    ]  # hashing mode: one per sparse feature; vocab mode: from the vocabularies
    vocab_path: str = ""  # vocabulary mode: the directory of memory-mapped vocabularies (vocab.py)
    dense_transform: str = "log1p"
    dense_dtype: str = "float32"
    strict: bool = False
    vocab_memory_bytes: int = (
        DEFAULT_MEMORY_MB << 20
    )  # vocabulary mode: pairs a counting task holds before it spills
    program: Program | None = None
    """A feature spec's program (spec_parse); None: Criteo's parser reads `schema`."""
    column_names: tuple[str, ...] = ()
    """Criteo's parser: each field's name where a spec of its shape names them (default: label,
    I1.., C1..)."""

    @property
    def names(self) -> list[str]:
        """Every sparse feature, in manifest order."""
        if self.program:
            return [c.name for c in self.program.spec.sparse]
        return list(self.column_names[1 + self.schema.num_dense :] or self.schema.sparse_names)

    @property
    def num_dense(self) -> int:
        return len(self.program.spec.dense) if self.program else self.schema.num_dense


Chunk = ParsedChunk | SpecChunk


def parse_piece(data: memoryview, opts: TaskOptions) -> Chunk:
    return parse_spec_chunk(data, opts.program) if opts.program else parse_chunk(data, opts.schema)


def describe_bad(data: memoryview, chunk: Chunk, row: int, opts: TaskOptions) -> tuple[str, str]:
    """(column name, offending value) of a malformed row."""
    if opts.program:
        return describe_bad_spec_row(data, chunk, row, opts.program)
    name, value = describe_bad_row(data, chunk, row, opts.schema)
    if opts.column_names and name in opts.schema.field_names:
        name = opts.column_names[opts.schema.field_names.index(name)]
    return name, value


class PartLayout:
    """How a task's parts hold their ids: one-hot columns grouped by dtype, list columns jagged."""

    def __init__(self, opts: TaskOptions) -> None:
        self.opts = opts
        if opts.program:
            self.groups, self.lists = list_groups(opts.program, opts.cardinalities)
            features = opts.program.features
            self.one_hot = [n for n, is_list, _ in features if not is_list]
            self.list_names = [n for n, is_list, _ in features if is_list]
        else:
            self.groups, self.lists = id_groups(opts.cardinalities), []
            self.one_hot, self.list_names = opts.names, []

    def new_part(self, capacity: int) -> PartColumns:
        return PartColumns(
            capacity, self.opts.num_dense, self.opts.dense_dtype, self.groups, self.lists
        )

    def append(
        self, cols: PartColumns, chunk: Chunk, rows: np.ndarray, vocabs: list[Vocabulary] | None
    ) -> None:
        o = self.opts
        if o.program:
            append_spec_rows(cols, chunk, rows, o.program, o.dense_dtype, o.cardinalities, vocabs)
        else:
            append_rows(
                cols,
                chunk,
                rows,
                o.dense_transform,
                o.dense_dtype,
                self.one_hot,
                o.cardinalities,
                vocabs,
            )

    def write(self, cols: PartColumns, part_dir: Path, fsync: bool) -> PartInfo:
        order = self.opts.names if self.lists else ()
        return cols.write(part_dir, self.one_hot, fsync, self.list_names, order)
