"""Blank lines that end a file (a hand-written CSV's doubled last newline, `echo >> file`) are no
rows: not counted as lines, not as malformed rows, no place in a split. Before, each was a line
of the last split and a malformed row (`empty_row`): a tiny file was refused for its share of
them, and a large one moved its val/test boundaries by a row, without a word."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli

from shardrec.tools.preprocess import gz_stream
from shardrec.tools.synth.criteo import SynthSpec, write_file

CHUNK_MB = "0.0625"  # 64 KiB of text per task: the .gz file below is cut into ranges
# `echo >> file`; and blank lines of a carriage return too, more of them than a range's text (a
# cut lands among them), the last one without its newline; and lines of spaces (in Criteo's TSV,
# a tab is a delimiter: a line of tabs is a row), one longer than a range's text. Before, a line
# of spaces was a malformed row: 'error: ...: 1 of 8,001 lines malformed (too_few_fields 1)'.
ENDINGS = {
    "one": b"\n",
    "many": b"\r\n\n" * 50_000 + b"\r",
    "spaces": b"   \n" + b" " * 100_000 + b"\r\n \r \n  ",
}


def _parts(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".work" not in p.parts and p.name != "manifest.json"
    }


def _manifest(root: Path) -> dict:
    m = json.loads((root / "manifest.json").read_text())
    return {"rows": {s: v["rows"] for s, v in m["splits"].items()}, "skipped": m["skipped"]}


def _preprocess(raw: Path, out: Path, *extra: str) -> None:
    cli("preprocess", raw, "--out", out, "--max-ids", "300", "--chunk-mb", CHUNK_MB, *extra)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("raw") / "train.txt"
    write_file(path, 8000, SynthSpec.from_seed(5, max_vocab=300), 0)
    return path.read_bytes()


def _write(path: Path, data: bytes) -> None:
    """`data` as `path`, and gzipped as gz/NAME.gz beside it (a folder: read as .gz input)."""
    path.parent.mkdir()
    path.write_bytes(data)
    (path.parent / "gz").mkdir()
    (path.parent / "gz" / f"{path.name}.gz").write_bytes(gzip.compress(data, compresslevel=1))


@pytest.fixture(scope="module")
def clean(text: bytes, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict]]:
    """The file without blank lines, preprocessed once for the module as the tests read the file
    with them: read name -> (its parts, its manifest's rows and skips)."""
    raw = tmp_path_factory.mktemp("clean") / "text" / "train.txt"
    _write(raw, text)
    reads = {
        "plain": (raw,),
        # The planning pass of a .gz file cut into ranges (vocabulary mode, --part), and a whole
        # .gz file read by one task (under 4 chunks compressed: not cut).
        "gzip ranges planned": (raw.parent / "gz", "--min-count", "2"),
        "gzip whole": (raw.parent / "gz", "--chunk-mb", "1"),
    }
    datasets = {}
    for name, (source, *args) in reads.items():
        out = raw.parent.parent / name
        _preprocess(source, out, *args)
        datasets[name] = (_parts(out), _manifest(out))
    return datasets


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_every_reader_gives_the_dataset_of_the_file_without_them(
    clean: dict[str, tuple[dict, dict]], text: bytes, tmp_path: Path, ending: str
) -> None:
    blank = tmp_path / "blank" / "train.txt"
    _write(blank, text + ENDINGS[ending])
    want, want_manifest = clean["plain"]
    assert want_manifest == {"rows": {"train": 6857, "val": 572, "test": 571}, "skipped": {}}
    runs = {
        "plain": (blank,),
        "gzip ranges streamed, 1 worker": (blank.parent / "gz", "--workers", "1"),
        "gzip ranges streamed, 2 workers": (blank.parent / "gz", "--workers", "2"),
    }
    for name, args in runs.items():
        _preprocess(*args[:1], tmp_path / name, *args[1:])
        assert _parts(tmp_path / name) == want, name
        assert _manifest(tmp_path / name) == want_manifest, name
    # The planning pass of a .gz file cut into ranges, and a whole .gz file read by one task, each
    # against the clean file read the same way.
    for name, args in {
        "gzip ranges planned": ("--min-count", "2"),
        "gzip whole": ("--chunk-mb", "1"),
    }.items():
        _preprocess(blank.parent / "gz", tmp_path / name, *args)
        assert (_parts(tmp_path / name), _manifest(tmp_path / name)) == clean[name], name


def test_more_blank_lines_than_a_streamed_range_holds(
    clean: dict[str, tuple[dict, dict]], text: bytes, tmp_path: Path
) -> None:
    """Blank lines that end a streamed .gz file, more than a range's shared-memory slot holds (its
    text and 1 MiB), on 2 workers. Before: 'error: memoryview assignment: lvalue and rvalue have
    different structures', exit 1 (the blank lines read past a range's end were copied into the
    next slot, which they did not fit)."""
    blank = tmp_path / "train.txt.gz"
    blank.write_bytes(gzip.compress(text + b"\n" * (3 << 19), compresslevel=1))
    _preprocess(blank, tmp_path / "got", "--workers", "2")
    assert (_parts(tmp_path / "got"), _manifest(tmp_path / "got")) == clean["plain"]


def test_a_long_run_of_blank_lines_is_judged_once(
    clean: dict[str, tuple[dict, dict]],
    text: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1 MiB of newlines that end a streamed .gz file cut into 64 KiB ranges: the decoder reads
    them 64 KiB at a time, to find out whether rows follow. Before, it judged all the blank lines
    read so far again after each read: quadratic (2 MB of them cost 6.9 CPU s, 8 MB 81 s, against
    ~1 s without them); each is judged once now (counted: the bytes blank_tail walks back over)."""
    walked = []

    def counted(data, lo: int, hi: int, *blank: bytes) -> int:
        start = blank_tail(data, lo, hi, *blank)
        walked.append(hi - start)
        return start

    blank_tail = gz_stream.blank_tail
    monkeypatch.setattr(gz_stream, "blank_tail", counted)
    run = 1 << 20
    blank = tmp_path / "train.txt.gz"
    blank.write_bytes(gzip.compress(text + b"\n" * run, compresslevel=1))
    _preprocess(blank, tmp_path / "got", "--workers", "1")
    # Twice: as read ahead of the last range, and as the text left after it (11.4x before).
    assert run <= sum(walked) <= 3 * run
    assert (_parts(tmp_path / "got"), _manifest(tmp_path / "got")) == clean["plain"]


def test_a_small_csv_with_a_blank_last_line_is_preprocessed(tmp_path: Path) -> None:
    """Before: 'error: small.csv: 1 of 6 lines malformed (16.67%: empty_row 1), more than the
    0.003 allowed (--max-skipped-fraction); first: small.csv:7: row: (empty line) (empty_row)'."""
    log, spec = tmp_path / "small.csv", tmp_path / "small.toml"
    log.write_text(
        "label,city\n1,paris\n0,rome\n1,paris\n0,oslo\n1,rome\n0,oslo\n1,rome\n0,paris\n\n"
    )
    cli("spec", "infer", log, "--label", "label", "--out", spec)
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "out")
    assert _manifest(tmp_path / "out") == {
        "rows": {"train": 6, "val": 1, "test": 1},
        "skipped": {},
    }


def test_a_csv_whose_last_lines_hold_spaces_and_tabs_is_preprocessed(tmp_path: Path) -> None:
    """Lines of nothing but spaces, tabs and carriage returns (but the delimiter) are blank, as
    pandas' read_csv skips them (and reads a line of tabs in a TSV file as a row of empty fields).
    Before, `spec infer` took them for rows ("label column 'label' holds 4 distinct values (e.g.
    ['\\t', ' \\t ', '0', '1']), not two"), and preprocess with the spec refused them: 'error:
    small.csv: 2 of 10 lines malformed (20.00%: too_few_fields 2), more than the 0.003 allowed
    (--max-skipped-fraction); first: small.csv:10: row: 1 fields, the spec needs at least 2 of 2
    (too_few_fields)'."""
    log, spec = tmp_path / "small.csv", tmp_path / "small.toml"
    log.write_text(
        "label,city\n1,paris\n0,rome\n1,paris\n0,oslo\n1,rome\n0,oslo\n1,rome\n0,paris\n \t \n\t",
        newline="",
    )
    cli("spec", "infer", log, "--label", "label", "--out", spec)
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "out")
    assert _manifest(tmp_path / "out") == {
        "rows": {"train": 6, "val": 1, "test": 1},
        "skipped": {},
    }


