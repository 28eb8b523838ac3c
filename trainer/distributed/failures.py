"""What a failed job leaves in the launcher's directory (`launch`'s, LAUNCHER_DIR_ENV) and how
the launcher reads it: each rank's one-line reason (rank_process.report_failure), torchrun's
agent's word on which ranks failed and how (torchrun_main), and the LaunchResult that names the
cause."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAILED_FIRST = "failed-first.json"
"""torchrun's agent's word on the failed ranks: {"rank", "exitcode", "signal"} of the one that failed
first, "failures": {rank: {"exitcode", "signal"}} of every rank it saw fail, and "refused": whether
every failed rank refused the job (rank_process.exit_refused; then torchrun printed no line)."""
REASON_SUFFIX = ".error"
"""`rank-N.error`: rank N's own one-line reason for failing (trainer.distributed.rank_process)."""
PEER_GONE_SUFFIX = ".peer-gone"
"""`rank-N.peer-gone`: rank N failed because another rank went away (a consequence)."""
REFUSAL_SUFFIX = ".refusal"
"""`rank-N.refusal`: rank N refused the job (bad input or state) in this one line, which says
what to do (rank_process.refuse). A job that ended in refusals alone shows that line alone."""
SIGNAL_HINTS = {
    "SIGKILL": "the kernel's OOM killer does this when memory runs out",
    "SIGSEGV": "a crash in native code",
    "SIGBUS": "a memory-mapped file changed or shrank under it, or a bad memory access",
    "SIGABRT": "an abort in native code (NCCL's watchdog aborts a rank whose collective failed)",
}


def describe_signal(name: str, exitcode: int | None = None, hint: bool = True) -> str:
    """ "SIGKILL (signal 9); the kernel's OOM killer ..." for how a rank was killed (without what
    the signal suggests, unless `hint`)."""
    try:
        number = int(signal.Signals[name])
    except KeyError:
        number = -exitcode if exitcode is not None and exitcode < 0 else None
    said = f"{name} (signal {number})" if number is not None else name
    suggests = SIGNAL_HINTS.get(name) if hint else None
    return f"{said}; {suggests}" if suggests else said


@dataclass(frozen=True)
class LaunchResult:
    """How a launched job ended."""

    code: int
    """torchrun's exit code (negative: the signal that ended it)."""
    signal: str | None = None
    """The first SIGTERM/SIGINT this launcher got while the job ran (None: none)."""
    forced: str = ""
    """How and why this launcher ended the job itself, without waiting for its checkpoint, as the
    CLI's last line starts ("": it did not)."""
    reasons: dict[int, str] = field(default_factory=dict)
    """rank -> the one line that rank left when it failed
    (trainer.distributed.rank_process.report_failure)."""
    failed_first: dict[str, Any] = field(default_factory=dict)
    """The agent's FAILED_FIRST record ({}: no rank failed, or the agent could not say)."""
    peers_gone: dict[int, str] = field(default_factory=dict)
    """rank -> its line, for ranks that failed because another rank went away (consequences)."""
    refusals: dict[int, str] = field(default_factory=dict)
    """rank -> its refusal, for ranks that refused the job (in `reasons` too)."""

    @property
    def refusal(self) -> str:
        """The one line to show where the job ended in refusals alone, as torchrun's agent judged
        it (refused_only; it then said nothing itself); "" otherwise: a crash, a kill or a rank
        that left no line keeps every rank's and torchrun's own output."""
        if self.code == 0 or self.forced or not self.failed_first.get("refused"):
            return ""
        return self.refusals[min(self.refusals)] if self.refusals else ""

    def _killed(self) -> dict[int, str]:
        """rank -> signal name, for the ranks the agent saw killed by a signal."""
        failures = dict(self.failed_first.get("failures") or {})
        first = self.failed_first.get("rank")
        if first is not None and self.failed_first.get("signal"):
            failures.setdefault(str(first), self.failed_first)
        return {
            int(rank): str(f["signal"])
            for rank, f in failures.items()
            if isinstance(f, dict) and f.get("signal")
        }

    def _describe(self, rank: int) -> str:
        if rank in self.reasons:
            return f"rank {rank}: {self.reasons[rank]}"
        failures = dict(self.failed_first.get("failures") or {})
        exitcode = (failures.get(str(rank)) or {}).get("exitcode")
        if exitcode is None and rank == self.failed_first.get("rank"):
            exitcode = self.failed_first.get("exitcode")
        return f"rank {rank} was killed by {describe_signal(self._killed()[rank], exitcode)}"

    @property
    def cause(self) -> str:
        """Why the job failed, in words: the rank that failed first, by its own reason or the
        signal that killed it; a rank that only lost another (a collective's "connection reset by
        peer") is named only when nothing else is known ("" when nothing says)."""
        first = self.failed_first.get("rank")
        causes = set(self.reasons) | set(self._killed())
        if first in causes:
            return self._describe(first)
        if causes:
            # The agent saw another rank fail first (one that lost its peer); prefer a death.
            killed = sorted(self._killed())
            return self._describe(killed[0] if killed else min(causes))
        if first is not None:
            return f"rank {first} exited with code {self.failed_first.get('exitcode')}"
        if self.peers_gone:
            rank = min(self.peers_gone)
            return f"rank {rank}: {self.peers_gone[rank]}"
        return ""


