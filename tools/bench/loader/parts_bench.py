"""`shardrec bench loader --part-rows R --parts N`: the loader over Criteo-1TB's real part count.

Criteo 1TB preprocessed is ~10,000 parts of ~450 K rows. Writing 4.5 B rows to measure the
loader would take hours and ~560 GB, so the dataset here is one part of bench loader's
Criteo-shaped rows whose file is hard-linked under N part names, with a manifest that lists
all N (the same checksums, as the preprocess would write for N identical parts): every check the
loader runs on a real dataset runs on it, its parts are mapped, evicted and mapped again as real
ones are, and all of them read one part's pages from the page cache (what is measured is the
loader's own cost at that part count, not the disk).

In the same run, under `ulimit -n` (the soft limit lowered for this process; maps hold no
descriptor, so the part count must not matter): the shuffled stream over the N parts, from
`build_loader` to its first batch (goal: within 10 s), then rows/s over `max_batches` batches
per round (one shuffle group's by default: `group_batches`), continuing the same stream round
after round (so parts come and go as the shuffle reaches new groups of segments), against the
one part alone at the same global batch and shuffle; and the resident memory of the process
(all of it, and anonymous only) after every round: flat is the goal, however many parts the
stream has crossed.

Rates are medians over the interleaved rounds (tools/bench/rounds.py), per wall second and per
CPU-second; the ratio is the median of same-round ratios with its spread. The stream's CPU
is its thread's plus what the thread warming the next shuffle group spent (opening parts off
the stream's thread is still the stream's cost; a warmer still running when a round ends is
waited for, its CPU counted in that round, its wall not), the one part's its thread's. On a loaded
machine the wall ratio also measures which loop got a core; the load average is printed with it.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardrec.tools.bench.loader.stream_runs import settle_warmers
from shardrec.tools.bench.rounds import Run, ratio, ratio_text, run_rounds, summarize
from shardrec.tools.console import console

GOAL_PER_CPU_S = 0.9
"""The many-part stream's rows per CPU-second against the one part's (issue goal)."""
OPEN_FILES = 1024
"""The open-file limit the run holds itself to (a user's usual `ulimit -n`)."""
FIRST_BATCH_GOAL_S = 10.0


def group_batches(loader) -> int:
    """Batches of one shuffle group of `loader`'s stream (at least 1): a round without
    --max-batches. The stream pays for a group's parts (opening and unmapping them, their first
    page faults) when it crosses into it, in its first windows: rounds of fewer batches (800 were
    ~0.4 group) held one crossing or none, so their median leaned on rounds without one; a round
    of a group holds exactly one crossing's worth (the rounds still spread with the machine's
    noise: 26-60% on one tree)."""
    spec = loader.spec
    mix = spec.shuffle
    group_rows = mix.block_rows * mix.segment_blocks * mix.group_segments
    return max(min(group_rows, spec.num_samples) // spec.global_batch_size, 1)


class LinkLimitError(ValueError):
    """The file system holds fewer hard links to one file than --parts asks for."""


def link_parts(one: Path, out: Path, parts: int) -> Path:
    """A dataset in `out` of `parts` parts, each one the single train part of `one` hard-linked.

    Raises:
        LinkLimitError: the file system's limit of links to one file is below `parts` + 1 (ext4:
            65,000), with the largest --parts it takes."""
    from shardrec.dataloader.format.manifest import PART_SUFFIX, Manifest, PartInfo, SplitInfo

    manifest = Manifest.load(one)
    (info,) = manifest.splits["train"].parts
    source = one / "train" / info.name
    (out / "train").mkdir(parents=True)
    infos = []
    for k in range(parts):
        name = f"part-{k:05d}{PART_SUFFIX}"
        try:
            os.link(source, out / "train" / name)
        except OSError as e:
            if e.errno != errno.EMLINK:
                raise
            raise LinkLimitError(
                f"--parts {parts:,}: the file system of {out.parent} holds at most {k + 1:,} "
                f"links to one file (ext4: 65,000); give --parts {k:,} or fewer, or a --work-dir "
                "on another file system"
            ) from None
        infos.append(PartInfo(name, info.rows, info.bytes, info.sha256))
    manifest.splits = {"train": SplitInfo(info.rows * parts, infos)}
    manifest.save(out)
    return out


def _memory_mb() -> tuple[float, float]:
    """(resident, anonymous resident) MB of this process."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", -1.0), fields.get("RssAnon", -1.0)


def _endless(loader) -> Iterator[Any]:
    """Batches of epoch after epoch (the one-part loader's epoch is shorter than a round)."""
    while True:
        yield from loader


def _run(batches: Iterator[Any], count: int) -> Run:
    """`count` batches: their rows, wall seconds and this thread's CPU seconds."""
    rows, start, cpu = 0, time.perf_counter(), time.thread_time()
    for _ in range(count):
        rows += len(next(batches).labels)
    return Run(rows, time.perf_counter() - start, time.thread_time() - cpu)


def _lower_open_files(limit: int) -> tuple[int, int]:
    """Lower this process's soft open-file limit to `limit` (never raise it); the old limits."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, old[0]), old[1]))
    return old


def run_parts_bench(
    part_rows: int,
    parts: int,
    global_batch: int,
    rounds: int,
    max_batches: int,
    work_dir: Path | None,
) -> dict[str, Any]:
    """Shuffled rows/s over `parts` hard-linked parts of `part_rows` rows against the one part;
    `max_batches` per round (0: one shuffle group's)."""
    import torch

    from shardrec.dataloader.loader import build_loader
    from shardrec.tools.bench.loader.criteo_rows import warm_page_cache, write_bench_data

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="shardrec-bench-parts-", dir=work_dir))
    old_limit = None
    try:
        with console.status(f"writing one part of {part_rows:,} rows, linked as {parts:,} parts"):
            one, theirs = write_bench_data(tmp, part_rows, name="one-part")
            shutil.rmtree(theirs)
            start = time.perf_counter()
            many = link_parts(one, tmp / "many-parts", parts)
            link_s = time.perf_counter() - start
            warm_page_cache(one)
        old_limit = _lower_open_files(OPEN_FILES)

        def loader(directory: Path):
            return build_loader(
                directory, "train", global_batch_size=global_batch, rank=0, world_size=1
            )

        baseline = _endless(loader(one))
        _run(baseline, 2)  # the kernels load before anything is timed
        memory = [_memory_mb()]
        start = time.perf_counter()
        many_loader = loader(many)
        stream = _endless(many_loader)
        next(stream)
        first_batch_s = time.perf_counter() - start
        parts_cache = many_loader.source.parts
        max_batches = max_batches or group_batches(many_loader)

        def one_part() -> Run:
            return _run(baseline, max_batches)

        def many_parts() -> Run:
            # Opening the next parts on the warming thread is the stream's cost too.
            warm = parts_cache.warm_cpu_s
            run = _run(stream, max_batches)
            settle_warmers()  # a warmer still running counts here, not in the next round's CPU
            return Run(run.work, run.wall_s, run.cpu_s + parts_cache.warm_cpu_s - warm)

        runs = run_rounds(
            {"one_part": one_part, "many_parts": many_parts},
            rounds,
            warmup=False,  # the kernels loaded and the stream's first batch came above
            on_run=lambda name, _r, _run: (
                memory.append(_memory_mb()) if name == "many_parts" else None
            ),
        )
        load = os.getloadavg()
    finally:
        if old_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, old_limit)
        shutil.rmtree(tmp, ignore_errors=True)
    rss, anon = [m[0] for m in memory], [m[1] for m in memory]
    summaries = {k: summarize(v) for k, v in runs.items()}
    return {
        "part_rows": part_rows,
        "parts": parts,
        "rows": part_rows * parts,
        "global_batch": global_batch,
        "open_file_limit": min(OPEN_FILES, old_limit[0]),
        "link_s": round(link_s, 2),
        "first_batch_s": round(first_batch_s, 3),
        "first_batch_goal_s": FIRST_BATCH_GOAL_S,
        "rows_per_s": {k: round(v.rate) for k, v in summaries.items()},
        "rows_per_cpu_s": {k: round(v.cpu_rate) for k, v in summaries.items()},
        "many_parts_vs_one_part": ratio(runs["many_parts"], runs["one_part"]).to_dict(),
        "goal_per_cpu_s": GOAL_PER_CPU_S,
        "load_average": [round(v, 2) for v in load],
        "rows_streamed": rounds * max_batches * global_batch,
        "rss_mb_per_round": [round(v, 1) for v in rss],
        "rss_growth_mb": round(max(rss[1:]) - rss[1], 1) if len(rss) > 1 else 0.0,
        "anon_mb_per_round": [round(v, 1) for v in anon],
        "rounds": rounds,
        "batches_per_round": max_batches,
    }


def print_result(r: dict[str, Any]) -> None:
    rates = r["rows_per_s"]
    console.print(
        f"loader over {r['parts']:,} parts of {r['part_rows']:,} rows ({r['rows']:,} rows; one part's file "
        f"hard-linked, linked in {r['link_s']} s), global batch {r['global_batch']}, shuffled, 1 thread, "
        f"ulimit -n {r['open_file_limit']}, medians of {r['rounds']} interleaved rounds of "
        f"{r['batches_per_round']} batches "
        f"(one stream, {r['rows_streamed']:,} rows):",
        highlight=False,
        soft_wrap=True,
    )
    per_cpu = r["rows_per_cpu_s"]
    console.print(
        f"  one part:  {rates['one_part'] / 1e6:8.2f} M rows/s, {per_cpu['one_part'] / 1e6:.2f} M rows per CPU-second",
        highlight=False,
    )
    console.print(
        f"  {r['parts']:,} parts: {rates['many_parts'] / 1e6:8.2f} M rows/s, "
        f"{per_cpu['many_parts'] / 1e6:.2f} M rows per CPU-second (warming the next groups included)",
        highlight=False,
    )
    console.print(
        f"  {r['parts']:,} parts vs one part: {ratio_text(r['many_parts_vs_one_part'], per='cpu')} "
        f"(goal >= {r['goal_per_cpu_s']}x per CPU-second; load average "
        f"{', '.join(f'{v:.2f}' for v in r['load_average'])} on {os.cpu_count()} CPUs)",
        highlight=False,
    )
    console.print(
        f"  first batch {r['first_batch_s']:.2f} s after build_loader started "
        f"(goal <= {r['first_batch_goal_s']:.0f} s)",
        highlight=False,
    )
    console.print(
        f"  resident MB after each round: {', '.join(f'{v:.0f}' for v in r['rss_mb_per_round'])} "
        f"(growth after the first {r['rss_growth_mb']:.0f} MB; anonymous: "
        f"{', '.join(f'{v:.0f}' for v in r['anon_mb_per_round'])})",
        highlight=False,
        soft_wrap=True,
    )
