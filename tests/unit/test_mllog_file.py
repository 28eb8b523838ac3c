"""RUN/mllog.jsonl across invocations: a resumed run's log replaces none of the earlier ones."""

from __future__ import annotations

from pathlib import Path

from shardrec.trainer.rundir.mllog import MlperfLog


def _invocation(path: Path, key: str) -> None:
    log = MlperfLog(enabled=True)
    log.event("init_start" if key == "first" else key)  # held until the file is opened
    log.open(path)
    log.event("run_start", metadata={"part": key})
    log._file.close()


def test_each_invocation_keeps_the_logs_before_it(tmp_path: Path) -> None:
    path = tmp_path / "mllog.jsonl"
    _invocation(path, "first")
    first = path.read_bytes()
    _invocation(path, "second")
    second = path.read_bytes()
    _invocation(path, "third")
    assert (tmp_path / "mllog.1.jsonl").read_bytes() == first
    assert (tmp_path / "mllog.2.jsonl").read_bytes() == second
    assert b'"part": "third"' in path.read_bytes() and b'"first"' not in path.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mllog.1.jsonl",
        "mllog.2.jsonl",
        "mllog.jsonl",
    ]


def test_a_disabled_log_writes_and_moves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "mllog.jsonl"
    path.write_text("kept\n")
    log = MlperfLog(enabled=False)
    log.open(path)
    log.event("run_start")
    assert [p.name for p in tmp_path.iterdir()] == ["mllog.jsonl"]
    assert path.read_text() == "kept\n"
