"""Checks that could not fail, made able to. The one-line-error helper rejects a traceback and a
second line; a missing numba fails the kernel tests instead of skipping them; tensorboard's test
runs; the ids a dataset stores are pinned to known answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.gather import gather_kernels
from shardrec.tools.cli.app import app
from shardrec.tools.cli.common import fail
from shardrec.tools.console import err_console
from shardrec.tools.preprocess.parse import parse_kernel

ROOT = Path(__file__).resolve().parents[2]
toy = typer.Typer()


@toy.command()
def _toy(how: str) -> None:
    if how == "crash":
        raise KeyError("C27")  # a bug: CliRunner keeps it in result.exception and prints nothing
    if how == "two":
        err_console.print("error: first")
    fail("the one line")


@pytest.mark.parametrize(
    "how, complaint",
    [("crash", "expected a deliberate typer.Exit"), ("two", "expected one line on stderr, got 2")],
)
def test_one_line_helper_rejects_a_traceback_and_a_second_line(how: str, complaint: str):
    result = CliRunner().invoke(toy, [how])
    assert result.exit_code == 1
    with pytest.raises(AssertionError, match=complaint):
        assert_one_line_error(result, "the one line")
    assert (
        assert_one_line_error(CliRunner().invoke(toy, ["ok"]), "^error: the one line$")
        == "error: the one line"
    )


def test_numba_kernels_are_the_ones_running():
    assert parse_kernel.AVAILABLE and gather_kernels.AVAILABLE, (
        "numba is a hard dependency; the numpy fallbacks are running"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "target",
    [
        "tests/unit/test_loader_kernels.py",
        "tests/unit/test_preprocess_fast_paths.py::test_stats_from_counts_equal_stats_from_sorted_bincount",
    ],
)
def test_kernel_tests_fail_without_numba(target: str):
    # sys.modules["numba"] = None makes `import numba` raise ImportError: a broken install.
    code = (
        "import sys, pytest; sys.modules['numba'] = None; "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', sys.argv[1]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, target], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode not in (0, 5), done.stdout[
        -2000:
    ]  # 0: passed or skipped; 5: nothing collected
    assert "skipped" not in done.stdout.splitlines()[-1]


def test_tensorboard_from_the_test_extra_is_installed():
    import tensorboard  # noqa: F401  (tests/unit/test_metrics.py writes event files with it)


def test_preprocessed_ids_are_the_known_answers(tmp_path: Path):
    hexes = ["00000001", "68fd1e64", "80e26c9b", "fb936136", "7b4723c4", "ffffffff"]
    golden = [
        374,
        468,
        28,
        685,
        295,
        272,
    ]  # hash ids for --max-ids 1000 (tests/unit/test_preprocess_ids_plan.py)
    row = "1\t" + "\t".join(["1"] * 13) + "\t" + "\t".join((hexes * 5)[:26]) + "\n"
    raw = tmp_path / "train.txt"
    raw.write_text(row * 7)  # kaggle layout: 7 lines, 6 train
    res = CliRunner().invoke(
        app, ["preprocess", str(raw), "--out", str(tmp_path / "data"), "--max-ids", "1000"]
    )
    assert res.exit_code == 0, res.output
    part = open_split(tmp_path / "data", "train")[0]
    got = [int(part.sparse[f"C{i + 1}"][0]) for i in range(26)]
    assert got == (golden * 5)[:26]
    assert np.unique(part.sparse["C1"]).tolist() == [374]


def test_tests_are_named_and_documented_by_behaviour_not_by_tracker_number() -> None:
    """A reader cannot look up a number in a tracker they may not see: a test says what it
    checks."""
    import ast
    import re

    tracker = re.compile(r"\b(issues?|cases?|items?) \d+\b|#\d+\b", re.IGNORECASE)
    found = []
    for path in sorted(Path(__file__).resolve().parents[1].rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
                name = getattr(node, "name", "")
                for text in (name.replace("_", " "), ast.get_docstring(node) or ""):
                    if tracker.search(text):
                        found.append(
                            f"{path.name}: {name or 'module'}: {tracker.search(text).group()!r}"
                        )
    assert found == []
