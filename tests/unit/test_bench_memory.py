"""The benchmarks' memory figure of a process tree: PSS counts a page its processes share once, RSS once per process."""

from __future__ import annotations

import os

from shardrec.tools.bench.proctree import tree_memory_bytes

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
