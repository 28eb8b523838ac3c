"""`shardrec synth` says how many rows it wrote, as the files hold them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from helpers import cli


def test_an_event_log_reports_the_events_written_not_those_asked(tmp_path: Path) -> None:
    printed = cli("synth", tmp_path / "pq", "--like", "yambda", "--rows", "4000").stdout
    events = pq.ParquetFile(tmp_path / "pq" / "events.parquet").metadata.num_rows
    assert events < 4000  # the listens past the log's last day are cut
    assert printed.startswith(f"wrote {events:,} events to 3 file(s) in {tmp_path / 'pq'} (")
    assert "of 4,000 asked" in printed
    shown = json.loads(
        cli(
            "synth", tmp_path / "csv", "--like", "yambda", "--rows", "4000", "--csv", "--json"
        ).stdout
    )
    assert shown["rows"] == pcsv.read_csv(tmp_path / "csv" / "events.csv").num_rows == events
