"""Growing ids, end to end: README's "Growing ids" commands run as written (on fewer rows, with the
README's job file): a drifting log of 3 days, raw ids, a plan that proposes row budgets, day 0
trained, days 1 and 2 continued with progressive validation, eval, export and predict on raw rows.
Then what a run that goes on must hold beside it: a kill in the middle of a day resumes bit for
bit, and what cannot go on is refused in one line before any rank starts.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    assert_one_line_error,
    cli,
    cli_process,
    final_weights,
    jobs_handed_to_ranks,
)
from safetensors import safe_open

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.format.raw_ids import MISSING_KEY

REPO = Path(__file__).resolve().parents[2]
ROWS = 9_000
"""Rows of the 3 days instead of the README's 600,000: a few steps of its batch a day."""
SUBPROCESS = ("train", "eval")


def _section() -> str:
    return (REPO / "README.md").read_text().split("### Growing ids", 1)[1].split("\n### ", 1)[0]


def readme_commands() -> list[list[str]]:
    block = _section().split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def readme_job_file() -> str:
    return _section().split("```toml\n", 1)[1].split("```", 1)[0]


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, ok: bool = True):
    """One command in `cwd`: ranks (train, eval) as the user starts them, the rest in-process."""
    if args[1] in SUBPROCESS:
        return cli_process(args[1:], cwd, env, ok)
    with contextlib.chdir(cwd):
        return cli(*args[1:], ok=ok)


def _small(args: list[str]) -> list[str]:
    """The README's command on fewer rows and a smaller batch (the job file's batch as is)."""
    if "--rows" in args:
        args[args.index("--rows") + 1] = str(ROWS)
    return args


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("growing")
    job = readme_job_file().replace("global_batch_size = 1024", "global_batch_size = 256")
    (root / "growing.toml").write_text(job)
    printed = {}
    for args in readme_commands():
        assert args[0] == "shardrec", args
        done = run(_small(args), root)
        printed[f"{args[1]} {' '.join(args[2:4])}"] = done.stdout + done.stderr
        if "days/1" in args and "--continue-on" in args:  # the run as day 1 left it, for later
            shutil.copytree(root / "runs" / "g", root / "day1", ignore=_lock)
    return {"root": root, "printed": printed}


def _lock(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n == ".lock"]


