"""`shardrec bench train --model hstu`: HSTU's training samples/s on CPU ranks against a plain
PyTorch version of the same layer, and where a step's time goes.

Data: `shardrec synth --like yambda` rows preprocessed with configs/yambda_events.toml; model and
optimizers: configs/dlrmv4.toml with the reference's input encoding of position and time
(REFERENCE_ENCODING). The ranks (torchrun, gloo) build two models with the same weights and the
same sharding plan, shardrec's (`build_job`, as `shardrec train` builds it) and one whose
STU layers are plain_stu.py's, check that they give the same logits on a batch, then time them in
interleaved rounds over the same batches held in memory (and shardrec's from disk through the
temporal loader). With --reference DIR (a meta-recsys/generative-recommenders checkout), a third
model runs the plain layer with the reference's own PyTorch attention (`pytorch_hstu_mha`). Ratios
are rounds.ratio's (medians of same-round ratios with their spread, per wall and per CPU-second;
"too small to measure" under bench train's MIN_STEPS steps or MIN_RUN_S seconds a window); a
baseline whose logits differ from shardrec's is refused.

Where the time goes: a profiled window of shardrec's model, each step's wall time split into the
attention (its forward ranges, and the backward of the operations recorded in them, matched by
autograd sequence number), the embedding lookups (their range less the all-to-alls inside it),
and torchrec's all-to-alls forward and backward (its `## all2all ... ##` / `## All2All ... ##`
ranges).
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardrec.tools.console import console

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "dlrmv4.toml"
EVENT_SPEC = Path(__file__).resolve().parents[3] / "configs" / "yambda_events.toml"
BASELINES = {
    "plain_layer": "the plain PyTorch layer",
    "reference_attention": "the plain layer with the reference's pytorch_hstu_mha",
}
REFERENCE_ENCODING = [
    "train.log_interval=1000000",
    'model.hstu_bias="input"',
    "model.hstu_recency=0",
]
"""Over configs/dlrmv4.toml: position and time at the input, as the reference encodes them (the
file's relative bias is not in the reference's attention, nor in the plain layer)."""
SAME_LOGITS = 1e-4
"""The most the two models' logits may differ on a batch (fp32) for their times to compare."""
COMM_PREFIXES = (
    "## all2all",
    "## All2All",
    "## reduce_scatter",
    "## ReduceScatter",
    "## all_gather",
)


def write_events(directory: Path, rows: int, seed: int = 0) -> Path:
    """A synthetic Yambda-like log, preprocessed; returns the dataset directory."""
    import shutil

    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.event_dataset import build_event_dataset
    from shardrec.tools.synth.yambda import write_yambda_like

    raw = directory / "raw"
    write_yambda_like(raw, rows, seed)
    spec = raw / "spec.toml"
    shutil.copy(EVENT_SPEC, spec)
    data = directory / "data"
    build_event_dataset([raw / "events.parquet"], load_event_spec(spec), spec, data)
    return data


def _plain_runner(job, env, mha=None):
    """A second model of the job's plan and weights whose STU layers are the plain ones (their
    attention `mha` where given: the reference's)."""
    import torch.nn as nn

    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.init import init_embedding_weights
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.tools.bench.sequence.plain_stu import PlainSTULayer
    from shardrec.trainer.loop.steps import StepRunner
    from shardrec.trainer.model import build, run_plan, train_module
    from shardrec.trainer.model.objective import TRAIN_EBC_PATH, TRAIN_EC_PATH

    cfg = job.config
    manifest = Manifest.load(cfg.data.path)
    tables = build_table_configs(
        manifest, cfg.model.embedding_dim, cfg.model.dims, unpooled_sequences=True
    )
    module = train_module.build_train_module(
        cfg.model,
        manifest,
        tables,
        env,
        global_batch_size=cfg.train.global_batch_size,
        seed=cfg.train.seed,
        sequence_dedup=cfg.sharding.sequence_dedup,
        loss_weight=cfg.optim.loss_weight,
    )
    module.model.layers = nn.ModuleList(
        PlainSTULayer.like(layer, cfg.model.hstu_max_seq_len, mha) for layer in module.model.layers
    )
    plan = run_plan.build_sharding_plan(job.plan, tables, env, cfg.train.global_batch_size)
    model = build.shard_model(module, plan, env, cfg.optim, qcomm=None, plan_file=job.plan)
    init_embedding_weights(
        model, tables, cfg.train.seed, ebc_path=TRAIN_EBC_PATH, ec_path=TRAIN_EC_PATH
    )
    optimizer = build.build_optimizer(model, tables, cfg.optim)
    return StepRunner(model, optimizer, env.device, "plain")


