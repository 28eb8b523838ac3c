"""Where a training step's time goes (`shardrec bench train --breakdown`), the same way for every
side: ours, stock torchrec and the DLRM reference.

A few steps run under torch.profiler (CPU activities); every operator the step's thread ran is put
in one category by its name or, failing that, by the nearest enclosing operator or scope that has
one (an `aten::cat` inside torchrec's output dist is all-to-all work, inside the interaction it is
the interaction's), and its self time counts there. Backward operators (those under the autograd
engine's `evaluate_function`) count apart from forward ones. What no operator covers, the step's
wall time less all self times, is Python and framework work between operators and time the
thread slept (waiting on the other rank outside a collective, the scheduler).

The first collective of a step waits for the slowest rank to get there: in torchrec's input dist
that is the splits all-to-all (each rank's few per-feature counts), so the time in its wait is
the other ranks' lateness, not the transfer, and counts apart as INPUT_DIST_WAIT. A plain loop
waits there at the start of every forward; torchrec's TrainPipelineSparseDist (stock torchrec, the
reference) starts the next batch's input dist before this batch's forward, so the same lateness
is mostly waited for later, in the pooled embeddings' all-to-all.

The profiler adds a few microseconds per operator, so the figures are shares of a slightly slower
step; their sum is that step's wall time. Categories follow the names torchrec, fbgemm, torch and
the models use; a name none matches counts as "other operators" (its own line, so that a new
operator cannot hide in a neighbour's share).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.hooks import RemovableHandle

STEP_SCOPE = "## bench step ##"
SCOPED = ("dense_arch", "over_arch", "inter_arch", "interaction")
"""Submodules (torchrec's DLRM and ours name them so) whose forward runs in a scope of that name."""
LOADER_SCOPE = "## loader ##"
INPUT_DIST_WAIT = "input dist: waiting for other ranks"
# (category, name fragments), first match wins: specific scopes before the operators inside them.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loader", (LOADER_SCOPE, "DataLoader", "_DatasetKind")),
    # torchrec's scopes around the wait for the splits all-to-all (one module's, or the pipeline's
    # fused one for all modules).
    (INPUT_DIST_WAIT, ("SplitsAllToAllAwaitable wait()", "FusedKJTListSplitsAwaitable wait()")),
    (
        "input dist",
        (
            "input_dist",
            "splits_dist",
            "sparse_data_dist",
            "KJTAllToAll",
            "SplitsAllToAll",
            "KJTOneToAll",
            "permute_2D_sparse_data",
            "KeyedJaggedTensor",
        ),
    ),
    ("all-to-all", ("output_dist", "All2All_Pooled", "alltoall", "all_to_all", "All2All")),
    ("lookups", ("[lookup]", "split_embedding", "embedding_bag", "EmbeddingBag")),
    ("gradient all-reduce", ("allreduce", "Reducer", "DistributedDataParallel.backward")),
    ("optimizers", ("Optimizer.", "_fused_adagrad", "_fused_adam", "_fused_sgd", "lr_scheduler")),
    ("dense + interaction (compiled)", ("Torch-Compiled Region", "CompiledFunction", "cpp_fused")),
    (
        "interaction",
        (
            "aten::bmm",
            "BmmBackward",
            "IndexBackward",
            "aten::index",
            "index_put",
            "StackBackward",
            "aten::stack",
            "## inter_arch ##",
            "## interaction ##",
            "PairwiseDots",
        ),
    ),
    (
        "dense",
        (
            "## dense_arch ##",
            "## over_arch ##",
            "aten::addmm",
            "aten::mm",
            "aten::linear",
            "AddmmBackward",
            "MmBackward",
            "aten::relu",
            "threshold_backward",
            "clamp_min",
            "ReluBackward",
            "binary_cross_entropy",
            "BinaryCrossEntropy",
            "aten::sigmoid",
            "TBackward",
        ),
    ),
)
SPLIT_BY_DIRECTION = {"lookups", "interaction", "dense"}
OTHER = "other operators"
FRAMEWORK = "python, framework, waiting"
BACKWARD_MARK = "autograd::engine::evaluate_function"


