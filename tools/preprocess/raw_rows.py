"""Raw text rows (or a Parquet file's) -> model inputs, with the transform an exported model
records.

`shardrec predict MODEL rows.tsv` scores text that never went through `shardrec preprocess`:
the rows are read by the dataset's own parser (its feature spec's, or Criteo's with the recorded
text schema), and their kept rows go through the very code that fills a part (pieces.PartLayout:
the same dense transforms, hashing or vocabulary, list ids), so a row gets exactly the inputs
preprocessing would have given it; with an on-the-fly multi-hot model, its one-hot ids become
their index-table rows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.multihot.multihot_tables import (
    MultiHotSpec,
    default_cache_dir,
    open_index_tables,
)
from shardrec.dataloader.spec.feature_spec import FeatureSpec, LabelColumn
from shardrec.dataloader.spec.spec_file import spec_from_dict
from shardrec.tools.preprocess.ids.id_maps import Vocabulary
from shardrec.tools.preprocess.ids.vocab import load_vocabularies
from shardrec.tools.preprocess.parse.criteo_text import REASONS, Schema
from shardrec.tools.preprocess.parse.parquet_schema import is_parquet
from shardrec.tools.preprocess.parse.spec_program import read_header
from shardrec.tools.preprocess.parse.text_parser import TextParser, choose_parser
from shardrec.tools.preprocess.parts.part_columns import NonFiniteDense, ReservedRawIdError
from shardrec.tools.preprocess.raw_columns import (
    check_named,
    ignoring_other_columns,
    no_label_column,
    some,
    warn_left_out,
    without_absent_skipped,
)
from shardrec.tools.preprocess.raw_labels import (
    NO_LABEL,
    bad_row_line,
    check_label_column,
    label_after_the_last_field,
    value_hint,
    with_label_column,
)
from shardrec.tools.preprocess.tasks.bad_rows import non_finite_error, note_lists_cut
from shardrec.tools.preprocess.tasks.task import TaskOptions
from shardrec.tools.preprocess.text.gz import open_text
from shardrec.tools.preprocess.text.lines import blank_tail
from shardrec.trainer.inference.model_file import VOCAB_PREFIX, reads_raw_rows

logger = logging.getLogger(__name__)
CHUNK_BYTES = 16 << 20
"""Text parsed at a time: bounds memory whatever the file's size."""
RawBatch = tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]
"""(dense [rows, num_dense] float32, feature -> (ids, lengths)), what
trainer.inference.predict.rows_batch takes."""


