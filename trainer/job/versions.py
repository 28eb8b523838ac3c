"""The torch / fbgemm-gpu / torchrec triples shardrec is known to work with."""

from __future__ import annotations

import logging
import os
from importlib import metadata

logger = logging.getLogger(__name__)

# (torch, fbgemm-gpu, torchrec) release prefixes checked together; see requirements/.
KNOWN_GOOD: tuple[tuple[str, str, str], ...] = (("2.13.0", "1.8.0", "1.8.0"),)
FIX = "run `make setup` (it installs the pinned stack into .venv), or see requirements/*.txt"
ALLOW_ENV = "SHARDREC_ALLOW_STACK"
"""TORCH/FBGEMM/TORCHREC: let exactly this one other triple start, for a check on a machine that
cannot install the pinned stack (scripts/gpu_check.sh sets it); any other triple is still
refused."""
GPU_CHECK_STACK = ("2.11.0", "1.6.0", "1.6.1")
"""The lent GPU machine's triple: torch 2.11 (cu130) is installed there, fbgemm-gpu 1.6.0 and
torchrec 1.6.1 are the releases built for it (the device tool's GPU-CHECK notes)."""


def _version(*dists: str) -> str | None:
    for name in dists:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def found_stack() -> tuple[str | None, str | None, str | None]:
    return (
        _version("torch"),
        _version("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm_gpu", "fbgemm_gpu_cpu"),
        _version("torchrec"),
    )


def _release(version: str | None) -> str:
    # The build's local label (2.13.0+cu126, 1.8.0+cpu: PyTorch's own indexes) names the CUDA
    # version it was built for, not another release: the triple compares releases only.
    return (version or "").split("+")[0]


def allowed_stack() -> tuple[str, str, str] | None:
    """The triple SHARDREC_ALLOW_STACK names, or None when it is unset or empty."""
    value = os.environ.get(ALLOW_ENV, "").strip()
    if not value:
        return None
    parts = tuple(p.strip() for p in value.split("/"))
    if len(parts) != 3 or not all(parts):
        raise ImportError(
            f"{ALLOW_ENV}={value!r}: expected TORCH/FBGEMM/TORCHREC versions, e.g. "
            f"{ALLOW_ENV}={'/'.join(GPU_CHECK_STACK)}"
        )
    return parts  # type: ignore[return-value]


def is_known_good(stack: tuple[str | None, str | None, str | None]) -> bool:
    """A known-good triple, whatever the builds' local labels (+cpu, +cu126)."""
    return tuple(_release(v) for v in stack) in KNOWN_GOOD


def check_stack() -> None:
    """Raise ImportError naming the versions found if they are neither a known-good triple nor
    the one SHARDREC_ALLOW_STACK lets through."""
    torch_v, fbgemm_v, torchrec_v = found_stack()
    if is_known_good((torch_v, fbgemm_v, torchrec_v)):
        return
    release = _release(torch_v)
    allowed = allowed_stack()
    if allowed == (release, _release(fbgemm_v), _release(torchrec_v)):
        logger.warning(
            "torch %s, fbgemm-gpu %s, torchrec %s is not a known-good triple; started because %s names it",
            torch_v,
            fbgemm_v,
            torchrec_v,
            ALLOW_ENV,
        )
        return
    known = "; ".join(f"torch {t} + fbgemm-gpu {f} + torchrec {r}" for t, f, r in KNOWN_GOOD)
    also = f" ({ALLOW_ENV} allows {'/'.join(allowed)} only)" if allowed else ""
    raise ImportError(
        f"shardrec.trainer: found torch {torch_v}, fbgemm-gpu {fbgemm_v}, torchrec {torchrec_v}, "
        f"which is not a known-good combination ({known}){also}; {FIX}"
    )
