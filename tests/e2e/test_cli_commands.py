"""Commands people look for: --version, config show/defaults, plan show
next to `plan` running alone, and help text that reads like other CLIs'."""

from __future__ import annotations

import json
import tomllib
from importlib.metadata import version
from pathlib import Path

from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_version() -> None:
    result = _run("--version")
    assert result.exit_code == 0 and result.stdout == f"shardrec {version('shardrec')}\n"


def test_config_show_resolves_file_then_set(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[train]\nseed = 3\nglobal_batch_size = 512\n")
    result = _run("config", "show", "--config", str(job), "--set", "train.seed=7")
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)
    assert shown["train"]["seed"] == 7 and shown["train"]["global_batch_size"] == 512
    assert shown["optim"]["dense_lr"] == 0.05  # a default
    bad = _run("config", "show", "--set", "train.sed=7")
    assert_one_line_error(
        bad, r"--set 'train\.sed=7': unknown key train\.sed; did you mean train\.seed\?"
    )


def test_config_show_says_the_seed_and_data_path_the_run_records(
    tmp_path: Path, monkeypatch
) -> None:
    # It had said seed = -1 (a run takes 0) and data.path = "d" (a run keeps it absolute).
    monkeypatch.chdir(tmp_path)
    shown = tomllib.loads(_run("config", "show", "--set", "data.path=d").stdout)
    assert shown["data"]["path"] == str(tmp_path.resolve() / "d") and shown["train"]["seed"] == 0
    drawn = tomllib.loads(_run("config", "show", "--set", "train.mlperf_log=true").stdout)
    assert drawn["train"]["seed"] == -1  # unset: each run draws its own


def test_config_defaults_are_a_commented_job_file() -> None:
    result = _run("config", "defaults")
    assert result.exit_code == 0
    assert "# Peak dense learning rate.\ndense_lr = 0.05\n" in result.stdout
    assert tomllib.loads(result.stdout)["train"]["global_batch_size"] == 2048


def test_config_defaults_written_to_a_file_load_as_a_job(tmp_path: Path) -> None:
    """`shardrec config defaults > job.toml` (the README's flow): a managed table's keys are shown
    commented out, and the file loads with no table named."""
    from shardrec.trainer.job.config import load_job_config

    result = _run("config", "defaults")
    assert "# [tables.FEATURE]\n" in result.stdout and '\n# policy = "lru"\n' in result.stdout
    job = tmp_path / "job.toml"
    job.write_text(result.stdout)
    assert load_job_config(job).tables == {}