def _logits(runner, batch):
    import torch

    model = runner.eval_mode()
    with torch.no_grad():
        _, (_, logits, *_) = model(batch)
    runner.model.train()
    return logits


def time_shares(prof) -> dict[str, float]:
    """Seconds of the profiled window in attention, lookups (less their comms) and all-to-alls."""
    from shardrec.trainer.model.hstu import ATTENTION_SCOPE
    from shardrec.trainer.model.hstu_model import LOOKUPS_SCOPE

    events = list(prof.events())
    main = {e.thread for e in events if e.name == ATTENTION_SCOPE}

    def ranges(name_test):
        return [e for e in events if name_test(e.name)]

    attention = ranges(lambda n: n == ATTENTION_SCOPE)
    lookups = ranges(lambda n: n == LOOKUPS_SCOPE)
    comms = ranges(lambda n: n.startswith(COMM_PREFIXES))

    def inside(e, spans):
        return any(s.time_range.start <= e.time_range.start <= s.time_range.end for s in spans)

    forward_ops = [e for e in events if e.thread in main and e.sequence_nr >= 0]
    seqs = {e.sequence_nr for e in forward_ops if inside(e, attention)}
    backward = [
        e
        for e in events
        if e.name.startswith("autograd::engine::evaluate_function") and e.sequence_nr in seqs
    ]
    seconds = lambda spans: sum(e.time_range.elapsed_us() for e in spans) / 1e6  # noqa: E731
    comm_in_lookups = [c for c in comms if inside(c, lookups)]
    return {
        "attention": seconds(attention) + seconds(backward),
        "lookups": max(0.0, seconds(lookups) - seconds(comm_in_lookups)),
        "all_to_all": seconds(comms),
    }


