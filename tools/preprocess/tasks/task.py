"""A preprocessing task: what it is (`Task`, a byte range of a plain file, a range of a gzip
file's text or a whole gzip file, with the split of each line) and what every task of a run shares
(`TaskOptions`: the parser, table sizes, transforms; picklable, sent to worker processes). Running
one is task_run.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from shardrec.dataloader.format.manifest import SparseFeature, smallest_uint
from shardrec.dataloader.format.part_file import file_layout
from shardrec.dataloader.format.raw_ids import RAW
from shardrec.dataloader.spec.feature_spec import ListColumn, SequenceColumn
from shardrec.dataloader.util.locks import WORK_DIR
from shardrec.tools.preprocess.ids.vocab import DEFAULT_MEMORY_MB
from shardrec.tools.preprocess.parse.text_parser import TextParser
from shardrec.tools.preprocess.parts.part_layout import PartLayout
from shardrec.tools.preprocess.tasks.task_text import TextRange

# Where a task puts its parts while its file's line count, hence its split, is unknown (gz_stream).
STAGED = f"{WORK_DIR}/staged"


@dataclass(frozen=True)
class SplitRange:
    """Lines [begin, end) of one file go to `split`."""

    split: str
    begin: int
    end: int


@dataclass(frozen=True)
class Task:
    """One unit of work: a byte range of a plain file, a range of a gzip file's text, or a whole
    gzip file."""

    index: int
    path: str
    start: int
    end: int
    """-1: to the end (gzip files)."""
    first_line: int
    """Line number (0-based, after any header) of the range's first line; -1 if unknown."""
    splits: tuple[SplitRange, ...]
    """By line number within the file; empty: the whole file is `default_split`."""
    default_split: str
    header: bool
    """The file starts with a header line (plain ranges already start past it)."""
    gz_index: str = ""
    """A range of a gzip file's text: its seek index (gz_split), "" for none."""
    crc: int = -1
    """A range of a gzip file's text: CRC-32 of its bytes, from the planning pass."""
    text_slot: str = ""
    """A range of a gzip file's text already decoded: its shared memory (gz_stream)."""
    parquet_bytes: int = -1
    """A Parquet file's row groups [start, end) (their uncompressed bytes; parquet_rows.py), not
    a byte range of text; -1: text."""

    @property
    def gz(self) -> bool:
        return self.path.endswith(".gz")

    @property
    def parquet(self) -> bool:
        return self.parquet_bytes >= 0

    @property
    def holds_train_lines(self) -> bool:
        """Whether any of the task's lines may be a training line (a task of the last day, or of
        Kaggle's seventh, holds none: the vocabulary pass does not read it)."""
        if not self.splits:
            return self.default_split == "train"
        first = max(self.first_line, 0)  # lines only grow from the task's first one
        return any(r.split == "train" and r.end > first for r in self.splits)

    def split_of(self, line: int) -> str:
        for r in self.splits:
            if r.begin <= line < r.end:
                return r.split
        return self.default_split

    @property
    def text(self) -> TextRange:
        """Where the task's text is, as reading it needs."""
        return TextRange(
            self.path, self.start, self.end, self.header, self.gz_index, self.crc, self.text_slot
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TaskOptions:
    """What every task of one run shares (picklable, sent to worker processes)."""

    out: str
    parser: TextParser
    chunk_bytes: int
    cardinalities: tuple[int, ...]
    """Hashing mode: one per sparse feature; vocabulary mode: from the vocabularies."""
    vocab_path: str = ""
    """Vocabulary mode: the directory of memory-mapped vocabularies (vocab.py)."""
    dense_transform: str = "log1p"
    dense_dtype: str = "float32"
    strict: bool = False
    vocab_memory_bytes: int = DEFAULT_MEMORY_MB << 20
    """Vocabulary mode: pairs a counting task holds before it spills."""

    @property
    def names(self) -> list[str]:
        """Every sparse feature, in manifest order."""
        return self.parser.sparse_names

    def features(self) -> list[SparseFeature]:
        """Every sparse feature as the manifest records it (less its statistics): name, table rows,
        id dtype, and for a spec's list columns their pooling."""
        features = [
            SparseFeature(n, c, str(smallest_uint(c - 1)))
            if c
            else SparseFeature(n, 0, "uint64", ids=RAW)
            for n, c in zip(self.names, self.cardinalities)
        ]
        unsigned = self.parser.parquet.unsigned if self.parser.parquet else ()
        for f in features:
            f.unsigned = f.raw and f.name in unsigned
        columns = self.parser.program.spec.sparse if self.parser.program else []
        for f, column in zip(features, columns):
            if isinstance(column, ListColumn):
                f.multi_hot, f.pooling = True, column.pooling
            f.table = column.table
            if isinstance(column, SequenceColumn):
                f.sequence, f.side_of = True, column.side_of
                f.values = column.values
        return features

    def part_layout(self) -> PartLayout:
        """The columns of the parts a task writes, from the run's table sizes and transforms."""
        p = self.parser
        return PartLayout(
            p.program,
            p.sparse_names,
            p.num_dense,
            self.cardinalities,
            self.dense_transform,
            self.dense_dtype,
            file_layout(p.dense_names, self.dense_dtype, self.features()),
        )


def split_rows(task: Task, line0: int, n: int) -> list[tuple[str, np.ndarray]]:
    """(split, row mask) for each split present in lines [line0, line0 + n) of the task."""
    if not task.splits:
        return [(task.default_split, np.ones(n, dtype=bool))]
    lines = task.first_line + line0 + np.arange(n) if task.first_line >= 0 else line0 + np.arange(n)
    out = []
    for r in task.splits:
        mask = (lines >= r.begin) & (lines < r.end)
        if mask.any():
            out.append((r.split, mask))
    return out
