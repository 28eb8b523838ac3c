"""The README's tours as written, from an empty directory: "The flow" (on fewer rows, smaller
tables and 2 ranks: synth -> preprocess -> data stats -> config defaults > job.toml -> plan ->
train), then, in the same directory, "Your own data" (on fewer rows) on a MovieLens-shaped log,
synth -> spec infer -> edit -> preprocess -> plan -> 2-rank train -> eval -> export -> predict on
the raw file; the model pools genres by mean as its spec says, and predict on the raw test rows
gives eval's AUC and, row by row, the probabilities of the preprocessed split. Neither tour undoes
the other (the second's CSV lands beside the first's train.txt; each keeps its own plan). An
Avazu-shaped log goes the same way (its 2-rank run's own final evaluation standing for eval).

One run of the README's commands (module fixture) serves every assertion.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_MODEL, assert_one_line_error, cli, click_city_spec, settings

from shardrec.dataloader.format.manifest import Manifest

REPO = Path(__file__).resolve().parents[2]
ROWS = 20_000
"""Rows of the synthetic logs instead of the README's million: 8 training steps of its batch."""
SCALED = {"--rows": str(ROWS), "--max-ids": "1000", "--world-size": "2", "--nproc-per-node": "2"}
"""What the test runs smaller than the README writes: rows, table rows (26 tables of a million
rows are 1.7 GB of weights), ranks (8 CPU ranks on a 2-core machine)."""
# Commands that start ranks (torchrun) run as the user runs them; the rest in this process.
SUBPROCESS = ("train", "eval")


def readme_commands(section: str = "Your own data") -> list[list[str]]:
    """The command lines of the first block of the README's section, comments dropped."""
    text = (REPO / "README.md").read_text().split(f"### {section}\n", 1)[1]
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def edit_spec(path: Path) -> None:
    """The README's edit: genres pooled by mean (each column a block of the file)."""
    blocks = path.read_text().split("\n\n")
    for i, block in enumerate(blocks):
        if 'name = "genres"' in block:
            assert 'pooling = "sum"' in block
            blocks[i] = block.replace('pooling = "sum"', 'pooling = "mean"')
    path.write_text("\n\n".join(blocks))