@pytest.mark.slow
def test_readme_growing_ids_flow_goes_on_day_by_day(flow: dict) -> None:
    root, printed = flow["root"], flow["printed"]
    manifest = Manifest.load(root / "days" / "1")
    assert all(f.raw and f.cardinality == 0 for f in manifest.sparse_features)
    plan_out = printed["plan --data days/0"]
    assert "row budgets" in plan_out and '\n[tables]\nC1 = { kind = "managed", rows = ' in plan_out
    stretches = json.loads((root / "runs" / "g" / "stretches.json").read_text())["stretches"]
    assert [Path(s["data"]).name for s in stretches] == ["0", "1", "2"]
    assert [s["first_step"] for s in stretches][0] == 0
    assert all(a["last_step"] == b["first_step"] for a, b in zip(stretches, stretches[1:]))
    assert all(0.5 < s["pv"]["auc"] <= 1 for s in stretches[1:])  # evaluated before training
    assert all(s["id_maps"]["admitted"] > 0 for s in stretches)
    assert stretches[2]["id_maps"]["evicted"] > 0  # max_age = "1 days": day 0's ids aged out
    # The summary says the run went on with the new day: it said "resumed from the checkpoint of
    # step N", as a resume of the day before would.
    went_on = printed["train --out-dir runs/g"]  # day 2's
    assert f"\nwent on from step {stretches[2]['first_step']} with days/2\n" in went_on, went_on
    assert "resumed from the checkpoint" not in went_on
    # The data as stretches.json names it (absolute): it was days/2, the launch directory's.
    summary = json.loads((root / "runs" / "g" / "summary.json").read_text())
    assert summary["continued_on"] == stretches[2]["data"] == str((root / "days" / "2").resolve())
    records = [
        json.loads(line)
        for line in (root / "runs" / "g" / "metrics.jsonl").read_text().splitlines()
    ]
    pv = [r for r in records if r["kind"] == "pv"]
    assert [r["stretch"] for r in pv] == [1, 2]
    assert [r["step"] for r in pv] == [s["first_step"] for s in stretches[1:]]
    # eval = export + predict: the day-2 test split scored by the exported model.
    (printed_auc,) = re.findall(r"AUC (\d\.\d{6})", printed["eval runs/g --split"])
    with contextlib.chdir(root):
        split = json.loads(
            cli(
                "predict", "g.safetensors", "days/2", "--split", "test", "--out", "s.npy", "--json"
            ).stdout
        )
    assert split["auc"] == pytest.approx(float(printed_auc), abs=1e-6)
    # Per managed table, the ids of the split that the model's id map has no slot for.
    with safe_open(root / "g.safetensors", "np") as model:
        slots = {f: model.get_tensor(f"id_maps.{f}").view(np.uint64) for f in split["shared_row"]}
    parts = open_split(root / "days" / "2", "test")
    for feature, counts in split["shared_row"].items():
        ids = np.concatenate([p.sparse[feature] for p in parts])
        ids = ids[ids != MISSING_KEY]
        assert counts == {"ids": len(ids), "shared_row": int((~np.isin(ids, slots[feature])).sum())}
    assert any(c["shared_row"] for c in split["shared_row"].values())  # the day's new ids
    scores = np.loadtxt(root / "p.txt")
    test_rows = Manifest.load(root / "days" / "2").splits["test"].rows
    np.testing.assert_allclose(scores[-test_rows:], np.load(root / "s.npy"), rtol=1e-6)


