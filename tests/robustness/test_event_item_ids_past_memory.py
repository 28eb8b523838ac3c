"""An item id is a row of the item tables: an id near 2^32 (the largest an event-log dataset
holds) makes tables of billions of rows, whose artist and album arrays preprocessing holds in
memory. Where they do not fit, it says so in one line naming the row and the value, not a
MemoryError traceback."""

from __future__ import annotations

import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_one_line_error

from shardrec.tools.synth.yambda import write_yambda_like

LIMITED = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({0}, {0})); "
    "sys.argv[0] = 'shardrec'; from shardrec.tools.cli.entry import main; main()"
)
"""`shardrec ARGS` in a process of at most {0} bytes of address space: every machine then lacks
the memory, as this one would at 2^32 rows."""


@pytest.mark.parametrize("item", [2**32 - 1, 2**32 - 2])
def test_an_item_id_whose_tables_do_not_fit_in_memory_is_refused_in_one_line(tmp_path, item):
    write_yambda_like(tmp_path, 3_000, seed=1)
    table = pq.read_table(tmp_path / "events.parquet")
    items = table["item_id"].cast(pa.uint64()).to_pylist()
    items[20] = item
    log = tmp_path / "big.parquet"
    pq.write_table(table.set_column(1, "item_id", pa.array(items, pa.uint64())), log)
    spec = tmp_path / "spec.toml"  # no item maps: the artist and album arrays are zeros
    spec.write_text('[format]\nkind = "parquet"\n\n[history]\nlength = 12\nmin_history = 4\n')
    limit = 6 * 2**30
    done = subprocess.run(
        [sys.executable, "-c", LIMITED.format(limit), "preprocess", str(log), "--events", str(spec)]
        + ["--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_line_error(
        done,
        rf"^error: {re.escape(str(log))}: row 20: item_id: {item} makes item tables of "
        rf"{item + 1:,} rows, whose artist and album \(64\.0 GiB\) do not fit in memory; renumber "
        r"the items from 0 \(an id is a row of its table\)$",
    )
    assert not (tmp_path / "out" / "manifest.json").exists()
