"""`make mutants`: mutation testing (mutmut) of the core modules, each against the tests that
should catch its bugs; prints the kill rate per module. Not part of CI or `make test`: it runs
one test process per mutant (minutes to hours). mutmut 2 mutates the files in place and puts
each back, so run it on a checkout nobody else is testing; `.mutmut-cache` keeps the results
(`mutmut show ID` prints a survivor) and a rerun tests only what changed.

Usage: python scripts/mutants.py [NAME ...]   (names below; default: all)
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# name -> (module file, the tests that exercise it, fast ones only)
MODULES: dict[str, tuple[str, list[str]]] = {
    "metrics": ("trainer/loop/metrics.py", ["tests/unit/test_metrics.py"]),
    "ids": (
        "tools/preprocess/ids/id_maps.py",
        ["tests/unit/test_preprocess_ids_plan.py", "tests/unit/test_parse.py"],
    ),
    "parse_kernel": (
        "tools/preprocess/parse/parse_kernel.py",
        ["tests/unit/test_parse.py", "tests/unit/test_preprocess_fast_paths.py"],
    ),
    "order": ("dataloader/order.py", ["tests/unit/test_order.py"]),
    "loader": (
        "dataloader/loader.py",
        ["tests/unit/test_loader.py", "tests/unit/test_loader_many_parts.py"],
    ),
    "format": ("dataloader/format/manifest.py", ["tests/unit/test_format.py"]),
    "checkpoint_trust": (
        "trainer/rundir/checkpoint_trust.py",
        ["tests/robustness/test_train_checkpoint_trust.py", "tests/unit/test_checkpoint.py"],
    ),
    "lifecycle": (
        "trainer/rundir/lifecycle.py",
        ["tests/unit/test_resume_rules.py", "tests/unit/test_train_config.py"],
    ),
    "cost": (
        "sharding/cost/cost_model.py",
        ["tests/unit/test_plan_memory.py", "tests/unit/test_plan_search.py"],
    ),
    "comms": ("sharding/cost/comms.py", ["tests/unit/test_comm_model.py"]),
    "files": (
        "dataloader/util/files.py",
        ["tests/unit/test_files.py", "tests/unit/test_preprocess_ids_plan.py"],
    ),
    "multihot": (
        "dataloader/multihot/multihot_tables.py",
        ["tests/unit/test_multihot.py", "tests/unit/test_multihot_loader.py"],
    ),
}


def kill_rates(cache: Path) -> dict[str, tuple[int, int]]:
    """File -> (killed, tested) from mutmut's cache; a timeout counts as killed, as mutmut's
    does."""
    out: dict[str, tuple[int, int]] = {}
    query = (
        "select f.filename, m.status from Mutant m "
        "join Line l on m.line = l.id join SourceFile f on l.sourcefile = f.id"
    )
    for filename, status in sqlite3.connect(cache).execute(query):
        if status in ("untested", "skipped"):
            continue
        killed, tested = out.get(filename, (0, 0))
        out[filename] = (killed + (status in ("ok_killed", "bad_timeout")), tested + 1)
    return out


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        print(f"unknown module {unknown[0]!r}; known: {', '.join(MODULES)}", file=sys.stderr)
        return 1
    for name in names or list(MODULES):
        path, tests = MODULES[name]
        runner = f"{PY} -m pytest -x -q -p no:cacheprovider {' '.join(tests)}"
        print(f"{name}: mutating {path} against {', '.join(tests)}", flush=True)
        subprocess.run(
            [
                PY,
                "-m",
                "mutmut",
                "run",
                "--paths-to-mutate",
                path,
                "--runner",
                runner,
                "--tests-dir",
                "tests",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
    rates = kill_rates(ROOT / ".mutmut-cache")
    for name in names or list(MODULES):
        killed, tested = rates.get(MODULES[name][0], (0, 0))
        share = f"{killed / tested:.0%}" if tested else "-"
        print(f"{name:>17}: {killed:4d} of {tested:4d} mutants killed ({share})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
