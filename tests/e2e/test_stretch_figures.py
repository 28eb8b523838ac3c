"""What RUN/stretches.json, summary.json and `train --json` say a stretch's id maps did: its share
of lookups on the shared row covers exactly the lookups of its own steps, checked against a count
made apart from the maps, from the data's ids in the order the run trains them.

Unbounded tables (an id gets its slot at the first update after its first sighting, never loses
it) updated every 2 steps make the count simple: a lookup goes to the shared row when its id was
not seen before the last update. Each stretch ends between two updates, so its last steps' lookups
are counted at its end, not at the next stretch's first update.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import cli

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.dataloader.loader import NO_SHUFFLE, build_loader

BATCH, EVERY = 128, 2
JOB = f"""
[train]
device = "cpu"
global_batch_size = {BATCH}

[data]
shuffle = false
eval_splits = []

[tables."*"]
kind = "unbounded"
rows = 5000
evict_every = {EVERY}
"""


def _train(root: Path, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", "train", "--nproc-per-node", "2", "--json"]
        + list(args),
        cwd=root,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout[done.stdout.index("{") :])


def expected_shares(days: list[Path]) -> list[float]:
    """Each day's share of lookups on the shared row, counted from the data's ids: a stretch
    updates at its first step (but the first stretch's) and every EVERY steps from it; an update
    admits every id seen before it."""
    seen: dict[str, set[int]] = {}
    admitted: dict[str, set[int]] = {}
    shares, step = [], 0
    for d, day in enumerate(days):
        loader = build_loader(
            day, "train", global_batch_size=BATCH, rank=0, world_size=1, shuffle=NO_SHUFFLE
        )
        start, misses, lookups = step, 0, 0
        for batch in loader:
            if (step == start and d > 0) or (step > start and (step - start) % EVERY == 0):
                admitted = {f: set(ids) for f, ids in seen.items()}
            real = batch.labels.numpy() >= 0
            for key, jt in batch.sparse_features.to_dict().items():
                ids = jt.values().numpy().view(np.uint64)
                ids = ids[np.repeat(real, jt.lengths().numpy())]
                ids = ids[ids != np.uint64(MISSING_KEY)].tolist()
                lookups += len(ids)
                misses += sum(i not in admitted.get(key, ()) for i in ids)
                seen.setdefault(key, set()).update(ids)
            step += 1
        shares.append(misses / lookups)
    return shares


@pytest.mark.slow
def test_each_stretchs_shared_row_share_counts_its_own_lookups(tmp_path: Path) -> None:
    with contextlib.chdir(tmp_path):
        cli("synth", "raw", "--like", "drift", "--days", "2", "--rows", "3000")
        for d in (0, 1):
            cli("preprocess", f"raw/day_{d}", "--out", f"days/{d}", "--raw-ids", "all")
    (tmp_path / "job.toml").write_text(JOB)
    days = [tmp_path / "days" / "0", tmp_path / "days" / "1"]
    want = expected_shares(days)
    assert 0 < want[0] < 1 and 0 < want[1] < want[0]  # the count is not trivially 0 or 1
    first = _train(tmp_path, "--config", "job.toml", "--data", "days/0", "--out-dir", "run")
    assert first["id_maps"]["shared_row_share"] == pytest.approx(want[0], abs=1e-6)
    second = _train(tmp_path, "--out-dir", "run", "--continue-on", "days/1")
    assert second["id_maps"]["shared_row_share"] == pytest.approx(want[1], abs=1e-6)
    listed = json.loads((tmp_path / "run" / "stretches.json").read_text())["stretches"]
    shares = [s["id_maps"]["shared_row_share"] for s in listed]
    assert shares == pytest.approx(want, abs=1e-6)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["id_maps"]["shared_row_share"] == pytest.approx(want[1], abs=1e-6)
