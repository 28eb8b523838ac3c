"""`bench train --breakdown`'s categories: the input dist's wait for late ranks counts apart from
its transfer, for a plain loop's scopes and the train pipeline's alike."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardrec.tools.bench.train.breakdown import FRAMEWORK, INPUT_DIST_WAIT, categorize, category


@dataclass
class Event:
    """The fields of a profiler event that categorize() reads (times in microseconds)."""

    name: str
    self_cpu_time_total: float
    cpu_children: list[Event] = field(default_factory=list)
    cpu_parent: Event | None = None
    thread: int = 1


def test_the_splits_wait_is_waiting_and_the_tensors_wait_is_input_dist() -> None:
    assert category("## SplitsAllToAllAwaitable wait() ##") == INPUT_DIST_WAIT
    assert category("## FusedKJTListSplitsAwaitable wait() ##") == INPUT_DIST_WAIT
    assert category("## KJTAllToAllSplitsAwaitable wait() ##") == "input dist"
    assert category("## KJTAllToAllTensorsAwaitable wait() ##") == "input dist"


def test_a_plain_steps_input_dist_splits_into_waiting_and_transfer() -> None:
    # torchrec's nesting in a plain forward: the KJT splits awaitable waits on the splits
    # all-to-all (whose c10d wait is where a late rank is waited for), then the tensors one.
    c10d_wait = Event("c10d::wait", 7_000.0)
    splits = Event("## SplitsAllToAllAwaitable wait() ##", 500.0, [c10d_wait])
    outer = Event("## KJTAllToAllSplitsAwaitable wait() ##", 200.0, [splits])
    tensors = Event("## KJTAllToAllTensorsAwaitable wait() ##", 2_000.0)
    splits.cpu_parent, c10d_wait.cpu_parent = outer, splits
    got = categorize([outer, tensors], thread=1, wall_ms=10.0, steps=1)
    assert got == {INPUT_DIST_WAIT: 7.5, "input dist": 2.2, FRAMEWORK: 0.3}
