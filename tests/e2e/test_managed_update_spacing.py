"""The spacing of a managed table's map updates where evict_every is unset (1/50 of a stretch's
steps) across a resume that trains the stretch longer: kept as the stretch began, and said."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import cli, train_tiny


def test_a_resume_with_more_steps_keeps_the_update_spacing_and_says_so(tmp_path: Path) -> None:
    # A resume with more --steps kept updating the maps every 1/50 of the steps the stretch
    # began with (as it must: the steps it shares with the uninterrupted run assign the same
    # ids), without a word, though README's table said "1/50 of the stretch".
    from shardrec.tools.synth.drift import write_drift

    days, _ = write_drift(tmp_path / "raw", 1200, seed=2, days=1, max_vocab=200)
    cli("preprocess", days[0], "--out", tmp_path / "d", "--raw-ids", "all")
    run = tmp_path / "run"
    managed = 'tables."*"={kind="managed", rows=50}'
    train_tiny(tmp_path / "d", run, managed, "train.global_batch_size=4", "train.steps=49")
    done = train_tiny(tmp_path / "d", run, managed, "train.global_batch_size=4", "train.steps=100")
    said = [line for line in done.stderr.splitlines() if "evict_every unset" in line]
    assert len(said) == 1, done.stderr
    assert re.search(
        rf"{re.escape(str(run))}: C1, C2, .*, C26 \(evict_every unset\): their maps go on "
        r"updating every 1 step\(s\), 1/50 of the 49 steps this stretch began with, not of the "
        r"100 it trains now \(the steps a resumed and an uninterrupted run share assign the same "
        r"ids\); set evict_every to space them otherwise$",
        said[0],
    ), said[0]
