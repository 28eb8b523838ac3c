"""A malformed event log is refused in one line naming the file, the row (Parquet) or line (CSV),
the column and the value, and no dataset is written."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from helpers import EVENT_SPEC, assert_one_line_error, cli

from shardrec.tools.synth.yambda import write_yambda_like


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> pa.Table:
    raw = tmp_path_factory.mktemp("raw")
    write_yambda_like(raw, 3_000, seed=1)
    table = pq.read_table(raw / "events.parquet")
    return table.set_column(4, "event_type", table["event_type"].cast(pa.string()))


def _write(tmp_path: Path, table: pa.Table, kind: str) -> tuple[Path, Path]:
    from shardrec.tools.synth.yambda import yambda_like

    maps = yambda_like(3_000, seed=1)["artist"]
    pq.write_table(pa.table(maps), tmp_path / "artist_item_mapping.parquet")
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[format]\nkind = "{kind}"\n' + EVENT_SPEC)
    path = tmp_path / f"events.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        pcsv.write_csv(table, path)
    return path, spec


def _preprocess(path: Path, spec: Path, out: Path):
    return cli("preprocess", path, "--events", spec, "--out", out, ok=False)


def test_a_good_log_makes_a_dataset_that_verifies_until_a_byte_changes(tmp_path, log):
    path, spec = _write(tmp_path, log, "csv")
    out = tmp_path / "out"
    result = cli("preprocess", path, "--events", spec, "--out", out)
    assert "samples in" in result.output and (out / "manifest.json").is_file()
    verified = json.loads(cli("data", "verify", out, "--json").stdout)
    assert verified["ok"] and verified["problems"] == []
    head = json.loads(cli("data", "head", out, "--rows", "2", "--json").stdout)
    assert len(head) == 2 and len(head[0]["hist_item"]) == len(head[0]["hist_ts"]) > 0
    part = out / "events" / "part-00000.arrow"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    result = cli("data", "verify", out, "--json", ok=False)
    assert result.exit_code == 1
    assert json.loads(result.stdout)["problems"] == [f"{part}: sha256 differs from the manifest's"]


def test_a_timestamp_before_its_users_previous_event_is_refused(tmp_path, log):
    ts = log["timestamp"].to_pylist()
    ts[5], ts[6] = ts[6] + 100, ts[5]  # user 0's 6th event now comes after its 7th
    path, spec = _write(
        tmp_path, log.set_column(2, "timestamp", pa.array(ts, pa.uint32())), "parquet"
    )
    result = _preprocess(path, spec, tmp_path / "out")
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(path))}: row 6: timestamp: {ts[6]} is before {ts[5]}, the "
        r"previous event of user 0; events must be in time order within each user",
    )
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_missing_column_is_refused_with_the_columns_there_are(tmp_path, log):
    path, spec = _write(tmp_path, log.drop_columns(["played_ratio_pct"]), "csv")
    result = _preprocess(path, spec, tmp_path / "out")
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(path))}: column 'played_ratio_pct' not found \(columns: uid, "
        rf"item_id, timestamp, .*\); set events.played_ratio in {re.escape(str(spec))}$",
    )


def test_an_item_outside_the_item_map_is_refused(tmp_path, log):
    items = log["item_id"].to_pylist()
    items[17] = 10_000_000
    path, spec = _write(tmp_path, log.set_column(1, "item_id", pa.array(items, pa.uint32())), "csv")
    result = _preprocess(path, spec, tmp_path / "out")
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(path))}:19: item_id: 10000000 is not an item of "
        rf"{re.escape(str(tmp_path / 'artist_item_mapping.parquet'))} \([\d,]+ items\)$",
    )


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize("user", [2**32 + 1, 2**63 + 5])
def test_a_user_id_past_32_bits_is_refused_not_folded_onto_another_user(tmp_path, log, kind, user):
    # The dataset keeps users as uint32 rows of their table: 2**32 + 1 had become user 1.
    users = log["uid"].to_pylist()
    users[4:8] = [user] * 4
    table = log.set_column(0, "uid", pa.array(users, pa.uint64()))
    path, spec = _write(tmp_path, table.sort_by("uid"), kind)
    result = _preprocess(path, spec, tmp_path / "out")
    place = f"{path}:{len(users) - 4 + 2}" if kind == "csv" else f"{path}: row {len(users) - 4}"
    assert_one_line_error(
        result,
        rf"^error: {re.escape(place)}: uid: {user} is past 4,294,967,295, the largest user id an "
        r"event-log dataset holds; renumber them from 0 \(an id is a row of its table\)$",
    )
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("80%", r"'80%' is not a number \(the percent played\)$"),
        # An empty one had made the listen a skip (label 0) without a word.
        (
            "",
            r"empty for a listen \(2 listens have none\); a listen's percent played makes its "
            r"label and its pool in later histories: fill it, or leave such rows out$",
        ),
        # An infinite one had made the listen a listen-plus (label 1), a negative one a skip.
        ("inf", r"inf is no percent played \(0 or more; 2 listens have such a value\); a listen"),
        ("-5", r"-5 is no percent played \(0 or more; 2 listens have such a value\); a listen"),
    ],
    ids=["no number", "empty", "infinite", "negative"],
)
def test_a_listens_played_ratio_that_is_no_number_or_empty_is_refused_with_its_row(
    tmp_path, log, kind, value, said
):
    played = [str(v) if v is not None else "" for v in log["played_ratio_pct"].to_pylist()]
    assert {log["event_type"][i].as_py() for i in (0, 9)} == {"listen"}
    played[0] = played[9] = value
    table = log.set_column(5, "played_ratio_pct", pa.array(played))
    path, spec = _write(tmp_path, table, kind)
    place = f"{path}:2" if kind == "csv" else f"{path}: row 0"
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(place)}: played_ratio_pct: {said}",
    )


def test_a_column_of_floats_in_the_second_file_names_that_file(tmp_path, log):
    first, _ = _write(tmp_path, log, "parquet")
    second = tmp_path / "later.parquet"
    pq.write_table(log.set_column(0, "uid", log["uid"].cast(pa.float64())), second)
    assert_one_line_error(
        cli(
            "preprocess",
            first,
            second,
            "--events",
            tmp_path / "spec.toml",
            "--out",
            tmp_path / "out",
            ok=False,
        ),
        rf"^error: {re.escape(str(second))}: uid holds double, not integers \(ids and seconds\)$",
    )


def test_an_unknown_event_type_is_refused_with_the_known_ones(tmp_path, log):
    kinds = log["event_type"].to_pylist()
    kinds[3] = "skip"
    path, spec = _write(tmp_path, log.set_column(4, "event_type", pa.array(kinds)), "parquet")
    result = _preprocess(path, spec, tmp_path / "out")
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(path))}: row 3: event_type: 'skip' is not one of listen, like, "
        r"dislike, unlike, undislike \(\[events.types\] in .*spec.toml\)$",
    )


def test_an_out_holding_a_dataset_of_another_spec_is_kept_and_the_same_rerun_allowed(tmp_path, log):
    path, spec = _write(tmp_path, log, "parquet")
    out = tmp_path / "out"
    cli("preprocess", path, "--events", spec, "--out", out)
    cli("preprocess", path, "--events", spec, "--out", out)  # the same command again: rewritten
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    other = tmp_path / "other.toml"
    other.write_text(spec.read_text() + "\n[label]\nplayed_ratio_min = 60\n")
    assert_one_line_error(
        _preprocess(path, other, out),
        rf"^error: {re.escape(str(out))}: holds a dataset made with another event spec "
        rf"\(label.played_ratio_min = 50.0 there, 60.0 in {re.escape(str(other))}\); remove the "
        "directory or choose another --out$",
    )
    later = tmp_path / "later.parquet"
    pq.write_table(log, later)
    assert_one_line_error(
        _preprocess(later, spec, out),
        rf"^error: {re.escape(str(out))}: holds a dataset of other inputs "
        rf"\({re.escape(str(path))}, not {re.escape(str(later))}\); remove the directory or "
        "choose another --out$",
    )
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_ctrl_c_or_a_kill_leaves_no_manifest_says_so_in_one_line_and_the_rerun_finishes(
    tmp_path, log, monkeypatch, stop
):
    from shardrec.dataloader.events import event_files

    path, spec = _write(tmp_path, log, "parquet")
    out = tmp_path / "out"
    cli("preprocess", path, "--events", spec, "--out", out)
    write_items = event_files.write_items

    def stopped(*args, **kwargs):
        if stop == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # a script's `kill`; its handler runs at once
        time.sleep(5)

    monkeypatch.setattr(event_files, "write_items", stopped)
    result = _preprocess(path, spec, out)
    assert result.exit_code == (130 if stop == "ctrl-c" else 143) and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"interrupted: {out}: the event-log dataset is not finished (no manifest, so nothing there "
        "is read as data); rerun the same command to make it"
    ]
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(event_files, "write_items", write_items)
    cli("preprocess", path, "--events", spec, "--out", out)
    assert json.loads(cli("data", "verify", out, "--json").stdout)["ok"]


@pytest.mark.parametrize("value", ['"fifty"', "true", "-1", "500"])
def test_a_label_threshold_not_a_percent_is_refused_naming_the_key(tmp_path, log, value):
    path, spec = _write(tmp_path, log, "parquet")
    spec.write_text(spec.read_text() + f"\n[label]\nplayed_ratio_min = {value}\n")
    shown = {"true": "True", '"fifty"': "'fifty'"}.get(value, value)
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(spec))}: \[label\] played_ratio_min = {re.escape(shown)} should "
        r"be a number from 0 to 100 \(the percent a listen is played to be a listen-plus\)$",
    )
    assert not (tmp_path / "out").exists()


def test_an_event_type_written_as_a_number_is_refused_in_the_spec(tmp_path, log):
    path, spec = _write(tmp_path, log, "parquet")
    spec.write_text(spec.read_text() + '\n[events.types]\nlisten = 1\nlike = "like"\n')
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(spec))}: \[events.types\] listen = 1 should be a string, the "
        r'value written in the type column as text \(e.g. listen = "1"\)$',
    )


def test_holding_out_every_window_of_the_log_is_refused_with_its_window_count(tmp_path, log):
    path, spec = _write(tmp_path, log, "parquet")
    spec.write_text(spec.read_text() + "\n[split]\nholdout_windows = 400\n")
    line = assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(spec))}: \[split\] holdout_windows = 400 holds out all of the "
        r"log's (\d+) window\(s\) of window_seconds = 86400, leaving none to train on; hold out at "
        r"most (\d+)$",
    )
    windows, most = map(int, re.search(r"log's (\d+) .* at most (\d+)$", line).groups())
    assert most == windows - 1 > 0
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_log_without_a_column_the_models_spec_reads_names_the_models_spec(tmp_path, log):
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.event_columns import EventLogError
    from shardrec.tools.preprocess.events.raw_events import event_row_batches

    path, spec = _write(tmp_path, log.drop_columns(["played_ratio_pct"]), "parquet")
    header = {"transform": {"events_spec": load_event_spec(spec).to_dict()}}
    with pytest.raises(EventLogError) as caught:
        event_row_batches(header, (np.zeros(1, np.int64), np.zeros(1, np.int64)), path)
    assert re.fullmatch(
        rf"{re.escape(str(path))}: column 'played_ratio_pct' not found \(columns: uid, item_id, "
        r"timestamp, .*\); the model's event spec reads events.played_ratio from it: score a log "
        "with the columns of the log the model was trained on",
        str(caught.value),
    )


@pytest.mark.parametrize("kind", ["csv", "tsv"])
def test_a_text_line_with_a_wrong_field_count_is_refused_with_its_line(tmp_path, log, kind):
    path, spec = _write(tmp_path, log, "csv")
    lines = path.read_text().splitlines()
    if kind == "tsv":
        lines = [line.replace(",", "\t") for line in lines]
        path = path.rename(tmp_path / "events.tsv")
        spec.write_text(spec.read_text().replace('kind = "csv"', 'kind = "tsv"'))
    sep = "\t" if kind == "tsv" else ","
    # Line 100 (the header is line 1): one field too many; rich printed "events.csv:100:" as
    # "events.csv💯", the line number gone (an emoji's name).
    lines[99] += f"{sep}9"
    path.write_text("\n".join(lines) + "\n")
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(path))}:100: expected 7 fields, got 8 \(as many as the header's "
        rf"columns, line 1; quote a value that holds a {'tab' if kind == 'tsv' else 'comma'}\)$",
    )
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_blank_lines_that_end_a_text_log_are_no_rows_and_one_between_rows_is_refused(tmp_path, log):
    # As the click-log readers take them; pyarrow refused the last: "events.csv:2864: expected 7
    # fields, got 1 (... quote a value that holds a comma)".
    path, spec = _write(tmp_path, log, "csv")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n  \n\t\n")
    result = cli("preprocess", path, "--events", spec, "--out", tmp_path / "out")
    assert (tmp_path / "out" / "manifest.json").is_file(), result.output
    path.write_text("\n".join([*lines[:40], " ", *lines[40:]]) + "\n")
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "mid"),
        rf"^error: {re.escape(str(path))}:41: expected 7 fields, got 1 ",
    )


def test_a_parquet_file_read_as_csv_is_refused_naming_the_format_setting(tmp_path, log):
    _, spec = _write(tmp_path, log, "csv")
    path = tmp_path / "events.csv"
    pq.write_table(log, path)  # a Parquet file under a .csv name, the spec's kind csv
    line = assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(path))}: a Parquet file, not csv text \(\[format\] kind = "
        rf'"csv" in {re.escape(str(spec))}\); set kind = "parquet" there$',
    )
    assert line.isprintable()


def test_an_item_map_in_parquet_under_a_csv_name_is_refused_naming_its_extension(tmp_path, log):
    path, spec = _write(tmp_path, log, "parquet")
    (tmp_path / "artist_item_mapping.parquet").rename(tmp_path / "artists.csv")
    spec.write_text(spec.read_text().replace("artist_item_mapping.parquet", "artists.csv"))
    map_path = tmp_path / "artists.csv"
    line = assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(map_path))}: a Parquet file, not csv text \(an item map is read "
        r"by its extension\); name it \.parquet \(items\.artist\.file in "
        rf"{re.escape(str(spec))}\)$",
    )
    assert line.isprintable()


def test_a_csv_file_read_as_parquet_is_refused_naming_the_format_setting(tmp_path, log):
    _, spec = _write(tmp_path, log, "parquet")
    path = tmp_path / "events.csv"
    pcsv.write_csv(log, path)  # CSV text, the spec's kind parquet
    line = assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(path))}: text, not a Parquet file \(\[format\] kind = "
        rf'"parquet" in {re.escape(str(spec))}\); set kind = "csv" there for comma-separated '
        r'text with a header \("tsv": tab-separated\)$',
    )
    assert line.isprintable()
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_item_map_in_csv_under_a_parquet_name_is_refused_naming_its_extension(tmp_path, log):
    path, spec = _write(tmp_path, log, "parquet")
    map_path = tmp_path / "artist_item_mapping.parquet"
    pcsv.write_csv(pq.read_table(map_path), map_path)
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(map_path))}: text, not a Parquet file \(an item map is read "
        r"by its extension\); name it \.csv or \.tsv \(items\.artist\.file in "
        rf"{re.escape(str(spec))}\)$",
    )


def test_a_missing_item_map_file_is_refused_naming_its_spec_key(tmp_path, log):
    path, spec = _write(tmp_path, log, "parquet")
    spec.write_text(spec.read_text().replace("artist_item_mapping.parquet", "maps/artists.parquet"))
    missing = tmp_path / "maps" / "artists.parquet"
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(spec))}: items\.artist\.file = 'maps/artists\.parquet': "
        rf"{re.escape(str(missing))} does not exist \(a relative path is read from the spec's "
        r"folder\); fix the path$",
    )
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("size", ["9223372036854775808", "99999999999999999999"])
def test_a_cross_size_past_64_bit_ids_is_refused_naming_the_key(tmp_path, log, size):
    """A cross's size had no upper bound (a column's hash_size has): 2^63 made a dataset whose
    table no 64-bit id could number."""
    path, spec = _write(tmp_path, log, "parquet")
    cross = f'\n[[crosses]]\nname = "user_x_item"\nkeys = ["uid", "item"]\nsize = {size}\n'
    spec.write_text(spec.read_text() + cross)
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        rf"^error: {re.escape(str(spec))}: crosses\[0\]: size = {size} is over "
        r"9223372036854775807 \(2\^63 - 1\), the most table rows 64-bit ids can number: give a "
        r"smaller one$",
    )
    assert not (tmp_path / "out").exists()


def test_an_event_part_whose_user_offsets_are_shifted_is_refused_by_verify_and_readers(
    tmp_path, log
):
    # Every list column's offsets shifted by -100, the size and checksum recorded: each user's
    # length unchanged, so the loader's anchor check passed, and the compiled history gather
    # (unchecked) would read before the events. verify said "every file matches", head read it.
    import hashlib

    path, spec = _write(tmp_path, log, "parquet")
    out = tmp_path / "out"
    cli("preprocess", path, "--events", spec, "--out", out)
    part = out / "events" / "part-00000.arrow"
    reader = pa.ipc.open_file(pa.memory_map(str(part), "r"))
    offsets = reader.get_batch(0).column("item").offsets.to_numpy()
    data = bytes(part.read_bytes())
    assert data.count(offsets.tobytes()) == 4  # item, ts, action, organic share them
    data = data.replace(offsets.tobytes(), (offsets - 100).tobytes())
    part.write_bytes(data)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(p for p in manifest["events"]["parts"] if p["name"].endswith("part-00000.arrow"))
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (out / "manifest.json").write_text(json.dumps(manifest))
    line = re.escape(f"{part}: its users' event offsets do not run in order from 0 to its ")
    verified = cli("data", "verify", out, ok=False)
    assert verified.exit_code == 1 and re.search(line, verified.stdout), verified.stdout
    assert_one_line_error(cli("data", "head", out, "--rows", "5", ok=False), line)


def test_a_history_too_short_for_its_three_pools_says_the_least_that_works(tmp_path, log):
    # "length = 2 keeps nothing" did not say that an interleaved history keeps length / 3 of each
    # of three pools, so that 3 is the least.
    path, spec = _write(tmp_path, log, "parquet")
    spec.write_text(spec.read_text().replace("length = 12", "length = 2"))
    assert_one_line_error(
        _preprocess(path, spec, tmp_path / "out"),
        r"length = 2 keeps nothing \(length / 3 of each of listen-plus, like and skip\): give at "
        r"least 3$",
    )
