"""Snapshots of a run of the Python engine's list scheduler, to resume from.

The refiner re-simulates only the part of a schedule that a move can change: it takes a
`snapshot` of a run now and then and `restore`s the last one before the first op a move touches
(`auto.refine`). `Snapshots` gives `list_scheduler.ListScheduler` the two methods; the compiled
engine's scheduler has its own (`native_scheduler.NativeSnapshot`). A snapshot copies everything
a step changes (ops' devices and times, tensors' uses, bookings, memory, heaps, tail queues) and
shares the tables no step changes: time and memory linear in what it copies.
"""

from __future__ import annotations

from baechi_tf.placer.tail_queues import TailQueue
from baechi_tf.placer.twins import UntouchedTwins

__all__ = ["Snapshots"]


class Snapshots:
    """`snapshot` and `restore` of a `ListScheduler` (its `state`, heaps and tail queues)."""

    _STATE_FIELDS = (
        "device", "start", "end", "order", "device_free", "last_op", "usage", "peak",
        "tensor_consumers_left", "preds_left", "group_device", "transfers",
    )

    def snapshot(self) -> dict:
        """A copy of everything a step changes (static arrays are shared)."""
        st = self.state
        snap = {f: list(getattr(st, f)) for f in self._STATE_FIELDS}
        snap["chan_start"] = [list(x) for x in st.chan_start]
        snap["chan_end"] = [list(x) for x in st.chan_end]
        snap["busy_start"] = [list(x) for x in st.busy_start]
        snap["busy_end"] = [list(x) for x in st.busy_end]
        snap["pair_lists"] = {k: (list(s), list(e)) for k, (s, e) in st.pair_lists.items()}
        snap["pending"] = [list(x) for x in st.pending]
        snap["twins"] = st.twins.saved()
        snap["arrival"] = dict(st.arrival)
        snap["release"] = {t: dict(r) for t, r in st.release.items()}
        snap["claims"] = {k: list(c) for k, c in st.claims.items()}
        snap["later"] = [list(x) for x in self.later]
        snap["now"] = [list(x) for x in self.now]
        snap["waiting"] = [set(x) for x in self.waiting]
        snap["waited"] = list(self.waited)
        snap["dead"] = set(self.dead)
        snap["tail_queues"] = {qid: q.saved() for qid, q in self.tail_queues.items()}
        snap["next_tail_id"] = self._next_tail_id
        snap["scheduled"] = self.scheduled
        snap["last_time"] = self.last_time
        return snap

    def restore(self, snap: dict) -> None:
        """Returns to `snap` (which stays usable for later restores)."""
        st = self.state
        for f in self._STATE_FIELDS:
            setattr(st, f, list(snap[f]))
        st.chan_start = [list(x) for x in snap["chan_start"]]
        st.chan_end = [list(x) for x in snap["chan_end"]]
        st.busy_start = [list(x) for x in snap["busy_start"]]
        st.busy_end = [list(x) for x in snap["busy_end"]]
        st.pair_lists = {k: (list(s), list(e)) for k, (s, e) in snap["pair_lists"].items()}
        st.pairs_of = [[] for _ in range(st.num_devices)]
        for a, b in st.pair_lists:  # in the order they were made
            st.pairs_of[a].append((a, b))
            if b != a:
                st.pairs_of[b].append((a, b))
        st.pending = [list(x) for x in snap["pending"]]
        st.twins = UntouchedTwins.restored(snap["twins"])
        st.arrival = dict(snap["arrival"])
        st.ready_memo.clear()  # versions only grow, but the memo may hold dry runs made after snap
        st.memo_devices.clear()
        st.release = {t: dict(r) for t, r in snap["release"].items()}
        st.claims = {k: list(c) for k, c in snap["claims"].items()}
        self.later = [list(x) for x in snap["later"]]
        self.now = [list(x) for x in snap["now"]]
        self.in_now = [{op for _, op in x if op >= 0} for x in self.now]
        self.is_busy = [True] * len(self.later)
        self.busy = list(range(len(self.later)))
        self._rest()
        self.waiting = [set(x) for x in snap["waiting"]]
        self.waited = list(snap["waited"])
        self.dead = set(snap["dead"])
        self.tail_queues = {qid: TailQueue.restored(q) for qid, q in snap["tail_queues"].items()}
        self.tail_ids = {(q.device, q.sources, q.widths): qid for qid, q in self.tail_queues.items()}
        self.pools = {q.device: qid for qid, q in self.tail_queues.items() if q.pool}
        # Ids only grow: a queue made from here on must not take the id of one in the snapshot.
        self._next_tail_id = max(self._next_tail_id, snap["next_tail_id"])
        self.scheduled = snap["scheduled"]
        self.last_time = snap["last_time"]
