"""mutmut's hook (imported by mutmut from PYTHONPATH, which scripts/mutants.py sets): with
MUTANTS_SAMPLE=K, tests one mutant in K, chosen by a hash of its file, line text and index, so a
rerun (after new tests) tests the same mutants. The others are recorded as skipped, which the
kill rate leaves out."""

from __future__ import annotations

import os
import zlib


def pre_mutation(context) -> None:
    every = int(os.environ.get("MUTANTS_SAMPLE", "1"))
    if every <= 1:
        return
    mutant = context.mutation_id
    key = f"{context.filename}\0{mutant.line}\0{mutant.index}".encode()
    if zlib.crc32(key) % every:
        context.skip = True