@pytest.mark.slow
def test_a_day_killed_midway_resumes_bit_for_bit_and_bad_continuations_are_refused(
    flow: dict,
) -> None:
    from shardrec.trainer.job.config import load_job_config

    root = flow["root"]
    stretches = json.loads((root / "runs" / "g" / "stretches.json").read_text())["stretches"]
    first, last = stretches[2]["first_step"], stretches[2]["last_step"]
    assert last - first >= 4
    # A copy of the run as day 1 left it goes on with day 2 three times: from another directory,
    # killed before the new stretch's first checkpoint (the run directory already names day 2);
    # then killed midway; then to the end, where it must equal runs/g, which went on whole.
    shutil.copytree(root / "day1", root / "killed", ignore=_lock)
    every = ["--set", f"checkpoint.interval_steps={first + 2}"]
    every += ["--allow-change", "checkpoint.interval_steps"]
    go_on = ["shardrec", "train", "--out-dir", "killed", "--continue-on", "days/2", *every]
    go_on += ["--nproc-per-node", "2"]
    # The README's first day gives `--plan plan.json`, relative: another directory's plan.json
    # (here not a plan at all) is not the run's, nor is a moved run's old path.
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "plan.json").write_text("{}")
    from_elsewhere = [*go_on[:2], "--out-dir", "../killed", "--continue-on", "../days/2"]
    from_elsewhere += go_on[6:]
    early = run(from_elsewhere, elsewhere, {"SHARDREC_FAULT": f"kill:{first + 1}"}, ok=False)
    assert early.returncode != 0
    # The change --allow-change accepted is said in one line (before: not a word of it).
    assert re.search(
        r"\.\./killed: going on from step [\d,]+ with changed settings: "
        rf"checkpoint\.interval_steps: 0 -> {first + 2}\n",
        early.stderr,
    ), early.stderr[-3000:]
    saved = load_job_config(root / "killed" / "config.toml")
    assert saved.sharding.plan == str((root / "killed" / "plan.json").resolve())
    listed = json.loads((root / "killed" / "stretches.json").read_text())["stretches"]
    assert [Path(s["data"]).name for s in listed] == ["0", "1", "2"]
    assert not (root / "killed" / "checkpoints" / f"step-{first + 2:08d}").exists()
    kill = {"SHARDREC_FAULT": f"kill:{first + 3}"}
    assert run(go_on, root, kill, ok=False).returncode != 0
    # Mid-day, a train without --continue-on said 'no dataset: pass --data' or, with day 0's
    # command again, 'trained on other data ... start over with --restart': how to finish it.
    unfinished = (
        r"^error: killed: its current stretch \(on \S+days/2\) is not complete \(step [\d,]+\); "
        r"finish it first: rerun with --continue-on \S+days/2$"
    )
    with contextlib.chdir(root):
        for args in ([], ["--config", "growing.toml", "--data", "days/0"]):
            plain = cli("train", "--out-dir", "killed", *args, "--nproc-per-node", "2", ok=False)
            assert_one_line_error(plain, unfinished)
    run(go_on, root)
    shutil.copytree(root / "runs" / "g", root / "whole", ignore=_lock)
    whole, again = final_weights(root / "whole"), final_weights(root / "killed")
    assert [k for k in whole if not torch.equal(whole[k], again[k])] == []

    def stretches_of(name: str) -> list[tuple]:
        listed = json.loads((root / name / "stretches.json").read_text())["stretches"]
        return [(s["first_step"], s["last_step"], s["pv"].get("auc"), s["id_maps"]) for s in listed]

    # Stretch 2 listed once, as it ran, its maps' figures too.
    assert stretches_of("killed") == stretches_of("whole")
    # What cannot go on, refused before any rank starts.
    two = ("--nproc-per-node", "2")
    with contextlib.chdir(root):
        assert_one_line_error(
            cli("train", "--out-dir", "killed", "--continue-on", "days/1", *two, ok=False),
            r"already trained on this data \(stretch 1",
        )
        cli("synth", "other", "--rows", "2000", "--seed", "3")
        cli("preprocess", "other/train.txt", "--out", "other-data", "--max-ids", "1000")
        assert_one_line_error(
            cli("train", "--out-dir", "killed", "--continue-on", "other-data", *two, ok=False),
            r"feature C1: 1,000 rows here, raw ids in the data killed trained on",
        )


@pytest.mark.slow
def test_a_checkpoint_of_an_earlier_day_evaluates_and_exports_on_that_days_data(
    flow: dict,
) -> None:
    root = flow["root"]
    stretches = json.loads((root / "runs" / "g" / "stretches.json").read_text())["stretches"]
    day0, day1 = stretches[0]["last_step"], stretches[1]["last_step"]
    evals = [
        json.loads(line)
        for line in (root / "runs" / "g" / "metrics.jsonl").read_text().splitlines()
        if '"eval"' in line
    ]
    (own,) = [r["auc"] for r in evals if r["step"] == day1 and r.get("final")]
    done = run(["shardrec", "eval", "runs/g", "--checkpoint", str(day1)], root)
    # The run's own evaluation at the end of day 1, on day 1's test split.
    assert f"on test of {root / 'days' / '1'} " in done.stdout
    assert re.findall(r"AUC (\d\.\d{6})", done.stdout) == [f"{own:.6f}"]
    with contextlib.chdir(root):
        cli("export", "runs/g", "--checkpoint", day0, "--out", "g0.safetensors")
        cli(
            "export", "runs/g", "--checkpoint", day0, "--out", "g0d.safetensors", "--data", "days/0"
        )
    with (
        safe_open(root / "g0.safetensors", "pt") as a,
        safe_open(root / "g0d.safetensors", "pt") as b,
    ):
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    # That day's data gone from where it trained: one line that names it and what to pass.
    shutil.copytree(root / "runs" / "g", root / "moved", ignore=_lock)
    stretches[0]["data"] = str(root / "gone")
    (root / "moved" / "stretches.json").write_text(json.dumps({"stretches": stretches}))
    gone = (
        rf"checkpoint {day0} was taken in the stretch on .*gone \(steps 0-{day0}\), which is not "
    )
    gone += "a directory here: pass --data DIR"
    with contextlib.chdir(root):  # refused before any rank starts: no need of a process
        assert_one_line_error(cli("eval", "moved", "--checkpoint", day0, ok=False), gone)
        out = cli("export", "moved", "--checkpoint", day0, "--out", "m.safetensors", ok=False)
    assert_one_line_error(out, gone)
    assert not (root / "m.safetensors").exists()