def run(args: list[str], cwd: Path) -> str:
    """One README command in `cwd` (its `> FILE` too); its stdout and stderr."""
    if ">" in args:
        at = args.index(">")
        printed = run(args[:at], cwd)
        (cwd / args[at + 1]).write_text(printed)
        return printed
    if args[1] in SUBPROCESS:
        done = subprocess.run(
            [sys.executable, "-m", "shardrec.tools.cli", *args[1:]],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout + done.stderr
    with contextlib.chdir(cwd):
        result = cli(*args[1:])
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The README's two tours run in one empty folder: command name -> what it printed ("flow "
    before the first tour's)."""
    root = tmp_path_factory.mktemp("own_data")
    printed = {}
    for section, prefix in (("The flow", "flow "), ("Your own data", "")):
        for args in readme_commands(section):
            if args[0] == "$EDITOR":
                edit_spec(root / args[1])
                continue
            assert args[0] == "shardrec", args
            for flag, value in SCALED.items():
                if flag in args:
                    args[args.index(flag) + 1] = value
            printed[prefix + args[1]] = run(args, root)
    printed["root"] = str(root)
    return printed


@pytest.mark.slow
def test_the_flow_tour_trains_and_the_own_data_tour_leaves_it_be(flow: dict[str, str]) -> None:
    root = Path(flow["root"])
    assert "dense features" in flow["flow data"]
    summary = json.loads((root / "runs" / "a" / "summary.json").read_text())
    assert (summary["steps"], summary["world_size"]) == (ROWS * 6 // 7 // 2048, 2)
    # The first tour's plan is its own: 26 Criteo tables for 2 ranks, not the second's.
    tables = json.loads((root / "plan.json").read_text())["fingerprint"]["tables"]
    assert [t["name"] for t in tables] == [f"t_C{i}" for i in range(1, 27)]
    shown = sorted(p.name for p in (root / "raw").iterdir() if not p.name.startswith("."))
    assert shown == ["train.csv", "train.txt"]  # and synth's record of them, hidden


def _test_rows(root: Path) -> int:
    """The test split's rows: the raw file's last lines (kaggle layout: the last seventh,
    halved)."""
    return Manifest.load(root / "ml").splits["test"].rows


@pytest.mark.slow
def test_readme_flow_trains_a_mean_pooled_list_and_records_the_spec(flow: dict[str, str]) -> None:
    root = Path(flow["root"])
    manifest = Manifest.load(root / "ml")
    assert (
        manifest.feature("genres").pooling == "mean" and "timestamp" not in manifest.feature_names
    )
    assert 1.5 < manifest.feature("genres").stats["mean_ids_per_sample"] < 2.5
    # The plan and the run's copy of it were made for a mean-pooled genres table.
    for plan in (root / "ml-plan.json", root / "runs" / "ml" / "plan.json"):
        tables = {t["name"]: t for t in json.loads(plan.read_text())["fingerprint"]["tables"]}
        assert tables["t_genres"]["pooling"] == "MEAN" and tables["t_zip"]["pooling"] == "SUM"
    # Its cost was estimated with genres' measured ids per sample, which the plan records and
    # prints.
    measured = round(manifest.feature("genres").stats["mean_ids_per_sample"], 4)
    assert json.loads((root / "ml-plan.json").read_text())["estimate"]["ids_per_sample"] == {
        "t_genres": measured
    }
    (row,) = [line for line in flow["plan"].splitlines() if "t_genres" in line]
    assert "ids/sample" in flow["plan"] and f"{measured:g}" in row
    from safetensors import safe_open

    with safe_open(str(root / "ml.safetensors"), framework="pt") as f:
        header = json.loads(f.metadata()["shardrec"])
    assert header["transform"]["spec"] == manifest.options["spec"]
    assert header["transform"]["spec_sha256"] == manifest.options["spec_sha256"]
    pooling = {t["name"]: t.get("pooling", "sum") for t in header["tables"]}
    assert pooling["t_genres"] == "mean" and set(pooling.values()) == {"sum", "mean"}
    summary = json.loads((root / "runs" / "ml" / "summary.json").read_text())
    assert summary["steps"] >= 5


@pytest.mark.slow
def test_predict_on_raw_rows_equals_eval_and_the_preprocessed_split(flow: dict[str, str]) -> None:
    root = Path(flow["root"])
    test_rows = _test_rows(root)
    whole = np.loadtxt(root / "p.txt")
    assert whole.shape == (ROWS,)
    # The test split as raw text (the header, then the file's last rows), scored by predict.
    lines = (root / "raw" / "train.csv").read_bytes().splitlines(keepends=True)
    (root / "test.csv").write_bytes(lines[0] + b"".join(lines[-test_rows:]))
    with contextlib.chdir(root):
        raw = json.loads(
            cli("predict", "ml.safetensors", "test.csv", "--out", "raw.npy", "--json").stdout
        )
        split = json.loads(
            cli(
                "predict", "ml.safetensors", "ml", "--split", "test", "--out", "s.npy", "--json"
            ).stdout
        )
    assert raw["rows"] == split["rows"] == test_rows
    assert split["batch_size"] == 8192 and "batch_size" not in raw  # a DLRM's split; raw rows
    np.testing.assert_allclose(np.load(root / "raw.npy"), np.load(root / "s.npy"), rtol=1e-6)
    # New rows come without the label: --no-label scores them (the file's rating column dropped,
    # and the timestamp the spec skips, or both kept and read past) with the very probabilities
    # of the labeled rows, and no AUC.
    with (root / "test.csv").open(newline="") as f:
        table = list(csv.reader(f))
    drop = {table[0].index("rating"), table[0].index("timestamp")}
    with (root / "unlabeled.csv").open("w", newline="") as f:
        csv.writer(f).writerows([[v for i, v in enumerate(r) if i not in drop] for r in table])
    with contextlib.chdir(root):
        assert_one_line_error(
            cli("predict", "ml.safetensors", "unlabeled.csv", ok=False),
            r"^error: unlabeled.csv: the header has no label column 'rating'; rows without labels\? "
            r"score them with --no-label$",
        )
        for name in ("unlabeled.csv", "test.csv"):
            scored = json.loads(
                cli(
                    "predict", "ml.safetensors", name, "--no-label", "--out", "u.npy", "--json"
                ).stdout
            )
            assert scored["rows"] == test_rows and scored.get("auc") is None
            np.testing.assert_allclose(np.load("u.npy"), np.load("raw.npy"), rtol=1e-6)
    np.testing.assert_allclose(whole[-test_rows:], np.load(root / "raw.npy"), rtol=1e-6)
    # eval printed its AUC with 6 decimals; the run's own final evaluation has it whole. eval
    # scores in batches of other sizes than predict's, so the probabilities agree within rtol
    # 1e-6, not bit for bit, and a near-tied pair may swap: on an Intel Xeon with AMX the AUCs
    # read 0.7441999 and 0.744202 (2.1e-6 apart); 5e-6 holds that and still fails
    # a real difference between the two paths.
    (printed,) = re.findall(r"AUC (\d\.\d{6})", flow["eval"])
    assert raw["auc"] == pytest.approx(float(printed), abs=5e-6)
    records = [
        json.loads(line)
        for line in (root / "runs" / "ml" / "metrics.jsonl").read_text().splitlines()
    ]
    (final,) = [r for r in records if r["kind"] == "eval" and r["final"] and r["split"] == "test"]
    assert raw["auc"] == pytest.approx(final["auc"], abs=5e-6)


def write_untrained_model(dataset: Path, out: Path) -> None:
    """A model file of the tiny model on `dataset`, as `shardrec export` writes one, with random
    weights: training stands in for nothing the checks below read."""
    import torch
    from safetensors.torch import save_file

    from shardrec.embeddings.tables import build_ebc, build_table_configs
    from shardrec.trainer.inference.export import META_KEY, TableMarks
    from shardrec.trainer.inference.file_header import describe_model
    from shardrec.trainer.inference.trained_rows import HEADER_KEY
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.model.models import build_model

    manifest = Manifest.load(dataset)
    job = load_job_config(None, [f'data.path="{dataset}"', *TINY_MODEL])
    torch.manual_seed(0)
    tables = build_table_configs(manifest, job.model.embedding_dim)
    model = build_model(
        job.model, build_ebc(tables, "cpu"), manifest.feature_names, len(manifest.dense_features)
    )
    header, tensors = describe_model(job, manifest), model.state_dict()
    marks = TableMarks(header, job.train.fixed_seed)  # which rows differ from a run's first draw
    for name, tensor in tensors.items():
        marks.read(name, tensor)
    header[HEADER_KEY] = marks.names()
    tensors.update(zip(marks.layout(), marks.bits()))
    save_file(tensors, str(out), metadata={META_KEY: json.dumps(header)})


@pytest.mark.slow
def test_an_avazu_like_log_trains_on_2_ranks_and_predict_on_raw_rows_equals_eval(
    tmp_path: Path,
) -> None:
    """Avazu's shape (id column ignored, label in the second column, hex and integer categoricals,
    hour as a code) through infer -> preprocess -> plan -> 2-rank train (its final evaluation of the
    test split) -> export -> predict on the raw test rows and on the preprocessed split."""
    with contextlib.chdir(tmp_path):
        cli("synth", "raw", "--like", "avazu", "--rows", "12000", "--seed", "3")
        cli("spec", "infer", "raw/train.csv", "--label", "click", "--out", "av.toml")
        cli("preprocess", "raw/train.csv", "--spec", "av.toml", "--out", "av")
        cli(
            "plan",
            "--data",
            "av",
            "--world-size",
            "2",
            "--out",
            "plan.json",
            *settings(*TINY_MODEL),
        )
    manifest = Manifest.load(tmp_path / "av")
    assert (
        "id" not in manifest.feature_names + manifest.dense_features
        and "click" not in manifest.feature_names
    )
    assert {"hour", "site_id", "device_ip", "C14", "C20"} <= set(manifest.feature_names)
    train = ["shardrec", "train", "--data", "av", "--plan", "plan.json", "--out-dir", "runs/av"]
    run([*train, "--nproc-per-node", "2", *settings(*TINY_MODEL)], tmp_path)
    test_rows = manifest.splits["test"].rows
    lines = (tmp_path / "raw" / "train.csv").read_bytes().splitlines(keepends=True)
    (tmp_path / "test.csv").write_bytes(lines[0] + b"".join(lines[-test_rows:]))
    with contextlib.chdir(tmp_path):
        cli("export", "runs/av", "--out", "av.safetensors")
        raw = json.loads(
            cli("predict", "av.safetensors", "test.csv", "--out", "raw.npy", "--json").stdout
        )
        split = json.loads(
            cli(
                "predict", "av.safetensors", "av", "--split", "test", "--out", "s.npy", "--json"
            ).stdout
        )
    assert raw["rows"] == split["rows"] == test_rows and raw["auc"] == pytest.approx(
        split["auc"], abs=1e-9
    )
    np.testing.assert_allclose(
        np.load(tmp_path / "raw.npy"), np.load(tmp_path / "s.npy"), rtol=1e-6
    )
    records = [
        json.loads(line)
        for line in (tmp_path / "runs" / "av" / "metrics.jsonl").read_text().splitlines()
    ]
    (final,) = [r for r in records if r["kind"] == "eval" and r["final"] and r["split"] == "test"]
    assert raw["auc"] == pytest.approx(final["auc"], abs=1e-6)
    assert json.loads((tmp_path / "runs" / "av" / "summary.json").read_text())["world_size"] == 2


@pytest.fixture
def tagged(tmp_path: Path) -> Path:
    """A tiny CSV log with a header and a list column, preprocessed by its spec into tmp_path/d."""
    rows = "".join(f"{i % 2},{i % 7},{['a|b', '', 'c', 'a|c|d'][i % 4]}\n" for i in range(400))
    (tmp_path / "log.csv").write_text("y,n,tags\n" + rows)
    (tmp_path / "s.toml").write_text(
        '[format]\nkind = "csv"\nheader = true\n[[columns]]\nname = "y"\nrole = "label"\n'
        '[[columns]]\nname = "n"\nrole = "dense"\n[[columns]]\nname = "tags"\nrole = "list"\nhash_size = 20\n'
    )
    cli("preprocess", tmp_path / "log.csv", "--spec", tmp_path / "s.toml", "--out", tmp_path / "d")
    return tmp_path / "d"


def test_multihot_sizes_on_a_dataset_with_lists_is_refused_before_any_rank_starts(
    tagged: Path,
) -> None:
    result = cli(
        "train",
        "--data",
        tagged,
        "--out-dir",
        tagged.parent / "run",
        "--set",
        "data.multihot_sizes=[3]",
        ok=False,
    )
    assert_one_line_error(
        result,
        rf"^error: --set .*: data.multihot_sizes: feature tags of {re.escape(str(tagged))} is a "
        r"list column of its feature spec, with each row's own ids: .* leave data.multihot_sizes "
        r"empty",
    )
    assert not (tagged.parent / "run").exists()


def test_a_spec_model_refuses_criteos_rows_in_one_line(tagged: Path, tmp_path: Path) -> None:
    write_untrained_model(tagged, tmp_path / "m.safetensors")
    cli("synth", tmp_path / "criteo", "--rows", "50")
    criteo = tmp_path / "criteo" / "train.txt"
    result = cli(
        "predict", tmp_path / "m.safetensors", criteo, "--out", tmp_path / "p.txt", ok=False
    )
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(criteo))}: its first line has no ',': the model's spec reads CSV \(',' between "
        r"fields\) with a header \(y, n, tags, \.\.\.\); this file is in another format$",
    )
    assert not (tmp_path / "p.txt").exists()


