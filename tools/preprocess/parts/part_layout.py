"""How a run's parts hold their columns: one-hot ids grouped by dtype, list ids jagged, and the
rows of a parsed piece appended by the parser's kind (Criteo's or a feature spec's), built once
per task from the run's table sizes and dense transform.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardrec.dataloader.format.arrow_ipc import FileLayout
from shardrec.dataloader.format.manifest import PartInfo
from shardrec.tools.preprocess.ids.id_maps import Vocabulary
from shardrec.tools.preprocess.parse.spec_program import Program
from shardrec.tools.preprocess.parse.text_parser import Chunk
from shardrec.tools.preprocess.parts.part_columns import (
    PartColumns,
    append_rows,
    append_spec_rows,
    check_finite,
    id_groups,
    list_groups,
)


class PartLayout:
    """The columns of every part a task writes, and how a piece's rows are appended to them."""

    def __init__(
        self,
        program: Program | None,
        names: list[str],
        num_dense: int,
        cardinalities: tuple[int, ...],
        dense_transform: str,
        dense_dtype: str,
        file: FileLayout,
    ) -> None:
        """Args:
        program: a feature spec's program; None: Criteo's layout (every feature one-hot).
        names: every sparse feature, in manifest order.
        cardinalities: rows of each feature's table (hashing mode) or its vocabulary's.
        file: the part files' layout (part_file.file_layout of the run's features).
        """
        self.file = file
        self.program, self.names, self.num_dense = program, names, num_dense
        self.cardinalities = cardinalities
        self.dense_transform, self.dense_dtype = dense_transform, dense_dtype
        if program:
            self.groups, self.lists = list_groups(program, cardinalities)
            self.one_hot = [n for n, is_list, _ in program.features if not is_list]
            self.list_names = [n for n, is_list, _ in program.features if is_list]
        else:
            self.groups, self.lists = id_groups(cardinalities), []
            self.one_hot, self.list_names = names, []

    def new_part(self, capacity: int) -> PartColumns:
        return PartColumns(capacity, self.num_dense, self.dense_dtype, self.groups, self.lists)

    @property
    def dense_transforms(self) -> list[str]:
        """Each dense column's transform."""
        if self.program:
            return [c.transform for c in self.program.spec.dense]
        return [self.dense_transform] * self.num_dense

    def append(
        self, cols: PartColumns, chunk: Chunk, rows: np.ndarray, vocabs: list[Vocabulary] | None
    ) -> None:
        """Append `rows` of the piece; NonFiniteDense for a dense value the part's dtype cannot
        hold (the caller names its file and line)."""
        first = cols.rows
        self._append(cols, chunk, rows, vocabs)
        check_finite(cols.dense[first : cols.rows], chunk.dense, rows, self.dense_transforms)

    def _append(
        self, cols: PartColumns, chunk: Chunk, rows: np.ndarray, vocabs: list[Vocabulary] | None
    ) -> None:
        if self.program:
            append_spec_rows(
                cols, chunk, rows, self.program, self.dense_dtype, self.cardinalities, vocabs
            )
        else:
            append_rows(
                cols,
                chunk,
                rows,
                self.dense_transform,
                self.dense_dtype,
                self.one_hot,
                self.cardinalities,
                vocabs,
            )

    def write(self, cols: PartColumns, path: Path, fsync: bool) -> PartInfo:
        return cols.write(path, self.file, self.one_hot, fsync, self.list_names)
