"""`shardrec bench sequence` warms both models' rates up over a tenth of the run, whatever its
length: by the epoch's steps (rows over configs/dlrmv4.toml's global batch), or by --steps."""

from __future__ import annotations

import tomllib

from shardrec.tools.bench.sequence import sequence_quality
from shardrec.tools.bench.sequence.hstu_bench import CONFIG


def test_the_epoch_is_counted_in_the_config_s_global_batch():
    config = tomllib.loads(CONFIG.read_text())
    assert sequence_quality.GLOBAL_BATCH == config["train"]["global_batch_size"]


def test_warmup_is_a_tenth_of_the_run():
    assert sequence_quality.warmup_steps(0, 36_626) == 14  # 144 steps of 256
    assert sequence_quality.warmup_steps(0, 118_000) == 46
    assert sequence_quality.warmup_steps(50, 10**6) == 5  # --steps wins over the epoch
    assert sequence_quality.warmup_steps(3, 100) == 1  # never 0: no warm-up at all