def test_a_column_the_spec_model_does_not_read_is_left_out_by_its_header_name(
    tagged: Path, tmp_path: Path, caplog
) -> None:
    """The model's spec finds its columns by header name, and it cannot be edited: a column it
    does not know (here between two of its own) is read past with a warning, and every row scores
    as without it."""
    import logging

    write_untrained_model(tagged, tmp_path / "m.safetensors")
    lines = (tmp_path / "log.csv").read_text().splitlines()
    wider = [f"{a},{'note' if i == 0 else f'x{i}'},{b}" for i, (a, b) in
             enumerate(line.split(",", 1) for line in lines)]  # fmt: skip
    (tmp_path / "wider.csv").write_text("\n".join(wider) + "\n")
    with caplog.at_level(logging.WARNING, logger="shardrec"):
        cli(
            "predict",
            tmp_path / "m.safetensors",
            tmp_path / "wider.csv",
            "--out",
            tmp_path / "w.txt",
        )
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{tmp_path / 'wider.csv'}: 1 column(s) the model does not read, left out: note"
    ]
    cli("predict", tmp_path / "m.safetensors", tmp_path / "log.csv", "--out", tmp_path / "p.txt")
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "w.txt"), np.loadtxt(tmp_path / "p.txt"))


def test_rows_without_the_header_a_spec_model_reads_are_named_so_labeled_or_not(
    tagged: Path, tmp_path: Path
) -> None:
    # Before: "the header has no label column 'y'; rows without labels? score them with
    # --no-label", and with --no-label a warning that the columns 0, 0, a|b were left out and
    # "the header has no column 'n' that the model's spec names (it has 0, 0, a|b)".
    write_untrained_model(tagged, tmp_path / "m.safetensors")
    rows = tmp_path / "rows.csv"
    rows.write_text("".join((tmp_path / "log.csv").read_text().splitlines(keepends=True)[1:]))
    for flags in ((), ("--no-label",)):
        result = cli("predict", tmp_path / "m.safetensors", rows, *flags, ok=False)
        assert_one_line_error(
            result,
            rf"^error: {re.escape(str(rows))}: its first line \(0, 0, a\|b\) names none of the "
            r"model's spec's columns \(y, n, tags\), and the spec reads rows after a header line: "
            r"give the file its header$",
        )


