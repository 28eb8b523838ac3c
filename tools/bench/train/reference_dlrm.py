"""The DLRM reference (facebookresearch/dlrm `torchrec_dlrm/dlrm_main.py`), run unmodified from a
checkout the user points `shardrec bench train --reference DIR` at, and timed from outside it.

torchrun starts this module on every rank; it imports `dlrm_main` from DIR/torchrec_dlrm and runs
its `main` with the reference's own arguments (`reference_args`: its flags for our model shape,
data and steps). Nothing of the reference is changed or copied: this wrapper only hands
`dlrm_main` a TrainPipelineSparseDist subclass that notes the clock (wall and this process's CPU
time) around each training `progress()` call, profiles a few steps after the timed ones with
bench train's breakdown when asked, and keeps the AUROC that `_evaluate` returns. Each rank writes
what it saw to OUT/rank-R.json; `read_reference_round` turns that into a Run, its AUC and its
breakdown.

On CPU the reference trains as its README says: gloo (it picks gloo where CUDA is absent), the
in-memory Criteo pipe over torchrec's day_N_*.npy files (`--in_memory_binary_criteo_path`, 23
training days, day 23 halved into val and test), torchrec's planner, fused embedding optimizer
(`--adagrad`: EXACT_ADAGRAD in the tables' backward, torch Adagrad on the dense layers).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from shardrec.dataloader.util.files import atomic_write_bytes

REFERENCE_SUBDIR = "torchrec_dlrm"


def check_reference(directory: Path) -> Path:
    """The reference's torchrec_dlrm folder in a checkout; ValueError (one line) if it is not one."""
    folder = Path(directory) / REFERENCE_SUBDIR
    if not (folder / "dlrm_main.py").is_file():
        raise ValueError(
            f"--reference {directory}: no {REFERENCE_SUBDIR}/dlrm_main.py there; point it at a "
            "checkout of https://github.com/facebookresearch/dlrm"
        )
    return folder


def reference_args(
    data: Path,
    *,
    per_rank_batch: int,
    table_rows: int,
    embedding_dim: int,
    dense_arch: list[int],
    over_arch: list[int],
    learning_rate: float,
    train_steps: int,
    val_batches: int,
) -> list[str]:
    """dlrm_main's command line for our model shape on torchrec's day files in `data`."""
    return [
        "--in_memory_binary_criteo_path", str(data),
        "--batch_size", str(per_rank_batch),
        "--num_embeddings", str(table_rows),
        "--embedding_dim", str(embedding_dim),
        "--dense_arch_layer_sizes", ",".join(map(str, dense_arch)),
        "--over_arch_layer_sizes", ",".join(map(str, over_arch)),
        "--adagrad",
        "--learning_rate", str(learning_rate),
        "--epochs", "1",
        "--limit_train_batches", str(train_steps),
        "--limit_val_batches", str(val_batches),
        "--limit_test_batches", "1",
    ]  # fmt: skip


def rank_main(reference: str, out: str, window: str, argv: list[str]) -> None:
    """One rank: run dlrm_main.main(argv), timing training steps [warm-up, warm-up + steps) and
    profiling the `profiled` steps after them (window = "warmup,steps,profiled")."""
    from shardrec.trainer.distributed.dist import bind_launched_rank

    warmup, steps, profiled = (int(v) for v in window.split(","))
    bind_launched_rank()  # its cores as shardrec's ranks get theirs (dist.bind_cores)
    sys.path.insert(0, str(check_reference(Path(reference))))
    import dlrm_main  # the reference, as it is

    from shardrec.tools.bench.train.breakdown import categorize, scope_modules

    seen: dict[str, Any] = {"wall": [], "cpu": [], "auc": {}}
    base = dlrm_main.TrainPipelineSparseDist

    class Timed(base):  # type: ignore[misc, valid-type]
        """The reference's pipeline, with a clock reading before each training step."""

        def progress(self, dataloader_iter: Any) -> Any:
            if not self._model.training:
                return super().progress(dataloader_iter)
            step = len(seen["wall"])
            seen["wall"].append(time.perf_counter())
            seen["cpu"].append(time.process_time())
            if profiled and step == warmup + steps:
                seen["profile"] = _start_profile(self._model, scope_modules)
            if profiled and step == warmup + steps + profiled:
                _stop_profile(seen, profiled, categorize)
            return super().progress(dataloader_iter)

    evaluate = dlrm_main._evaluate

    def evaluated(limit: Any, pipeline: Any, loader: Any, stage: str) -> float:
        if "profile" in seen:  # fewer training batches than asked: close the profile anyway
            _stop_profile(seen, len(seen["wall"]) - warmup - steps, categorize)
        auc = evaluate(limit, pipeline, loader, stage)
        seen["auc"][stage] = auc
        if stage == "val":  # the round's figures are complete: kept if the test pass fails
            _write_figures(out, seen)
        return auc

    dlrm_main.TrainPipelineSparseDist = Timed
    dlrm_main._evaluate = evaluated
    dlrm_main.main(argv)
    _write_figures(out, seen)


def _write_figures(out: str, seen: dict[str, Any]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    atomic_write_bytes(
        Path(out, f"rank-{rank}.json"),
        json.dumps({k: seen[k] for k in seen if k != "profile"}).encode(),
    )


def _start_profile(model: Any, scope_modules: Any) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    handles = scope_modules(model)
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.__enter__()
    return {"prof": prof, "handles": handles, "start": time.perf_counter()}


def _stop_profile(seen: dict[str, Any], steps: int, categorize: Any) -> None:
    import threading

    run = seen.pop("profile")
    wall_ms = (time.perf_counter() - run["start"]) * 1e3
    run["prof"].__exit__(None, None, None)
    for handle in run["handles"]:
        handle.remove()
    if steps <= 0:
        return
    events = run["prof"].events()
    # The training thread: the one that ran the pipeline's forward.
    threads = [e.thread for e in events if e.name.startswith(("## forward", "## backward"))]
    thread = threads[0] if threads else threading.get_ident()
    seen["breakdown"] = {
        "step wall": round(wall_ms / steps, 3),
        **categorize(events, thread, wall_ms, steps),
    }


def read_reference_round(out: Path, warmup: int, steps: int, global_batch: int) -> dict[str, Any]:
    """The figures of one reference launch: samples, wall and CPU seconds (every rank's) of its
    timed steps, its val AUC, and its breakdown averaged over ranks (if profiled)."""
    from shardrec.tools.bench.train.breakdown import mean_over_ranks

    ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank-*.json"))]
    if not ranks:
        raise RuntimeError(f"the reference wrote no figures into {out}")
    first, last = warmup, warmup + steps
    if any(len(r["wall"]) <= last for r in ranks):
        got = min(len(r["wall"]) for r in ranks)
        raise RuntimeError(
            f"the reference trained {got} steps, fewer than the {last + 1} timed: more data needed"
        )
    if ranks[0]["auc"].get("val") is None:
        raise RuntimeError(f"the reference wrote no val AUC into {out}")
    wall = max(r["wall"][last] - r["wall"][first] for r in ranks)
    cpu = sum(r["cpu"][last] - r["cpu"][first] for r in ranks)
    profiles = [r["breakdown"] for r in ranks if "breakdown" in r]
    return {
        "run": (float(steps * global_batch), wall, cpu),
        "auc": ranks[0]["auc"].get("val"),
        "breakdown": mean_over_ranks(profiles) if profiles else None,
    }


if __name__ == "__main__":
    rank_main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
