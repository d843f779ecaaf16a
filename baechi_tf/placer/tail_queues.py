"""Ready ops of the list scheduler that share one heap entry: those waiting for copies booked
after everything on busy channels, and those a policy holds back from a device to a common floor.

`TailQueue` is the queue's data; `list_scheduler.ListScheduler` decides when an op joins one and
when its entry is looked at (`_defer`, `_tail_entry`). Why they keep the schedules the same, and
the work they save, is told in `baechi_tf.placer.list_scheduler`. Pushing and popping a member
is O(log M) for M members.
"""

from __future__ import annotations

import heapq
from typing import Optional

__all__ = ["TailQueue"]


class TailQueue:
    """Candidates of one device whose start was the arrival of their copies from `sources`,
    `widths` us long, booked one after another after everything on the channels they use, from
    `since` or later (their other copies, if any, took gaps before and arrived no later).

    While, for each source, its channel or the device's stays busy without a gap from `since` to
    the channels' tail, every member's such copies still go after the tail, one after another, so
    no member starts before the tail plus the widths: one entry in the device's `later` heap stands
    for all members (in topological order, as ties between equal starts are broken), instead of
    each member being evaluated again at every booking. Copies that go to the tail of busy
    channels are the case where thousands of ready ops wait on one channel (updates colocated
    with a variable and fed from other devices, gathers of one embedding feeding other devices,
    ops of a fan-out waiting for their source to be sent to a device), which was quadratic.

    A *pool* (`sources` and `widths` None) holds the ops a policy held back from the device to its
    `Policy.hold_floor`: while the floor holds, no member (the exempt op aside) starts before
    it, so one entry keyed at the floor stands for all of them; when the policy stops holding
    ops there, that entry goes down to the device's free time (`ListScheduler.step`), where each
    member was offered again one by one before. m-SCT's reservations held the same thousands of
    ops at each step on chained updates of one variable and on fan-outs, which was quadratic.
    """

    __slots__ = ("device", "sources", "widths", "since", "members", "entry", "now", "ids")

    def __init__(
        self, device: int, sources: Optional[tuple[int, ...]], widths: Optional[tuple[float, ...]],
        since: float,
    ) -> None:
        self.device, self.sources, self.widths, self.since = device, sources, widths, since
        self.members: list[tuple[int, int, float]] = []  # heap of (topo, op, start when queued)
        self.entry: Optional[tuple[float, int]] = None  # (key, topo) of the live heap entry
        self.now = False  # whether that entry is in the device's `now` heap (else `later`)
        self.ids: set[int] = set()  # a pool's members (an op is one at most once)

    @property
    def pool(self) -> bool:
        """Whether its members are ops held to the policy's floor (no copies)."""
        return self.sources is None

    def push(self, tp: int, op: int, start: float) -> None:
        if self.pool:
            if op in self.ids:
                return
            self.ids.add(op)
        heapq.heappush(self.members, (tp, op, start))

    def pop(self) -> tuple[int, int, float]:
        """Removes and returns the first member (topological order)."""
        out = heapq.heappop(self.members)
        self.ids.discard(out[1])
        return out

    def saved(self) -> tuple:
        """Its state as plain data (a snapshot's), for `restored`."""
        return (self.device, self.sources, self.widths, self.since, list(self.members), self.entry,
                self.now, set(self.ids))

    @staticmethod
    def restored(saved: tuple) -> "TailQueue":
        device, sources, widths, since, members, entry, now, ids = saved
        out = TailQueue(device, sources, widths, since)
        out.members, out.entry, out.now, out.ids = list(members), entry, now, set(ids)
        return out
