"""The benchmarks' memory figure of a process tree: PSS counts a page its processes share once, RSS once per process."""

from __future__ import annotations

import os
import sys
import time

from shardrec.tools.bench.proctree import run_measured, tree_memory_bytes

_MB = 1 << 20


def test_pss_counts_pages_shared_by_a_forked_child_once():
    block = bytearray(os.urandom(1 << 10) * (64 << 10))  # 64 MiB of private pages, all touched
    rss_before, pss_before = tree_memory_bytes(os.getpid())
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # holds the parent's pages (copy-on-write, untouched) until the pipe closes
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    try:
        os.close(read_end)
        rss_after, pss_after = tree_memory_bytes(os.getpid())
    finally:
        os.close(write_end)
        os.waitpid(child, 0)
    assert rss_after - rss_before > len(block) // _MB * _MB  # the child's copy of the block counts again
    assert abs(pss_after - pss_before) < 16 * _MB  # ... but is the same pages: PSS splits them, the sum holds


_MANY_MAPPINGS = """
import mmap, sys, time
maps = [mmap.mmap(-1, 4096) for _ in range(8000)]  # one mapping each (shared: never merged)
for m in maps:
    m[0] = 1
time.sleep(1.0)
"""


def test_measuring_a_tree_costs_a_small_share_of_a_core():
    # smaps_rollup walks every mapping: the sampler must not become the load it measures
    cpu = time.process_time()
    res = run_measured([sys.executable, "-c", _MANY_MAPPINGS])
    sampler_cpu = time.process_time() - cpu
    assert res["returncode"] == 0 and res["peak_pss_mb"] > 8000 * 4096 / _MB  # PSS still read, pages counted
    assert sampler_cpu < 0.12 * res["wall_s"], (sampler_cpu, res["wall_s"])