def test_a_header_line_before_rows_that_have_none_is_named_with_a_cut_that_works(
    tmp_path: Path,
) -> None:
    # Before: "with_header.csv:1: click: 'click' (bad_label) (rows without a label column, as
    # Criteo's test.txt? score them with --no-label)", and --no-label then refused the rows too.
    (tmp_path / "s.toml").write_text(click_city_spec(header=False))
    rows = "".join(f"{i % 2},city{i % 5}\n" for i in range(200))
    (tmp_path / "log.csv").write_text(rows)
    cli("preprocess", tmp_path / "log.csv", "--spec", tmp_path / "s.toml", "--out", tmp_path / "d")
    write_untrained_model(tmp_path / "d", tmp_path / "m.safetensors")
    (tmp_path / "with_header.csv").write_text("click,city\n" + rows)
    with contextlib.chdir(tmp_path):
        line = assert_one_line_error(
            cli("predict", "m.safetensors", "with_header.csv", ok=False),
            r"^error: with_header.csv:1: click: 'click' \(bad_label\) \(a header line\? the model "
            r"reads rows without one, as its training data had: `(tail -n \+2 with_header.csv > "
            r"rows.txt)` leaves it out\)$",
        )
        cut = re.search(r"`(.*)`", line).group(1)
        subprocess.run(cut, shell=True, check=True)
        cli("predict", "m.safetensors", "rows.txt", "--out", "p.txt")
        cli("predict", "m.safetensors", "log.csv", "--out", "q.txt")
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "p.txt"), np.loadtxt(tmp_path / "q.txt"))