def test_plan_show_reprints_a_saved_plan_and_plan_runs_alone(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    made = _run("plan", "--data", str(tiny_dataset), "--world-size", "2", "--out", str(plan))
    assert made.exit_code == 0, made.output
    shown = _run("plan", "show", str(plan), "--json")
    assert shown.exit_code == 0, shown.output
    saved = json.loads(plan.read_text())
    assert [t["name"] for t in json.loads(shown.stdout)["tables_plan"]] == [
        t["name"] for t in saved["tables"]
    ]
    text = _run("plan", "show", str(plan))
    # Whitespace aside: the console wraps a long temporary path (pytest-xdist's are longer)
    # anywhere.
    squeezed = "".join(text.stdout.split())
    assert "".join(f"{plan}: 4 tables for 2 ranks, global batch 2,048".split()) in squeezed
    missing = _run("plan", "show", str(tmp_path / "nope.json"))
    assert_one_line_error(missing, r"nope\.json: does not exist$")
    usage = _run("plan", "--help")
    assert "Usage: shardrec plan [OPTIONS] [COMMAND [ARGS]...]" in " ".join(usage.stdout.split())


def test_help_reads_like_other_clis() -> None:
    listed = _run("--help").stdout
    order = [
        line.split()[1]
        for line in listed.splitlines()
        if line.startswith("│ ")
        and line.split()[1].isalpha()
        and line.split()[1] in ("synth", "preprocess", "data", "plan", "train", "report", "bench")
    ]
    assert order == ["synth", "preprocess", "data", "plan", "train", "report", "bench"]
    train = " ".join(_run("train", "--help").stdout.split())
    assert "--set KEY=VALUE" in train and "repeat" in train
    assert "shardrec's planner" in train and "torchrec's planner" not in train
    head = " ".join(_run("data", "head", "--help").stdout.split())
    assert "--rows -n" in head


def test_errors_name_the_file_the_flag_and_a_near_miss(tiny_dataset: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("[trian]\nsteps = 3\n")
    typo = _run("train", "--data", str(tiny_dataset), "--config", str(job))
    assert_one_line_error(
        typo, rf"^error: {job}: unknown section \[trian\]; did you mean train\?$"
    )  # not eaten as markup
    job.write_text("[train]\nseed = 'x'\n")
    assert_one_line_error(
        _run("config", "show", "--config", str(job)), r'train\.seed = "x" should be an integer$'
    )
    missing = _run("train", "--data", str(tmp_path / "nodata"))
    assert_one_line_error(missing, r"nodata: does not exist$")
    nowhere = tmp_path / "runs" / "nonexist"
    for args in (["eval", str(nowhere)], ["export", str(nowhere), "--out", str(tmp_path / "m")]):
        assert_one_line_error(_run(*args), rf"^error: {nowhere}: does not exist$")
    assert_one_line_error(_run("report", str(nowhere)), rf"^error: {nowhere}: does not exist$")
    digest = _run("data", "digest", str(tiny_dataset), "--world-size", "3")
    # its default global batch is training's (train.global_batch_size), not 8192 as it was
    assert_one_line_error(digest, r"^error: --global-batch 2048 does not divide by --world-size 3$")
    for args, flag in (
        (["plan", "--data", str(tiny_dataset), "--search", "tr"], "--search"),
        (["train", "--data", str(tiny_dataset), "--nproc-per-node", "0"], "--nproc-per-node"),
        # before: eval and bench sequence checked it themselves, exit 1 with a line of their own
        (["eval", str(nowhere), "--nproc-per-node", "0"], "--nproc-per-node"),
        (["bench", "sequence", "--nproc-per-node", "0"], "--nproc-per-node"),
    ):
        usage = _run(*args)
        assert usage.exit_code == 2, usage.output  # a usage error: typer's convention
        assert f"Invalid value for '{flag}'" in usage.stderr, usage.output


def test_help_keeps_bracketed_defaults_and_one_paragraph_summaries() -> None:
    # rich markup ate "[default: stdout]" whole, leaving "one per line ." in the help
    out = " ".join(_run("predict", "--help").stdout.replace("│", " ").split())
    assert "one per line (default: stdout)" in out
    cache = " ".join(_run("data", "multihot", "--help").stdout.replace("│", " ").split())
    assert "reused (default: shardrec/multihot under $XDG_CACHE_HOME, else ~/.cache)" in cache
    # the group listing shows a docstring's whole first paragraph with its line breaks as typed:
    # so the first paragraph is a one-line summary, the details come after it
    listed = " ".join(_run("--help").stdout.replace("│", " ").split())
    assert "export Write a run's checkpoint as one unsharded safetensors file. predict" in listed
    data = " ".join(_run("data", "--help").stdout.replace("│", " ").split())
    assert (
        "multihot Write a multi-hot copy of the one-hot dataset SRC, as MLPerf DLRMv2 does. "
        "upgrade Rewrite a dataset of the old layout in place as one file per part. ╰" in data
    )


def test_predict_refuses_a_flag_its_input_would_not_use(tiny_dataset: Path, tmp_path: Path):
    # Before, each was taken and did nothing: raw rows were scored whole whatever --split or
    # --batch-size said, and a dataset's split was scored with its AUC under --no-label.
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"not read: the flags are checked first")
    rows = tmp_path / "rows.txt"
    rows.write_text("1\t2\n")
    for args, says in (
        ([rows, "--split", "val"], f"--split val is for a dataset directory: {rows} is a file"),
        ([rows, "--batch-size", "7"], f"--batch-size 7 is for a dataset directory: {rows} is"),
        ([tiny_dataset, "--no-label"], f"--no-label is for raw rows: {tiny_dataset} is a dataset"),
    ):
        assert_one_line_error(_run("predict", str(model), *map(str, args)), f"^error: {says}")