def test_a_last_line_of_the_delimiter_is_a_row(text: bytes, tmp_path: Path) -> None:
    """A line of tabs in Criteo's TSV is a row of empty fields, not a blank line: a malformed row
    (no label), counted as such by every reader."""
    log = tmp_path / "train.txt.gz"
    log.write_bytes(gzip.compress(text + b"\t" * 39 + b"\n", compresslevel=1))
    for workers in ("1", "2"):
        _preprocess(log, tmp_path / workers, "--workers", workers)
        assert _manifest(tmp_path / workers)["skipped"] == {"bad_label": 1}


def test_a_blank_line_with_rows_after_it_is_still_a_malformed_row(tmp_path: Path) -> None:
    log, spec = tmp_path / "small.csv", tmp_path / "small.toml"
    log.write_text("label,city\n1,paris\n0,rome\n\n1,paris\n0,oslo\n1,rome\n0,oslo\n1,rome\n")
    cli("spec", "infer", log, "--label", "label", "--out", spec)
    refused = cli("preprocess", log, "--spec", spec, "--out", tmp_path / "out", ok=False)
    assert_one_line_error(
        refused,
        rf"^error: {log}: 1 of 8 lines malformed \(12\.50%: empty_row 1\).*"
        rf"first: {log}:4: row: \(empty line\) \(empty_row\); remove the line or skip such "
        r"rows with --max-skipped-fraction 0\.13$",
    )
