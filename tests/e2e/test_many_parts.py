"""The data commands on more parts than a low open-file limit allows descriptors for: 300 part
files under `ulimit -n 256` (np.load's maps held one descriptor each; a part's file is closed once
mapped), and `bench loader --part-rows` over 300 parts of one part's hard-linked file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from dataset_writing import resplit
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

PARTS = 300
LIMIT = 256


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("many-parts")
    write_tiny_dataset(root / "one", rows={"train": [1200]})
    resplit(root / "one", root / "many", PARTS, seed=11)
    return root / "one", root / "many"


# One process under the limit runs every command (torch is imported once): CliRunner inside it,
# each command's exit code and stdout printed as JSON.
_LIMITED = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
from typer.testing import CliRunner
from shardrec.tools.cli.app import app
out = []
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(app, args)
    out.append({{"code": r.exit_code, "stdout": r.stdout, "error": repr(r.exception)}})
print(json.dumps(out))
"""


def _limited(*commands: list[str]) -> list[dict]:
    script = _LIMITED.format(limit=LIMIT)
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    for command, r in zip(commands, results):
        assert r["code"] == 0, (command, r)
    return results


def _in_process(args: list[str]) -> str:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.stdout


def _digests(stdout: str) -> list[str]:
    return [row["sha256"] for row in json.loads(stdout)["digests"]]


def test_data_commands_and_the_many_part_bench_under_ulimit_256(datasets):
    one, many = datasets
    digest = ["--global-batch", "48", "--batches", "25", "--json"]
    ordered, shuffled, verified, head, bench = _limited(
        ["data", "digest", str(many), "--no-shuffle", *digest],
        ["data", "digest", str(many), *digest],
        ["data", "verify", str(many), "--json"],
        ["data", "head", str(many), "--rows", "3", "--json"],
        # The loader at Criteo 1TB's part count, in miniature: 300 parts of one part's hard-linked
        # file.
        ["bench", "loader", "--parts", "300", "--part-rows", "64", "--global-batch", "64", "--rounds", "1",
         "--max-batches", "40", "--work-dir", str(many.parent), "--json"],
    )  # fmt: skip
    # The whole unshuffled epoch: every batch crosses parts, some cross part 256 (uint16 indices).
    assert len(_digests(ordered["stdout"])) == 25
    assert _digests(ordered["stdout"]) == _digests(
        _in_process(["data", "digest", str(one), "--no-shuffle", *digest])
    )
    # Shuffled, the stream is the one the same dataset gives without the limit.
    assert _digests(shuffled["stdout"]) == _digests(
        _in_process(["data", "digest", str(many), *digest])
    )
    assert json.loads(verified["stdout"]) == {"directory": str(many), "ok": True, "problems": []}
    figures = json.loads(bench["stdout"])
    assert (figures["parts"], figures["rows"], figures["open_file_limit"]) == (300, 19_200, LIMIT)
    assert figures["rows_per_s"]["many_parts"] > 0 and len(figures["rss_mb_per_round"]) == 2
    assert figures["rows_per_cpu_s"]["many_parts"] > 0 and len(figures["load_average"]) == 3
    assert head["stdout"] == _in_process(
        ["data", "head", str(one), "--rows", "3", "--json"]
    ).replace(str(one), str(many))