def bench_rank(data: str, out: str, steps: int, rounds: int, threads: int, reference: str) -> None:
    """One rank (started by torchrun); rank 0 writes the figures to `out`. `reference`: a
    generative-recommenders checkout whose attention a third model runs ("" for none)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from shardrec.tools.bench.rounds import Run
    from shardrec.tools.bench.train.timing import timed_window
    from shardrec.tools.bench.train.train_ranks import (
        build_ours,
        close_loader,
        from_disk,
        run_rounds,
    )
    from shardrec.trainer.distributed.dist import init_distributed, shutdown
    from shardrec.trainer.job.config import load_job_config

    torch.set_num_threads(threads)
    env = init_distributed("cpu")
    config = load_job_config(CONFIG, [f'data.path="{data}"', *REFERENCE_ENCODING])
    with tempfile.TemporaryDirectory() as run_root:
        ours = build_ours(config, env, Path(run_root) / "ours", (rounds + 3) * steps * 3)
        plain = _plain_runner(ours.job, env)
        baselines = {"plain_layer": plain}
        if reference:
            from shardrec.tools.bench.sequence.plain_stu import reference_attention

            mha = reference_attention(Path(reference))
            baselines["reference_attention"] = _plain_runner(ours.job, env, mha)
        stream = iter(ours.job.train_loader)
        memory = list(itertools.islice(stream, steps))
        close_loader(stream)
        torch.manual_seed(0)
        mine = _logits(ours.job.runner, memory[0])
        same = {
            name: float((mine - _logits(runner, memory[0])).abs().max())
            for name, runner in baselines.items()
        }
        samples = steps * config.train.global_batch_size

        def in_memory(runner):
            def run():
                for _ in runner.run(iter(memory)):
                    pass

            return lambda: Run(*timed_window(run, samples))

        for runner in (ours.job.runner, *baselines.values()):  # warm-up, outside the figures
            for _ in runner.run(iter(memory[:2])):
                pass
        runs = run_rounds(
            {
                "ours": in_memory(ours.job.runner),
                **{name: in_memory(runner) for name, runner in baselines.items()},
                "ours_from_disk": lambda: from_disk(ours, steps, samples),
            },
            rounds,
        )
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = in_memory(ours.job.runner)().wall_s
        shares = {k: v / wall for k, v in time_shares(prof).items()}
        ours.reporter.close()
    dedup = ours.job.config.sharding.sequence_dedup
    result = {
        "runs": {name: [asdict(run) for run in side] for name, side in runs.items()},
        "max_logit_difference": same,
        "profiled_seconds": wall,
        "shares": shares,
        "sharding_types": sorted({t.sharding_type for t in ours.job.plan.tables}),
        "sequence_dedup": dedup,
    }
    if env.is_main:
        Path(out).write_text(json.dumps(result))
    shutdown()


def run_bench(
    rows: int, steps: int, rounds: int, nproc: int, threads: int, reference: Path | None = None
) -> dict[str, Any]:
    """Generate the data, run the ranks, summarise; RuntimeError with the ranks' stderr.
    `reference`: a meta-recsys/generative-recommenders checkout; its PyTorch attention is then a
    second baseline (plain_stu.reference_attention)."""
    if reference is not None:
        from shardrec.tools.bench.sequence.plain_stu import reference_attention

        reference_attention(reference.resolve())  # refused here in one line, before any rank
    from shardrec.tools.bench.train.train_bench import launch_ranks

    with tempfile.TemporaryDirectory() as tmp:
        data = write_events(Path(tmp), rows)
        out = Path(tmp) / "result.json"
        args = [str(data), str(out), str(steps), str(rounds), str(threads)]
        args.append(str(reference.resolve()) if reference is not None else "")
        launch_ranks("shardrec.tools.bench.sequence.hstu_bench", args, nproc, threads)
        raw = json.loads(out.read_text())
    for name, difference in raw["max_logit_difference"].items():
        if not difference <= SAME_LOGITS:
            # Timing two models that compute different things would be no comparison.
            raise RuntimeError(
                f"{name}: its logits differ from shardrec's by {difference:.3g} (more than "
                f"{SAME_LOGITS}): not the same layer, no ratio"
            )
    return summarise(raw, rows, steps, rounds, nproc, threads)


def summarise(
    raw: dict[str, Any], rows: int, steps: int, rounds: int, nproc: int, threads: int
) -> dict[str, Any]:
    """The ranks' runs as rates and ratios (rounds.ratio: medians of same-round ratios, per wall
    and per CPU-second, "too small to measure" under train_bench's MIN_STEPS or MIN_RUN_S)."""
    from shardrec.tools.bench.rounds import MIN_RUN_S, Run, ratio, summarize
    from shardrec.tools.bench.train.train_bench import too_small

    runs = {k: [Run(**r) for r in v] for k, v in raw["runs"].items()}
    summaries = {k: summarize(v) for k, v in runs.items()}
    ratios = {
        f"ours_vs_{name}": ratio(
            runs["ours"], runs[name], too_small=too_small(steps), min_run_s=MIN_RUN_S
        ).to_dict()
        for name in raw["max_logit_difference"]
    }
    return {
        "model": "hstu",
        "config": str(CONFIG),
        "ranks": nproc,
        "threads_per_rank": threads,
        "rows": rows,
        "steps": steps,
        "rounds": rounds,
        "median_samples_per_s": {k: round(v.rate, 1) for k, v in summaries.items()},
        "samples_per_cpu_s": {k: round(v.cpu_rate, 1) for k, v in summaries.items()},
        **ratios,
        "max_logit_difference": raw["max_logit_difference"],
        "time_shares": {k: round(v, 3) for k, v in raw["shares"].items()},
        "sharding_types": raw["sharding_types"],
        "sequence_dedup": raw["sequence_dedup"],
    }


def print_result(result: dict[str, Any]) -> None:
    from shardrec.tools.bench.rounds import ratio_text

    console.print(
        f"{result['ranks']} CPU ranks x {result['threads_per_rank']} thread(s), HSTU of "
        f"configs/dlrmv4.toml on a synthetic log of {result['rows']:,} listens, "
        f"{result['rounds']} interleaved rounds x {result['steps']} steps"
    )
    for name, rate in result["median_samples_per_s"].items():
        console.print(f"  {name:16s} {rate:>10,.1f} samples/s")
    for name, difference in result["max_logit_difference"].items():
        what = BASELINES[name]
        console.print(
            f"ours / {what} (same weights, plan, batches): "
            f"{ratio_text(result[f'ours_vs_{name}'])}; logits differ by at most {difference:.2e}",
            highlight=False,
        )
    shares = result["time_shares"]
    console.print(
        "share of a step: "
        + ", ".join(f"{name.replace('_', '-')} {share:.1%}" for name, share in shares.items())
        + f" (sharding: {', '.join(result['sharding_types'])}; dedup {result['sequence_dedup']})"
    )


if __name__ == "__main__":
    bench_rank(
        sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    )
