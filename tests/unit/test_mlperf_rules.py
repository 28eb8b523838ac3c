"""configs/dlrmv2.toml follows MLPerf's DLRMv2 rules, and a job that logs for MLPerf is warned,
rule by rule, where it breaks one (shardrec.trainer.job.mlperf_rules)."""

from __future__ import annotations

import shlex
from pathlib import Path

from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.job.mlperf_rules import REFERENCE_MULTIHOT, rule_breaks
from shardrec.trainer.job.sections import SEED_UNSET

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
    assert job.train.seed == SEED_UNSET  # drawn from the OS for each run (trainer.loop.train_job)


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


DLRMV4 = Path(__file__).resolve().parents[2] / "configs" / "dlrmv4.toml"


def readme_dlrmv4_recipe() -> list[str]:
    """The --set settings of the README's full DLRMv4 recipe (its command that trains
    configs/dlrmv4.toml for MLPerf's log)."""
    readme = (DLRMV4.parents[1] / "README.md").read_text()
    block = next(
        b.split("```")[0]
        for b in readme.split("```sh")[1:]
        if "--config configs/dlrmv4.toml" in b and "train.mlperf_log=true" in b.split("```")[0]
    )
    words = shlex.split(block.replace("\\\n", " "))
    return [words[i + 1] for i, w in enumerate(words) if w == "--set"]


def test_the_dlrmv4_recipe_keeps_every_closed_rule_and_the_scaled_file_says_where_it_differs() -> (
    None
):
    recipe = readme_dlrmv4_recipe()
    assert "train.mlperf_log=true" in recipe and "model.hstu_max_seq_len=4096" in recipe
    assert rule_breaks(load_job_config(DLRMV4, recipe)) == []
    scaled = rule_breaks(load_job_config(DLRMV4, ["train.mlperf_log=true"]))
    assert [line.split(": ", 1)[1].split(" ")[0] for line in scaled] == [
        "optim.warmup_steps",
        "model.hstu_max_seq_len",
        "model.hstu_bias",
        "eval.every_epoch_fraction",
        "eval.skip_until_fraction",
        "train.target_auc",
    ]
    assert scaled[4].endswith(
        "at a global batch of 256 the first evaluation is at FLOOR((4480 x GBS + 135331840) / 3) "
        "= 45,492,906 samples (0.0198587)"
    )
    assert scaled[2].endswith(
        "model.hstu_bias = 'pairwise': the reference encodes position and time at the input "
        "('input', hstu_recency = 0)"
    )


def test_every_closed_division_setting_the_rules_fix_is_warned_about() -> None:
    """The model's widths and depths, the multi-hot sizes and table rows, the batch outside the
    RCPs, a step cap and a set seed: a shrunk or capped run is not a closed-division run."""
    scaled = load_job_config(
        DLRMV2,
        [
            "model.embedding_dim=16",
            "model.dense_arch=[64, 16]",
            "model.dcn_layers=2",
            "data.multihot_rows=[]",
            "train.global_batch_size=512",
            "train.steps=20",
            "train.seed=0",
        ],
    )
    prefix = "MLPerf DLRMv2 rule broken: "
    assert [line.removeprefix(prefix) for line in rule_breaks(scaled)] == [
        "train.steps = 20: a run trains until the target or one epoch's end (0)",
        "model.embedding_dim = 16: the reference's is 128",
        "model.dense_arch = [64, 16]: the reference's is [512, 256, 128]",
        "model.dcn_layers = 2: the reference's is 3",
        f"data.multihot_rows = []: the reference's (they define the multi-hot dataset) is "
        f"{REFERENCE_MULTIHOT['rows']!r}",
        "train.global_batch_size = 512: the RCPs cover 32,768 to 160,000; the RCP checker has no "
        "reference convergence point for it",
        "train.seed = 0 is set: the rules seed each run from the clock or the OS (runs that log one "
        "seed on one line fail the seed check); leave it unset (-1)",
    ]
    # The open division may change all of them but the step cap.
    open_division = load_job_config(
        DLRMV2, ['train.mlperf_submission={division = "open"}', "model.embedding_dim=16"]
    )
    assert rule_breaks(open_division) == []


def test_a_materialised_multihot_dataset_is_checked_by_its_manifest() -> None:
    job = load_job_config(DLRMV2, ["data.multihot_sizes=[]", "data.multihot_rows=[]"])
    assert rule_breaks(job, dict(REFERENCE_MULTIHOT)) == []
    other = {**REFERENCE_MULTIHOT, "sizes": [1] * 26}
    assert rule_breaks(job, other) == [
        f"MLPerf DLRMv2 rule broken: the dataset's multi-hot sizes = {[1] * 26!r}: the "
        "reference's (they define the multi-hot dataset) is "
        f"{REFERENCE_MULTIHOT['sizes']!r}"
    ]
    (line,) = rule_breaks(job, None)
    assert line.endswith(
        "is no `shardrec data multihot` copy: DLRMv2 trains on the reference's multi-hot ids"
    )


def test_the_readmes_scaled_down_dlrmv2_command_is_the_job_files_own() -> None:
    # The README's copy left out --set model.dcn_low_rank=32: its runs kept rank 512, above the
    # cross layers' own width (432 at these widths).
    readme = (DLRMV2.parents[1] / "README.md").read_text()
    inline = readme.split("Scaled down, the same job file runs on CPU: `", 1)[1].split("`", 1)[0]
    comment = DLRMV2.read_text().split("dataset with 26 sparse features:\n", 1)[1].split("\n\n")[0]
    in_file = " ".join(line.lstrip("# ").rstrip("\\ ") for line in comment.splitlines())
    assert shlex.split(inline.replace("\n", " ")) == shlex.split(in_file)
    assert "model.dcn_low_rank=32" in shlex.split(in_file)