def _rank_lines(shared: Path, suffix: str) -> dict[int, str]:
    lines = {}
    for path in shared.glob(f"rank-*{suffix}"):
        try:
            lines[int(path.name.removeprefix("rank-").removesuffix(suffix))] = (
                path.read_text().strip()
            )
        except (OSError, ValueError):
            continue
    return lines


def read_reports(shared: Path) -> dict[str, Any]:
    """What the ranks and the agent left in `shared` when they failed (LaunchResult's fields)."""
    refusals = _rank_lines(shared, REFUSAL_SUFFIX)
    reasons = {**_rank_lines(shared, REASON_SUFFIX), **refusals}
    try:
        failed_first = json.loads((shared / FAILED_FIRST).read_text())
    except (OSError, ValueError):
        failed_first = {}
    return {
        "reasons": reasons,
        "failed_first": failed_first if isinstance(failed_first, dict) else {},
        "peers_gone": _rank_lines(shared, PEER_GONE_SUFFIX),
        "refusals": refusals,
    }


def refused_only(shared: Path | None, failures: dict[int, Any]) -> bool:
    """Whether every rank torchrun's agent saw fail (its ProcessFailures by rank) exited after
    refusing the job, or after losing a peer, at least one refusing and none killed by a signal:
    its refusal, one line, is all the user needs (no "rank 0 failed first" beside it)."""
    if shared is None or not failures or any(f.exitcode < 0 for f in failures.values()):
        return False
    refused = set(_rank_lines(shared, REFUSAL_SUFFIX))
    return bool(refused) and set(failures) <= refused | set(_rank_lines(shared, PEER_GONE_SUFFIX))


def failures_line(first: int, failure: Any, failures: dict[int, Any]) -> str:
    """torchrun's failures in one line. Its "first" is the earliest by the second: a rank whose
    collective failed when its peer was killed often ties with it, so a rank killed by a signal is
    named first."""
    if len(failures) <= 1:
        return f"rank {first} failed first (exit code {failure.exitcode})"

    def said(rank: int, f: Any) -> str:
        if f.exitcode < 0:
            signal_name = f.signal_name()
            return f"rank {rank} was killed by {describe_signal(signal_name, f.exitcode, False)}"
        return f"rank {rank} exited with code {f.exitcode}"

    order = sorted(failures, key=lambda r: (failures[r].exitcode >= 0, failures[r].timestamp, r))
    return "ranks failed: " + ", ".join(said(r, failures[r]) for r in order)


def failure_record(failure: Any) -> dict[str, Any]:
    """torchrun's ProcessFailure as {"exitcode", "signal"} ("" when it exited)."""
    return {
        "exitcode": failure.exitcode,
        "signal": failure.signal_name() if failure.exitcode < 0 else "",
    }