def labeled_batches(batches: Iterable[Any]) -> Iterator[Any]:
    """`batches` with each `next()` in the LOADER_SCOPE (its time is the loader's)."""
    it = iter(batches)
    while True:
        with record_function(LOADER_SCOPE):
            try:
                batch = next(it)
            except StopIteration:
                return
        yield batch


def scope_modules(model: nn.Module) -> list[RemovableHandle]:
    """Run the forward of every SCOPED submodule of `model` in a profiler scope of its name
    (forward hooks; remove the returned handles after). Operators with no category of their own
    (an aten::cat) then count where they ran. Not for compiled modules: a hook added after the
    compile would make it compile again."""
    handles: list[RemovableHandle] = []
    for fqn, module in model.named_modules():
        leaf = fqn.rsplit(".", 1)[-1]
        if leaf not in SCOPED:
            continue
        open_scopes: list[record_function] = []

        def enter(_m: nn.Module, _args: Any, name: str = f"## {leaf} ##", stack=open_scopes):
            scope = record_function(name)
            scope.__enter__()
            stack.append(scope)

        def leave(_m: nn.Module, _args: Any, _out: Any, stack=open_scopes) -> None:
            stack.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


def category(name: str) -> str | None:
    for cat, fragments in RULES:
        if any(f in name for f in fragments):
            return cat
    return None


def _add(totals: dict[str, float], event: Any, inherited: str | None, backward: bool) -> None:
    backward = backward or event.name.startswith(BACKWARD_MARK)
    cat = category(event.name) or inherited
    if cat is not None:
        key = f"{cat} {'bwd' if backward else 'fwd'}" if cat in SPLIT_BY_DIRECTION else cat
    elif event.name.startswith(("aten::", "fbgemm::", "c10d::", "torchrec::")):
        key = OTHER
    else:
        key = FRAMEWORK  # a scope's own time: Python between the operators it holds
    totals[key] = totals.get(key, 0.0) + event.self_cpu_time_total / 1e3
    for child in event.cpu_children:
        _add(totals, child, cat, backward)


def categorize(events: Iterable[Any], thread: int, wall_ms: float, steps: int) -> dict[str, float]:
    """Milliseconds per step by category of the top-level `events` that ran on `thread`; what no
    operator covers of `wall_ms` counts as framework and waiting."""
    totals: dict[str, float] = {}
    for event in events:
        if event.cpu_parent is None and event.thread == thread:
            _add(totals, event, None, False)
    totals[FRAMEWORK] = totals.get(FRAMEWORK, 0.0) + max(0.0, wall_ms - sum(totals.values()))
    return {k: round(v / steps, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def profile_steps(run: Callable[[int], object], steps: int) -> dict[str, float]:
    """Run `run(steps)` under the profiler; milliseconds per step by category on this thread,
    and the profiled step's wall time (`step wall`)."""
    thread = threading.get_ident()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        with record_function(STEP_SCOPE):
            run(steps)
        wall_ms = (time.perf_counter() - start) * 1e3
    events = prof.events()
    step = [e for e in events if e.name == STEP_SCOPE]
    tid = step[0].thread if step else thread
    return {"step wall": round(wall_ms / steps, 3), **categorize(events, tid, wall_ms, steps)}


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Each category's mean over ranks (a rank without it counts 0)."""
    keys = {k for r in per_rank for k in r}
    means = {k: sum(r.get(k, 0.0) for r in per_rank) / len(per_rank) for k in keys}
    wall = means.pop("step wall", 0.0)
    ordered = sorted(means.items(), key=lambda kv: -kv[1])
    return {"step wall": round(wall, 3), **{k: round(v, 3) for k, v in ordered}}


def gather_breakdown(mine: dict[str, float]) -> dict[str, float]:
    """The mean over every rank of the process group (all ranks call it)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mean_over_ranks([mine])
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return mean_over_ranks(parts)
