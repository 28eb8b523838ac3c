import json
import re
from pathlib import Path

from dataset_writing import change_part_byte, file_offset
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.part_file import open_split
from shardrec.tools.cli.app import app

runner = CliRunner()


def _digests(data: Path, *args: str) -> list[dict]:
    result = runner.invoke(
        app, ["data", "digest", str(data), "--global-batch", "64", "--seed", "3", "--json", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["digests"]


def test_digest_is_the_same_at_every_world_size_and_start(tiny_dataset: Path):
    one = _digests(tiny_dataset, "--world-size", "1", "--batches", "6")
    assert [d["batch"] for d in one] == list(range(6)) and len({d["sha256"] for d in one}) == 6
    assert _digests(tiny_dataset, "--world-size", "2", "--batches", "6") == one
    assert _digests(tiny_dataset, "--world-size", "4", "--batches", "6") == one
    assert (
        _digests(tiny_dataset, "--world-size", "2", "--start-batch", "4", "--batches", "2")
        == one[4:]
    )
    assert _digests(tiny_dataset, "--batches", "6", "--seed", "4") != one
    text = runner.invoke(
        app,
        [
            "data",
            "digest",
            str(tiny_dataset),
            "--global-batch",
            "64",
            "--seed",
            "3",
            "--batches",
            "2",
        ],
    )
    assert text.exit_code == 0 and text.stdout.split() == [
        "0",
        one[0]["sha256"],
        "1",
        one[1]["sha256"],
    ]


def test_digest_bad_input_is_one_clear_error(tiny_dataset: Path):
    result = runner.invoke(
        app, ["data", "digest", str(tiny_dataset), "--split", "val", "--global-batch", "512"]
    )
    assert_one_line_error(result, re.escape("fewer than one global batch of 512"))
    result = runner.invoke(
        app, ["data", "digest", str(tiny_dataset), "--global-batch", "64", "--world-size", "3"]
    )
    assert_one_line_error(result, re.escape("--global-batch 64 does not divide by --world-size 3"))
    result = runner.invoke(app, ["data", "digest", str(tiny_dataset), "--epoch", "-1"])
    assert_one_line_error(result, re.escape("--epoch must not be negative, got -1"))
    victim = tiny_dataset / "train" / "part-00000.arrow"
    victim.write_bytes(victim.read_bytes()[:-5])
    result = runner.invoke(app, ["data", "digest", str(tiny_dataset), "--global-batch", "64"])
    assert_one_line_error(result, re.escape("train/part-00000.arrow"))


def test_verify_passes_then_names_the_corrupted_file(tiny_dataset: Path):
    ok = runner.invoke(app, ["data", "verify", str(tiny_dataset), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout) == {
        "directory": str(tiny_dataset),
        "ok": True,
        "problems": [],
    }
    dense = open_split(tiny_dataset, "val")[0].dense
    # same size, different content (a dense value; the metadata intact): only the checksum can tell
    change_part_byte(tiny_dataset, "val", 0, file_offset(dense) + 5, record=False)
    assert open_split(tiny_dataset, "val")[0].rows == 256  # opening does not read the values
    bad = runner.invoke(app, ["data", "verify", str(tiny_dataset)])
    # verify reports every problem on stdout (a report, not one input error), then exits 1.
    assert bad.exit_code == 1 and "val/part-00000.arrow: checksum differs" in bad.stdout
    missing = runner.invoke(app, ["data", "verify", str(tiny_dataset / "nope")])
    assert_one_line_error(missing, re.escape("nope: does not exist"))


def test_verify_names_a_part_file_the_manifest_does_not_list(tiny_dataset: Path):
    # A part copied into a split's folder by hand (or left there by another run) is read by no
    # command, since the loader opens the manifest's parts: verify said "every file matches its
    # manifest checksum" and exited 0, as if its rows were in the dataset.
    extra = tiny_dataset / "train" / "part-00099.arrow"
    extra.write_bytes((tiny_dataset / "train" / "part-00000.arrow").read_bytes())
    bad = runner.invoke(app, ["data", "verify", str(tiny_dataset), "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.stdout)["problems"] == [
        f"{extra}: not in the manifest, so no command reads its rows; remove it, or re-run the "
        "preprocessing that should have written it"
    ]
    extra.unlink()
    assert runner.invoke(app, ["data", "verify", str(tiny_dataset)]).exit_code == 0
