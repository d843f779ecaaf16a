"""The memory-aware list scheduler that m-ETF, m-SCT and the simulator share.

The scheduler repeatedly picks, among ready ops and the devices each may go to, the pair that can
start earliest (ties: topological index, then device index) and commits it: the op's group is
placed on the device if it was not yet, the tensors it reads from other devices are booked on the
communication channels, memory is allocated, and successors whose inputs are all scheduled become
ready. A `Policy` decides which devices an op may go to and may hold a device back (m-SCT keeps a
device for a favourite child); m-ETF lets every op go anywhere; the simulator fixes the device.

The model (Baechi, SoCC 2020, section 3; ETF: Hwang, Chow, Anger and Lee, SIAM J. Comput. 1989):

* A device runs one op at a time, without preemption.
* Moving tensor t from device a to b takes ``cluster.transfer_us(a, b, bytes(t))`` and occupies
  the channels of both a and b for that time but the part of the intercept that the link's K
  copies in flight overlap (`CommCost.copies_in_flight`: a copy holds intercept / K of it, so at
  most K are in flight; K = 1 by default); a tensor is sent to a device once. Transfers are
  booked in the earliest gap of both channels at or after the producer's end, so channel time is
  kept in time order, not in processing order. A gap between two bookings of a channel, or of the
  two channels together, shorter than the shortest transfer of the cluster can take no transfer
  and is closed (booked) at once.
* A device that serves its copies on the thread that runs its ops (`Device.sends_on_compute`: a
  CPU worker task, whose RecvTensor waits on its inter-op pool) starts a copy out only when it
  runs no op: at the end of the block of back-to-back ops running at the producer's end (TF runs
  a successor ready then on the same thread), as far as the ops committed so far go. Its busy
  blocks are kept sorted (starts on a device never decrease), so the check is a bisection, and
  a commit there makes the dry runs that read from it stale. The time a copy holds the channels
  is also compute time of each of its two devices that is such a task (one core serves the
  copy's RPC and the ops): the reader's op that brings a copy in runs that much longer, and the
  sender is busy that long from the send, or after the ops committed on it since. With K copies
  in flight, the hold (bytes and intercept / K) is what copies sent together are measured to
  take each (`comm_fit.fit_copies_in_flight`). GPUs copy on streams of their own.
* Memory per device: persistent bytes of every op on it for the whole step; temporary bytes while
  an op runs; an op's outputs from its start (outputs nobody reads are freed at the op's end,
  outputs of sinks are kept); a received tensor from the start of its first consumer on that
  device. A tensor is freed once all its consumers are scheduled: its copy on a device at the
  last end of its consumers there (and, on the producer's device, of its transfers out), but
  never before the start of its last consumer, the moment the scheduler learns of the free. An
  op starts only when its allocation fits under the device's capacity, waiting for frees if
  needed. An output that reuses a buffer (`OpGraph.output_alias`, `buffer_tables`) allocates
  nothing on its op's device: an input's buffer there (the producer's, or the copy received) is
  freed only when the last reader of either is done; a view of persistent memory is no buffer.
  A copy sent to another device is a buffer of its own, but on a device of shared memory
  (`Cluster.shares_memory`): the sender's buffer, held until that reader is done (a constant's
  value is a replica there, held from the start as persistent bytes are).

Start times of successive decisions on a device never decrease (across devices they may: under
m-SCT the ops a reservation held start, when it ends, before the last decision), so memory in
use can be tracked per device as a running total plus a sorted list of future frees, and the
candidate heap can be updated lazily: a stored key is a lower bound of the pair's earliest start,
re-evaluated when it reaches the top. A free that lowers a memory wait pushes the waiting pairs
again (from the device's free time), and so does a copy to a device of a tensor that ready ops
there counted a copy of. A rarer case can lower an estimate without a push, so that an op may
start a little later than the earliest start rule would give (the schedule stays valid): an op
with several copies books them in input order, so that a booking that delays its first copy can
let a later one take an earlier slot.

Ops waiting for copies that go after everything booked on busy channels share one heap entry per
(device, sources, widths) (`TailQueue`) instead of being evaluated again at each booking, and
so do the ops a policy holds back from a device to a common floor (m-SCT's reservations). The
schedules are the same as without the queues (tests compare them), unless the rare case above
meets a queued op, which is then looked at at another moment.

Of a large cluster most devices are untouched twins: devices of one of `Cluster.twins` (of one
memory and type, and interchangeable in every copy's cost) that no group or op is on yet, all in one
state, so that an op's dry run gives the same on each. Under m-ETF's and m-SCT's policies the
scheduler weighs the first of them alone (`UntouchedTwins`); when it is touched, what the scheduler
holds for it (heaps, tail queues, ops waiting for memory or unable to go there) goes to the next
twin (`ListScheduler._hand_over`), which would have held the same. Ties between equal starts go to
the lower device, the first twin, so the schedules are exactly those of weighing every device
(tests/test_many_devices.py compares them). A step looks only at the devices that hold candidates.

Two engines run it. This module (with `scheduler_state`, `policies`, `twins`, `tail_queues`,
`pins` and `snapshots`) is the readable reference; `native/scheduler.cpp` is its port to C++
(`native_scheduler.NativeListScheduler`), step for step, which `run_scheduler`'s
`run_list_scheduler` and `make_list_scheduler`, and so m-ETF, m-SCT, the simulator, refinement and
the fit search, run when `engine.current()` is "native" and the policy is `FixedPolicy`,
`EarliestStartPolicy` or m-SCT's `FavouriteChildPolicy` (`native_scheduler.POLICIES`; other
policies, subclasses included, run here). tests/test_engines.py holds the two to bit-identical
schedules: a change to the model lands in both at once. The compiled engine is C++ through pybind11,
built by setuptools: one header-only build dependency from PyPI and gcc, an extension that
setuptools may skip (`optional`) so that a machine without a compiler still installs, and a loop
over plain arrays and heaps that Cython would have kept among Python objects to stay this readable.

Time: O((V + E) * D * log(V * D)) heap work plus a gap search per copy, for V ops, E edges and
D devices weighed (those touched, plus one of each set of untouched twins), plus one
re-evaluation of each stale key that reaches the top of a heap. A booking on a channel makes
stale the keys of the ready ops that wait for a copy over it: when their last copy goes to the
channels' tail they wait in a tail queue, evaluated once per queue rather than once per op at
each booking; ops m-SCT holds back from a device kept for a favourite child wait in a pool the
same way; when their start is a copy into a gap between bookings each step may still re-evaluate
most of them. A gap search
costs O(log B) expected for B bookings of the pair in the compiled engine (a treap of gap widths,
native/gaps.hpp), and a step per gap too narrow in this reference, plus a step per copy of the
same dry run it passes. Memory O(V * D + E + P * B) for the P pairs of devices that copies joined.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.pins import place_pinned
from baechi_tf.placer.policies import Policy, ScheduleCutOff
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.scheduler_state import GraphTables, SchedulerState, _ro, _stuck
from baechi_tf.placer.snapshots import Snapshots
from baechi_tf.placer.tail_queues import TailQueue
from baechi_tf.placer.twins import UntouchedTwins
from baechi_tf.placer.work import WorkMeter, scheduler_work
from baechi_tf.progress import Progress

__all__ = ["ListScheduler"]

# Scheduling steps between progress bar updates: a step can take milliseconds when thousands of
# ready ops wait for copies over one channel, and the bar redraws only every 0.1 s anyway.
_STEPS_PER_UPDATE = 64


class ListScheduler(Snapshots):
    """One run of the list scheduler, step by step, with snapshots to resume from.

    `run_scheduler.run_list_scheduler` is the plain entry point; the refiner uses
    `snapshot`/`restore` (`snapshots.Snapshots`) to re-simulate only the part of a schedule that a
    move can change.
    """

    # Whether candidates waiting on a busy channel share one entry (`TailQueue`); the
    # schedules are the same either way but in rare cases (see the module's docstring).
    queue_tails = True
    # Whether an op has at most one entry in a device's `now` heap (`in_now`); the schedules are
    # the same either way.
    once_in_now = True

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        groups: Groups,
        policy: Policy,
        initial_group_device: Optional[Sequence[int]] = None,
        persistent_headroom: float = 0.0,
        tables: Optional[GraphTables] = None,
        cutoff_us: float = math.inf,
    ) -> None:
        self.graph, self.cluster, self.groups, self.policy = graph, cluster, groups, policy
        self.cutoff_us = cutoff_us  # `step` raises ScheduleCutOff past it
        state = self.state = SchedulerState(
            graph, cluster, groups, persistent_headroom, tables, twins=policy.twins_alike
        )
        place_pinned(graph, cluster, groups, state, initial_group_device)
        if initial_group_device is not None:
            for g, dev in enumerate(initial_group_device):
                if dev >= 0 and state.group_device[g] < 0:
                    state.place_group(g, int(dev))
        nd = state.num_devices
        # Per device: `later` holds (lower bound of start, topo, op) for ops that cannot start
        # when the device is next free; `now` holds (topo, op) for ops that can (their start is
        # the device's free time). Both are lazy: entries are checked when they reach the top.
        self.later: list[list[tuple[float, int, int]]] = [[] for _ in range(nd)]
        self.now: list[list[tuple[int, int]]] = [[] for _ in range(nd)]
        # The ops with an entry in `now`: an op's other entries that come up while it has one
        # there are dropped, since that one is looked at afresh (m-SCT's held ops, offered again
        # at each reservation's end, had dozens there each, every one evaluated at each step).
        self.in_now: list[set[int]] = [set() for _ in range(nd)]
        self.waiting: list[set[int]] = [set() for _ in range(nd)]  # ops held back by memory
        self.waited = [False] * nd  # whether any op ever waited for memory on the device
        self.dead: set[tuple[int, int]] = set()
        # The devices whose heaps may hold entries, ascending, which `step` looks at: of a large
        # cluster most have none (simulated, or untouched twins), so a step costs O(busy) and not
        # O(devices).
        self.busy: list[int] = []
        self.is_busy = [False] * nd
        # Candidates whose start is the arrival of their copies booked after everything on their
        # channels, queued per (device, source devices, copy widths) (`TailQueue`), by id.
        self.tail_queues: dict[int, TailQueue] = {}
        self.tail_ids: dict[tuple[int, tuple[int, ...], tuple[float, ...]], int] = {}
        self._next_tail_id = 0  # never reused: an entry of a dropped queue finds no queue
        self.pools: dict[int, int] = {}  # device -> id of its pool of held ops (`TailQueue`)
        # `tail_copy` when it gave the start, or (None, None, 0.0, start) when the policy held
        # the op to its `hold_floor`; see `evaluate`.
        self.tail_bound: Optional[tuple] = None
        self.scheduled = 0
        self.evaluations = 0  # calls of `evaluate`: with the steps, the work a run has done
        self.last_time = 0.0
        for op in graph.topo_order.tolist():
            if state.preds_left[op] == 0:
                self.push_ready(op, 0.0)

    # ---------------------------------------------------------------- candidates

    def push_ready(self, op: int, t: float) -> None:
        state = self.state
        g = state.group_of[op]
        gdev = state.group_device[g]
        devices = (gdev,) if gdev >= 0 else self.policy.devices(op, state)
        item = (t, state.topo[op], op)
        for d in devices:
            self._push(d, item)

    def _push(self, d: int, item: tuple[float, int, int]) -> None:
        """Pushes `item` onto d's `later` heap, from outside `best(d)`."""
        heapq.heappush(self.later[d], item)
        self._wake(d)

    def _wake(self, d: int) -> None:
        if not self.is_busy[d]:
            self.is_busy[d] = True
            bisect.insort(self.busy, d)

    def evaluate(self, op: int, dev: int) -> Optional[float]:
        """Earliest start of op on dev now, None if impossible for now (memory). Sets
        `tail_bound` to the `tail_copy` of op's dry run when that copy's arrival is the start, or
        to (None, None, 0.0, start) when the policy held op until its `hold_floor`."""
        self.evaluations += 1
        self.tail_bound = None
        state = self.state
        g = state.group_of[op]
        gdev = state.group_device[g]
        need_persistent = 0
        if gdev < 0:
            need_persistent = state.group_persistent[g]
            if state.peak[dev] + need_persistent > state.persistent_cap[dev]:
                self.dead.add((op, dev))
                return None
        elif gdev != dev:
            self.dead.add((op, dev))
            return None
        ready, new_bytes = state.ready_time(op, dev)
        copy = state.tail_copy  # this op's: a policy's hold may make dry runs of other ops
        free = state.device_free[dev]
        base = ready if ready > free else free
        need = state.alloc[op] + new_bytes + need_persistent
        t = state.memory_time(dev, need, base)
        if t is None or t > base:
            self.waiting[dev].add(op)
            self.waited[dev] = True
        if t is None:
            return None
        start = self.policy.hold(op, dev, t, state)
        if self.queue_tails:
            if start == t:
                if copy is not None and start == copy[3]:
                    self.tail_bound = copy
            else:
                floor = self.policy.hold_floor(dev, state)
                if floor is not None and start == floor[0]:
                    self.tail_bound = (None, None, 0.0, start)
        return start

    def best(self, d: int) -> Optional[tuple[float, int, int, int]]:
        """The (start, topo, device, op) that starts first on device d.

        An entry whose op is negative stands for a tail queue (`TailQueue`): in `later` its
        members start no earlier than its key, in `now` (where its members may start when the
        device is free) it hands them out one at a time in topological order.
        """
        free = self.state.device_free[d]
        h, p, in_p = self.later[d], self.now[d], self.in_now[d]
        once = self.once_in_now
        device_of, dead, evaluate = self.state.device, self.dead, self.evaluate
        while h and h[0][0] <= free:
            key, tp, op = h[0]
            if op < 0:
                queue = self._tail_entry(h, key, tp, op)
                if queue is not None:  # its members may start when the device is free
                    heapq.heappop(h)
                    queue.entry, queue.now = (free, queue.members[0][0]), True
                    heapq.heappush(p, (queue.members[0][0], op))
                continue
            heapq.heappop(h)
            if not once or op not in in_p:
                in_p.add(op)
                heapq.heappush(p, (tp, op))
        while p:
            tp, op = p[0]
            if op < 0:
                queue = self.tail_queues.get(-1 - op)
                if queue is None or not queue.now or queue.entry[1] != tp:
                    heapq.heappop(p)  # an entry the queue no longer has
                    continue
                mt, m, _ = queue.pop()
                if queue.members:
                    queue.entry = (free, queue.members[0][0])
                    heapq.heapreplace(p, (queue.entry[1], op))
                else:
                    heapq.heappop(p)
                    self._drop(queue)
                if not once or m not in in_p:
                    in_p.add(m)
                    heapq.heappush(p, (mt, m))
                continue
            if device_of[op] >= 0 or (op, d) in dead:
                heapq.heappop(p)
                in_p.discard(op)
                continue
            v = evaluate(op, d)
            if v is None:
                heapq.heappop(p)
                in_p.discard(op)
            elif v > free:
                heapq.heappop(p)
                in_p.discard(op)
                self._defer(h, d, tp, op, v)
            else:
                return (v, tp, d, op)
        while h:
            key, tp, op = h[0]
            if op < 0:
                queue = self._tail_entry(h, key, tp, op)
                if queue is not None:  # its first member may start at `key`: look at it alone
                    mt, m, _ = queue.pop()
                    if device_of[m] < 0 and (m, d) not in dead:
                        v = evaluate(m, d)
                        if v is not None:
                            heapq.heappush(h, (v, mt, m))
                continue
            if device_of[op] >= 0 or (op, d) in dead:
                heapq.heappop(h)
                continue
            v = evaluate(op, d)
            if v is None:
                heapq.heappop(h)
            elif v > key:
                if self.tail_bound is None:
                    heapq.heapreplace(h, (v, tp, op))
                else:
                    heapq.heappop(h)
                    self._defer(h, d, tp, op, v)
            else:
                return (v, tp, d, op)
        return None

    def _hand_over(self, dev: int, twin: int) -> None:
        """Gives `twin` what the scheduler holds for `dev`, the untouched twin it stands in for
        from now on (`UntouchedTwins.stand_in`): had every twin been weighed, it would hold the
        same, as each of their dry runs gave what dev's gave. Its tail queues are copies, with
        ids new and in the same order (heap entries with equal keys compare by them)."""
        ids = {op for h in (self.later[dev], self.now[dev]) for *_, op in h if op < 0}
        ids.update(-1 - qid for qid, q in self.tail_queues.items() if q.device == dev)
        new = {}
        for op in sorted(ids, reverse=True):  # ascending queue ids
            qid = new[op] = self._next_tail_id
            self._next_tail_id += 1
            queue = self.tail_queues.get(-1 - op)
            if queue is not None and queue.device == dev:
                copy = self.tail_queues[qid] = TailQueue.restored(queue.saved())
                copy.device = twin
                self.tail_ids[(twin, copy.sources, copy.widths)] = qid
                if copy.pool:
                    self.pools[twin] = qid
        self.later[twin] = [(k, tp, -1 - new[op] if op < 0 else op) for k, tp, op in self.later[dev]]
        self.now[twin] = [(tp, -1 - new[op] if op < 0 else op) for tp, op in self.now[dev]]
        self.in_now[twin] = set(self.in_now[dev])
        self.waiting[twin] = set(self.waiting[dev])
        self.waited[twin] = self.waited[dev]
        self.dead.update([(op, twin) for op, d in self.dead if d == dev])
        self._wake(twin)

    def _rest(self) -> None:
        """Drops from `busy` the devices whose heaps are empty."""
        busy = []
        for d in self.busy:
            if self.later[d] or self.now[d]:
                busy.append(d)
            else:
                self.is_busy[d] = False
        self.busy = busy

    # ---------------------------------------------------------------- tail queues

    def _defer(self, h: list, d: int, tp: int, op: int, v: float) -> None:
        """Puts (op, d), just evaluated to start at v, back among d's later candidates: into
        the tail queue of its copy when the copy's arrival is its start (`tail_bound`)."""
        copy = self.tail_bound
        if copy is None:
            heapq.heappush(h, (v, tp, op))
            return
        sources, widths, start, _ = copy
        qkey = (d, sources, widths)
        qid = self.tail_ids.get(qkey)
        queue = self.tail_queues[qid] if qid is not None else None
        if queue is not None and queue.now:
            # Its members were offered as able to start when the device is free; this one's
            # copies, over the same pairs, still go after the tails, so theirs do too if the
            # pairs stayed solid (they wait in `later` again, from when such copies are in); if
            # not, they stay in `now`. Likewise for ops held to the policy's floor. If the bound
            # is the device's free time or earlier, its members may still start then: the queue
            # stays in `now` (moved to `later`, where `best` has already looked, they would be
            # missed) and this one waits alone.
            bound = self._queue_bound(queue)
            if bound is not None and bound <= self.state.device_free[d]:
                heapq.heappush(h, (v, tp, op))
                return
            if bound is not None:
                bound = min(bound, v)
                queue.now, queue.entry = False, (bound, queue.members[0][0])
                heapq.heappush(h, (bound, queue.members[0][0], -1 - qid))
            else:
                for mt, m, _ in queue.members:
                    if not self.once_in_now or m not in self.in_now[d]:
                        self.in_now[d].add(m)
                        heapq.heappush(self.now[d], (mt, m))
                self._drop(queue)
                queue = None
        if queue is None:
            qid = self.tail_ids[qkey] = self._next_tail_id
            self._next_tail_id += 1
            queue = self.tail_queues[qid] = TailQueue(d, sources, widths, start)
            if queue.pool:
                self.pools[d] = qid
        elif start < queue.since:
            queue.since = start
        queue.push(tp, op, v)
        if queue.entry is None or (v, tp) < queue.entry:
            queue.entry = (v, tp)
            heapq.heappush(h, (v, tp, -1 - qid))

    def _tail_entry(self, h: list, key: float, tp: int, op: int) -> Optional["TailQueue"]:
        """Looks at the entry (key, tp, op) of a tail queue at the top of `h`. Returns the queue
        when the entry is exact: the queue's first member can start no earlier than `key`, and
        may start then. Otherwise drops the entry (its queue was emptied or entered again),
        raises it to the queue's bound now, or, when the channels are no longer solid behind
        the queue's copies, puts the members back as plain candidates; and returns None."""
        queue = self.tail_queues.get(-1 - op)
        if queue is None or queue.now or queue.entry != (key, tp):
            heapq.heappop(h)
            return None
        members, device_of, dead, d = queue.members, self.state.device, self.dead, queue.device
        while members and (device_of[members[0][1]] >= 0 or (members[0][1], d) in dead):
            queue.pop()
        if not members:
            heapq.heappop(h)
            self._drop(queue)
            return None
        start = self._queue_bound(queue)
        if start is None:
            heapq.heappop(h)
            self._drop(queue)
            # Each start they were queued with is still a lower bound, but for a pool's (held
            # under a reservation that may have ended): the device's free time is one.
            free = self.state.device_free[d] if queue.pool else None
            for mt, m, v in members:
                if device_of[m] < 0:
                    heapq.heappush(h, (v if free is None else free, mt, m))
            return None
        bound = (start, members[0][0])
        if bound > queue.entry:
            queue.entry = bound
            heapq.heapreplace(h, (bound[0], bound[1], op))
            return None
        return queue

    def _queue_bound(self, queue: "TailQueue") -> Optional[float]:
        """No member of `queue` starts before this, if not None (`TailQueue`).

        A pool's: the policy's floor, unless the op exempt from it is a member (None); the
        device's free time while the policy holds nothing back there."""
        if not queue.pool:
            return self.state.tail_start(queue.sources, queue.widths, queue.device, queue.since)
        floor = self.policy.hold_floor(queue.device, self.state)
        if floor is None:
            return self.state.device_free[queue.device]
        return None if floor[1] in queue.ids else floor[0]

    def _drop(self, queue: "TailQueue") -> None:
        qkey = (queue.device, queue.sources, queue.widths)
        del self.tail_queues[self.tail_ids.pop(qkey)]
        if queue.pool:
            del self.pools[queue.device]

    # ---------------------------------------------------------------- running

    def step(self) -> Optional[tuple[int, int, float]]:
        """Commits the next (op, device, start), or returns None when nothing can run."""
        state = self.state
        choice = None
        later, now = self.later, self.now
        idle = False
        for d in self.busy:
            if not later[d] and not now[d]:
                idle = True  # nothing can go there until a push
                continue
            c = self.best(d)
            if c is not None and (choice is None or c < choice):
                choice = c
        if idle:
            self._rest()
        if choice is None:
            return None
        t, _, dev, op = choice
        if t > self.cutoff_us:
            raise ScheduleCutOff(t, self.cutoff_us)
        g = state.group_of[op]
        first_of_group = state.group_device[g] < 0
        copies = len(state.transfers)
        twin = state.twins.stand_in(dev)
        if twin is not None:
            self._hand_over(dev, twin)
        newly_free = state.commit(op, dev, t)
        for tr in state.transfers[copies:]:
            # A tensor is sent to a device once: the ready ops reading it there counted a copy
            # of their own in their keys, and may start earlier now. Offered again (t bounds
            # their start), whether their entry waits in `later` or in a tail queue.
            to = tr.dst_device
            for w in state.readers[tr.tensor]:
                if state.device[w] < 0 and state.preds_left[w] == 0:
                    gdev = state.group_device[state.group_of[w]]
                    if gdev == to or gdev < 0 and to in self.policy.devices(w, state):
                        self._push(to, (t, state.topo[w], w))
        self.scheduled += 1
        self.last_time = t
        released = self.policy.committed(op, dev, state)
        topo, device_of = state.topo, state.device
        for d, qid in self.pools.items():
            pool = self.tail_queues[qid]
            free = state.device_free[d]
            if not pool.now and pool.entry[0] > free and self.policy.hold_floor(d, state) is None:
                # Its floor no longer holds: its entry goes down to the device's free time, a
                # lower bound of every start there, once for all its members.
                pool.entry = (free, pool.entry[1])
                self._push(d, (*pool.entry, -1 - qid))
        for w, d in released or ():
            qid = self.pools.get(d)
            if qid is not None and w in self.tail_queues[qid].ids:
                continue  # its pool's entry went down just above
            if device_of[w] < 0:  # the device's free time is a lower bound of w's start there
                # The entry w was held with stays in the heap: if it comes up while this one
                # waits in `now`, it is dropped there (`in_now`).
                self._push(d, (state.device_free[d], topo[w], w))
        for d in newly_free:
            # The device's free time bounds w's start there; `t` does not, as m-SCT's starts
            # can go back in time when a reservation ends.
            free = state.device_free[d]
            for w in self.waiting[d]:
                if device_of[w] < 0:
                    self._push(d, (free, topo[w], w))
            self.waiting[d].clear()
        for s in state.succ[op]:
            if state.preds_left[s] == 0:
                self.push_ready(s, t)
        members = self.groups.members[g]
        if first_of_group and len(members) > 1:
            # Ready members of a group placed just now may only go where the group went.
            for m in members.tolist():
                if device_of[m] < 0 and state.preds_left[m] == 0:
                    self.dead.discard((m, dev))
                    self._push(dev, (t, topo[m], m))
        return op, dev, t

    @property
    def done(self) -> bool:
        return self.scheduled == self.graph.num_ops

    def run(self, bar: Optional[Progress] = None, meter: Optional[WorkMeter] = None) -> None:
        """Runs to the end; raises `InfeasiblePlacementError` when ops are left unscheduled, and
        `OverWorkCap` when `meter` sees its work pass the cap. `bar` is told of the ops scheduled
        now and then."""
        steps = 0
        while self.step() is not None:
            steps += 1
            if steps % _STEPS_PER_UPDATE == 0:
                if bar is not None:
                    bar.update(self.scheduled)
                if meter is not None:
                    meter.check(self.scheduled + scheduler_work(self))
        if not self.done:
            slots = self.state.copy_slots
            error = _stuck(self.graph, self.cluster, self.groups, self.state)
            # Its dry runs make the message, not the schedule: no work (`work`), as in the
            # compiled engine, whose message reads the bytes alone.
            self.state.copy_slots = slots
            raise error

    def schedule(self, method: str) -> Schedule:
        state = self.state
        return Schedule(
            placement=Placement(np.asarray(state.device, dtype=np.int32), method),
            start_us=_ro(np.asarray(state.start, dtype=np.float64)),
            end_us=_ro(np.asarray(state.end, dtype=np.float64)),
            transfers=tuple(state.transfers),
            peak_memory_bytes=tuple(int(p) for p in state.peak),
            order=_ro(np.asarray(state.order, dtype=np.int32)),
        )
