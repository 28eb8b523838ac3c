"""How the columns of a file to score meet the model's feature spec, which finds them by header
name (raw_rows): the spec's columns the file lacks (renamed, or rows without labels) are refused
in one line naming what to rename; the file's columns the spec does not read are left out, with
a warning once the rest is resolved."""

from __future__ import annotations

import dataclasses
import difflib
import logging
from pathlib import Path

from shardrec.dataloader.spec.feature_spec import FeatureSpec, IgnoredColumn
from shardrec.tools.preprocess.raw_labels import NO_LABEL

logger = logging.getLogger(__name__)


def some(names: list[str]) -> str:
    """The first names of a list, for a line of text."""
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def without_absent_skipped(spec: FeatureSpec, names: list[str]) -> FeatureSpec:
    """`spec` without the columns it skips (role = "ignore", found by name) that a file to score
    does not have: the model never read them."""
    kept = tuple(
        c
        for c in spec.columns
        if not isinstance(c, IgnoredColumn) or c.position is not None or c.name in names
    )
    return dataclasses.replace(spec, columns=kept)


def _renamed(spec: FeatureSpec, names: list[str], name: str) -> str | None:
    """The file's column, of those the model's spec does not read, that looks like its column
    `name` renamed (in another case, or spelt nearly so)."""
    read = {c.name for c in spec.columns}
    other = [n for n in names if n not in read and n != NO_LABEL]
    near = [n for n in other if n.lower() == name.lower()]
    return (near or difflib.get_close_matches(name, other, n=1) or [None])[0]


def no_label_column(where: str, spec: FeatureSpec, names: list[str]) -> ValueError:
    """The refusal of a file without the label column: renamed, or rows without labels."""
    label = spec.label.name
    renamed = _renamed(spec, names, label)
    fix = (
        f"rename its column {renamed!r} to {label!r}, as the training data named it (rows "
        "without labels: score them with --no-label)"
        if renamed
        else "rows without labels? score them with --no-label"
    )
    return ValueError(f"{where} has no label column {label!r}; {fix}")


def check_named(spec: FeatureSpec, names: list[str], path: Path) -> None:
    """Refuses a file without a column the model's spec finds by name, naming the file's column
    of another name that may hold it (the model reads nothing from a renamed column)."""
    missing = [c.name for c in spec.columns if c.position is None and c.name not in names]
    if not missing:
        return
    name, read = missing[0], {c.name for c in spec.columns}
    renamed = _renamed(spec, names, name)
    other = [n for n in names if n not in read and n != NO_LABEL]
    shown = _unread(other, [n for n in names if n != NO_LABEL])
    fix = (
        f"; rename its column {renamed!r} to {name!r}"
        if renamed
        else f" ({shown}): name the column of its values {name!r}"
    )
    more = f" (and {len(missing) - 1} more: {some(missing[1:])})" if len(missing) > 1 else ""
    raise ValueError(
        f"{path}: the file has no column {name!r}{more}, which the model's spec reads by "
        f"name{fix}, as the training data named it"
    )


def _unread(other: list[str], names: list[str]) -> str:
    """The columns of a file that the model does not read, or all of them where it reads each."""
    return f"the model reads none of {some(other)}" if other else f"it has {some(names)}"


def ignoring_other_columns(spec: FeatureSpec, header: list[str]) -> tuple[FeatureSpec, list[str]]:
    """`spec` with an ignored column for each header name it does not read (the model's columns
    are found by name, so a file's other columns cannot shift them), and those names."""
    names = {c.name for c in spec.columns}
    placed = {c.position for c in spec.columns if c.position is not None}
    other = [(i, h) for i, h in enumerate(header) if h not in names and i not in placed]
    ignored = tuple(IgnoredColumn(f"{h} (field {i})", position=i) for i, h in other)
    return dataclasses.replace(spec, columns=spec.columns + ignored), [h for _, h in other]


def warn_left_out(path: Path, names: list[str]) -> None:
    logger.warning(
        "%s: %d column(s) the model does not read, left out: %s",
        path,
        len(names),
        ", ".join(names[:8]) + (" ..." if len(names) > 8 else ""),
    )