class RawRows:
    """Turns text rows into model inputs with one model's transform (its header's "transform")."""

    def __init__(self, header: dict[str, Any], model: Path | None = None) -> None:
        """`model`: the model file the header is of, named when its rows cannot be read."""
        t = header["transform"]
        if not reads_raw_rows(header):
            who = model if model is not None else f"the model of {t.get('dataset')}"
            how = f": `shardrec predict {model} DATASET_DIR --split test`" if model else ""
            raise ValueError(
                f"{who}: cannot read raw rows: its training data records neither a feature spec nor "
                "Criteo's text schema and dense transform (as data from `shardrec data import-npy`); "
                f"score a preprocessed split of such data instead{how}"
            )
        self.spec = (
            spec_from_dict(t["spec"], "the model's transform: spec") if t.get("spec") else None
        )
        self.schema = Schema(**t["schema"]) if self.spec is None else Schema()
        self.dense_transform, self.dense_dtype = (
            t.get("dense_transform") or "log1p",
            t.get("dense_dtype") or "float32",
        )
        self.names, self.cardinalities = list(header["feature_names"]), tuple(t["cardinalities"])
        self.vocabs = None
        if t.get("mode") == "vocab":
            self.vocabs = _file_vocabularies(model, self.names) if model is not None else None
        if t.get("mode") == "vocab" and self.vocabs is None:  # a file exported without them
            if not t.get("vocab_dir") or not Path(t["vocab_dir"]).is_dir():
                raise ValueError(
                    f"vocabulary folder {t.get('vocab_dir')!r} of the model's dataset is gone: "
                    "raw rows cannot be mapped to ids without it"
                )
            self.vocabs = load_vocabularies(Path(t["vocab_dir"]), self.names)
        self.tables = None
        self.lists_cut: dict[str, list[int]] = {}
        """The rows read so far whose lists held more than max_length values
        (bad_rows.note_lists_cut): they are scored on the values preprocessing keeps."""
        materialised = t.get("materialised_multihot")
        if materialised:
            # Trained on a `data multihot` copy: raw rows are hashed as its one-hot source's were,
            # then expanded by the same index tables.
            if not materialised.get("one_hot_cardinalities"):
                raise ValueError(
                    f"the model was trained on multi-hot ids made from {materialised['source']}, "
                    "which was gone at export: raw rows cannot be hashed as its training rows were; score a "
                    "multi-hot split instead"
                )
            self.cardinalities = tuple(materialised["one_hot_cardinalities"])
        m = t.get("multihot") or materialised
        if m:
            spec = MultiHotSpec(
                tuple(m["sizes"]), tuple(m.get("rows") or self.cardinalities), m["dist"], m["seed"]
            )
            self.tables = open_index_tables(m.get("cache_dir") or default_cache_dir(), spec)

    def options(self, path: Path, labeled: bool = True) -> TaskOptions:
        """How this file's rows are read (a spec is matched to the file's own header; columns the
        header has beside the model's are read past, with a warning naming them). `labeled` off,
        with a spec whose text has a header: the label is read from a 0 put after each row's last
        field (convert), and the spec's own label column, if the file has one, is read past."""
        spec = self.spec
        parquet = spec is not None and spec.format.kind == "parquet"
        if parquet != is_parquet(path):  # read in the model's format, its bytes would be garbage
            reads = f"{spec.format.kind.upper()} text" if spec else "Criteo's text rows"
            raise ValueError(
                f"{path}: {'not ' if parquet else ''}a Parquet file, and the model reads "
                f"{'Parquet files' if parquet else reads}, as its data was written: give it rows "
                "in that format, or a dataset directory preprocessed as its data was"
            )
        if parquet:
            return self._parquet_options(spec, path, labeled)
        if spec is not None and spec.format.header:
            header = read_header(path, spec)
            names = [c.name for c in spec.columns]
            if len(header) > 1 and not set(header) & set(names):
                raise ValueError(
                    f"{path}: its first line ({some(header)}) names none of the model's "
                    f"spec's columns ({some(names)}), and the spec reads "
                    "rows after a header line: give the file its header"
                )
            if not labeled:
                spec = label_after_the_last_field(spec, header)
            elif spec.label.position is None and spec.label.name not in header and len(header) > 1:
                raise no_label_column(f"{path}: the header", spec, header)
            left_out = []
            if len(header) > 1:  # a header of one field is another format: resolve_program says
                spec = without_absent_skipped(spec, header)
                check_named(spec, header, path)
                spec, left_out = ignoring_other_columns(spec, header)
        parser, dense_transform = choose_parser(
            spec, "the model's spec", self.schema, self.dense_transform, [path], editable=False
        )
        if spec is not None and spec.format.header and left_out:
            warn_left_out(path, left_out)
        return TaskOptions(
            "",
            parser,
            chunk_bytes=0,
            cardinalities=self.cardinalities,
            dense_transform=dense_transform,
            dense_dtype=self.dense_dtype,
        )

    def _parquet_options(self, spec: FeatureSpec, path: Path, labeled: bool) -> TaskOptions:
        """A Parquet file read by the model's spec: its columns found by name, the others left out
        (with a warning naming them); `labeled` off: the label is a 0 column of the reader's
        (_read_parquet), the file's own label column, if it has one, left out."""
        import pyarrow as pa

        from shardrec.tools.preprocess.parse.parquet_schema import (
            read_parquet_schema,
            resolve_parquet,
        )

        schema = read_parquet_schema(path)
        label = spec.label.name
        if labeled and label not in schema.names:
            raise no_label_column(f"{path}: the Parquet file", spec, schema.names)
        if not labeled:
            spec = dataclasses.replace(
                spec,
                columns=tuple(
                    LabelColumn(NO_LABEL) if c is spec.label else c for c in spec.columns
                ),
            )
        spec = without_absent_skipped(spec, schema.names)
        check_named(spec, [*schema.names, NO_LABEL], path)
        wanted = {c.name for c in spec.columns}
        other = [n for n in schema.names if n not in wanted and n != label]
        fields = [schema.field(n) for n in schema.names if n in wanted]
        if not labeled:
            fields.append(pa.field(NO_LABEL, pa.uint8()))
        pp = resolve_parquet(spec, path, "the model's spec", schema=pa.schema(fields))
        if other:
            warn_left_out(path, other)
        return TaskOptions(
            "",
            TextParser(Schema(), pp.program, parquet=pp),
            chunk_bytes=0,
            cardinalities=self.cardinalities,
            dense_transform="log1p",
            dense_dtype=self.dense_dtype,
        )

    def convert(
        self, data: bytes, path: Path, first_line: int, opts: TaskOptions, labeled: bool = True
    ) -> tuple[RawBatch, np.ndarray | None]:
        """Inputs and labels (None: `labeled` off) of the rows in `data` (whole lines); ValueError
        names a malformed row's line. Rows without a label column are parsed with a 0 put in
        front."""
        if not labeled:
            data = with_label_column(data, path, first_line, opts)
        if labeled and opts.parser.program is None and first_line <= 2:
            check_label_column(data, path, opts.parser.schema)
        chunk = opts.parser.parse(data)
        bad = np.flatnonzero(~chunk.ok)
        if bad.size:
            raise ValueError(
                bad_row_line(data, chunk, int(bad[0]), path, first_line, opts, labeled)
            )
        inputs = self._inputs(chunk, opts, lambda r: f"{path}:{first_line + r}")
        return inputs, chunk.labels if labeled else None

    def _inputs(self, chunk, opts: TaskOptions, where: Callable[[int], str]) -> RawBatch:
        """The model inputs of a parsed chunk's rows (all of them good); where(row): the file and
        line (or row) a refusal names."""
        layout = opts.part_layout()
        cols = layout.new_part(chunk.rows)
        note_lists_cut(chunk, np.arange(chunk.rows), opts, self.lists_cut)
        try:
            layout.append(cols, chunk, np.arange(chunk.rows), self.vocabs)
        except NonFiniteDense as e:
            raise non_finite_error(where(e.row), e, opts, scoring=True) from None
        except ReservedRawIdError as e:  # rows are appended in order: its k is the chunk's row
            raise ValueError(f"{where(e.k)}: {e}") from None
        one_hot = cols.columns(layout.one_hot)
        lists = dict(
            zip(
                layout.list_names,
                zip(cols.list_ids, (o[: chunk.rows + 1] for o in cols.list_offsets)),
            )
        )
        ids = {}
        for t, name in enumerate(self.names):
            if name in lists:
                values, offsets = lists[name]
                ids[name] = (values[: offsets[-1]], np.diff(offsets).astype(np.int32))
            elif self.tables is not None:
                multi = self.tables.expand(t, one_hot[name].astype(np.int64))
                ids[name] = (multi.reshape(-1), np.full(chunk.rows, multi.shape[1], np.int32))
            else:
                ids[name] = (one_hot[name], np.ones(chunk.rows, np.int32))
        return cols.dense[: chunk.rows].astype(np.float32), ids

    def _read_parquet(
        self, path: Path, opts: TaskOptions, labeled: bool
    ) -> Iterator[tuple[RawBatch, np.ndarray | None]]:
        """A Parquet file's rows, a row group at a time, read as preprocessing reads them."""
        import pyarrow as pa

        from shardrec.tools.preprocess.parse.parquet_rows import (
            describe_bad_row,
            read_row_groups,
            table_chunk,
        )

        pp, row = opts.parser.parquet, 1
        columns = [c for c in pp.columns if c != NO_LABEL]
        for table, _ in read_row_groups(path, 0, _row_groups(path), pp, columns):
            if not labeled:
                table = table.append_column(NO_LABEL, pa.array(np.zeros(table.num_rows, np.uint8)))
            chunk = table_chunk(table, pp)
            bad = np.flatnonzero(~chunk.ok)
            if bad.size:
                field, value = describe_bad_row(table, chunk, int(bad[0]), pp)
                reason = REASONS[int(chunk.reason[int(bad[0])])]
                hint = (
                    " (rows without labels? score them with --no-label)"
                    if reason == "bad_label" and value == "null"
                    else value_hint(reason, field)
                )
                raise ValueError(
                    f"{path}: row {row + int(bad[0])}: {field}: {value} ({reason}){hint}"
                )
            # a copy: the chunk's arrays serve the next row group (parquet_rows._scratch)
            inputs = self._inputs(chunk, opts, lambda r, first=row: f"{path}: row {first + r}")
            yield inputs, chunk.labels.copy() if labeled else None
            row += chunk.rows

    def read(
        self, path: Path, chunk_bytes: int = CHUNK_BYTES, labeled: bool = True
    ) -> Iterator[tuple[RawBatch, np.ndarray | None]]:
        """The file's rows, a chunk of whole lines at a time (gzip inputs too); `labeled` off: rows
        without the label column (labels None)."""
        opts = self.options(path, labeled)
        if opts.parser.parquet is not None:
            yield from self._read_parquet(path, opts, labeled)
            return
        header = self.spec.format.header if self.spec else self.schema.header
        line, rest, blank = 1, b"", opts.parser.blank
        with open_text(path) as f:
            if header:
                f.readline()
                line += 1
            while True:
                block = f.read(chunk_bytes)
                data = rest + block
                if not block:
                    # no rows, as preprocess reads them (a line of the delimiter is one)
                    data = data[: blank_tail(data, 0, len(data), blank)]
                    if data:
                        yield self.convert(
                            data if data.endswith(b"\n") else data + b"\n",
                            path,
                            line,
                            opts,
                            labeled,
                        )
                    return
                # Blank lines wait for what follows: rows, or the end of the file (no rows there).
                cut = blank_tail(data, 0, data.rfind(b"\n") + 1, blank)
                if cut == 0:
                    rest = data
                    continue
                data, rest = data[:cut], data[cut:]
                yield self.convert(data, path, line, opts, labeled)
                line += data.count(b"\n")


