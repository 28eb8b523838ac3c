"""Fault injection for tests of failure handling: SIGKILL at a step, during a save, or a NaN.

Set SHARDREC_FAULT to comma-separated items `KIND:STEP[:RANK[:ATTEMPT]]`, KIND one of

- `kill`: SIGKILL this rank right after step STEP (mid-segment, nothing saved);
- `kill_in_save`: SIGKILL during the checkpoint of step STEP, after the shards are written
  and before the checkpoint is renamed into place;
- `nan`: poison a dense weight with NaN after step STEP (the next loss is NaN);
- `slow`: sleep SLOW_S after step STEP and every later one (a run slow enough to be signalled
  mid-way; the arithmetic is unchanged).

RANK empty or absent: every rank. A fault fires only in torchrun attempt ATTEMPT
(TORCHELASTIC_RESTART_COUNT; default 0, the first), so a restarted group runs clean.
Unset (the normal case), every check is one environment lookup.
"""

from __future__ import annotations

import os
import signal
import time

import torch

ENV = "SHARDREC_FAULT"
SLOW_S = 0.2


def _faults() -> list[tuple[str, int, int | None, int]]:
    spec = os.environ.get(ENV, "")
    if not spec:
        return []
    out = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3, 4):
            raise ValueError(f"{ENV}={spec!r}: expected KIND:STEP[:RANK[:ATTEMPT]] items")
        rank = int(parts[2]) if len(parts) > 2 and parts[2] else None
        attempt = int(parts[3]) if len(parts) > 3 else 0
        out.append((parts[0], int(parts[1]), rank, attempt))
    return out


def should_fire(kind: str, step: int, rank: int) -> bool:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return any(
        k == kind and s == step and r in (None, rank) and a == attempt for k, s, r, a in _faults()
    )


def maybe_slow(step: int, rank: int) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if any(
        k == "slow" and s <= step and r in (None, rank) and a == attempt for k, s, r, a in _faults()
    ):
        time.sleep(SLOW_S)


def maybe_kill(kind: str, step: int, rank: int) -> None:
    if should_fire(kind, step, rank):
        os.kill(os.getpid(), signal.SIGKILL)


@torch.no_grad()
def maybe_poison(model: torch.nn.Module, step: int, rank: int) -> None:
    if should_fire("nan", step, rank):
        for name, param in model.named_parameters():
            if "over_arch" in name:
                param.fill_(float("nan"))
                return
