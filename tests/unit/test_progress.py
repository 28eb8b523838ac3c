"""Progress on a terminal: training's and evaluation's bars show an ETA, and a log line printed
while a bar is live lands on a line of its own, never over the bar (checked on a real pty)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

SCRIPT = """
import logging, sys
from shardrec.trainer.loop.progress import TrainReporter, eval_progress
from shardrec.trainer.loop.steps import StepStats

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr, force=True)

class Writer:
    def write(self, record): pass
    def close(self): pass

reporter = TrainReporter(Writer(), total_steps=4, first_step=0, log_interval=1, lr=lambda: 0.1)
for step in (1, 2):
    reporter.on_report(StepStats(step, 0.5, 64, 1), epoch=0)
logging.getLogger("shardrec.test").info("LOG-LINE-DURING-TRAINING")
reporter.on_report(StepStats(3, 0.5, 64, 1), epoch=0)
reporter.close()
with eval_progress(3, show=True) as advance:
    advance(1)
    logging.getLogger("shardrec.test").info("LOG-LINE-DURING-EVAL")
    advance(3)
"""


def _on_a_terminal(script: str) -> str:
    """What `script` writes to a terminal (stdout and stderr both on one pty)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "COLUMNS": "160", "TERM": "xterm"},
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the pty closes when the child ends
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")[-3000:]
    return out.decode(errors="replace")


def _as_shown(raw: str) -> list[str]:
    """The terminal's lines: what is left on each after its last carriage return or line erase."""
    lines = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        shown = re.split(r"\r|\x1b\[2K", line)[-1]
        lines.append(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown))
    return lines


def test_bars_show_an_eta_and_log_lines_print_above_them() -> None:
    raw = _on_a_terminal(SCRIPT)
    assert "eta" in raw and re.search(r"eta.*\d:\d\d:\d\d", raw), raw[-2000:]
    shown = _as_shown(raw)
    for message in ("LOG-LINE-DURING-TRAINING", "LOG-LINE-DURING-EVAL"):
        (line,) = [line for line in shown if message in line]
        assert line.strip() == message, f"{message} shares its line with the bar: {line!r}"
