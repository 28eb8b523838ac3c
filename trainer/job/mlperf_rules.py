"""MLPerf Training's rules for DLRMv2 (DCNv2) and DLRMv4 (HSTU) that a job file can break, checked
before the start.

DLRMv2: read from mlcommons/training_policies training_rules.adoc (Dec 2025, DLRMv2 at v6.0: the
closed division uses the reference's preprocessing, model, training method and quality target;
seeds come from the clock or the OS; only the global batch and the one learning rate are tunable),
mlcommons/logging's training_6.0.0 dlrm_dcnv2 compliance rules and RCPs (global batches 32,768 to
160,000), and the reference (mlcommons/training recommendation_v2/torchrec_dlrm: its model, its
multi-hot sizes and table rows). DLRMv4: the closed division's rules as mlcommons/logging PR #470
(training_6.1.0 closed_dlrmv4.yaml) checks them, and the reference's recipe (mlcommons/training
PR #889, recommendation_v4 README and yambda_5b.gin). A run that logs for MLPerf
(train.mlperf_log) and breaks one still runs: each broken rule is one warning naming the setting,
its value and the rule, because an open-division or exploratory run may break them on purpose.
Torch-free: the CLI calls it before any rank starts.
"""

from __future__ import annotations

from typing import Any

from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.job.sections import SEED_UNSET

TARGET_AUC = 0.80275
"""The quality target: validation AUC within one epoch."""
EVALUATIONS_PER_EPOCH = 20
"""NUM_EVAL: evaluate every FLOOR(TOTAL_TRAINING_SAMPLES / (GLOBAL_BATCH_SIZE * 20)) steps."""
ADAGRAD_EPS = 1e-8
RCP_BATCHES = (32768, 160000)
"""The smallest and largest global batch of training_6.0.0's dlrm_dcnv2 RCPs: the RCP checker
has no reference convergence point outside them."""
REFERENCE_MODEL = {
    "model.arch": "dcnv2",
    "model.embedding_dim": 128,
    "model.dims": {},
    "model.dense_arch": [512, 256, 128],
    "model.over_arch": [1024, 1024, 512, 256, 1],
    "model.dcn_layers": 3,
    "model.dcn_low_rank": 512,
}
"""The reference's DCNv2 (dlrm_main.py's defaults and README command)."""
REFERENCE_MULTIHOT = {
    "sizes": [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1],
    "rows": [
        40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
        2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
    ],
    "dist": "uniform",
    "seed": 0,
}  # fmt: skip
"""The reference's multi-hot ids (--multi_hot_sizes, --num_embeddings_per_feature,
--multi_hot_distribution_type; index tables from numpy's legacy generator, seed 0), which define
the Criteo multi-hot dataset: as data.multihot_* or a `shardrec data multihot` copy's manifest."""


DLRMV4_TARGET_AUC = 0.75
DLRMV4_TRAIN_SAMPLES = 2_290_835_423
"""Anchors of Yambda-5b's 299 training days (the rules' train_samples)."""
DLRMV4_WARMUP_STEPS = 24_000
DLRMV4_MAX_SEQ_LEN = 4096
DLRMV4_EVAL_EVERY = 0.001


def dlrmv4_first_eval_samples(global_batch_size: int) -> int:
    """Where DLRMv4's evaluations start, by the rules' fit through the reference's convergence
    points less two evaluation blocks: FLOOR((4480 x GBS + 135,331,840) / 3) samples."""
    return (4480 * global_batch_size + 135_331_840) // 3


def dlrmv4_skip_fraction(global_batch_size: int) -> float:
    """eval.skip_until_fraction (the reference's skip_eval_epoch_pct) for a global batch."""
    return dlrmv4_first_eval_samples(global_batch_size) / DLRMV4_TRAIN_SAMPLES


def _differs(key: str, value: Any, reference: Any, what: str) -> tuple[bool, str]:
    return value == reference, f"{key} = {value!r}: {what} is {reference!r}"


def _model_checks(job: JobConfig) -> list[tuple[bool, str]]:
    m = job.model
    return [
        _differs(key, getattr(m, key.split(".")[1]), value, "the reference's")
        for key, value in REFERENCE_MODEL.items()
        if key != "model.arch"  # its own line below, as before
    ]


def _multihot_checks(job: JobConfig, manifest_multihot: dict[str, Any] | None) -> list:
    """The multi-hot ids: made on the fly (data.multihot_*), or read from a materialised copy
    (data.multihot_sizes = []: its manifest's record, when the caller has it)."""
    d = job.data
    if d.multihot_sizes:
        given = {
            "sizes": d.multihot_sizes,
            "rows": d.multihot_rows,
            "dist": d.multihot_dist,
            "seed": d.multihot_seed,
        }
        prefix = "data.multihot_"
    elif manifest_multihot is not None:
        given, prefix = manifest_multihot, f"{d.path or 'the dataset'}'s multi-hot "
    else:
        return [
            (
                False,
                f"data.multihot_sizes = [] and {d.path or 'the dataset'} is no `shardrec data "
                "multihot` copy: DLRMv2 trains on the reference's multi-hot ids",
            )
        ]
    return [
        _differs(
            f"{prefix}{name}",
            list(given.get(name) or []) if name in ("sizes", "rows") else given.get(name),
            value,
            "the reference's (they define the multi-hot dataset)",
        )
        for name, value in REFERENCE_MULTIHOT.items()
    ]


