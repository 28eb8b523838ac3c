"""HSTU settings that an event-log dataset cannot honour are refused before the ranks start, in
one line naming the setting, the dataset's feature and what to set instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli, run_direct_rank

SPEC = (
    '[items.artist]\nfile = "artist_item_mapping.parquet"\nvalue = "artist_id"\n'
    "[history]\nlength = 12\nmin_history = 4\n"
)
BASE = [
    'train.device="cpu"',
    'model.arch="hstu"',
    'data.eval_splits=["val"]',
    "train.global_batch_size=64",
]


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> Path:
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.event_dataset import build_event_dataset
    from shardrec.tools.synth.yambda import write_yambda_like

    raw = tmp_path_factory.mktemp("raw")
    write_yambda_like(raw, 3_000, seed=1)
    spec = raw / "spec.toml"
    spec.write_text(SPEC)
    data = tmp_path_factory.mktemp("events")
    build_event_dataset([raw / "events.parquet"], load_event_spec(spec), spec, data)
    return data


def _job(data: Path, *settings: str) -> list[str]:
    flat = [*BASE, *settings]
    return ["--data", str(data), *(f for s in flat for f in ("--set", s))]


def test_action_bits_fewer_than_the_event_pools_are_refused_not_dropped(events, tmp_path):
    """An event log's actions are three pool bits (listen-plus, like, skip); with
    model.hstu_action_bits = 2 every skip would reach HSTU as no action at all, silently."""
    run = tmp_path / "run"
    result = cli("train", *_job(events, "model.hstu_action_bits=2"), "--out-dir", run, ok=False)
    line = assert_one_line_error(
        result,
        rf"^error: --set 'model.hstu_action_bits=2': model.hstu_action_bits = 2 reads 2 of the 3 "
        rf"bits of {re.escape(str(events))}'s hist_action \(values up to 7\): the others would be "
        r"dropped from every token; set it to at least 3$",
    )
    assert not run.exists()
    # A rank torchrun starts directly (the README's multi-node path) refuses it in the same line.
    direct = run_direct_rank(*_job(events, "model.hstu_action_bits=2"), "--out-dir", str(run))
    assert assert_one_line_error(direct, "^error: ") == line
    assert not (run / "metrics.jsonl").exists()
    # Three bits hold every pool: the same job passes the checks (checked, not trained).
    from shardrec.trainer.job.flags import job_from_flags
    from shardrec.trainer.job.preflight import preflight

    preflight(job_from_flags(None, events, None, None, [*BASE, "model.hstu_action_bits=3"]), 1)
