"""What shardrec knows of each sparse optimizer is said once
(shardrec.embeddings.sparse_optimizers), without torch, and the config, the pre-start check, the
planner and the torch side agree with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardrec.embeddings.sparse_optimizers import NAMES, check_device, state_bytes


def test_the_facts_and_the_config_that_reads_them_load_without_torch() -> None:
    code = (
        "import sys, shardrec.embeddings.sparse_optimizers, shardrec.trainer.job.config; "
        "print('torch' in sys.modules)"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        == "False\n"
    )


def test_every_name_has_a_torch_optimizer_and_the_config_takes_exactly_these() -> None:
    from shardrec.embeddings.optim import TORCH_OPTIMIZERS
    from shardrec.trainer.job.sections import OptimConfig

    assert NAMES == ("rowwise_adagrad", "adam", "sgd", "adagrad") and set(TORCH_OPTIMIZERS) == set(
        NAMES
    )
    for name in NAMES:
        OptimConfig(sparse=name)
    assert (
        OptimConfig().sparse == "rowwise_adagrad"
    )  # full Adagrad is DLRMv2's choice, not the default
    with pytest.raises(
        ValueError,
        match="^optim.sparse = 'lamb' is not one of rowwise_adagrad, adam, sgd, adagrad$",
    ):
        OptimConfig(sparse="lamb")


def test_state_per_row_and_per_weight() -> None:
    # A shard of 1,000 rows x 16 columns: row-wise Adagrad keeps one fp32 accumulator per row,
    # whatever the weights' dtype; Adam two values per weight of the weights' dtype; SGD none.
    assert state_bytes("rowwise_adagrad", 1000, 16) == 4000
    assert state_bytes("rowwise_adagrad", 1000, 16, elem_bytes=2) == 4000
    assert state_bytes("adam", 1000, 16) == 2 * 1000 * 16 * 4
    assert state_bytes("adam", 1000, 16, elem_bytes=2) == 2 * 1000 * 16 * 2
    assert state_bytes("sgd", 1000, 16) == 0
    # Full Adagrad: one fp32 sum per weight, whatever the weights' dtype (fbgemm's EXACT_ADAGRAD
    # momentum1).
    assert state_bytes("adagrad", 1000, 16) == 1000 * 16 * 4
    assert state_bytes("adagrad", 1000, 16, elem_bytes=2) == 1000 * 16 * 4
    with pytest.raises(
        ValueError, match="^optimizer 'lamb' is not one of rowwise_adagrad, adam, sgd, adagrad$"
    ):
        state_bytes("lamb", 1, 1)


def test_which_device_runs_which() -> None:
    for name in NAMES:
        check_device(name, "cuda")
    check_device("rowwise_adagrad", "cpu")
    check_device("sgd", "cpu")
    check_device("adagrad", "cpu")  # fbgemm's EXACT_ADAGRAD has a CPU kernel
    with pytest.raises(ValueError) as refused:
        check_device("adam", "cpu")
    assert str(refused.value) == (
        "optim.sparse = 'adam' runs on CUDA only (fbgemm's CPU kernels have no Adam); "
        "use rowwise_adagrad, sgd or adagrad on CPU"
    )
