"""The rows `shardrec predict` scores, checked and labelled: a file without its label column
found (Criteo's test.txt) or given a 0 label (--no-label), and the one line for a malformed row
(preprocessing's words, and what would score it)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.spec.feature_spec import FeatureSpec, IgnoredColumn, LabelColumn
from shardrec.tools.preprocess.parse.criteo_text import REASONS, Schema
from shardrec.tools.preprocess.tasks.row_advice import READS
from shardrec.tools.preprocess.tasks.task import TaskOptions


def bad_row_line(
    data: bytes,
    chunk: Any,
    row: int,
    path: Path,
    first_line: int,
    opts: TaskOptions,
    labeled: bool,
) -> str:
    """One line for a malformed raw row: file, line, field, value and reason (preprocessing's
    words), and what would score it (the model's rows are fixed: no preprocessing flag applies)."""
    parser = opts.parser
    field, value = parser.describe_bad(data, chunk, row, hint=False)
    reason = REASONS[int(chunk.reason[row])]
    text = bytes(data[int(chunk.row_start[row]) : int(chunk.row_end[row])]).removesuffix(b"\r")
    fmt = parser.program.spec.format if parser.program else None
    delimiter = fmt.delimiter if fmt else parser.schema.delimiter
    width = parser.program.num_fields if parser.program else parser.schema.num_fields
    hint = ""
    # Line 1 is a row only where the model's rows have no header: a word there may be one.
    if reason == "bad_label" and first_line + row == 1 and any(c.isalpha() for c in value):
        read = f"zcat {path} | tail" if path.name.endswith(".gz") else "tail"
        source = "" if path.name.endswith(".gz") else f" {path}"
        hint = (
            " (a header line? the model reads rows without one, as its training data had: "
            f"`{read} -n +2{source} > rows.txt` leaves it out)"
        )
    elif reason == "bad_label":
        hint = " (rows without a label column, as Criteo's test.txt? score them with --no-label)"
    elif reason == "too_many_fields" and not labeled:
        # The 0 put in front of each row is no field of the user's.
        fields = len(text.split(delimiter.encode())) - 1
        value = f"{fields} fields, a row without its label has {width - 1}"
        hint = " (with --no-label: the rows have a label column; leave --no-label out)"
    elif reason in ("too_few_fields", "too_many_fields") and fmt is None and b"," in text:
        hint = (
            f" (a CSV row: this model reads Criteo's tab-separated rows of {width} fields, as it "
            "was trained on, and cannot score these; a model for them starts with "
            f"`shardrec spec infer {path} --label COLUMN`)"
        )
    elif reason == "too_many_fields" and not (fmt and fmt.quoting):
        d = "" if delimiter == "\t" else f"-d'{delimiter}' "
        read = f"zcat {path} | cut" if path.name.endswith(".gz") else "cut"
        source = "" if path.name.endswith(".gz") else f" {path}"
        hint = (
            f" (the model reads rows of {width} fields, as its training data had; if the extra "
            f"ones are the last: `{read} {d}-f1-{width}{source} > rows.txt` keeps the first {width})"
        )
    else:
        hint = value_hint(reason, field)
    return f"{path}:{first_line + row}: {field}: {value} ({reason}){hint}"


def value_hint(reason: str, field: str) -> str:
    """For a value of `field` the model cannot read (`reason`: bad_hex, bad_integer, bad_float),
    what it reads there and what to do; "" for another reason. Preprocessing skips such a row, but
    predict gives every row its probability, so it stops at one."""
    reads = READS.get(reason)
    if reads is None:
        return ""
    return (
        f" (the model reads {field} as {reads}, as its training data was written; predict gives "
        "every row a probability and skips none: correct the value or leave the row out)"
    )


NO_LABEL = "(no label: --no-label)"
"""The label column of rows read without one: a 0 after each row's last field."""


def label_after_the_last_field(spec: FeatureSpec, header: list[str]) -> FeatureSpec:
    """`spec` reading its label from one field past the header's (convert puts a 0 there), the
    file's own label column, if it has one, read past."""
    label = spec.label
    columns = [
        IgnoredColumn(c.name, position=c.position) if c is label else c
        for c in spec.columns
        if c is not label or c.name in header or c.position is not None
    ]
    return dataclasses.replace(
        spec, columns=(*columns, LabelColumn(NO_LABEL, position=len(header)))
    )


def with_label_column(data: bytes, path: Path, first_line: int, opts: TaskOptions) -> bytes:
    """Rows without a label column, a 0 label put in each: in front in Criteo's layout (its label
    is the first field), after the last field for a feature spec whose text has a header
    (`label_after_the_last_field`). A spec without a header finds its columns by position, with
    the label's among them: such rows are refused."""
    program = opts.parser.program
    if program is None:
        return re.sub(rb"(?m)^(?=[^\n])", b"0" + opts.parser.schema.delimiter.encode(), data)
    if program.spec.format.header and program.spec.label.name == NO_LABEL:
        end = program.spec.format.delimiter.encode() + b"0"
        return re.sub(rb"(?m)^(?!\r?$)([^\r\n]*)(\r?)$", lambda m: m[1] + end + m[2], data)
    raise ValueError(
        f"{path}:{first_line}: --no-label reads rows of Criteo's layout (label first) or with a "
        "header; this model's feature spec finds its columns by position, the label's among them: "
        "give the rows a label column (any 0 or 1) and leave --no-label out"
    )


def check_label_column(data: bytes, path: Path, schema: Schema) -> None:
    """Criteo strips trailing empty fields, never the label: at most one field fewer than a labeled
    row in every row of a chunk is a file without labels, whose first integer would be read as the
    label and every field after it shifted by one."""
    if _most_fields(data, schema.delimiter) == schema.num_fields - 1:
        raise ValueError(
            f"{path}: rows of at most {schema.num_fields - 1} fields, a labeled row has "
            f"{schema.num_fields}: no label column (as Criteo's test.txt)? score them with --no-label"
        )


def _most_fields(data: bytes, delimiter: str) -> int:
    """The largest number of fields of a line of `data` (whole lines)."""
    raw = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    delimiters = np.flatnonzero(raw == ord(delimiter))
    per_line = np.diff(np.searchsorted(delimiters, ends), prepend=0)
    return int(per_line.max()) + 1 if per_line.size else 0
