"""MLPerf Training's rules for DLRMv2 (DCNv2) that a job file can break, checked before the start.

Read from mlcommons/training_policies training_rules.adoc (Dec 2025, DLRMv2 at v6.0: the closed
division uses the reference's preprocessing, model, training method and quality target; seeds
come from the clock or the OS; only the global batch and the one learning rate are tunable),
mlcommons/logging's training_6.0.0 dlrm_dcnv2 compliance rules and RCPs (global batches 32,768 to
160,000), and the reference (mlcommons/training recommendation_v2/torchrec_dlrm: its model, its
multi-hot sizes and table rows). A run that logs for MLPerf (train.mlperf_log) and breaks one
still runs: each broken rule is one warning naming the setting, its value and the rule, because an
open-division or exploratory run may break them on purpose. Torch-free: the CLI calls it before
any rank starts.
"""

from __future__ import annotations

from typing import Any

from shardrec.trainer.job.config import SEED_UNSET, JobConfig

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
    """One line per MLPerf DLRMv2 rule the job breaks (none unless train.mlperf_log).

    manifest_multihot: the dataset manifest's `multihot` record (a `shardrec data multihot` copy),
    checked where data.multihot_sizes is empty; None: the dataset is none (or was not read)."""
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
