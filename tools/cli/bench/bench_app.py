"""`shardrec bench ...`: benchmarks that print ratios against a baseline measured in the same run.

Each command's module is imported when the command runs (common.LazyGroup): `bench check` must
not pay for the imports of `bench train`'s stock torchrec or `bench plan`'s planners.
"""

from __future__ import annotations

import typer

from shardrec.tools.cli.common import LazyGroup

# The commands in the order `shardrec bench --help` lists them, each with the module under
# shardrec.tools.cli.bench whose register(bench_app) adds it, and its summary there.
MODULES = {
    "loader": "loader",
    "preprocess": "preprocess",
    "plan": "plan",
    "plan-reality": "plan_reality",
    "hitrate": "hitrate",
    "train": "train",
    "sequence": "sequence",
    "quality": "quality",
    "scale": "scale",
    "check": "check",
}
SUMMARIES = {
    "loader": "Loader rows/s as torchrec Batches on one thread, vs the memcpy roofline and "
    "torchrec's pipe.",
    "preprocess": "Preprocess MB/s and peak RSS against a polars pipeline doing the same work (1 "
    "and all threads), same file.",
    "plan": "The plan `shardrec plan` writes vs torchrec's default planner's, priced by the better "
    "predictor as --profile measured it, else by the default model (ratio < 1: shardrec faster), "
    "both keeping the same memory free; CPU cases trained too.",
    "plan-reality": "Train 12+ plans (both planners', simple and bad ones) on local CPU ranks: "
    "which cost model orders them like the clock (Kendall tau, median error), and how close is "
    "each rank's memory estimate to its peak?",
    "hitrate": "Predicted UVM cache hit rates against exact LRU and LFU caches replaying the "
    "data's id stream.",
    "train": "Training samples/s: `shardrec train`'s path (fp32, bf16) vs stock torchrec (or the "
    "DLRM reference), real loader vs in-memory batches; --managed: managed tables vs static "
    "ones of the same rows; --model hstu: HSTU against a plain PyTorch version of its layer (and "
    "the reference's attention, --reference), and the shares of a step in attention, lookups and "
    "all-to-alls.",
    "sequence": "Held-out AUC of HSTU (configs/dlrmv4.toml) against a DLRM that pools the same "
    "history, on a synthetic log whose label depends on the order of each user's events; "
    "several seeds each.",
    "quality": "Managed tables (1/4 of the distinct ids) vs hashing into the same rows vs an "
    "unbounded vocabulary, on a drifting log trained day by day with progressive validation.",
    "scale": "Make, preprocess (hashing and vocabulary), stream and train a Criteo-1TB-shaped "
    "dataset at a fraction.",
    "check": "The quick benchmarks, each ratio against the floor recorded for this machine class "
    "(make bench-check); exit 1 when one is below its floor, too small to measure or has no "
    "floor.",
}


class BenchCommands(LazyGroup):
    package, modules, summaries = "shardrec.tools.cli.bench", MODULES, SUMMARIES


bench_app = typer.Typer(
    cls=BenchCommands,
    help="Benchmarks; each but `scale` prints its ratio against a baseline measured in the same run.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
