"""`make mutants`: mutation testing (mutmut) of the core modules, each against the tests that
should catch its bugs; prints the kill rate per module. Not part of CI or `make test`: it runs
one test process per mutant (minutes to hours). mutmut 2 mutates the files in place and puts
each back, so run it on a checkout nobody else is testing; `.mutmut-cache` keeps the results
(`mutmut show ID` prints a survivor) and a rerun tests only what changed.

Each mutant's pytest starts from a fork server (scripts/mutant_runner.py) that has imported torch,
torchrec and numba once; --plain runs a fresh interpreter per mutant instead. Either way a run
that fails in any manner (a failed test, a module that no longer imports) kills the mutant, and
each module's tests are timed afresh (with an empty numba cache, so compiling counts): mutmut
stops a mutant's run after 10 x that time, at least 60 s, and counts it killed (an endless loop). --sample K
tests one mutant in K (scripts/mutmut_config.py picks them by a hash, the same ones each run) for
a module whose full run takes too long; the report says how many were tested.

Usage: python scripts/mutants.py [--sample K] [--plain] [NAME ...]   (names below; default: all)
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider"]
BASELINE_FLOOR_S = 6.0
# name -> (module file, the tests that exercise it, fast ones only)
MODULES: dict[str, tuple[str, list[str]]] = {
    "metrics": ("trainer/loop/metrics.py", ["tests/unit/test_metrics.py"]),
    "ids": (
        "tools/preprocess/ids/id_maps.py",
        [
            "tests/unit/test_id_maps.py",
            "tests/unit/test_preprocess_ids_plan.py",
            "tests/unit/test_parse.py",
        ],
    ),
    "parse_kernel": (
        "tools/preprocess/parse/parse_kernel.py",
        [
            "tests/unit/test_parse.py",
            "tests/unit/test_preprocess_fast_paths.py",
            "tests/unit/test_preprocess_ids_plan.py",
        ],
    ),
    "column_kernels": (
        "tools/preprocess/parts/column_kernels.py",
        [
            "tests/unit/test_preprocess_fast_paths.py",
            "tests/unit/test_preprocess_ids_plan.py",
        ],
    ),
    "order": ("dataloader/order.py", ["tests/unit/test_order.py"]),
    "loader": (
        "dataloader/loader.py",
        ["tests/unit/test_loader.py", "tests/unit/test_loader_many_parts.py"],
    ),
    "format": ("dataloader/format/manifest.py", ["tests/unit/test_format.py"]),
    "fingerprints": (
        "dataloader/format/fingerprints.py",
        [
            "tests/unit/test_run_lifecycle_rules.py",
            "tests/unit/test_event_data_checks.py",
            "tests/e2e/test_data_upgrade.py",
        ],
    ),
    "checkpoint_trust": (
        "trainer/rundir/checkpoint/trust.py",
        [
            "tests/unit/test_checkpoint_trust.py",
            "tests/robustness/test_train_checkpoint_trust.py",
            "tests/unit/test_checkpoint.py",
        ],
    ),
    **{
        name: (
            f"trainer/rundir/life/{name}.py",
            [
                "tests/unit/test_run_lifecycle_rules.py",
                "tests/unit/test_run_status.py",
                "tests/unit/test_resume_rules.py",
                "tests/unit/test_train_config.py",
            ],
        )
        # lifecycle.py until it was split by concept: the same tests
        for name in ("lifecycle", "resume_settings", "run_state", "trained_data")
    },
    "cost": (
        "sharding/cost/cost_model.py",
        [
            "tests/unit/test_plan_cost.py",
            "tests/unit/test_plan_memory.py",
            "tests/unit/test_plan_search.py",
        ],
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


def kill_rates(cache: Path) -> dict[str, tuple[int, int, int]]:
    """File -> (killed, tested, registered) from mutmut's cache. Killed: the tests failed, slowly
    (suspicious) or not, or ran past the timeout; skipped (sampled out) and untested mutants are
    not tested."""
    out: dict[str, tuple[int, int, int]] = {}
    query = (
        "select f.filename, m.status from Mutant m "
        "join Line l on m.line = l.id join SourceFile f on l.sourcefile = f.id"
    )
    for filename, status in sqlite3.connect(cache).execute(query):
        killed, tested, registered = out.get(filename, (0, 0, 0))
        is_tested = status not in ("untested", "skipped")
        is_killed = status in ("ok_killed", "ok_suspicious", "bad_timeout")
        out[filename] = (killed + is_killed, tested + is_tested, registered + 1)
    return out


def start_server(socket_path: str, env: dict[str, str]) -> subprocess.Popen:
    server = subprocess.Popen(
        [PY, str(ROOT / "scripts" / "mutant_runner.py"), "serve", socket_path],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    if server.stdout.readline().strip() != "ready":
        server.kill()
        raise RuntimeError("the mutant runner's fork server did not start")
    return server


def seed_baseline(runner: str, env: dict[str, str]) -> None:
    """mutmut keeps one baseline time for every module (keyed by the tests folder's hash) and
    stops a mutant's run at 10 x it, counting it killed: a fast module's baseline would time out a
    slow module's mutants, and on a loaded machine a 1-second baseline times out sound runs. Each
    module's tests are timed here and mutmut is handed at least BASELINE_FLOOR_S."""
    from mutmut.cache import hash_of_tests, set_cached_test_time

    start = time.monotonic()
    done = subprocess.run(runner, shell=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"the tests fail without mutations: {runner}")
    elapsed = time.monotonic() - start
    cwd = os.getcwd()
    os.chdir(ROOT)  # mutmut's cache lives in the current directory
    try:
        set_cached_test_time(max(elapsed, BASELINE_FLOOR_S), hash_of_tests(["tests"]))
    finally:
        os.chdir(cwd)


def run_module(name: str, plain: bool, sample: int) -> None:
    path, tests = MODULES[name]
    print(f"{name}: mutating {path} against {', '.join(tests)}", flush=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "scripts"),
            "MUTANTS_SAMPLE": str(sample),
            # Empty: the baseline compiles the module's kernels as each of its mutants must.
            "NUMBA_CACHE_DIR": tmp,
        }
        socket_path = os.path.join(tmp, "runner.sock")
        prefix = [PY, str(ROOT / "scripts" / "mutant_runner.py")]
        prefix += ["plain"] if plain else ["run", socket_path, "600"]
        runner = " ".join([*prefix, *PYTEST_ARGS, *tests])
        server = None if plain else start_server(socket_path, env)
        try:
            seed_baseline(runner, env)
            subprocess.run(
                [PY, "-m", "mutmut", "run", "--paths-to-mutate", path, "--runner", runner]
                + ["--tests-dir", "tests"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
            )
        finally:
            if server is not None:
                server.kill()
                server.wait()
    print(f"{name}: {time.monotonic() - start:.0f} s", flush=True)


def main(argv: list[str]) -> int:
    sample, plain, names = 1, False, []
    args = iter(argv)
    for arg in args:
        if arg == "--sample":
            sample = int(next(args, "0"))
            if sample < 1:
                print("--sample takes a whole number K >= 1 (one mutant in K)", file=sys.stderr)
                return 1
        elif arg == "--plain":
            plain = True
        else:
            names.append(arg)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        print(f"unknown module {unknown[0]!r}; known: {', '.join(MODULES)}", file=sys.stderr)
        return 1
    for name in names or list(MODULES):
        run_module(name, plain, sample)
    rates = kill_rates(ROOT / ".mutmut-cache")
    for name in names or list(MODULES):
        killed, tested, registered = rates.get(MODULES[name][0], (0, 0, 0))
        share = f"{killed / tested:.0%}" if tested else "-"
        print(
            f"{name:>17}: {killed:4d} of {tested:4d} tested mutants killed ({share});"
            f" {registered} mutants in all"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
