"""MLPerf Training's rules for DLRMv2 (DCNv2) that a job file can break, checked before the start.

Read from mlcommons/training_policies training_rules.adoc (Dec 2025, DLRMv2 at v6.0) and
mlcommons/logging's training_6.0.0 dlrm_dcnv2 compliance rules. A run that logs for MLPerf
(train.mlperf_log) and breaks one still runs: each broken rule is one warning naming the setting,
its value and the rule, because an open-division or exploratory run may break them on purpose.
Torch-free: the CLI calls it before any rank starts.
"""

from __future__ import annotations

from shardrec.trainer.job.config import JobConfig

TARGET_AUC = 0.80275
"""The quality target: validation AUC within one epoch."""
EVALUATIONS_PER_EPOCH = 20
"""NUM_EVAL: evaluate every FLOOR(TOTAL_TRAINING_SAMPLES / (GLOBAL_BATCH_SIZE * 20)) steps."""
ADAGRAD_EPS = 1e-8


def rule_breaks(job: JobConfig) -> list[str]:
    """One line per MLPerf DLRMv2 rule the job breaks (none unless train.mlperf_log)."""
    if not job.train.mlperf_log:
        return []
    o, t, e, d = job.optim, job.train, job.eval, job.data
    closed = job.train.mlperf_submission.get("division", "closed") == "closed"
    checks = [
        (
            o.sparse == "adagrad",
            f"optim.sparse = {o.sparse!r}: the reference's embeddings use full Adagrad ('adagrad')",
        ),
        (
            o.dense == "adagrad",
            f"optim.dense = {o.dense!r}: the reference's dense layers use Adagrad ('adagrad')",
        ),
        (
            o.sparse_lr == o.dense_lr,
            f"optim.sparse_lr = {o.sparse_lr} and optim.dense_lr = {o.dense_lr} differ: the rules have one "
            "opt_base_learning_rate for the embeddings and the dense layers",
        ),
        (o.eps == ADAGRAD_EPS, f"optim.eps = {o.eps}: opt_adagrad_epsilon must be 1e-08"),
        (
            not d.shuffle,
            "data.shuffle = true: only the preprocessing's one-time per-sample shuffle is allowed",
        ),
        (
            e.every_epoch_fraction == 1 / EVALUATIONS_PER_EPOCH and not e.interval_steps,
            f"eval.every_epoch_fraction = {e.every_epoch_fraction}, eval.interval_steps = {e.interval_steps}: "
            "the rules evaluate every FLOOR(TOTAL_TRAINING_SAMPLES / (GLOBAL_BATCH_SIZE * 20)) steps "
            "(every_epoch_fraction = 0.05, interval_steps = 0)",
        ),
        (
            e.during_training == ["val"],
            f"eval.during_training = {e.during_training!r}: the quality metric is validation AUC (['val'])",
        ),
        (
            not e.max_batches,
            f"eval.max_batches = {e.max_batches}: the whole validation split must be evaluated",
        ),
        (
            t.target_auc == TARGET_AUC,
            f"train.target_auc = {t.target_auc}: the quality target is {TARGET_AUC}",
        ),
        (t.epochs == 1, f"train.epochs = {t.epochs}: DLRMv2 trains at most one epoch"),
        (t.precision == "fp32", f"train.precision = {t.precision!r}: the reference trains in fp32"),
        (job.model.arch == "dcnv2", f"model.arch = {job.model.arch!r}: DLRMv2 is DCNv2 ('dcnv2')"),
    ]
    if closed:
        schedule = (o.warmup_steps, o.decay_start, o.decay_steps)
        checks.append(
            (
                schedule == (0, 0, 0),
                f"optim.warmup_steps / decay_start / decay_steps = {schedule}: the closed division requires "
                "the learning-rate schedule off (0, 0, 0)",
            )
        )
    elif o.warmup_steps or o.decay_start or o.decay_steps:
        checks.append(
            (
                o.schedule_tables,
                "optim.schedule_tables = false: the reference schedules the embeddings' rate too",
            )
        )
    return [f"MLPerf DLRMv2 rule broken: {why}" for ok, why in checks if not ok]
