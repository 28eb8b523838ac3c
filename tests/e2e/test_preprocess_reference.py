"""The MLPerf DLRMv2 reference's preprocessing (tools/preprocess/derived/mlperf_reference.py)
against torchrec's own Criteo scripts, run here on 24 tiny synthetic days: every array byte for
byte; `shardrec data reference-npy` with the published arrays' dense transform, a rerun, and a
malformed row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardrec.tools.preprocess.derived.mlperf_reference import reference_preprocess

DAYS = 24


def _write_days(raw: Path) -> list[Path]:
    """24 day files of a few rows: missing fields, negative integers, ids repeated across days."""
    rng = np.random.RandomState(5)
    raw.mkdir()
    paths = []
    for d in range(DAYS):
        lines = []
        for _ in range(3 + d % 4):
            dense = [str(int(v)) for v in rng.randint(-3 if d % 3 else 0, 50, 13)]
            sparse = [
                f"{int(v):08x}" for v in rng.choice([0x1F, 0xDEADBEEF, 0x7FFFFFFF, *range(40)], 26)
            ]
            for i in rng.choice(39, 4, replace=False):  # missing values
                (dense if i < 13 else sparse)[i % 13 if i < 13 else i - 13] = ""
            lines.append("\t".join([str(rng.randint(2)), *dense, *sparse]))
        path = raw / f"day_{d}"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def _torchrec_scripts(raw: Path, root: Path) -> Path:
    """The reference's process_Criteo_1TB_Click_Logs_dataset.sh, in process."""
    from torchrec.datasets.criteo import BinaryCriteoUtils
    from torchrec.datasets.scripts import contiguous_preproc_criteo, npy_preproc_criteo

    s1, s2, out = root / "s1", root / "s2", root / "ref"
    for d in (s1, s2, out):
        d.mkdir()
    npy_preproc_criteo.main(["--input_dir", str(raw), "--output_dir", str(s1)])
    contiguous_preproc_criteo.main(
        ["--input_dir", str(s1), "--output_dir", str(s2), "--frequency_threshold", "0"]
    )
    for d in range(DAYS):
        (s2 / f"day_{d}_sparse_contig_freq.npy").rename(s2 / f"day_{d}_sparse.npy")
    rows = {d: len(np.load(s1 / f"day_{d}_labels.npy")) for d in range(DAYS - 1)}
    BinaryCriteoUtils.shuffle(str(s1), str(s2), str(out), rows, random_seed=0)
    return out


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    root = tmp_path_factory.mktemp("reference")
    paths = _write_days(root / "raw")
    return paths, _torchrec_scripts(root / "raw", root)


