"""What shardrec knows of each sparse (embedding) optimizer, without torch: its name, the state
it keeps per weight, and the devices fbgemm's kernels run it on.

The job's settings (the allowed `optim.sparse` values), the pre-start check (the device) and
the planner (the memory of the state) read these facts here, so that the CLI and the planner
stay light; embeddings/optim.py maps the names to torch optimizers, and
embeddings/optim_layouts.py converts row-wise state between table layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_STATE_BYTES = 4
"""Bytes of one Adagrad accumulator (row-wise or per weight): fbgemm keeps it in fp32 whatever the
weights' dtype."""


@dataclass(frozen=True)
class SparseOptimizer:
    name: str
    """The `optim.sparse` value."""
    label: str
    """Its name in prose."""
    row_state: int
    """Accumulators per row of each column shard (row-wise Adagrad: 1)."""
    element_state: int
    """State values per weight, of the weights' dtype (Adam: 2, its two moments)."""
    element_state_fp32: int
    """State values per weight kept in fp32 whatever the weights' dtype (full Adagrad: 1, its
    sum)."""
    devices: tuple[str, ...]
    """Device kinds whose fbgemm kernels fuse it into the embedding backward."""


SPARSE_OPTIMIZERS: dict[str, SparseOptimizer] = {
    o.name: o
    for o in (
        SparseOptimizer(
            "rowwise_adagrad",
            "row-wise Adagrad",
            row_state=1,
            element_state=0,
            element_state_fp32=0,
            devices=("cpu", "cuda"),
        ),
        # fbgemm's CPU kernels have no Adam.
        SparseOptimizer(
            "adam", "Adam", row_state=0, element_state=2, element_state_fp32=0, devices=("cuda",)
        ),
        SparseOptimizer(
            "sgd",
            "SGD",
            row_state=0,
            element_state=0,
            element_state_fp32=0,
            devices=("cpu", "cuda"),
        ),
        # fbgemm's EXACT_ADAGRAD (MLPerf DLRMv2's): one fp32 sum per weight (`momentum1`, the
        # weights' shape).
        SparseOptimizer(
            "adagrad",
            "Adagrad",
            row_state=0,
            element_state=0,
            element_state_fp32=1,
            devices=("cpu", "cuda"),
        ),
    )
}
NAMES = tuple(SPARSE_OPTIMIZERS)


def sparse_optimizer(name: str) -> SparseOptimizer:
    """The optimizer called `name`; ValueError naming the known ones."""
    if name not in SPARSE_OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is not one of {', '.join(NAMES)}")
    return SPARSE_OPTIMIZERS[name]


def state_bytes(name: str, rows: int, cols: int, elem_bytes: int = 4) -> float:
    """Bytes of optimizer state for a shard of `rows` x `cols` weights of `elem_bytes` each."""
    optimizer = sparse_optimizer(name)
    per_weight = (
        optimizer.element_state * elem_bytes + optimizer.element_state_fp32 * ROW_STATE_BYTES
    )
    return float(optimizer.row_state * rows * ROW_STATE_BYTES + per_weight * rows * cols)


def check_device(name: str, device_kind: str) -> None:
    """ValueError (one line) when fbgemm has no `device_kind` kernel for the optimizer `name`."""
    optimizer = sparse_optimizer(name)
    if device_kind in optimizer.devices:
        return
    runs_on = " and ".join(d.upper() for d in optimizer.devices)
    names = [o.name for o in SPARSE_OPTIMIZERS.values() if device_kind in o.devices]
    others = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    raise ValueError(
        f"optim.sparse = {name!r} runs on {runs_on} only (fbgemm's {device_kind.upper()} kernels have no "
        f"{optimizer.label}); use {others} on {device_kind.upper()}"
    )
