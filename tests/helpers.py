"""Assertions shared by tests (importable as `helpers`: tests/ is on sys.path via conftest.py).

`assert_one_line_error` is the check behind every "bad input gets one clear line" test. typer's
CliRunner catches any exception into `result.exception` and prints no traceback, so checking
`"Traceback" not in result.output` cannot fail; what can fail is asking that the exit came from a
deliberate `typer.Exit(1)` (a SystemExit) and that stderr holds exactly that one line.
"""

from __future__ import annotations

import re
import subprocess
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from typer.testing import Result

from shardrec.dataloader.format import Manifest, SplitInfo, open_part, write_part


def tiny_model(batch: int = 64) -> list[str]:
    """`shardrec train` flags for a model small enough for tests, with global batch `batch`."""
    settings = ("model.embedding_dim=8", "model.dense_arch=[16, 8]", "model.over_arch=[16, 1]")
    return [arg for setting in (*settings, f"train.global_batch_size={batch}") for arg in ("--set", setting)]


TINY_MODEL = tiny_model()
"""The tiny model at batch 64: 15 steps an epoch of conftest's tiny dataset."""

# Log records the CLI writes to stderr while it works (configure_logging's format); a
# subprocess shows them, and they are not part of the error message.
_LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO) \S+: ")


def assert_one_line_error(result: Result | subprocess.CompletedProcess, pattern: str) -> str:
    """Assert a command failed the way bad input must: exit code 1, no traceback, and exactly one
    line on stderr, which matches the regular expression `pattern` (re.search). Returns that line.

    result: typer's CliRunner result, or a finished subprocess run with text=True.
    """
    if isinstance(result, subprocess.CompletedProcess):
        code, stderr = result.returncode, result.stderr
        assert "Traceback" not in stderr, stderr[-3000:]
    else:
        code, stderr = result.exit_code, result.stderr
        if not isinstance(result.exception, SystemExit):
            shown = "".join(traceback.format_exception(result.exception)) if result.exception else "no exception"
            raise AssertionError(f"expected a deliberate typer.Exit(1), got:\n{shown}\nstderr: {stderr}")
    assert code == 1, f"exit code {code}, expected 1; stderr:\n{stderr[-3000:]}"
    lines = [line for line in stderr.splitlines() if line.strip() and not _LOG_LINE.match(line)]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n" + "\n".join(lines)[-3000:]
    assert re.search(pattern, lines[0]), f"stderr line {lines[0]!r} does not match {pattern!r}"
    return lines[0]


def resplit(src: Path, dst: Path, parts: int, seed: int = 7) -> None:
    """Write the train rows of the 1-part dataset `src` again as `parts` parts of uneven sizes."""
    manifest = Manifest.load(src)
    whole = open_part(src, "train", manifest.splits["train"].parts[0], manifest)
    rows = whole.rows
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(1, rows), parts - 1, replace=False))
    bounds = [0, *cuts.tolist(), rows]
    info = SplitInfo(rows=rows)
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        sparse = {n: np.asarray(v[a:b]) for n, v in whole.sparse.items()}
        info.parts.append(
            write_part(
                dst / "train" / f"part-{k:05d}",
                np.asarray(whole.labels[a:b]),
                np.asarray(whole.dense[a:b]),
                sparse,
                fsync=False,
            )
        )
    Manifest(manifest.dense_features, manifest.sparse_features, {"train": info}).save(dst)


@dataclass(frozen=True)
class Proc:
    """One live process as /proc shows it."""

    pid: int
    ppid: int
    state: str
    argv: list[bytes]


def processes() -> list[Proc]:
    """Every process of this machine (those that end while being read are left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        found.append(Proc(int(entry.name), int(fields[1]), fields[0], argv))
    return found


def trainer_ranks(run_dir: Path) -> list[int]:
    """Pids of live trainer ranks (`python -m shardrec.trainer ...`) working on `run_dir`."""

    def is_rank(argv: list[bytes]) -> bool:
        return any(argv[i : i + 2] == [b"-m", b"shardrec.trainer"] for i in range(1, 4))  # torchrun adds -u

    return [p.pid for p in processes() if is_rank(p.argv) and str(run_dir).encode() in p.argv and p.state != "Z"]


def final_weights(run_dir: Path, part: str = "model") -> dict:
    """A part of the run's last checkpoint as full tensors (read offline, no process group)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    dcp_to_torch_save(ckpt, run_dir / "final.pt")
    state = torch.load(run_dir / "final.pt", weights_only=False)[part]
    if part == "fused_optim":
        return {name: value for entries in state["state"].values() for name, value in entries.items()}
    return state
