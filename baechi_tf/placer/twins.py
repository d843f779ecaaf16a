"""The devices of a cluster that no op is on yet and that any op would find alike.

Of a large cluster most devices are untouched twins: devices of one of `Cluster.twins` (of one
memory and type, and interchangeable in every copy's cost) that no group or op is on yet. Weighing
an op on any of them gives what it gives on the first, so the placers weigh that one alone
(`UntouchedTwins.distinct`); how the list scheduler hands over what it holds for a twin once it is
touched is told in `baechi_tf.placer.list_scheduler`. `touch` is O(D) for D devices (a sorted
insert), `stand_in` O(1).
"""

from __future__ import annotations

import bisect
from typing import Optional, Sequence

from baechi_tf.cluster import Cluster

__all__ = ["UntouchedTwins"]


class UntouchedTwins:
    """The devices of each set of `Cluster.twins` that no group or op has been put on yet: all
    in one state (no memory in use, free from time 0, no copies booked), so that weighing an op
    on any of them gives what it gives on the first, their stand-in. `distinct` lists the
    devices worth weighing, ascending: all but the untouched twins after the first of each set
    (with `enabled` or `skip` False, every device). A device leaves its set when it is `touch`ed.
    """

    # Whether the placers weigh one of each set of untouched twins (m-ETF and m-SCT through
    # `ListScheduler._hand_over`, HEFT); the placements are the same either way (the tests
    # compare them with every device weighed).
    skip = True

    def __init__(self, cluster: Cluster, enabled: bool = True) -> None:
        nd = cluster.num_devices
        self.set_of = [-1] * nd  # per device, the index of its set while it is untouched
        self.untouched: list[list[int]] = []  # per set, its untouched devices, ascending
        self.distinct: Sequence[int] = range(nd)  # a range while it holds every device
        if enabled and self.skip and cluster.twins():
            self.untouched = [list(t) for t in cluster.twins()]
            for k, members in enumerate(self.untouched):
                for d in members:
                    self.set_of[d] = k
            firsts = {members[0] for members in self.untouched}
            self.distinct = [d for d in range(nd) if self.set_of[d] < 0 or d in firsts]

    def stand_in(self, dev: int) -> Optional[int]:
        """The untouched twin that takes `dev`'s place in `distinct` once `dev` is touched."""
        k = self.set_of[dev]
        if k < 0:
            return None
        members = self.untouched[k]
        return members[1] if members[0] == dev and len(members) > 1 else None

    def touch(self, dev: int) -> None:
        """`dev` gets a group or an op: it leaves its set, and it and its stand-in are in
        `distinct`."""
        k = self.set_of[dev]
        if k < 0:
            return
        self.set_of[dev] = -1
        members = self.untouched[k]
        first = members[0] == dev
        members.remove(dev)
        assert isinstance(self.distinct, list)  # a set has untouched devices only when enabled
        if not first:
            bisect.insort(self.distinct, dev)
        elif members:
            bisect.insort(self.distinct, members[0])

    def saved(self) -> tuple:
        """Its state as plain data (a snapshot's), for `restored`."""
        distinct = list(self.distinct) if isinstance(self.distinct, list) else self.distinct
        return list(self.set_of), [list(m) for m in self.untouched], distinct

    @staticmethod
    def restored(saved: tuple) -> "UntouchedTwins":
        out = object.__new__(UntouchedTwins)
        out.set_of, out.untouched, out.distinct = saved
        out.set_of, out.untouched, out.distinct = out.saved()  # copies: `saved` stays usable
        return out