def test_predict_names_the_file_and_line_of_a_raw_id_that_marks_an_empty_field(
    flow: dict,
) -> None:
    root = flow["root"]
    lines = (root / "raw" / "day_2").read_text().splitlines()[:3]
    fields = lines[1].split("\t")
    fields[14] = "8000000000000000"  # C1
    bad = root / "bad63.txt"
    bad.write_text("\n".join([lines[0], "\t".join(fields), lines[2]]) + "\n")
    with contextlib.chdir(root):
        result = cli("predict", "g.safetensors", "bad63.txt", "--out", "bad.txt", ok=False)
    assert_one_line_error(
        result, r"^error: bad63\.txt:2: C1: 8000000000000000 \(this raw id marks an empty field"
    )
    assert not (root / "bad.txt").exists()


def test_a_run_goes_on_with_fewer_ranks_than_its_own_plan_was_made_for(flow: dict) -> None:
    # The run's own plan (RUN/plan.json) is for 2 ranks; on 1 the refusal named
    # --nproc-per-node 2 and `plan --world-size 1`, not --plan '' (plan at start-up), the way
    # that needs neither the ranks nor a new file.
    root = flow["root"]
    shutil.copytree(root / "day1", root / "fewer", ignore=_lock)
    go_on = ["train", "--out-dir", "fewer", "--continue-on", "days/2", "--nproc-per-node", "1"]
    with contextlib.chdir(root):
        refused = cli(*go_on, ok=False)
    assert_one_line_error(
        refused,
        re.escape(
            "error: fewer/plan.json: the plan was made for another job: world size: plan 2, job 1 "
            "(train with --nproc-per-node 2, or --plan '' to plan at start-up, or re-run "
            "`shardrec plan --world-size 1`)"
        )
        + "$",
    )
    run(["shardrec", *go_on, "--plan", ""], root)
    stretches = json.loads((root / "fewer" / "stretches.json").read_text())["stretches"]
    assert [Path(s["data"]).name for s in stretches] == ["0", "1", "2"]


def test_a_new_day_trains_its_epoch_whatever_steps_the_day_before_was_given(
    flow: dict, monkeypatch
) -> None:
    # `--continue-on days/1 --steps 3` made day 1 three steps long, and config.toml kept
    # steps = 3: every later day without --steps trained 3 steps, silently.
    root = flow["root"]
    shutil.copytree(root / "day1", root / "oneoff", ignore=_lock)
    config = root / "oneoff" / "config.toml"
    config.write_text(re.sub(r"(?m)^steps = \d+$", "steps = 3", config.read_text()))
    handed = jobs_handed_to_ranks(monkeypatch)
    go_on = ["train", "--out-dir", "oneoff", "--continue-on", "days/2", "--nproc-per-node", "2"]
    with contextlib.chdir(root):
        for given in ([], ["--steps", "4"], ["--set", "train.steps=5"]):
            cli(*go_on, *given, ok=False)
    assert [j.train.steps for j in handed] == [0, 4, 5]  # 0: train.epochs over the new day