def rule_breaks(job: JobConfig, manifest_multihot: dict[str, Any] | None = None) -> list[str]:
    """One line per MLPerf rule the job breaks (none unless train.mlperf_log): DLRMv4's for an
    HSTU model, DLRMv2's otherwise.

    manifest_multihot: the dataset manifest's `multihot` record (a `shardrec data multihot` copy),
    checked where data.multihot_sizes is empty; None: the dataset is none (or was not read)."""
    if not job.train.mlperf_log:
        return []
    if job.model.arch == "hstu":
        return dlrmv4_rule_breaks(job)
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
        (
            not t.steps,
            f"train.steps = {t.steps}: a run trains until the target or one epoch's end (0)",
        ),
    ]
    if closed:
        checks += _model_checks(job) + _multihot_checks(job, manifest_multihot)
        checks += [
            (
                RCP_BATCHES[0] <= t.global_batch_size <= RCP_BATCHES[1],
                f"train.global_batch_size = {t.global_batch_size}: the RCPs cover "
                f"{RCP_BATCHES[0]:,} to {RCP_BATCHES[1]:,}; the RCP checker has no reference "
                "convergence point for it",
            ),
            (
                t.seed == SEED_UNSET,
                f"train.seed = {t.seed} is set: the rules seed each run from the clock or the OS "
                "(runs that log one seed on one line fail the seed check); leave it unset (-1)",
            ),
        ]
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


def dlrmv4_rule_breaks(job: JobConfig) -> list[str]:
    """One line per closed-division DLRMv4 rule the job breaks: only the global batch and the one
    learning rate may be tuned."""
    o, t, e, d, m = job.optim, job.train, job.eval, job.data, job.model
    skip = dlrmv4_skip_fraction(t.global_batch_size)
    checks = [
        (o.dense == "adam", f"optim.dense = {o.dense!r}: the dense optimizer is Adam ('adam')"),
        (
            (o.adam_beta1, o.adam_beta2) == (0.95, 0.999),
            f"optim.adam_beta1, adam_beta2 = {o.adam_beta1}, {o.adam_beta2}: the rules fix 0.95, 0.999",
        ),
        (o.eps == ADAGRAD_EPS, f"optim.eps = {o.eps}: opt_adam_epsilon must be 1e-08"),
        (o.clip_grad_norm == 1.0, f"optim.clip_grad_norm = {o.clip_grad_norm}: the rules fix 1.0"),
        (
            o.sparse == "rowwise_adagrad",
            f"optim.sparse = {o.sparse!r}: the tables' optimizer is row-wise Adagrad",
        ),
        (
            o.sparse_lr == o.dense_lr,
            f"optim.sparse_lr = {o.sparse_lr} and optim.dense_lr = {o.dense_lr} differ: one rate for both",
        ),
        (
            o.warmup_steps == DLRMV4_WARMUP_STEPS and o.warmup_from_zero and o.schedule_tables,
            f"optim.warmup_steps = {o.warmup_steps}, warmup_from_zero = {o.warmup_from_zero}, "
            f"schedule_tables = {o.schedule_tables}: the rules warm both rates up from 0 over "
            f"{DLRMV4_WARMUP_STEPS} steps",
        ),
        (
            not (o.decay_start or o.decay_steps),
            f"optim.decay_start / decay_steps = {o.decay_start} / {o.decay_steps}: no decay",
        ),
        (
            m.hstu_max_seq_len == DLRMV4_MAX_SEQ_LEN,
            f"model.hstu_max_seq_len = {m.hstu_max_seq_len}: max_sequence_length must be {DLRMV4_MAX_SEQ_LEN}",
        ),
        (
            m.hstu_bias == "input",
            f"model.hstu_bias = {m.hstu_bias!r}: the reference encodes position and time at the "
            "input ('input', hstu_recency = 0)",
        ),
        (
            e.every_epoch_fraction == DLRMV4_EVAL_EVERY
            and e.fraction_rounding == "round"
            and not e.interval_steps,
            f"eval.every_epoch_fraction = {e.every_epoch_fraction}, fraction_rounding = "
            f"{e.fraction_rounding!r}, interval_steps = {e.interval_steps}: the rules evaluate every "
            "ROUND(0.001 x FLOOR(train samples / global batch)) steps (0.001, round, 0)",
        ),
        (
            abs(e.skip_until_fraction - skip) <= 1e-4 * skip,
            f"eval.skip_until_fraction = {e.skip_until_fraction}: at a global batch of "
            f"{t.global_batch_size} the first evaluation is at FLOOR((4480 x GBS + 135331840) / 3) "
            f"= {dlrmv4_first_eval_samples(t.global_batch_size):,} samples ({skip:.6g})",
        ),
        (
            e.during_training == ["val"] and not e.max_batches,
            f"eval.during_training = {e.during_training!r}, max_batches = {e.max_batches}: the "
            "whole held-out window (val) is evaluated",
        ),
        (
            t.target_auc == DLRMV4_TARGET_AUC,
            f"train.target_auc = {t.target_auc}: the target is {DLRMV4_TARGET_AUC}",
        ),
        (not d.shuffle, "data.shuffle = true: the reference trains each day in its users' order"),
        (t.epochs == 1, f"train.epochs = {t.epochs}: DLRMv4 trains at most one pass"),
    ]
    return [f"MLPerf DLRMv4 rule broken: {why}" for ok, why in checks if not ok]
