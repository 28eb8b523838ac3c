"""The benchmarks' memory figure of a process tree: PSS counts a page its processes share once, RSS
once per process."""

from __future__ import annotations

import subprocess
import sys
import time

from shardrec.tools.bench.proctree import run_measured, tree_memory_bytes

_MB = 1 << 20


_FORKS_A_HOLDER = """
import gc, os, sys
gc.disable()  # a collection would write into every object's header: copy-on-write pages of its own
block = bytearray(os.urandom(1 << 10) * (64 << 10))  # 64 MiB of private pages, all touched
print("allocated", flush=True)
sys.stdin.readline()
read_end, write_end = os.pipe()
if os.fork() == 0:  # holds the parent's pages (copy-on-write, untouched) until the pipe closes
    os.close(write_end)
    os.read(read_end, 1)
    os._exit(0)
print("forked", flush=True)
sys.stdin.readline()
"""


def test_pss_counts_pages_shared_by_a_forked_child_once():
    # measured from outside: a process that measures itself allocates while it reads /proc, and in a
    # big test worker a collection after the fork copies tens of MiB of pages the child shares
    proc = subprocess.Popen(
        [sys.executable, "-c", _FORKS_A_HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "allocated\n"
        rss_before, pss_before = tree_memory_bytes(proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "forked\n"
        rss_after, pss_after = tree_memory_bytes(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert rss_after - rss_before > 64 * _MB - _MB  # the child's copy of the block counts again
    assert (
        abs(pss_after - pss_before) < 16 * _MB
    )  # ... but is the same pages: PSS splits them, the sum holds


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
    assert (
        res["returncode"] == 0 and res["peak_pss_mb"] > 8000 * 4096 / _MB
    )  # PSS still read, pages counted
    assert sampler_cpu < 0.12 * res["wall_s"], (sampler_cpu, res["wall_s"])
