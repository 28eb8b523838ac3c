"""The spacing of a managed table's map updates where evict_every is unset (1/50 of a stretch's
steps) across a resume that trains the stretch longer: kept as the stretch began, said, and
what a max_age in steps is checked against before any rank starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import TINY_MODEL, Result, assert_one_line_error, cli, jobs_handed_to_ranks, train_tiny

MANAGED = 'tables."*"={kind="managed", rows=50}'


def _first_stretch(tmp_path: Path, steps: int) -> tuple[Path, str]:
    """A day of a drifting log preprocessed into tmp_path/d with raw ids, and a run (its folder)
    of managed tables trained `steps` steps on it; the tables' setting, for the resume."""
    from shardrec.tools.synth.drift import write_drift

    days, _ = write_drift(tmp_path / "raw", 1200, seed=2, days=1, max_vocab=200)
    cli("preprocess", days[0], "--out", tmp_path / "d", "--raw-ids", "all")
    run = tmp_path / "run"
    train_tiny(tmp_path / "d", run, MANAGED, "train.global_batch_size=4", f"train.steps={steps}")
    return run, MANAGED


@pytest.fixture(scope="module")
def resumed_longer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int, str]:
    """A first stretch of 100 steps resumed with 150 (one preprocessing, two trainings, shared by
    the module's tests): the run, its plan's id map bytes before and after the resume, and the
    resume's stderr."""
    root = tmp_path_factory.mktemp("resumed_longer")
    run, managed = _first_stretch(root, 100)
    first = _id_map_bytes(run)
    done = train_tiny(root / "d", run, managed, "train.global_batch_size=4", "train.steps=150")
    return run, first, _id_map_bytes(run), done.stderr


def _id_map_bytes(run: Path) -> int:
    return json.loads((run / "plan.json").read_text())["estimate"]["ranks"][0]["id_map_bytes"]


def test_a_resume_with_more_steps_keeps_the_update_spacing_and_says_so(
    resumed_longer: tuple[Path, int, int, str],
) -> None:
    # A resume with more --steps kept updating the maps every 1/50 of the steps the stretch
    # began with (as it must: the steps it shares with the uninterrupted run assign the same
    # ids), without a word, though README's table said "1/50 of the stretch".
    run, _, _, stderr = resumed_longer
    said = [line for line in stderr.splitlines() if "evict_every unset" in line]
    assert len(said) == 1, stderr
    assert re.search(
        rf"{re.escape(str(run))}: C1, C2, .*, C26 \(evict_every unset\): their maps go on "
        r"updating every 2 step\(s\), 1/50 of the 100 steps this stretch began with, not of the "
        r"150 it trains now \(the steps a resumed and an uninterrupted run share assign the same "
        r"ids\); set evict_every to space them otherwise$",
        said[0],
    ), said[0]


def test_a_resume_plans_the_maps_for_the_update_spacing_it_keeps(
    resumed_longer: tuple[Path, int, int, str],
) -> None:
    # The plan made at start on a resume sized the maps' ids missed between two updates from the
    # resume's --steps (1/50 of 150: 3 steps) while the run keeps updating every 2 steps (1/50 of
    # the 100 its stretch began with); at many more steps, enough memory counted that the run
    # never uses to refuse a resume that fits.
    _, first, resumed, _ = resumed_longer
    assert resumed == first > 0


def test_a_resume_checks_max_age_against_the_update_spacing_it_keeps(
    resumed_longer: tuple[Path, int, int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check before any rank starts took the spacing from the resume's --steps (1/50 of 200:
    # 4) while the run keeps updating every 2 steps (1/50 of the 100 its stretch began with): a
    # max_age of 2 steps was refused, "tables."*".max_age = '2 steps' is below the 4 steps
    # between two updates (tables."*".evict_every unset: 1/50 of the 200 steps this job trains)".
    # Neither resume trains (no rank starts), so the module's run is left as it was.
    run = resumed_longer[0]

    def resume(max_age: str) -> Result:
        aged = f'tables."*"={{kind="managed", rows=50, max_age="{max_age}"}}'
        settings = [*TINY_MODEL, 'data.eval_splits=["val"]', 'train.device="cpu"', aged]
        return cli(
            "train", "--data", run.parent / "d", "--out-dir", run, "--steps", "200",
            "--set", "train.global_batch_size=4", *[f for s in settings for f in ("--set", s)],
            "--allow-change", "tables", ok=False,
        )  # fmt: skip

    handed = jobs_handed_to_ranks(monkeypatch)
    resume("2 steps")
    assert [job.tables["*"].max_age for job in handed] == ["2 steps"]
    assert_one_line_error(
        resume("1 steps"),
        r"^error: tables\.\"\*\"\.max_age = '1 steps' is below the 2 steps between two updates "
        r"\(tables\.\"\*\"\.evict_every unset: 1/50 of the 100 steps this stretch began with\): "
        r"ids would age out between two updates; raise max_age or set tables\.\"\*\"\.evict_every$",
    )
    assert len(handed) == 1
