"""Row-wise Adagrad state between table layouts: how a table's accumulators change when a
resume cuts it into other column shards.

fbgemm keeps one row-wise Adagrad accumulator per row of each column shard, under the state
name `<table>.momentum1`: a table cut into k column shards has a momentum of [k x rows] (shard j
at offset j * rows), a table kept whole has [rows]. DCP reshards rows freely, but not between
these layouts. The conversion spreads each old shard's accumulator over its columns and gives
each new shard the width-weighted mean over its columns: exact when the cut is unchanged, and
the natural estimate otherwise.
"""

from __future__ import annotations

import torch

ROWWISE_STATE = "momentum1"
"""fbgemm's name of the row-wise accumulator in a table's optimizer state (`<table>.momentum1`)."""


def rowwise_state_key(table: str) -> str:
    """The state key of `table`'s row-wise accumulator."""
    return f"{table}.{ROWWISE_STATE}"


def convert_rowwise_momentum(
    old: torch.Tensor, rows: int, old_widths: list[int], new_widths: list[int]
) -> torch.Tensor:
    """[len(old_widths) * rows] accumulators -> [len(new_widths) * rows] (see the module
    docstring)."""
    per_column = torch.cat(
        [old[j * rows : (j + 1) * rows, None].expand(rows, w) for j, w in enumerate(old_widths)],
        dim=1,
    )
    out, col = [], 0
    for w in new_widths:
        out.append(per_column[:, col : col + w].mean(dim=1))
        col += w
    return torch.cat(out)