def in_the_models_format(header: dict[str, Any], path: Path) -> bool:
    """Whether `path` may hold rows the model of `header` reads, from its first bytes: a Parquet
    file for a Parquet spec's model, else text whose first line holds the model's delimiter (a
    README of one word does not). True where the model reads no raw rows: nothing to tell by."""
    t = header.get("transform") or {}
    if t.get("events_spec") or not reads_raw_rows(header):
        return True
    spec = spec_from_dict(t["spec"], "the model's transform: spec") if t.get("spec") else None
    if spec is not None and spec.format.kind == "parquet":
        return is_parquet(path)
    delimiter = spec.format.delimiter if spec is not None else Schema(**t["schema"]).delimiter
    try:
        with open_text(path) as f:
            first = f.readline(1 << 16)
    except (OSError, EOFError):
        return False
    return not is_parquet(path) and delimiter.encode() in first


def _file_vocabularies(model: Path, names: list[str]) -> list[Vocabulary] | None:
    """The vocabularies a model file holds (export writes them: its dataset's folder may since have
    been rebuilt for other data); None for a file exported before they were written."""
    from safetensors import safe_open

    with safe_open(str(model), framework="numpy") as f:
        if f"{VOCAB_PREFIX}{names[0]}.values" not in f.keys():
            return None
        return [
            Vocabulary(
                f.get_tensor(f"{VOCAB_PREFIX}{n}.values"), f.get_tensor(f"{VOCAB_PREFIX}{n}.ids")
            )
            for n in names
        ]


def _row_groups(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_row_groups
