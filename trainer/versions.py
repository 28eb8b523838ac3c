"""The torch / fbgemm-gpu / torchrec triples shardrec is known to work with."""

from __future__ import annotations

from importlib import metadata

# (torch, fbgemm-gpu, torchrec) release prefixes checked together; see requirements/.
KNOWN_GOOD: tuple[tuple[str, str, str], ...] = (("2.13.0", "1.8.0", "1.8.0"),)
FIX = "run `make setup` (it installs the pinned stack into .venv), or see requirements/*.txt"


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


def check_stack() -> None:
    """Raise ImportError naming the versions found if they are not a known-good triple."""
    torch_v, fbgemm_v, torchrec_v = found_stack()
    release = (torch_v or "").split("+")[0]
    for good in KNOWN_GOOD:
        if release == good[0] and fbgemm_v == good[1] and torchrec_v == good[2]:
            return
    known = "; ".join(f"torch {t} + fbgemm-gpu {f} + torchrec {r}" for t, f, r in KNOWN_GOOD)
    raise ImportError(
        f"shardrec.trainer: found torch {torch_v}, fbgemm-gpu {fbgemm_v}, torchrec {torchrec_v}, "
        f"which is not a known-good combination ({known}); {FIX}"
    )
