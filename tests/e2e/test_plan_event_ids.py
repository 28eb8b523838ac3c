"""`shardrec plan` on an event log whose ids are rows of their tables: a table too large for any
rank because of one large id says to renumber the ids, not only to add ranks."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import EVENT_SPEC, assert_one_line_error, cli

REPO = Path(__file__).resolve().parents[2]


def test_a_user_id_of_2_to_the_32_minus_1_is_refused_saying_to_renumber_the_ids(
    tmp_path: Path,
) -> None:
    # Before: "... (table t_uid fits on no rank: it needs 520.00 GiB on one rank at least (...),
    # a rank has 2.33 GiB for tables after the 1.07 GiB every rank holds; add ranks or raise
    # memory per rank)": 2^32 rows for a few dozen users, and no word of the ids.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardrec.tools.synth.yambda import write_yambda_like

    raw = tmp_path / "raw"
    write_yambda_like(raw, 3_000, seed=1)
    events = pq.read_table(raw / "events.parquet")
    users = events.column("uid").to_numpy().copy()
    users[users == users.max()] = 2**32 - 1
    at = events.schema.get_field_index("uid")
    pq.write_table(events.set_column(at, "uid", pa.array(users, pa.uint32())), raw / "big.parquet")
    (raw / "spec.toml").write_text('[format]\nkind = "parquet"\n' + EVENT_SPEC)
    cli("preprocess", raw / "big.parquet", "--events", raw / "spec.toml", "--out", tmp_path / "ev")
    plan = ("plan", "--data", tmp_path / "ev", "--config", REPO / "configs" / "dlrmv4.toml")
    for search in ("shardrec", "torchrec"):
        assert_one_line_error(
            cli(*plan, "--search", search, "--out", tmp_path / "plan.json", ok=False),
            re.escape(
                "its 4,294,967,296 rows are a row per user id up to the largest: renumber the "
                "user ids from 0 (one row each) and preprocess again, or add ranks or raise "
                "memory per rank)"
            )
            + "$",
        )
    assert not (tmp_path / "plan.json").exists()
