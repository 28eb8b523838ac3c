"""configs/dlrmv2.toml follows MLPerf's DLRMv2 rules, and a job that logs for MLPerf is warned,
rule by rule, where it breaks one (shardrec.trainer.job.mlperf_rules)."""

from __future__ import annotations

from pathlib import Path

from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.job.mlperf_rules import rule_breaks

DLRMV2 = Path(__file__).resolve().parents[2] / "configs" / "dlrmv2.toml"


def test_the_dlrmv2_job_file_keeps_every_rule() -> None:
    job = load_job_config(DLRMV2)
    assert rule_breaks(job) == []
    o, e = job.optim, job.eval
    assert (o.sparse, o.dense, o.sparse_lr, o.dense_lr, o.schedule_tables) == (
        "adagrad",
        "adagrad",
        0.004,
        0.004,
        True,
    )
    assert (job.data.shuffle, e.during_training, job.train.mlperf_log) == (False, ["val"], True)


def test_each_broken_rule_is_one_warning_naming_the_setting() -> None:
    broken = load_job_config(
        DLRMV2,
        [
            'optim.sparse="rowwise_adagrad"',
            "optim.dense_lr=0.005",
            "data.shuffle=true",
            'eval.during_training=["val", "test"]',
            "optim.warmup_steps=100",
        ],
    )
    assert rule_breaks(broken) == [
        "MLPerf DLRMv2 rule broken: optim.sparse = 'rowwise_adagrad': the reference's embeddings use full Adagrad "
        "('adagrad')",
        "MLPerf DLRMv2 rule broken: optim.sparse_lr = 0.004 and optim.dense_lr = 0.005 differ: the rules have one "
        "opt_base_learning_rate for the embeddings and the dense layers",
        "MLPerf DLRMv2 rule broken: data.shuffle = true: only the preprocessing's one-time per-sample shuffle is "
        "allowed",
        "MLPerf DLRMv2 rule broken: eval.during_training = ['val', 'test']: the quality metric is validation AUC "
        "(['val'])",
        "MLPerf DLRMv2 rule broken: optim.warmup_steps / decay_start / decay_steps = (100, 0, 0): the closed division "
        "requires the learning-rate schedule off (0, 0, 0)",
    ]
    # The open division may schedule, but both optimizers, as the reference does.
    open_division = ['train.mlperf_submission={division = "open"}', "optim.warmup_steps=100"]
    assert rule_breaks(load_job_config(DLRMV2, open_division)) == []
    assert rule_breaks(
        load_job_config(DLRMV2, [*open_division, "optim.schedule_tables=false"])
    ) == [
        "MLPerf DLRMv2 rule broken: optim.schedule_tables = false: the reference schedules the embeddings' rate too"
    ]
    # Jobs that do not log for MLPerf are not its business.
    assert (
        rule_breaks(load_job_config(DLRMV2, ["train.mlperf_log=false", "data.shuffle=true"])) == []
    )
