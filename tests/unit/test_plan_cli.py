"""`shardrec plan` on a tiny dataset: writes a plan the trainer can check, and refuses bad input
clearly."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.sharding.plan.plan_file import check_plan, load_plan, plan_fingerprint
from shardrec.tools.cli.app import app

runner = CliRunner()


def _job(tmp_path: Path, constraints: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"[train]\nglobal_batch_size = 256\n\n[sharding.constraints]\n{constraints}\n")
    return path


def test_plan_writes_checked_plan_and_report(tiny_dataset: Path, tmp_path: Path) -> None:
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs

    job = _job(
        tmp_path,
        't_f0 = { sharding_types = ["row_wise"] }\nt_f1 = { sharding_types = ["column_wise"], min_partition = 8 }',
    )
    out = tmp_path / "plan.json"
    res = runner.invoke(
        app,
        [
            "plan",
            "--data",
            str(tiny_dataset),
            "--config",
            str(job),
            "--world-size",
            "2",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "critical path" in res.output and "t_f0" in res.output
    plan = load_plan(out)
    tables = build_table_configs(Manifest.load(tiny_dataset), 16)
    check_plan(plan, plan_fingerprint(tables, 2, 256, "cpu"))
    assert plan.table("t_f0").sharding_type == "row_wise"
    assert plan.table("t_f1").sharding_type == "column_wise"

    res = runner.invoke(
        app,
        ["plan", "--data", str(tiny_dataset), "--config", str(job), "--world-size", "2", "--json"],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{") :])
    assert summary["tables"] == 4 and summary["world_size"] == 2
    assert len(summary["estimate"]["ranks"]) == 2


def test_plan_bad_input_exits_with_one_line(tiny_dataset: Path, tmp_path: Path) -> None:
    job = _job(tmp_path, 't_nope = { sharding_types = ["row_wise"] }')
    res = runner.invoke(app, ["plan", "--data", str(tiny_dataset), "--config", str(job)])
    assert_one_line_error(res, re.escape("unknown table 't_nope'"))

    job = _job(tmp_path, 't_f0 = { sharding_types = ["row_wise"] }')
    res = runner.invoke(
        app, ["plan", "--data", str(tiny_dataset), "--config", str(job), "--memory-gib", "0.00001"]
    )
    assert_one_line_error(res, "(?=.*does not fit)(?=.*rank 0 needs)")

    res = runner.invoke(app, ["plan", "--data", str(tmp_path / "missing"), "--config", str(job)])
    assert_one_line_error(res, re.escape("missing: does not exist"))
    # Named by the flags as typed, not the topology's field (`local_world_size = 3 must ...`).
    res = runner.invoke(
        app, ["plan", "--data", str(tiny_dataset), "--config", str(job), "--local-world-size", "3"]
    )
    assert_one_line_error(
        res, re.escape("error: --local-world-size 3 does not divide --world-size 2") + "$"
    )
    # Before, --sync-every without --group-size was taken and planned nothing different.
    res = runner.invoke(app, ["plan", "--data", str(tiny_dataset), "--sync-every", "5"])
    assert_one_line_error(
        res,
        re.escape(
            "error: --sync-every 5 is for 2D sharding: give --group-size too (-1: the fastest)"
        )
        + "$",
    )
    # A bad flag value is typer's usage error (exit 2) naming the flag as typed.
    for flag, value in (
        ("--memory-gib", "-1"),
        ("--local-world-size", "-1"),
        ("--world-size", "0"),
        ("--group-size", "-2"),
        ("--sync-every", "0"),
    ):
        # --world-size 0 with --local-world-size 3 and --out DIR: before, 'does not divide' (or
        # 'DIR/plan0.json' suggested) ahead of the world size's own check.
        extra = (
            ["--local-world-size", "3", "--out", str(tmp_path)] if flag == "--world-size" else []
        )
        res = runner.invoke(app, ["plan", "--data", str(tiny_dataset), flag, value, *extra])
        shown = " ".join(res.stderr.replace("│", " ").split())  # rich's panel may wrap it
        assert res.exit_code == 2 and f"Invalid value for '{flag}'" in shown, res.output


def test_a_table_that_fits_on_no_rank_is_named_with_its_need_and_the_room_left(
    tmp_path: Path,
) -> None:
    from conftest import write_tiny_dataset

    # t_f0: 400,000 x 16 weights (24.4 MiB) and row-wise Adagrad's 1.5 MiB, pinned table-wise: no
    # rank has room for it, though the tables' sum would fit two ranks' 20.7 MiB for tables.
    data = tmp_path / "data"
    write_tiny_dataset(data, cardinalities=(400_000, 50))
    job = _job(tmp_path, 't_f0 = { sharding_types = ["table_wise"] }')
    plan = ["plan", "--data", str(data), "--world-size", "2", "--memory-gib", "0.07"]
    res = runner.invoke(app, [*plan, "--config", str(job)])
    assert_one_line_error(
        res,
        re.escape(
            "(table t_f0 fits on no rank: it needs 25.97 MiB on one rank at least (table_wise; "
            "allowed: table_wise), a rank has 20.68 MiB for tables after the 40.25 MiB every rank "
            "holds; loosen sharding.constraints.t_f0 or raise memory per rank)"
        )
        + "$",
    )
    # What every rank holds besides its tables alone past the memory: that is named instead.
    res = runner.invoke(app, [*plan[:-1], "0.03", "--config", str(job)])
    assert_one_line_error(
        res,
        re.escape(
            "(what every rank holds besides its tables (dense layers, framework) needs 40.25 MiB, "
            "more than the 26.11 MiB usable: raise memory per rank)"
        )
        + "$",
    )


def test_torchrec_search_finding_no_placement_is_one_line(tmp_path: Path) -> None:
    from conftest import write_tiny_dataset

    # Before: torchrec's PlannerError, a traceback and 20 lines of its storage figures. t_f0's
    # 800,000 rows (49 MiB of weights) pass the 43.5 MiB a rank may fill.
    data = tmp_path / "data"
    write_tiny_dataset(data, cardinalities=(800_000, 50))
    job = _job(tmp_path, 't_f0 = { sharding_types = ["table_wise"] }')
    res = runner.invoke(
        app,
        ["plan", "--data", str(data), "--config", str(job), "--memory-gib", "0.05"]
        + ["--search", "torchrec", "--out", str(tmp_path / "plan.json")],
    )
    assert_one_line_error(
        res,
        "^"
        + re.escape(
            "error: the plan does not fit: torchrec's planner found no placement within 43.52 MiB "
            "per rank (table t_f0 fits on no rank: it needs 51.91 MiB on one rank at least"
        ),
    )
    assert not (tmp_path / "plan.json").exists()


def test_plan_data_and_batch_errors_name_the_flag_or_key_as_given(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before: 'missing: does not exist', 'global batch size 256 is not divisible by world size 3'.
    job, missing, file = _job(tmp_path, ""), tmp_path / "missing", tiny_dataset / "manifest.json"
    for data, said in ((missing, "does not exist"), (file, "not a directory")):
        res = runner.invoke(app, ["plan", "--data", str(data), "--config", str(job)])
        assert_one_line_error(res, "^" + re.escape(f"error: --data {data}: {said}") + "$")
    job.write_text(f"[data]\npath = '{missing}'\n")
    res = runner.invoke(app, ["plan", "--config", str(job)])
    assert_one_line_error(
        res, "^" + re.escape(f"error: {job}:2: data.path = '{missing}': does not exist") + "$"
    )
    job = _job(tmp_path, "")
    res = runner.invoke(
        app, ["plan", "--data", str(tiny_dataset), "--config", str(job), "--world-size", "3"]
    )
    assert_one_line_error(
        res,
        "^"
        + re.escape(
            f"error: {job}:2: train.global_batch_size = 256 does not divide by --world-size 3"
        )
        + "$",
    )
    res = runner.invoke(
        app,
        ["plan", "--data", str(tiny_dataset), "--set", "train.global_batch_size=63"],
    )
    assert_one_line_error(
        res,
        "^"
        + re.escape(
            "error: --set 'train.global_batch_size=63': train.global_batch_size = 63 does not "
            "divide by --world-size 2"
        )
        + "$",
    )


def test_plan_simulate_json(tiny_dataset: Path, tmp_path: Path) -> None:
    job = _job(tmp_path, "")
    res = runner.invoke(
        app, ["plan", "--data", str(tiny_dataset), "--config", str(job), "--simulate", "--json"]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("{") :])["rows"]
    assert [r["world_size"] for r in rows] == [2**k for k in range(3, 13)]
    assert rows[-1]["row_wise_bytes"] > rows[0]["row_wise_bytes"] * 100


def test_plan_at_start_writes_the_plan_shardrec_plan_writes(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """The trainer without --plan and `shardrec plan` turn the same job into the same bytes."""
    import torch

    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.machine.memory import dense_footprint
    from shardrec.trainer.distributed.dist import DistEnv
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.model.run_plan import plan_at_start
    from shardrec.trainer.model.train_module import build_train_module

    job_path = _job(tmp_path, 't_f1 = { sharding_types = ["column_wise"], min_partition = 8 }')
    out = tmp_path / "plan.json"
    res = runner.invoke(
        app,
        [
            "plan",
            "--data",
            str(tiny_dataset),
            "--config",
            str(job_path),
            "--world-size",
            "2",
            "--out",
            str(out),
            "--set",
            "optim.sparse=adam",
        ],
    )
    assert res.exit_code == 0, res.output
    job = load_job_config(job_path, ["optim.sparse=adam"])
    manifest = Manifest.load(tiny_dataset)
    configs = build_table_configs(manifest, job.model.embedding_dim, job.model.dims)
    env = DistEnv(
        rank=0,
        local_rank=0,
        world_size=2,
        local_world_size=2,
        device=torch.device("cpu"),
        backend="gloo",
    )
    module = build_train_module(
        job.model, manifest, configs, env, global_batch_size=job.train.global_batch_size, seed=0
    )
    plan = plan_at_start(
        configs,
        manifest,
        env,
        train=job.train,
        sharding=job.sharding,
        optim=job.optim,
        dense=dense_footprint(module, job.optim.dense),
    )
    assert plan.to_json() == out.read_text()
    # The dense layers are in the estimate, on every rank.
    assert all(r.fixed_bytes > 40 * 2**20 for r in plan.estimate.ranks)


def test_a_plan_or_profile_that_cannot_be_written_is_one_line(
    tiny_dataset: Path, tmp_path: Path, monkeypatch
) -> None:
    import errno
    import os

    from shardrec.dataloader.util import files
    from shardrec.tools.measure import calibrate

    job = _job(tmp_path, "")
    plan = ["plan", "--data", str(tiny_dataset), "--config", str(job), "--out"]
    res = runner.invoke(app, [*plan, str(tmp_path)])
    assert_one_line_error(
        res, re.escape(f"--out {tmp_path}: is a directory; give a file name such as ")
    )
    (tmp_path / "file").write_text("")
    res = runner.invoke(app, [*plan, str(tmp_path / "file" / "plan.json")])
    assert_one_line_error(
        res,
        re.escape(
            f"{tmp_path / 'file' / 'plan.json'}: cannot write the plan: {tmp_path / 'file'} is a "
            "file, not a folder"
        ),
    )

    def full(path):  # what a full disk gives when the file's pages are flushed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "fsync_path", full)
    res = runner.invoke(app, [*plan, str(tmp_path / "plan.json")])
    assert_one_line_error(
        res, re.escape(f"{tmp_path / 'plan.json'}: No space left on device: it needs ")
    )
    monkeypatch.setattr(calibrate, "calibrate", lambda device, world_size: {"measured": {}})
    res = runner.invoke(app, ["plan", "calibrate", "--out", str(tmp_path / "c.json"), "--json"])
    assert_one_line_error(
        res, re.escape(f"{tmp_path / 'c.json'}: No space left on device: it needs ")
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_profile_measured_on_another_device_kind_is_refused(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # `plan calibrate` on a CPU host, then a plan for H100s: the CPU's 13.8 GB/s of lookups and
    # 1.2 GB/s all-to-all replaced the H100's 2.7 TB/s and 360 GB/s without a word (the estimated
    # step 6.6x the preset's, the placement searched on those figures).
    profile = tmp_path / "cal.json"
    measured = {"lookup_bw": 1.38e10, "intra_host_bw": 1.18e9, "collective_latency_s": 1.2e-4}
    profile.write_text(json.dumps({"device_kind": "cpu", "measured": measured}))
    job = _job(tmp_path, "")
    plan = ["plan", "--data", str(tiny_dataset), "--config", str(job), "--profile", str(profile)]
    assert_one_line_error(
        runner.invoke(app, [*plan, "--topology", "h100"]),
        re.escape(
            f"error: {profile}: measured on cpu devices, and the h100 topology is of cuda devices: "
            "measure those (`shardrec plan calibrate --device cuda` on their machine) or plan "
            "without --profile"
        )
        + "$",
    )
    res = runner.invoke(app, [*plan, "--topology", "cpu-gloo", "--json"])
    assert res.exit_code == 0, res.output


def test_the_planning_time_said_counts_the_proposed_row_budgets(
    tiny_dataset: Path, tmp_path: Path, monkeypatch
) -> None:
    """`planned N tables ... in X s` (and --json's seconds) is the whole planning: the proposals for
    managed tables plan again (up to 15 plans; ~6 s each with --search torchrec) after the plan."""
    import time

    from shardrec.trainer.job import planning

    propose = planning.propose_row_budgets

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return propose(*args, **kwargs)

    monkeypatch.setattr(planning, "propose_row_budgets", slow)
    res = runner.invoke(
        app,
        ["plan", "--data", str(tiny_dataset), "--config", str(_job(tmp_path, "")),
         "--world-size", "2", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["seconds"] >= 0.5
