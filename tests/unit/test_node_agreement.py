"""What ranks started node by node compare before they train (trainer/rundir/life/node_agreement.py),
without torch: a node's own paths and machine settings are its own; another plan is refused. The
exchange between real ranks: tests/e2e/test_nodes_agree.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from conftest import write_tiny_dataset

from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.rundir.life.node_agreement import disagreement, rank_view


def _view(data: Path, plan: Path, *items: str):
    config = load_job_config(None, [f'data.path="{data}"', f'sharding.plan="{plan}"', *items])
    return rank_view(config, Path("run"))


def test_a_nodes_own_paths_and_machine_settings_are_no_disagreement(tmp_path: Path) -> None:
    write_tiny_dataset(tmp_path / "data")
    shutil.copytree(tmp_path / "data", tmp_path / "copy")
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "plan1.json").write_text("{}")
    views = [
        _view(tmp_path / "data", tmp_path / "plan.json"),
        _view(
            tmp_path / "copy", tmp_path / "plan1.json", "data.num_workers=3", "dist.bind_cores=true"
        ),
    ]
    assert disagreement(views, [True, True]) is None


def test_another_plan_file_is_refused_naming_both(tmp_path: Path) -> None:
    write_tiny_dataset(tmp_path / "data")
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "plan1.json").write_text('{"other": 1}')
    views = [
        _view(tmp_path / "data", tmp_path / "plan.json"),
        _view(tmp_path / "data", tmp_path / "plan1.json"),
    ]
    line = disagreement(views, [True, True])
    assert line is not None and re.fullmatch(
        r"rank 1 \(host \S+\) was given another plan than rank 0 \(host \S+\): "
        + re.escape(f"{tmp_path / 'plan1.json'} on rank 1, {tmp_path / 'plan.json'} on rank 0; ")
        + re.escape("give every node the same plan file (copy rank 0's)"),
        line,
    ), line
