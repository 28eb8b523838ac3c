"""Torn and lost files (README, Failures and trust: Preprocessing, Reports): torn task markers, a
torn run record, a lost part, a write error, an export's completion marker, and a torn
metrics.jsonl."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app
from shardrec.tools.preprocess.derived import npy_import_export
from shardrec.tools.synth.criteo import write_dataset

runner = CliRunner()
ARGS = ["--max-ids", "5000", "--chunk-mb", "0.1"]


def outputs(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and ".work" not in p.parts
    }


def preprocess(raw: Path, out: Path, *extra: str):
    return runner.invoke(app, ["preprocess", str(raw), "--out", str(out), *ARGS, *extra, "--json"])


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("raw"), rows=3000, seed=8, max_vocab=500)[
        0
    ]  # ~7 tasks


@pytest.fixture(scope="module")
def reference(raw: Path, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "data"
    assert preprocess(raw, out).exit_code == 0
    return outputs(out)


@pytest.mark.parametrize("torn", [b"", b'{"index": 1, "path": "'], ids=["empty", "half-written"])
def test_torn_task_marker_means_the_task_is_redone(
    raw: Path, reference, tmp_path: Path, torn: bytes
):
    out = tmp_path / "data"
    assert preprocess(raw, out).exit_code == 0
    (out / ".work" / "task-00001.json").write_bytes(torn)
    res = preprocess(raw, out)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tasks_run"] == 1
    assert outputs(out) == reference


def test_torn_run_record_is_named(raw: Path, tmp_path: Path):
    out = tmp_path / "data"
    assert preprocess(raw, out).exit_code == 0
    record = out / ".work" / "run.json"
    record.write_bytes(record.read_bytes()[:10])
    assert_one_line_error(
        preprocess(raw, out),
        rf"^error: {re.escape(str(record))}: unreadable run record \(.*\); remove the directory",
    )


def test_a_dataset_without_its_run_record_is_not_overwritten(raw: Path, tmp_path: Path):
    """A finished dataset whose .work/ is gone (cleaned up, copied without it): its settings are
    unknown, so a run with other settings is refused instead of replacing its files."""
    out = tmp_path / "data"
    assert preprocess(raw, out).exit_code == 0
    (out / ".work" / "run.json").unlink()
    before = outputs(out)
    assert_one_line_error(
        preprocess(raw, out, "--max-ids", "7000"),
        rf"^error: {re.escape(str(out))}: holds a dataset \(manifest.json\) but no record of the "
        r"run that wrote it \(.work/run.json\); remove the directory or choose another --out",
    )
    assert outputs(out) == before


def test_deleted_part_whose_marker_survives_is_rebuilt(raw: Path, reference, tmp_path: Path):
    out = tmp_path / "data"
    assert preprocess(raw, out).exit_code == 0
    (out / "train" / "part-00002-0000.arrow").unlink()
    res = preprocess(raw, out)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tasks_run"] == 1
    assert outputs(out) == reference


def _limit_file_size() -> None:
    # Writes past 15 KB fail with EFBIG (Python ignores SIGXFSZ): a write error on the 1st
    # part file.
    resource.setrlimit(resource.RLIMIT_FSIZE, (15_000, 15_000))


def test_write_error_leaves_no_temporary_and_the_rerun_recovers(
    raw: Path, reference, tmp_path: Path
):
    out = tmp_path / "data"
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "preprocess",
        str(raw),
        "--out",
        str(out),
        *ARGS,
    ]
    failed = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size
    )
    assert_one_line_error(
        failed, rf"^error: {re.escape(str(out))}/train/part-00000-0000.arrow: File too large$"
    )
    assert not list(out.rglob(".*.tmp*"))
    assert preprocess(raw, out).exit_code == 0
    assert outputs(out) == reference


def test_export_npy_writes_a_completion_marker_last(raw: Path, tmp_path: Path, monkeypatch):
    data, npy = tmp_path / "data", tmp_path / "npy"
    assert preprocess(raw, data).exit_code == 0
    res = runner.invoke(app, ["data", "export-npy", str(data), "--out", str(npy), "--json"])
    assert res.exit_code == 0, res.output
    marker = json.loads((npy / npy_import_export.EXPORT_MARKER).read_bytes())
    assert marker["rows"] == json.loads(res.stdout)
    assert marker["bytes"] == {p.name: p.stat().st_size for p in npy.glob("day_*.npy")}

    real, calls = npy_import_export._export_day, []

    def dies_on_day_two(parts, out, day, names):  # an export that fails part way (full disk, kill)
        calls.append(day)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(parts, out, day, names)

    monkeypatch.setattr(npy_import_export, "_export_day", dies_on_day_two)
    with pytest.raises(OSError):
        npy_import_export.export_npy(data, npy)
    assert not (
        npy / npy_import_export.EXPORT_MARKER
    ).exists()  # the earlier marker does not vouch for it


RECORDS = [
    {"kind": "train", "step": s, "loss": 0.7 - s / 100, "samples_per_s": 1000.0}
    for s in (10, 20, 30)
]


def test_report_skips_a_torn_last_metrics_line_and_names_a_torn_middle_one(tmp_path: Path):
    metrics = tmp_path / "metrics.jsonl"
    whole = "".join(json.dumps(r) + "\n" for r in RECORDS)
    metrics.write_text(whole + '{"kind": "train", "step": 4')  # killed while appending
    res = runner.invoke(app, ["report", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["records"] == 3
    assert res.stderr.splitlines() == [
        f"warning: {metrics}:4: torn last record skipped (a run killed while writing it?)"
    ]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    metrics.write_text(json.dumps(RECORDS[0]) + '\n{"kind": "tr\n' + json.dumps(RECORDS[1]) + "\n")
    assert_one_line_error(
        runner.invoke(app, ["report", str(tmp_path)]),
        rf"^error: {re.escape(str(metrics))}:2: not a JSON record ",
    )
