"""The job file's sections, `[data]` to `[dist]` (`[model]` is model_section.py's): one dataclass
each, the one home of their defaults; each field's docstring is its help, and `__post_init__` checks
the values, naming the key and the bad value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardrec.embeddings import sparse_optimizers
from shardrec.trainer.job.toml_values import (
    check_choice,
    check_counts,
    check_elements,
    check_positive,
)


@dataclass
class DataConfig:
    path: str = ""
    """Preprocessed dataset directory (a `manifest.json` inside)."""
    train_split: str = "train"
    """Split to train on."""
    eval_splits: list[str] = field(default_factory=lambda: ["val", "test"])
    """Splits evaluated at intervals and at the end (each must exist in the dataset; empty ones are
    skipped)."""
    shuffle: bool = True
    """Shuffle the training stream (seeded): a click log's blocks of rows and a bounded window of
    them; an event log's samples within each time window (their windows stay in time order)."""
    num_workers: int = 1
    """Loader prefetch threads per rank (0: batches are made in the training loop; 1 overlaps them
    with communication waits)."""
    tail: str = "drop"
    """What happens to the last partial global batch of an epoch: drop or pad."""
    multihot_sizes: list[int] = field(default_factory=list)
    """Multi-hot ids made from a one-hot dataset at batch time: ids per sample of each sparse
    feature (empty: ids as stored)."""
    multihot_rows: list[int] = field(default_factory=list)
    """Table rows per feature for multihot_sizes, which also size the embedding tables (empty: the
    dataset's cardinalities)."""
    multihot_dist: str = "uniform"
    """How multihot_sizes' extra ids are drawn: uniform or pareto (MLPerf DLRMv2's reference
    algorithm)."""
    multihot_seed: int = 0
    """Seed of the multi-hot index tables (numpy's legacy generator; the reference uses 0)."""
    multihot_cache: str = ""
    """Folder the index tables are drawn into once and shared by ranks (empty:
    ~/.cache/shardrec/multihot)."""

    def __post_init__(self) -> None:
        check_choice("data.tail", self.tail, ("drop", "pad"))
        check_elements("data.multihot_sizes", self.multihot_sizes, int)
        check_elements("data.multihot_rows", self.multihot_rows, int)
        for key, values in (
            ("data.multihot_sizes", self.multihot_sizes),
            ("data.multihot_rows", self.multihot_rows),
        ):
            for v in values:
                if v < 1:
                    raise ValueError(f"{key} = {values!r}: {v} must be >= 1")
        if self.multihot_rows and len(self.multihot_rows) != len(self.multihot_sizes):
            raise ValueError(
                f"data.multihot_rows = {self.multihot_rows!r}: {len(self.multihot_rows)} values for "
                f"{len(self.multihot_sizes)} data.multihot_sizes; give one per feature"
            )
        check_choice("data.multihot_dist", self.multihot_dist, ("uniform", "pareto"))
        if not 0 <= self.multihot_seed < 2**32:
            raise ValueError(f"data.multihot_seed = {self.multihot_seed!r} must lie in [0, 2^32)")
        check_elements("data.eval_splits", self.eval_splits, str)
        check_positive("data.num_workers", self.num_workers, allow_zero=True)


