"""`shardrec synth` says how many rows it wrote, as the files hold them."""

from __future__ import annotations

import gzip
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


def test_a_seed_writes_the_same_gzip_bytes_whenever_and_whoever_runs_it(
    tmp_path: Path, monkeypatch
) -> None:
    # gzip's header held the clock's time and the temporary's name (.day_0.gz.tmp-PID): a rerun
    # of the same command, later or from another process, wrote other bytes.
    for like, name in (("criteo", "day_0.gz"), ("avazu", "train.csv.gz")):
        days = ["--days", "1"] if like == "criteo" else []
        args = ["--like", like, "--rows", "300", "--seed", "3", "--gz", *days]
        cli("synth", tmp_path / f"{like}-a", *args)
        monkeypatch.setattr(gzip.time, "time", lambda: 2e9)  # the second run, much later
        cli("synth", tmp_path / f"{like}-b", *args)
        monkeypatch.undo()
        first = (tmp_path / f"{like}-a" / name).read_bytes()
        assert first == (tmp_path / f"{like}-b" / name).read_bytes()
        # As gzip -n writes it: no time, and the name the file is renamed to, without .gz.
        assert first[4:8] == bytes(4)
        assert first[10:].split(b"\0", 1)[0] == name.removesuffix(".gz").encode()