def test_a_step_max_age_below_the_default_update_spacing_is_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    """Without evict_every the maps update every 1/50 of the steps a job trains; a max_age in
    steps below that spacing evicts ids seen since the last update, as an evict_every above
    max_age would (refused): refused alike, before any rank starts."""
    from shardrec.tools.synth.drift import write_drift

    days, _ = write_drift(tmp_path / "raw", 1200, seed=2, days=1, max_vocab=200)
    cli("preprocess", days[0], "--out", tmp_path / "d", "--raw-ids", "all")
    job = tmp_path / "job.toml"
    job.write_text(
        '[train]\ndevice = "cpu"\nglobal_batch_size = 4\n\n'
        '[tables."*"]\nkind = "managed"\nrows = 50\nmax_age = "2 steps"\n'
    )
    args = ("train", "--config", job, "--data", tmp_path / "d", "--out-dir", tmp_path / "run")
    result = cli(*args, ok=False)
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(job))}:8: "
        r"tables\.\"\*\"\.max_age = '2 steps' is below the 5 steps between two updates "
        r"\(tables\.\"\*\"\.evict_every unset: 1/50 of the 257 steps this job trains\): ids "
        r"would age out between two updates; raise max_age or set tables\.\"\*\"\.evict_every$",
    )
    assert not (tmp_path / "run").exists()
    # The spacing given (as check() allows it), or a max_age that spans it, passes.
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.job.preflight import preflight

    for change in ('tables."*".evict_every=2', 'tables."*".max_age="5 steps"'):
        preflight(load_job_config(job, [f'data.path="{tmp_path / "d"}"', change]), 1)


def test_an_unbounded_table_with_fewer_slots_than_its_ids_is_refused_naming_the_key(
    tmp_path: Path,
) -> None:
    """An unbounded table gives every id a slot: one with fewer slots than the ids it trains on
    would put the rest on the shared row without a word, a managed table that never evicts under
    another name. Refused before any rank starts; a run that goes on keeps its table's size, so
    there it is a warning."""
    from shardrec.tools.synth.drift import write_drift
    from shardrec.trainer.job.config import load_job_config

    days, _ = write_drift(tmp_path / "raw", 1200, seed=2, days=1, max_vocab=200)
    cli("preprocess", days[0], "--out", tmp_path / "d", "--raw-ids", "all")
    manifest = Manifest.load(tmp_path / "d")
    first = manifest.sparse_features[0]
    distinct = first.stats["distinct_ids"]
    job = tmp_path / "job.toml"
    job.write_text(
        '[train]\ndevice = "cpu"\nglobal_batch_size = 4\n\n'
        f'[tables."*"]\nkind = "unbounded"\nrows = {distinct - 1}\n'
    )
    args = ("train", "--config", job, "--data", tmp_path / "d", "--out-dir", tmp_path / "run")
    result = cli(*args, ok=False)
    key = rf"tables\.\"\*\"\.rows = {distinct - 1:,} \(feature {first.name}\)"
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(job))}:\d+: {key}: an unbounded table gives every id a slot, "
        rf"and {re.escape(str(tmp_path / 'd'))} holds {distinct:,} distinct {first.name} ids to "
        rf"train on: 1 would share row 1; give rows >= {distinct:,} \(more for the days to "
        r'come\), or kind = "managed" for a table that evicts$',
    )
    assert not (tmp_path / "run").exists()
    from shardrec.trainer.job.preflight import unbounded_shortfalls

    loaded = load_job_config(job, [f'data.path="{tmp_path / "d"}"'])
    (warning,) = unbounded_shortfalls(loaded, manifest, continuing=True)
    assert warning.startswith(f'tables."*".rows = {distinct - 1:,} (feature {first.name}): ')
    assert "share row 1 (a run keeps its table's size; more slots need a new run)" in warning
    # As many slots as ids: nothing to say.
    enough = load_job_config(job, [f'data.path="{tmp_path / "d"}"', 'tables."*".rows=100000'])
    assert unbounded_shortfalls(enough, manifest) == []