def test_arrays_equal_torchrecs_scripts_byte_for_byte(
    days, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardrec.tools.preprocess.derived import mlperf_reference as reference

    paths, ref = days
    # Pieces of 2 rows and ~300 bytes of text: every step crosses chunk boundaries, as on real days.
    monkeypatch.setattr(reference, "CHUNK_ROWS", 2)
    monkeypatch.setattr(reference, "CHUNK_BYTES", 300)
    # Today's torchrec scripts transform dense values as log(x - day minimum + 2).
    rows = reference_preprocess(paths, tmp_path / "out", dense="log-min2", seed=0)
    assert rows == [3 + d % 4 for d in range(DAYS)]
    names = sorted(p.name for p in ref.iterdir())
    # Beside the arrays, only the record of what made them (a rerun with other settings is refused).
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted([*names, "reference-npy.json"]) and len(names) == 3 * DAYS
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == (ref / name).read_bytes(), name


def _without_minus_three(paths: list[Path], into: Path) -> list[Path]:
    """The days with each dense -3 written as -2: log3 (log(x + 3)) of -3 is -inf, which
    reference-npy refuses (the next test); ids and labels stay as they were."""
    into.mkdir()
    out = []
    for path in paths:
        rows = [line.split("\t") for line in path.read_text().splitlines()]
        for r in rows:
            r[1:14] = ["-2" if v == "-3" else v for v in r[1:14]]
        out.append(into / path.name)
        out[-1].write_text("".join("\t".join(r) + "\n" for r in rows))
    return out


def test_log3_is_the_published_arrays_transform_and_a_rerun_keeps_the_files(
    days, tmp_path: Path
) -> None:
    paths, ref = days
    paths = _without_minus_three(paths, tmp_path / "raw")
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardrec.tools.cli",
            "data",
            "reference-npy",
            *map(str, paths),
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"rows": [3 + d % 4 for d in range(DAYS)]}
    # torchrec 0.3.2 (the published arrays): int32 values + 3, then np.log to float32; missing -> 0
    # -> log(3).
    raw = [[line.split("\t") for line in p.read_text().splitlines()] for p in paths]
    log3 = [
        np.log(
            np.array([[int(v or "0") for v in r[1:14]] for r in day], dtype=np.int32) + 3,
            dtype=np.float32,
        )
        for day in raw
    ]
    perm = np.random.RandomState(0).permutation(sum(len(day) for day in raw[:-1]))
    shuffled, at = np.concatenate(log3[:-1])[perm], 0
    for d in range(DAYS - 1):
        got = np.load(out / f"day_{d}_dense.npy")
        assert got.tobytes() == shuffled[at : at + len(got)].tobytes()
        at += len(got)
    assert np.load(out / f"day_{DAYS - 1}_dense.npy").tobytes() == log3[-1].tobytes()
    # Ids and labels do not depend on the dense transform; the last day's ids keep the dtype
    # torchrec 0.3.2 parsed them into, int32 (today's torchrec: int64), as its md5sums need.
    for d in range(DAYS):
        for kind in ("sparse", "labels"):
            if (d, kind) == (DAYS - 1, "sparse"):
                continue
            assert (out / f"day_{d}_{kind}.npy").read_bytes() == (
                ref / f"day_{d}_{kind}.npy"
            ).read_bytes()
    last, today = (np.load(p / f"day_{DAYS - 1}_sparse.npy") for p in (out, ref))
    assert (last.dtype, today.dtype) == (np.int32, np.int64)
    assert np.array_equal(last, today)
    # A rerun finds every file in place and rewrites none.
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    reference_preprocess(paths, out, dense="log3", seed=0)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_ids_past_2_to_the_24_round_through_float32_as_torchrecs_shuffle_rounds_them(
    tmp_path: Path,
) -> None:
    """Criteo 1TB's largest columns number ids past 2^24, where torchrec's one float32 matrix
    rounds them (to even, 2 apart up to 2^25, ...): step 3 against torchrec's own shuffle on ids
    from 2^24 - 2 to 2^31 - 1 (contiguous ids that large need tens of millions of distinct values,
    so step 3 is fed step 2's arrays directly). The last day's ids pass unrounded."""
    from torchrec.datasets.criteo import BinaryCriteoUtils

    from shardrec.tools.preprocess.derived.mlperf_reference import reference_dense, write_days

    rng = np.random.RandomState(3)
    work, s1, s2, ref, out = (tmp_path / n for n in ("work", "s1", "s2", "ref", "out"))
    for d in (work, s1, s2, ref, out):
        d.mkdir()
    large = np.array([2**24 - 2, 2**24 - 1, 2**24, 2**24 + 1, 2**24 + 3, 2**25 + 5, 2**31 - 1])
    rows = {0: 5, 1: 4, 2: 6}
    for day, n in rows.items():
        dense_raw = rng.randint(-3, 100, (n, 13)).astype(np.int32)
        ids = rng.choice(np.concatenate([large, np.arange(2, 40)]), (n, 26)).astype(np.int64)
        ids[0, : len(large)] = large  # every large id on every day
        labels = rng.randint(0, 2, (n, 1)).astype(np.int32)
        np.save(work / f"day_{day}_dense_raw.npy", dense_raw)
        np.save(work / f"day_{day}_ids.npy", ids)
        np.save(work / f"day_{day}_labels.npy", labels)
        # torchrec's inputs: steps 1-2's outputs (today's dense transform).
        np.save(
            s1 / f"day_{day}_dense.npy", reference_dense(dense_raw, "log-min2", dense_raw.min())
        )
        np.save(s1 / f"day_{day}_labels.npy", labels)
        np.save(s2 / f"day_{day}_sparse.npy", ids)
    training = {day: n for day, n in rows.items() if day < 2}  # as the reference's script gives it
    BinaryCriteoUtils.shuffle(str(s1), str(s2), str(ref), training, days=3, random_seed=0)
    write_days(work, out, 3, "log-min2", seed=0)
    names = sorted(p.name for p in ref.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names and len(names) == 9
    for name in names:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    shuffled = np.concatenate([np.load(out / f"day_{d}_sparse.npy") for d in (0, 1)])
    # Rounded as torchrec rounds them (2^24 + 1 -> 2^24, 2^25 + 5 -> 2^25 + 4); the last day not.
    assert not np.isin([2**24 + 1, 2**24 + 3, 2**25 + 5], shuffled).any()
    assert np.isin([2**24, 2**24 + 4, 2**25 + 4], shuffled).all()
    assert np.isin(large, np.load(out / "day_2_sparse.npy")).all()


def test_a_malformed_row_is_one_line_naming_file_line_reason_and_what_to_do(tmp_path: Path) -> None:
    """Before, the line named no reason and no fix: 'day_1:2: row: 2 fields, schema needs at least
    37 of 40; the reference parses every row'."""
    good = "\t".join(["1", *["1"] * 13, *["0000000a"] * 26])
    (tmp_path / "day_0").write_text(f"{good}\n{good}\n")
    (tmp_path / "day_1").write_text(f"{good}\n1\tx\n")
    said = (
        f"{tmp_path}/day_1:2: row: 2 fields, schema needs at least 37 of 40 (too_few_fields); the "
        "reference parses every row, skipping none: correct the row or remove it"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        reference_preprocess([tmp_path / "day_0", tmp_path / "day_1"], tmp_path / "out")


def test_a_non_finite_dense_value_is_refused_where_it_enters_and_the_hint_makes_finite_arrays(
    tmp_path: Path,
) -> None:
    """log(x + 3) of Criteo's I2 = -3 is -inf (torchrec's old transform, fixed in its scripts by
    log(x - min + 2)): reference-npy refuses it naming file, line and column, import-npy refuses
    arrays holding such a value naming file, row and column, and the command both name writes
    finite arrays that import."""
    from helpers import assert_one_line_error, cli

    good = "\t".join(["1", *["1"] * 13, *["0000000a"] * 26])
    low = "\t".join(["0", "5", "-3", *["1"] * 11, *["0000000b"] * 26])
    days = [tmp_path / "day_0", tmp_path / "day_1"]
    days[0].write_text(f"{good}\n{low}\n{good}\n")
    days[1].write_text(f"{good}\n{good}\n")
    refused = cli("data", "reference-npy", *days, "--out", tmp_path / "ref", ok=False)
    assert_one_line_error(
        refused,
        rf"^error: {days[0]}:2: I2: -3: log\(-3 \+ 3\) is -inf \(the reference's log3 has no "
        r"finite value for integers below -2\); rerun with --dense log-min2, ",
    )
    # Arrays made by the old transform elsewhere: -inf in I2 of day 0's second row.
    old = tmp_path / "old"
    old.mkdir()
    for d, rows in enumerate(([good, low, good], [good, good])):
        fields = [r.split("\t") for r in rows]
        dense = np.array([[int(v) for v in f[1:14]] for f in fields], np.int32)
        with np.errstate(divide="ignore"):
            np.save(old / f"day_{d}_dense.npy", np.log(dense + 3, dtype=np.float32))
        np.save(old / f"day_{d}_sparse.npy", np.full((len(rows), 26), 3, np.int32))
        np.save(old / f"day_{d}_labels.npy", np.array([[int(f[0])] for f in fields], np.int32))
    assert_one_line_error(
        cli("data", "import-npy", old, "--out", tmp_path / "imported", ok=False),
        rf"^error: {old / 'day_0_dense.npy'}: row 1, column 1 \(I2\): -inf is not a number a "
        r"model can train on \(1 such value in rows 0-2\); remake the arrays with finite values "
        r"\(`shardrec data reference-npy DAYS --out DIR --dense log-min2` ",
    )
    # The hint: today's torchrec transform, every value finite; the arrays import.
    cli("data", "reference-npy", *days, "--out", tmp_path / "ref", "--dense", "log-min2")
    assert all(np.isfinite(np.load(tmp_path / "ref" / f"day_{d}_dense.npy")).all() for d in (0, 1))
    cli("data", "import-npy", tmp_path / "ref", "--out", tmp_path / "imported")


def test_blank_lines_that_end_a_day_file_are_no_rows_and_one_before_a_row_is_refused(
    tmp_path: Path,
) -> None:
    """Blank lines that end a file are no rows, as preprocess and predict read them: the arrays are
    those of the files without them. Before, a day file ending in "\\n\\n" was refused: 'error:
    day_1:3: row: (empty line); the reference parses every row'."""
    from helpers import assert_one_line_error, cli

    rows = ["\t".join([str(k % 2), *[str(k)] * 13, *[f"{k + 10:08x}"] * 26]) for k in range(4)]
    plain, blank = tmp_path / "plain", tmp_path / "blank"
    for folder, tail in ((plain, ""), (blank, "\n \r\n  \n")):
        folder.mkdir()
        for d in (0, 1):
            (folder / f"day_{d}").write_text("\n".join(rows[2 * d : 2 * d + 2]) + "\n" + tail)
    for folder in (plain, blank):
        cli("data", "reference-npy", folder / "day_0", folder / "day_1", "--out", folder / "out")
    arrays = sorted(p.name for p in (plain / "out").glob("day_*.npy"))
    assert len(arrays) == 6
    for name in arrays:
        assert (blank / "out" / name).read_bytes() == (plain / "out" / name).read_bytes()
    # A blank line with a row after it holds no row of the day: refused, naming its line.
    (blank / "day_1").write_text(rows[2] + "\n\n" + rows[3] + "\n\n")
    days = (blank / "day_0", blank / "day_1")
    refused = cli("data", "reference-npy", *days, "--out", tmp_path / "o", ok=False)
    said = (
        rf"^error: {days[1]}:2: row: \(empty line\) \(empty_row\); the reference parses every row"
    )
    assert_one_line_error(refused, said)