@dataclass
class ShardingConfig:
    plan: str = ""
    """Plan file from `shardrec plan`; empty: plan at start-up with shardrec's planner."""
    compute_kernel: str = "fused"
    """Embedding kernel: fused (the sparse optimizer applied in backward; the one kernel the trainer
    runs)."""
    qcomm: str = ""
    """Quantized embedding all-to-all: fp16, bf16, or empty for fp32."""
    constraints: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per table: allowed sharding_types, compute_kernels, min_partition, ... (torchrec
    ParameterConstraints)."""
    sequence_dedup: bool = True
    """A sequence model sends each table's distinct ids of a batch through the all-to-all once,
    not once per occurrence (the same rows and updates, fewer bytes)."""

    def __post_init__(self) -> None:
        check_choice("sharding.compute_kernel", self.compute_kernel, ("fused",))
        check_choice("sharding.qcomm", self.qcomm, ("", "fp16", "bf16"))
        for table, cons in self.constraints.items():
            if not isinstance(cons, dict):
                raise ValueError(
                    f"sharding.constraints.{table} = {cons!r} should be a table of settings"
                )


@dataclass
class OptimConfig:
    sparse: str = "rowwise_adagrad"
    """Embedding optimizer (fused into the tables' backward): rowwise_adagrad, adam, sgd, or adagrad
    (full, element-wise: fbgemm's EXACT_ADAGRAD, MLPerf DLRMv2's; one fp32 value of state per
    weight)."""
    sparse_lr: float = 0.05
    """Embedding learning rate."""
    dense: str = "adagrad"
    """Dense optimizer: adagrad, adam or sgd."""
    dense_lr: float = 0.05
    """Peak dense learning rate."""
    eps: float = 1e-8
    """Epsilon of Adagrad/Adam."""
    warmup_steps: int = 0
    """Linear warm-up of the dense learning rate (DLRMv2 schedule; the tables' too with
    schedule_tables)."""
    decay_start: int = 0
    """Step at which the polynomial decay starts (0: no decay; set with decay_steps)."""
    decay_steps: int = 0
    """Steps over which the learning rate decays to zero (0: no decay; set with decay_start)."""
    schedule_tables: bool = False
    """Apply the schedule (warm-up, decay) to the embedding tables' learning rate too, as the DLRMv2
    reference does; false: the dense layers' only."""
    warmup_from_zero: bool = False
    """Warm-up's rate at step s is lr * s / warmup_steps, the first step at 0 (DLRMv4's reference);
    false: lr * (s + 1) / warmup_steps (DLRMv2's)."""
    adam_beta1: float = 0.9
    """Adam's first-moment decay, dense layers (DLRMv4: 0.95)."""
    adam_beta2: float = 0.999
    """Adam's second-moment decay, dense layers."""
    clip_grad_norm: float = 0.0
    """Clip the dense layers' gradient to this global norm before their step (DLRMv4: 1.0; 0: no
    clipping)."""
    loss_weight: float = 1.0
    """The loss is scaled by this before backward (DLRMv4's reference: 0.2); the reported loss is
    not."""

    def __post_init__(self) -> None:
        check_choice("optim.sparse", self.sparse, sparse_optimizers.NAMES)
        check_choice("optim.dense", self.dense, ("adagrad", "adam", "sgd"))
        check_positive("optim.sparse_lr", self.sparse_lr)
        check_positive("optim.dense_lr", self.dense_lr)
        check_positive("optim.eps", self.eps)
        check_counts("optim", self, "warmup_steps", "decay_start", "decay_steps")
        if bool(self.decay_start) != bool(self.decay_steps):  # the schedule needs both
            raise ValueError(
                f"optim.decay_start = {self.decay_start} and optim.decay_steps = "
                f"{self.decay_steps}: a decay needs both (the step it starts at, the steps it "
                "lasts); set the other, or neither for no decay"
            )
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"optim.{name} = {getattr(self, name)!r} must lie in [0, 1)")
        check_positive("optim.clip_grad_norm", self.clip_grad_norm, allow_zero=True)
        check_positive("optim.loss_weight", self.loss_weight)


SEED_UNSET = -1
"""train.seed when the job does not set it (TrainConfig.seed)."""


@dataclass
class TrainConfig:
    global_batch_size: int = 2048
    """Samples per step over all ranks; each rank takes global_batch_size / world_size."""
    epochs: int = 1
    """Passes over the training split (when train.steps is 0); with --continue-on, over the new
    stretch's data."""
    steps: int = 0
    """Steps to train, past an epoch's end into the next epoch (0: train.epochs epochs); with
    --continue-on, the steps of the new stretch, counted from its first (a run at step 2 that
    goes on for 5 steps ends at step 7)."""
    seed: int = -1
    """Seed of the model's initial weights and the data order; -1 (unset): 0, or, where
    train.mlperf_log, one drawn from the OS for the run (MLPerf's rules), kept in the run's
    config.toml so that a resume continues with it."""
    pipeline: str = "auto"
    """sparse_dist (torchrec TrainPipelineSparseDist), plain, or auto: sparse_dist on CUDA, plain on
    CPU (where it measured slower)."""
    device: str = "auto"
    """auto, cpu or cuda."""
    log_interval: int = 20
    """Steps between progress log lines."""
    precision: str = "fp32"
    """fp32, bf16 (dense layers and interaction under autocast; embeddings, optimizer state, loss,
    metrics and checkpoints stay fp32) or auto: bf16 where the device has native bf16 (a CPU with
    AVX512-BF16 or AMX, a GPU of compute capability 8.0+), fp32 elsewhere."""
    allow_emulated_bf16: bool = False
    """Train bf16 even where the device only emulates it (measured at start: often many times
    slower than fp32); without it such a run is refused, saying the slowdown."""
    compile: str = "auto"
    """torch.compile of the dense layers and the interaction in training: on, off, or auto: on for
    CPU training of dense layers of >= 1 M parameters with a C++ compiler present (the compile
    takes ~1 min at start), off otherwise."""
    target_auc: float = 0.0
    """Stop once the first evaluation split's AUC reaches this (MLPerf DLRMv2: 0.80275 on val; 0:
    run every step)."""
    mlperf_log: bool = False
    """Write MLPerf's events (`:::MLLOG {json}` lines) to RUN/mllog.jsonl, and warn before the start
    about every setting that breaks the benchmark's rules: DLRMv2's (dlrm_dcnv2) for DLRM,
    DLRMv4's for HSTU (model.arch = "hstu")."""
    mlperf_submission: dict[str, str] = field(default_factory=dict)
    """The submission_* values of the MLPerf log: org (default "shardrec"), platform (default
    "<ranks>x<device>"), division (closed or open; default closed) and status (onprem, cloud or
    research; default onprem)."""

    @property
    def fixed_seed(self) -> int:
        """The seed where no run draws one (planning's id counts, benchmarks, tests): unset is 0,
        the seed a run without train.mlperf_log takes (trainer.loop.train_job.with_run_seed)."""
        return 0 if self.seed == SEED_UNSET else self.seed

    def total_steps(self, steps_per_epoch: int) -> int:
        """The step a run of these settings ends at: train.steps, or train.epochs epochs when it is
        0."""
        return self.steps or self.epochs * steps_per_epoch

    def __post_init__(self) -> None:
        check_choice("train.precision", self.precision, ("fp32", "bf16", "auto"))
        check_choice("train.compile", self.compile, ("auto", "on", "off"))
        if not 0 <= self.target_auc <= 1:
            raise ValueError(f"train.target_auc = {self.target_auc!r} must lie in [0, 1]")
        check_positive("train.global_batch_size", self.global_batch_size)
        check_positive("train.epochs", self.epochs)
        check_positive("train.steps", self.steps, allow_zero=True)
        if self.seed < 0 and self.seed != SEED_UNSET:
            raise ValueError(f"train.seed = {self.seed!r} must be >= 0 (or {SEED_UNSET}: unset)")
        check_positive("train.log_interval", self.log_interval)
        check_choice("train.pipeline", self.pipeline, ("auto", "sparse_dist", "plain"))
        check_choice("train.device", self.device, ("auto", "cpu", "cuda"))
        check_elements("train.mlperf_submission", self.mlperf_submission, str)
        for key, value in self.mlperf_submission.items():
            check_choice(
                "train.mlperf_submission key", key, ("org", "platform", "division", "status")
            )
            choices = {
                "division": ("closed", "open"),
                "status": ("onprem", "cloud", "research"),
            }.get(key)
            if choices:
                check_choice(f"train.mlperf_submission.{key}", value, choices)


