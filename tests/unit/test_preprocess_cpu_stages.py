"""Where preprocessing's CPU goes: each stage's CPU-seconds, counted once, reported with the run."""

from __future__ import annotations

import time
from pathlib import Path

from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.pipeline import PreprocessConfig, run_preprocess
from shardrec.tools.synth.criteo import write_dataset


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_an_inner_stage_pauses_the_outer_one():
    before = cpu_stages.totals()
    with cpu_stages.stage(cpu_stages.PARSE):
        _spin(0.02)
        with cpu_stages.stage(cpu_stages.IDS):
            _spin(0.06)
        _spin(0.02)
    after = cpu_stages.totals()
    outer = after[cpu_stages.PARSE] - before.get(cpu_stages.PARSE, 0.0)
    inner = after[cpu_stages.IDS] - before.get(cpu_stages.IDS, 0.0)
    # Each spin runs at least its time; the totals are sums of float differences (1e-6 of slack).
    assert 0.06 - 1e-6 <= inner < 0.075 and 0.04 - 1e-6 <= outer < 0.055


def test_a_run_reports_its_stages_within_its_cpu_time(tmp_path: Path):
    write_dataset(tmp_path / "raw", rows=1500, seed=3, max_vocab=300)
    t0 = time.process_time()
    result = run_preprocess(PreprocessConfig([tmp_path / "raw"], tmp_path / "out", chunk_mb=0.1))
    cpu = time.process_time() - t0
    stages = result.cpu_s_by_stage
    pipeline = (
        cpu_stages.PLAN,
        cpu_stages.READ,
        cpu_stages.PARSE,
        cpu_stages.IDS,
        cpu_stages.DENSE,
    )
    for name in (*pipeline, cpu_stages.APPEND, cpu_stages.WRITE, cpu_stages.SYNC, cpu_stages.STATS):
        assert stages[name] >= 0, (
            name
        )  # each stage was entered (1,500 rows: some take under a millisecond)
    assert stages[cpu_stages.PARSE] + stages[cpu_stages.WRITE] + stages[cpu_stages.STATS] > 0
    assert list(stages) == [s for s in cpu_stages.STAGES if s in stages]  # pipeline order
    # Counted once: the stages of this run (start-up aside: this process started long before) fit in
    # its CPU time.
    assert sum(v for k, v in stages.items() if k != cpu_stages.STARTUP) <= cpu + 0.01
