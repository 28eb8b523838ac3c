"""gzip inputs: ISA-L and Python's gzip give the same dataset; damaged files are one clear line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from shardrec.tools.cli.app import app
from shardrec.tools.preprocess.text import gz
from shardrec.tools.synth.criteo import write_dataset

runner = CliRunner()


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".work" not in p.parts
    }


def _preprocess(raw: Path, out: Path, *extra: str):
    return runner.invoke(
        app, ["preprocess", str(raw), "--out", str(out), "--max-ids", "300", *extra]
    )


@pytest.mark.skipif(gz._igzip is None, reason="isal is not installed")
@pytest.mark.parametrize("mode", [[], ["--min-count", "2"]])
def test_isal_and_python_gzip_give_the_same_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: list[str]
):
    write_dataset(tmp_path / "raw", rows=4000, seed=3, days=3, gz=True, max_vocab=300)
    monkeypatch.setenv(gz.ENV, "isal")
    assert gz.backend() == "isal"
    fast = _preprocess(tmp_path / "raw", tmp_path / "fast", *mode)
    monkeypatch.setenv(gz.ENV, "python")
    assert gz.backend() == "python"
    slow = _preprocess(tmp_path / "raw", tmp_path / "slow", *mode)
    assert fast.exit_code == 0 and slow.exit_code == 0, fast.output + slow.output
    a, b = _tree(tmp_path / "fast"), _tree(tmp_path / "slow")
    assert "manifest.json" in a and len(a) > 3  # the manifest and the parts of 3 days
    assert a == b  # every part file and the manifest (with every file's SHA-256), byte for byte


def test_bad_backend_name_is_one_line(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(gz.ENV, "zstd")
    with pytest.raises(ValueError, match="SHARDREC_GZIP='zstd' is not one of isal, python"):
        gz.backend()


def _corrupt_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 4000] = (
        np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    )
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backend", ["isal", "python"])
@pytest.mark.parametrize("day", [0, 1])  # day 1 is the last: its lines are counted while planning
def test_dead_gzip_stream_mid_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, day: int
):
    if backend == "isal" and gz._igzip is None:
        pytest.skip("isal is not installed")
    monkeypatch.setenv(gz.ENV, backend)
    days = write_dataset(tmp_path / "raw", rows=20000, seed=1, days=2, gz=True, max_vocab=200)
    _corrupt_middle(days[day])
    res = _preprocess(tmp_path / "raw", tmp_path / "data")
    assert res.exit_code == 1
    lines = [
        ln for ln in res.output.splitlines() if ln.startswith("error:")
    ]  # the rest is the progress bar
    assert len(lines) == 1, res.output
    assert lines[0].startswith(
        f"error: {days[day]}: dead gzip stream mid-file at or before compressed byte "
    ), lines[0]
    assert f"of {days[day].stat().st_size:,}: corrupt data" in lines[0]
    assert "Traceback" not in res.output


@pytest.mark.parametrize("backend", ["isal", "python"])
def test_truncated_and_non_gzip_files_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
):
    if backend == "isal" and gz._igzip is None:
        pytest.skip("isal is not installed")
    monkeypatch.setenv(gz.ENV, backend)
    days = write_dataset(tmp_path / "raw", rows=3000, seed=1, days=2, gz=True, max_vocab=200)
    data = days[1].read_bytes()
    days[1].write_bytes(data[: len(data) // 2])
    res = _preprocess(tmp_path / "raw", tmp_path / "a")
    assert (
        res.exit_code == 1
        and f"{days[1]}: unreadable or truncated: the gzip stream ends early" in res.output
    )
    days[1].write_bytes(b"label\tI1\n1\t2\n")  # plain text named .gz
    res = _preprocess(tmp_path / "raw", tmp_path / "b")
    assert res.exit_code == 1 and f"{days[1]}: unreadable: not a gzip stream" in res.output
    assert gzip.decompress(days[0].read_bytes())  # the other day is untouched