@dataclass
class EvalConfig:
    interval_steps: int = 0
    """Evaluate every N steps (0: only at the end)."""
    max_batches: int = 0
    """Cap on evaluation batches per split (0: the whole split)."""
    batch_size: int = 0
    """Global evaluation batch (0: the training global batch)."""
    every_epoch_fraction: float = 0.0
    """Evaluate every floor(fraction * training rows / global batch) steps, as MLPerf does (0.05: 20
    times per epoch; 0: off; less than one step: every step, with a warning)."""
    during_training: list[str] = field(default_factory=list)
    """The splits evaluated during training (MLPerf DLRMv2: ["val"]); every data.eval_splits split
    is evaluated at the end. Empty: all of them, every time."""
    fraction_rounding: str = "floor"
    """How every_epoch_fraction becomes steps: floor (DLRMv2: FLOOR(fraction x rows / global batch))
    or round (DLRMv4: ROUND(fraction x FLOOR(rows / global batch)))."""
    skip_until_fraction: float = 0.0
    """Evaluations during training wait until this share of the epoch is trained (DLRMv4's
    skip_eval_epoch_pct, FLOOR((4480 x global batch + 135331840) / 3) / 2290835423 in its rules);
    the final evaluation always runs."""

    def __post_init__(self) -> None:
        check_choice("eval.fraction_rounding", self.fraction_rounding, ("floor", "round"))
        if not 0 <= self.skip_until_fraction <= 1:
            raise ValueError(
                f"eval.skip_until_fraction = {self.skip_until_fraction!r} must lie in [0, 1]"
            )
        check_positive("eval.interval_steps", self.interval_steps, allow_zero=True)
        if not 0 <= self.every_epoch_fraction <= 1:
            raise ValueError(
                f"eval.every_epoch_fraction = {self.every_epoch_fraction!r} must lie in [0, 1]"
            )
        check_counts("eval", self, "max_batches", "batch_size")
        check_elements("eval.during_training", self.during_training, str)


@dataclass
class CheckpointConfig:
    interval_steps: int = 0
    """Save every N steps (0: only at the end)."""
    keep: int = 2
    """Checkpoints kept; older ones are deleted after a newer one is complete."""
    timeout_s: int = 1800
    """Seconds a checkpoint save or load may wait for the slowest rank (large saves to shared
    storage are slow)."""
    stop_grace_s: int = 60
    """Seconds `shardrec train` gives its ranks, after SIGTERM or SIGINT, to finish the step and
    write a checkpoint before it ends them."""

    def __post_init__(self) -> None:
        check_positive("checkpoint.keep", self.keep)
        check_positive("checkpoint.timeout_s", self.timeout_s)
        check_positive("checkpoint.stop_grace_s", self.stop_grace_s)
        check_positive("checkpoint.interval_steps", self.interval_steps, allow_zero=True)


@dataclass
class DistConfig:
    timeout_s: int = 600
    """Seconds a collective may wait for the other ranks before the job fails (a lost rank is then
    named)."""
    bind_cores: bool = True
    """CPU ranks: each local rank bound to its own equal share of the cores the job may use (where
    they split evenly), its threads with it; false: the OS places them."""

    def __post_init__(self) -> None:
        check_positive("dist.timeout_s", self.timeout_s)
