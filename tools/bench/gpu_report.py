"""A pytest plugin for the GPU check (`pytest -p shardrec.tools.bench.gpu_report`): each test's
result written as the test ends, one JSON line each, to the file GPU_CHECK_REPORT names, so that a
check killed at its time limit still knows every result before it.

Lines (appended and flushed one by one):
  {"event": "collected", "tests": [node ids], "time": t}   once, after selection (-m gpu)
  {"event": "start", "test": id, "time": t}                  as each test starts
  {"event": "result", "test": id, "outcome": passed | failed | skipped | error,
   "message": first line, "seconds": setup + call (+ teardown) so far}
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "GPU_CHECK_REPORT"
_seconds: dict[str, float] = {}


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def _message(report: Any) -> str:
    """The report's one line: a skip's reason, a failure's exception line."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr or "")
    return (text.strip().splitlines() or [""])[0]


def pytest_collection_finish(session: Any) -> None:
    _write({"event": "collected", "tests": [i.nodeid for i in session.items], "time": time.time()})


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"event": "start", "test": nodeid, "time": time.time()})


def pytest_runtest_logreport(report: Any) -> None:
    seconds = _seconds.get(report.nodeid, 0.0) + float(report.duration)
    _seconds[report.nodeid] = seconds
    ended = report.when == "call" or (report.when == "setup" and not report.passed)
    if report.when == "teardown" and report.failed:
        outcome = "error"
    elif ended:
        outcome = "error" if report.when == "setup" and report.failed else report.outcome
    else:
        return
    _write(
        {
            "event": "result",
            "test": report.nodeid,
            "outcome": outcome,
            "message": _message(report) if outcome != "passed" else "",
            "seconds": round(seconds, 2),
        }
    )
