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
  the channels of both a and b for that time; a tensor is sent to a device once. Transfers are
  booked in the earliest gap of both channels at or after the producer's end, so channel time is
  kept in time order, not in processing order. A gap between two bookings of a channel, or of the
  two channels together, shorter than the shortest transfer of the cluster can take no transfer
  and is closed (booked) at once.
* A device that serves its copies on the thread that runs its ops (`Device.sends_on_compute`: a
  CPU worker task, whose RecvTensor waits on its inter-op pool) starts a copy out only when it
  runs no op: at the end of the block of back-to-back ops running at the producer's end (TF runs
  a successor ready then on the same thread), as far as the ops committed so far go. Its busy
  blocks are kept sorted (starts on a device never decrease), so the check is a bisection, and
  a commit there makes the dry runs that read from it stale. GPUs copy on streams of their own.
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
  A copy of it sent to another device is a buffer of its own.

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
(device, sources, widths) (`_TailQueue`) instead of being evaluated again at each booking, and
so do the ops a policy holds back from a device to a common floor (m-SCT's reservations). The
schedules are the same as without the queues (tests compare them; so did 2,902 m-SCT, m-ETF and
simulator schedules of 1,408 seeded random and benchmark graphs and clusters, and 9,491 of 9,495
m-SCT runs on integer-timed random graphs where ties abound), unless the rare case above meets a
queued op, which is then looked at at another moment (the 4 others).

Of a large cluster most devices are untouched twins: devices of one of `Cluster.twins` (of one
memory and type, and interchangeable in every copy's cost) that no group or op is on yet, all in
one state, so that an op's dry run gives the same on each. Under m-ETF's and m-SCT's policies
the scheduler weighs the first of them alone (`UntouchedTwins`); when it is touched, what the
scheduler holds for it (heaps, tail queues, ops waiting for memory or unable to go there) goes to
the next twin (`ListScheduler._hand_over`), which would have held the same. Ties between equal
starts go to the lower device, the first twin, so the schedules are exactly those of weighing
every device (tests/test_many_devices.py compares them). A 2,000-op layered graph on 1,024
devices of 16 GiB, of which m-ETF and m-SCT use 22 (bench/placement_scaling.py --devices 1024):
m-ETF took 50 s, now 1.2 s; m-SCT 66 s, now 2.4 s; auto 198 s, now 8 s (at 4 devices, 0.19, 1.0
and 4.3 s, then and now). A step looks only at the devices that hold candidates.

Two engines run it. This module is the readable reference; `native/scheduler.cpp` is its port to
C++ (`native_scheduler.NativeListScheduler`), step for step, which `run_list_scheduler`, `make_list_scheduler` and
so m-ETF, m-SCT, the simulator, refinement and the fit search run when `engine.current()` is
"native" and the policy is `FixedPolicy`, `EarliestStartPolicy` or m-SCT's `FavouriteChildPolicy`
(`native_scheduler.POLICIES`; other policies, subclasses included, run here).
tests/test_engines.py holds the two to bit-identical schedules: a change to the model lands in
both at once. The compiled engine is C++ through pybind11, built by setuptools: one header-only
build dependency from PyPI and gcc, an extension that setuptools may skip (`optional`) so that a
machine without a compiler still installs, and a loop over plain arrays and heaps that Cython
would have kept among Python objects to stay this readable.

Time: O((V + E) * D * log(V * D)) heap work plus a gap search per copy, for V ops, E edges and
D devices weighed (those touched, plus one of each set of untouched twins), plus one
re-evaluation of each stale key that reaches the top of a heap. A booking on a channel makes
stale the keys of the ready ops that wait for a copy over it: when their last copy goes to the
channels' tail they wait in a tail queue (thousands of updates of one variable fed
from other devices: about 4.5 evaluations per op, where each booking re-evaluated every waiting
op; a 1,200-op fan-out placed by m-ETF, whose source goes to the tail and each op's own input
into a gap: 11,500 evaluations, 161,000 when only ops all of whose copies went to the tail were
queued); ops m-SCT holds back from a device kept for a favourite child wait in a pool (chained
updates of one variable: 6,982 evaluations at 1,601 ops, 69,997 before); when their start is a
copy into a gap between bookings each step may still re-evaluate most of them. A gap search
costs O(log B) expected for B bookings of the pair in the compiled engine (a treap of gap widths,
native/gaps.hpp), and a step per gap too narrow in this reference, plus a step per copy of the
same dry run it passes. Memory O(V * D + E + P * B) for the P pairs of devices that copies joined.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.buffers import HELD_VIEW, OWN, buffer_tables, free_at_end_bytes
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.schedule import Placement, Schedule, Transfer
from baechi_tf.placer.work import WorkMeter, current_meter, scheduler_work
from baechi_tf.progress import Progress

__all__ = [
    "EarliestStartPolicy",
    "FixedPolicy",
    "GraphTables",
    "ListScheduler",
    "Policy",
    "ScheduleCutOff",
    "SchedulerState",
    "UntouchedTwins",
    "byte_formatter",
    "format_bytes",
    "free_at_end_bytes",
    "make_list_scheduler",
    "pinned_device_index",
    "pinned_group_devices",
    "run_list_scheduler",
    "run_with_headroom",
]

_INF = float("inf")
# Scheduling steps between progress bar updates: a step can take milliseconds when thousands of
# ready ops wait for copies over one channel, and the bar redraws only every 0.1 s anyway.
_STEPS_PER_UPDATE = 64


def _tentative(extra: dict, devices: tuple[int, int], s: float, e: float, gap: float) -> None:
    """Books [s, e) in a dry run's `extra` (device -> (starts, ends)) on both devices, unless it
    is empty (s + w == s: see `SchedulerState.ready_time`), merged as `_close_in` merges with the
    bookings closer than `gap`, the shortest transfer. No transfer fits such a gap (for t >= e
    and w >= gap, t + w >= e + gap > the next start), so `_slot` gives the same answers, and the
    many copies into one op (an op with hundreds of control inputs) make one booking, not a list
    that `_slot` walks copy by copy."""
    if e > s:
        for d in devices:
            starts, ends = extra.setdefault(d, ([], []))
            _close_in(starts, ends, s, e, gap)


def _close_in(starts: list[float], ends: list[float], s: float, e: float, gap: float) -> None:
    """Books [s, e) in the sorted, disjoint bookings (starts, ends), merged with the bookings
    closer than `gap` (the shortest transfer): such a gap can never be used, and dropping it
    keeps the lists short. The result does not depend on the order of the bookings."""
    i = bisect.bisect_left(starts, s)
    if i > 0 and ends[i - 1] + gap > s:
        i -= 1
        s = starts[i]
        e = max(e, ends[i])
        del starts[i], ends[i]
    while i < len(starts) and starts[i] < e + gap:
        e = max(e, ends[i])
        del starts[i], ends[i]
    starts.insert(i, s)
    ends.insert(i, e)


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def byte_formatter(*sizes: float) -> Callable[[float], str]:
    """`format_bytes`, or exact bytes ("3,200 B") when it would show two of `sizes` alike: a
    message comparing sizes must not say that 3.12 KiB exceed 3.12 KiB."""
    shown: dict[str, float] = {}
    for n in sizes:
        if shown.setdefault(format_bytes(n), n) != n:
            return lambda n: f"{int(n):,} B"
    return format_bytes


class Policy:
    """Which devices an op may take, and whether a device is held back at a time.

    Subclasses override `devices` and optionally `hold` and `committed`.
    """

    # Whether `devices` and `hold` treat untouched twins alike (`Cluster.twins`): then the
    # scheduler weighs one of each set of them (`SchedulerState.distinct`).
    twins_alike = False

    def devices(self, op: int, state: "SchedulerState") -> Iterable[int]:
        """The devices `op` may go to; by default every one of `SchedulerState.distinct`."""
        return state.distinct

    def hold(self, op: int, device: int, start: float, state: "SchedulerState") -> float:
        """The earliest time `op` may start on `device`, given its earliest feasible `start`.

        Must not decrease as the schedule grows (a held device can only be released later).
        """
        return start

    def hold_floor(self, device: int, state: "SchedulerState") -> Optional[tuple[float, int]]:
        """(floor, exempt) while `device` holds ops back: no op whose group is on no device,
        `exempt` aside, starts on `device` before `floor`, which does not decrease until
        `committed` releases the ops held there. None when there is no such bound. Ops held to
        the floor wait in one pool per device (`_TailQueue`) with one heap entry."""
        return None

    def committed(
        self, op: int, device: int, state: "SchedulerState"
    ) -> Optional[Iterable[tuple[int, int]]]:
        """Called after `op` was scheduled on `device`.

        May return (op, device) pairs whose hold was lifted: the scheduler looks at them again.
        """
        return None


class EarliestStartPolicy(Policy):
    """m-ETF: any device, earliest start first."""

    twins_alike = True


class FixedPolicy(Policy):
    """The simulator: every op on the device the placement gives it."""

    def __init__(self, device_of: Sequence[int]) -> None:
        self.device_of = [int(d) for d in device_of]

    def devices(self, op: int, state: "SchedulerState") -> Iterable[int]:
        return (self.device_of[op],)


class ScheduleCutOff(Exception):
    """A run's next op would start after the run's `cutoff_us`: whatever it could still
    schedule ends later. `place_auto` stops placements that can no longer be of use this way."""

    def __init__(self, start_us: float, cutoff_us: float) -> None:
        super().__init__(f"an op would start at {start_us:.1f} us, after the cutoff {cutoff_us:.1f} us")
        self.start_us = start_us
        self.cutoff_us = cutoff_us

    def __reduce__(self):  # pickled from a worker process (`workers`)
        return ScheduleCutOff, (self.start_us, self.cutoff_us)


class GraphTables:
    """What every scheduler of a graph reads and none changes (tuples, so none can): build it
    once and hand it to each `ListScheduler` of the graph, as the refiner does (one per move)."""

    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        self.compute = tuple(graph.compute_us.tolist())
        self.topo = tuple(graph.topo_index.tolist())
        # Inputs of each op: (producer, tensor, bytes), one per edge in edge order, so one per
        # distinct tensor: an OpGraph holds no repeated edge.
        edge_tensor = graph.edge_tensor.tolist()
        self.tensor_bytes = tensor_bytes = tuple(graph.tensor_bytes.tolist())
        src = graph.edge_src.tolist()
        dst = graph.edge_dst.tolist()
        inputs: list[list[tuple[int, int, int]]] = [[] for _ in range(graph.num_ops)]
        consumers = [0] * graph.num_tensors
        for e in range(graph.num_edges):
            t = edge_tensor[e]
            inputs[dst[e]].append((src[e], t, tensor_bytes[t]))
            consumers[t] += 1
        self.inputs = tuple(tuple(i) for i in inputs)
        self.consumers = tuple(consumers)
        readers: list[list[int]] = [[] for _ in range(graph.num_tensors)]
        for e in range(graph.num_edges):
            readers[edge_tensor[e]].append(dst[e])
        self.readers = tuple(tuple(r) for r in readers)  # per tensor, the ops reading it
        self.succ = graph.successors  # a tuple of tuples, cached on the graph
        self.num_preds = tuple(len(p) for p in graph.predecessors)
        own, alias, _ = buffer_tables(graph)
        self.alloc = tuple((own + graph.temp_bytes).tolist())
        self.free_at_end = tuple(free_at_end_bytes(graph))
        # per tensor, OWN, HELD_VIEW or the tensor whose buffer it is on its producer's device
        self.tensor_alias = tuple(alias.tolist())
        self.tensor_src = tuple(graph.tensor_src.tolist())
        # per op, the tensors whose buffers on its device its outputs that are read reuse
        aliased: list[list[int]] = [[] for _ in range(graph.num_ops)]
        for t in np.flatnonzero(alias >= 0).tolist():
            aliased[self.tensor_src[t]].append(self.tensor_alias[t])
        self.aliased = tuple(tuple(a) for a in aliased)
        self.persistent = tuple(graph.persistent_bytes.tolist())


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


class SchedulerState:
    """The evolving schedule: device clocks, channels, memory, tensor copies, op times.

    Policies read it; only the scheduler changes it.
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        groups: Groups,
        persistent_headroom: float = 0.0,
        tables: Optional[GraphTables] = None,
        twins: bool = False,
    ) -> None:
        n = graph.num_ops
        nd = cluster.num_devices
        self.graph = graph
        self.cluster = cluster
        self.groups = groups
        self.num_devices = nd
        if tables is None:
            tables = GraphTables(graph)
        elif tables.graph is not graph:
            raise ValueError("the GraphTables given were built for another graph")
        self.compute = tables.compute
        self.topo = tables.topo
        self.group_of = groups.group_of.tolist()
        self.capacity = [d.memory_bytes for d in cluster.devices]
        # Groups are placed only while persistent memory leaves this share of a device free for
        # tensors (m-ETF retries with more headroom when it runs out of memory).
        self.persistent_cap = [int(c * (1 - persistent_headroom)) for c in self.capacity]
        self.slope, self.intercept = cluster.link_tables()
        self.inputs = tables.inputs
        self.readers = tables.readers
        self.tensor_bytes = tables.tensor_bytes
        self.tensor_consumers_left = list(tables.consumers)
        self.succ = tables.succ
        self.preds_left = list(tables.num_preds)
        self.alloc = tables.alloc
        self.free_at_end = tables.free_at_end
        self.persistent = tables.persistent
        self.group_persistent = groups.byte_sums(graph.persistent_bytes).tolist()
        self.group_device = [-1] * groups.num_groups

        self.device = [-1] * n
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.order: list[int] = []
        self.device_free = [0.0] * nd  # compute clock
        self.last_op = [-1] * nd
        self.min_transfer_us = cluster.min_link_intercept_us()
        # Of each device that sends on its compute thread (`Device.sends_on_compute`), when it
        # runs ops: runs back to back merged into one busy block, sorted (`_sender_idle`).
        self.sends_on_compute = list(cluster.sends_on_compute())
        self.busy_start: list[list[float]] = [[] for _ in range(nd)]
        self.busy_end: list[list[float]] = [[] for _ in range(nd)]
        self.chan_start: list[list[float]] = [[] for _ in range(nd)]
        self.chan_end: list[list[float]] = [[] for _ in range(nd)]
        # The bookings of two channels together, per pair (a, b), a < b, made when a copy between
        # them first looks for a slot and kept up to date from then on (`_pair`).
        self.pair_lists: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        self.pairs_of: list[list[tuple[int, int]]] = [[] for _ in range(nd)]
        # Bumped whenever a device's channel or its received copies change; a dry run of
        # `ready_time` is remembered per (op, device) with the sum of the versions it read (they
        # only grow, so an equal sum means nothing it read has changed).
        self.chan_version = [0] * nd
        self.ready_memo: dict[tuple[int, int], tuple[int, tuple[float, int, Optional[tuple]]]] = {}
        self.memo_devices: dict[int, set[int]] = {}  # op -> the devices of its entries in ready_memo
        # Of the last dry run of `ready_time`, when its copies went one after another after
        # every booking of the channels they use, starting at the tail (`channel_tail`):
        # (source devices, widths, tail, last arrival), copies in input order; else None.
        # `ListScheduler` queues such ops in `_TailQueue`s.
        self.tail_copy: Optional[tuple[tuple[int, ...], tuple[float, ...], float, float]] = None
        self.usage = [0] * nd
        self.peak = [0] * nd
        self.pending: list[list[tuple[float, int]]] = [[] for _ in range(nd)]  # sorted frees
        self.arrival: dict[tuple[int, int], float] = {}  # (tensor, device) -> copy available
        self.release: dict[int, dict[int, float]] = {}  # tensor -> device -> last use
        # (tensor, device) -> [holders, latest release]: a buffer that outputs reusing it hold
        # too; freed when its own consumers and every such output are done (`_release`)
        self.claims: dict[tuple[int, int], list] = {}
        self.tensor_alias = tables.tensor_alias
        self.tensor_src = tables.tensor_src
        self.aliased = tables.aliased
        self.twins = UntouchedTwins(cluster, twins)  # `distinct`: the devices worth a dry run
        self.transfers: list[Transfer] = []
        self.copy_slots = 0  # copies given a slot on the channels (booked, or tried in dry runs), for the refiner

    # ---------------------------------------------------------------- channels

    def _slot(self, a: int, b: int, t: float, w: float, extra: dict) -> float:
        """Earliest start >= t of a w-long interval free on the channels of a and b.

        `extra` maps a device to the (starts, ends) of tentative bookings of the same dry run. The
        channels' bookings together (`_pair`) have no gap shorter than the shortest transfer, so
        each too-short gap stepped over is one that a transfer of another width could take.
        """
        if w <= 0:
            return t
        self.copy_slots += 1
        lists = [self._pair(a, b)]
        for d in (a, b):
            if d in extra:
                lists.append(extra[d])
        while True:
            t0 = t
            for starts, ends in lists:
                if ends and ends[-1] > t:
                    i = bisect.bisect_right(ends, t)  # the first booking ending after t
                    while i < len(ends) and starts[i] < t + w:
                        t = ends[i]
                        i += 1
            if t == t0 or len(lists) == 1:  # one list: its gap at t is free
                return t

    def _send_slot(self, a: int, b: int, t: float, w: float, extra: dict) -> float:
        """`_slot` for a copy from a to b, which, when a sends on its compute thread
        (`Device.sends_on_compute`), also starts only when a runs no op (`_sender_idle`). Each
        round moves the start to the end of a busy block or of a booking, so it ends."""
        if not self.sends_on_compute[a]:
            return self._slot(a, b, t, w, extra)
        while True:
            t = self._sender_idle(a, t)
            s = self._slot(a, b, t, w, extra)
            if s == t or self._sender_idle(a, s) == s:
                return s
            t = s

    def _sender_idle(self, dev: int, t: float) -> float:
        """The earliest time >= t at which `dev` runs no op: the end of its busy block holding t,
        or t. O(log n) in the blocks."""
        starts = self.busy_start[dev]
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and self.busy_end[dev][i] > t:
            return self.busy_end[dev][i]
        return t

    def _pair(self, a: int, b: int) -> tuple[list[float], list[float]]:
        """The bookings of the channels of a and b together, gaps shorter than the shortest
        transfer closed; made from both channels when first asked for, then kept by `_book`."""
        if a > b:
            a, b = b, a
        both = self.pair_lists.get((a, b))
        if both is None:
            starts, ends = list(self.chan_start[a]), list(self.chan_end[a])
            for s, e in zip(self.chan_start[b], self.chan_end[b]):
                _close_in(starts, ends, s, e, self.min_transfer_us)
            both = self.pair_lists[(a, b)] = (starts, ends)
            self.pairs_of[a].append((a, b))
            if b != a:
                self.pairs_of[b].append((a, b))
        return both

    def _book(self, dev: int, s: float, e: float) -> None:
        self.chan_version[dev] += 1
        gap = self.min_transfer_us
        _close_in(self.chan_start[dev], self.chan_end[dev], s, e, gap)
        for key in self.pairs_of[dev]:
            starts, ends = self.pair_lists[key]
            _close_in(starts, ends, s, e, gap)

    # ---------------------------------------------------------------- estimates

    def ready_time(self, op: int, dev: int, commit: bool = False) -> tuple[float, int]:
        """When all inputs of `op` can be on `dev`, and the bytes of copies still to receive.

        With `commit`, books the transfers for real. A dry run is answered from `ready_memo` when
        none of the channels it depends on changed since it was last made.
        """
        device = self.device
        version = self.chan_version
        key = copied = 0
        if not commit:
            key = version[dev]
            for p, _, _ in self.inputs[op]:
                key += version[device[p]]
            memo = self.ready_memo.get((op, dev))
            if memo is not None and memo[0] == key:
                ready, new_bytes, self.tail_copy = memo[1]
                return ready, new_bytes
        ready = 0.0
        extra: dict[int, tuple[list[float], list[float]]] = {}  # tentative bookings per device
        new_bytes = 0
        copies: list[tuple[int, float, float, float, float]] = []  # (source, width, start, arrival, sent)
        for p, t, nbytes in self.inputs[op]:
            pd = device[p]
            if pd == dev:
                if self.end[p] > ready:
                    ready = self.end[p]
                continue
            arrived = self.arrival.get((t, dev))
            if arrived is None:
                w = self.slope[pd][dev] * nbytes + self.intercept[pd][dev]
                s = self._send_slot(pd, dev, self.end[p], w, extra)
                arrived = s + w
                new_bytes += nbytes
                if not commit:
                    copies.append((pd, w, s, arrived, self.end[p]))
                # Only a booking that moves the clock: a transfer shorter than the float spacing
                # at `s` (s + w == s: a few bytes on a free link late in a long step) occupies
                # nothing, and a zero-length booking inserted before another of the same start
                # would leave `ends` unsorted for `_slot`'s bisect, which then missed bookings
                # and let two transfers share a channel.
                _tentative(extra, (pd, dev), s, arrived, self.min_transfer_us)
                if commit:
                    self.arrival[(t, dev)] = arrived
                    copied = 1
                    self.transfers.append(Transfer(t, pd, dev, s, arrived))
                    rel = self.release.setdefault(t, {})
                    if rel.get(pd, -1.0) < arrived:
                        rel[pd] = arrived
            if arrived > ready:
                ready = arrived
        if commit:
            # Booked only now, so that a commit finds exactly the slots its dry run found.
            for d, (starts, ends) in extra.items():
                for s, e in zip(starts, ends):
                    self._book(d, s, e)
            version[dev] += copied  # new copies on dev (also free ones, which book nothing)
        else:
            self.tail_copy = self._at_tail(copies, dev, ready)
            if self.preds_left[op] == 0:  # inputs all placed: the key covers everything read
                self.ready_memo[(op, dev)] = (key, (ready, new_bytes, self.tail_copy))
                self.memo_devices.setdefault(op, set()).add(dev)
        return ready, new_bytes

    def _at_tail(self, copies: list, dev: int, ready: float) -> Optional[tuple]:
        """`tail_copy` of a dry run that made these `copies` into `dev` and found `ready`: of
        the copies that searched from before their pair's tail and found no gap before it, when
        the last of them arrives at `ready`. Other copies took gaps before their pair's tail and
        arrive no later (an input of a fan-out sent once to a device goes to the tail, the op's
        own input into a gap)."""
        if not copies:
            return None
        sources, widths, since, last = [], [], math.inf, -math.inf
        for source, w, start, arrived, sent in copies:
            tail = self.channel_tail(source, dev)
            if tail is not None and w > 0 and sent <= tail <= start:
                sources.append(source)
                widths.append(w)
                since = min(since, tail)
                last = max(last, arrived)
        if last != ready:
            return None
        # After the tail only the dry run's own earlier copies are booked, so `tail_start`, which
        # books these copies alone, finds arrivals no later than they did.
        return tuple(sources), tuple(widths), since, ready

    def channel_tail(self, a: int, b: int) -> Optional[float]:
        """The end of the last booking on the channels of a and b; None when neither has one."""
        ea, eb = self.chan_end[a], self.chan_end[b]
        if ea and eb:
            return ea[-1] if ea[-1] > eb[-1] else eb[-1]
        return ea[-1] if ea else eb[-1] if eb else None

    def tail_start(
        self, sources: Sequence[int], widths: Sequence[float], dev: int, since: float
    ) -> Optional[float]:
        """When copies from `sources` to `dev`, `widths` us long and booked in that order, are
        all in if each goes after the last booking of its pair of channels (`channel_tail`).

        None when a pair has no booking, a width is not positive, or, for some source, neither
        its channel nor dev's is busy without a gap from `since` to the pair's tail (`_book`
        merges bookings closer than the shortest transfer, so a device's last booking is one
        solid block). Otherwise a copy whose search for a slot found none before `since` finds
        none before the tail either, and this is when the copies are in."""
        extra: dict[int, tuple[list[float], list[float]]] = {}
        done = -math.inf
        for a, w in zip(sources, widths):
            tail = self.channel_tail(a, dev)
            if tail is None or w <= 0:
                return None
            for d in (a, dev):
                starts, ends = self.chan_start[d], self.chan_end[d]
                if starts and starts[-1] <= since and ends[-1] >= tail:
                    break
            else:
                return None
            s = self._send_slot(a, dev, tail, w, extra)  # the pair's own bookings all end by `tail`
            arrived = s + w
            _tentative(extra, (a, dev), s, arrived, self.min_transfer_us)
            done = max(done, arrived)
        return done

    def memory_time(self, dev: int, need: int, t: float) -> Optional[float]:
        """Earliest time >= t at which `need` more bytes fit on `dev`, or None if never (yet)."""
        room = self.capacity[dev] - self.usage[dev]
        if need <= room:
            return t
        for when, nbytes in self.pending[dev]:
            room += nbytes
            if need <= room:
                return max(t, when)
        return None

    def free_bytes(self, dev: int) -> int:
        """Capacity minus memory still in use on `dev` once every known free has happened."""
        return self.capacity[dev] - self.usage[dev] + sum(b for _, b in self.pending[dev])

    # ---------------------------------------------------------------- commit

    def _apply_frees(self, dev: int, now: float) -> None:
        pending = self.pending[dev]
        k = 0
        while k < len(pending) and pending[k][0] <= now:
            self.usage[dev] -= pending[k][1]
            k += 1
        if k:
            del pending[:k]

    def _ran(self, dev: int, start: float, end: float) -> None:
        """Records that `dev`, which sends on its compute thread, runs an op from start to end:
        copies out of it now wait for that (`_sender_idle`), so its dry runs are stale. Starts on
        a device never decrease, so the blocks stay sorted; a run that starts as the last ends
        extends that block (TF runs a successor ready then on the same thread)."""
        self.chan_version[dev] += 1
        starts, ends = self.busy_start[dev], self.busy_end[dev]
        if ends and start <= ends[-1]:
            if end > ends[-1]:
                ends[-1] = end
        elif end > start:
            starts.append(start)
            ends.append(end)

    def _free_later(self, dev: int, when: float, nbytes: int) -> None:
        if nbytes:
            bisect.insort(self.pending[dev], (when, nbytes))

    def _release(self, t: int, dev: int, when: float, freed: set[int]) -> None:
        """One holder of tensor t's buffer on dev is done at `when`; frees it when none is left.
        The buffer of an output that reuses its input's, on its producer's device, is that
        input's: its release is one holder of the input's buffer less."""
        while True:
            claim = self.claims.get((t, dev))
            if claim is not None:
                claim[0] -= 1
                if claim[1] < when:
                    claim[1] = when
                if claim[0]:
                    return
                when = claim[1]
                del self.claims[(t, dev)]
            source = self.tensor_alias[t]
            if source == OWN or self.device[self.tensor_src[t]] != dev:
                self._free_later(dev, when, self.tensor_bytes[t])
                freed.add(dev)
                return
            if source == HELD_VIEW:
                return
            t = source

    @property
    def distinct(self) -> Sequence[int]:
        """The devices worth a dry run: all but the untouched twins that one stands for."""
        return self.twins.distinct

    def place_group(self, group: int, dev: int) -> None:
        self.twins.touch(dev)
        self.group_device[group] = dev
        p = self.group_persistent[group]
        self.usage[dev] += p
        self.peak[dev] += p  # persistent memory is held from the start of the step

    def commit(self, op: int, dev: int, start: float) -> list[int]:
        """Schedules `op` on `dev` at `start`; returns devices that gained future frees."""
        self._apply_frees(dev, start)
        g = self.group_of[op]
        if self.group_device[g] < 0:
            self.place_group(g, dev)
        ready, new_bytes = self.ready_time(op, dev, commit=True)
        assert ready <= start + 1e-6, (op, ready, start)
        end = start + self.compute[op]
        self.twins.touch(dev)
        self.device[op] = dev
        for d in self.memo_devices.pop(op, ()):  # not every device: O(devices) per op
            self.ready_memo.pop((op, d), None)
        self.start[op] = start
        self.end[op] = end
        self.order.append(op)
        self.device_free[dev] = end
        self.last_op[dev] = op
        if self.sends_on_compute[dev]:
            self._ran(dev, start, end)
        self.usage[dev] += self.alloc[op] + new_bytes
        if self.usage[dev] > self.peak[dev]:
            self.peak[dev] = self.usage[dev]
        freed = {dev}
        self._free_later(dev, end, self.free_at_end[op])
        for t in self.aliased[op]:  # its own consumers hold it until now: 2 holders at first
            claim = self.claims.setdefault((t, dev), [1, -1.0])
            claim[0] += 1
        seen: set[int] = set()
        for p, t, nbytes in self.inputs[op]:
            if t in seen:
                continue
            seen.add(t)
            rel = self.release.setdefault(t, {})
            if rel.get(dev, -1.0) < end:
                rel[dev] = end
            self.tensor_consumers_left[t] -= 1
            if self.tensor_consumers_left[t] == 0:
                for d, when in sorted(self.release.pop(t).items()):
                    self._release(t, d, max(when, start), freed)
        for s in self.succ[op]:
            self.preds_left[s] -= 1
        return sorted(freed)


class _TailQueue:
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
    def restored(saved: tuple) -> "_TailQueue":
        device, sources, widths, since, members, entry, now, ids = saved
        out = _TailQueue(device, sources, widths, since)
        out.members, out.entry, out.now, out.ids = list(members), entry, now, set(ids)
        return out


class ListScheduler:
    """One run of the list scheduler, step by step, with snapshots to resume from.

    `run_list_scheduler` is the plain entry point; the refiner uses `snapshot`/`restore` to
    re-simulate only the part of a schedule that a move can change.
    """

    # Whether candidates waiting on a busy channel share one entry (`_TailQueue`); the
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
        _place_pinned(graph, cluster, groups, state, initial_group_device)
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
        # cluster most have none (simulated, or untouched twins), and looking at every device
        # took a tenth of auto's time on 1,024 devices.
        self.busy: list[int] = []
        self.is_busy = [False] * nd
        # Candidates whose start is the arrival of their copies booked after everything on their
        # channels, queued per (device, source devices, copy widths) (`_TailQueue`), by id.
        self.tail_queues: dict[int, _TailQueue] = {}
        self.tail_ids: dict[tuple[int, tuple[int, ...], tuple[float, ...]], int] = {}
        self._next_tail_id = 0  # never reused: an entry of a dropped queue finds no queue
        self.pools: dict[int, int] = {}  # device -> id of its pool of held ops (`_TailQueue`)
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

        An entry whose op is negative stands for a tail queue (`_TailQueue`): in `later` its
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
                copy = self.tail_queues[qid] = _TailQueue.restored(queue.saved())
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
            queue = self.tail_queues[qid] = _TailQueue(d, sources, widths, start)
            if queue.pool:
                self.pools[d] = qid
        elif start < queue.since:
            queue.since = start
        queue.push(tp, op, v)
        if queue.entry is None or (v, tp) < queue.entry:
            queue.entry = (v, tp)
            heapq.heappush(h, (v, tp, -1 - qid))

    def _tail_entry(self, h: list, key: float, tp: int, op: int) -> Optional["_TailQueue"]:
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

    def _queue_bound(self, queue: "_TailQueue") -> Optional[float]:
        """No member of `queue` starts before this, if not None (`_TailQueue`).

        A pool's: the policy's floor, unless the op exempt from it is a member (None); the
        device's free time while the policy holds nothing back there."""
        if not queue.pool:
            return self.state.tail_start(queue.sources, queue.widths, queue.device, queue.since)
        floor = self.policy.hold_floor(queue.device, self.state)
        if floor is None:
            return self.state.device_free[queue.device]
        return None if floor[1] in queue.ids else floor[0]

    def _drop(self, queue: "_TailQueue") -> None:
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

    # ---------------------------------------------------------------- snapshots

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
        self.tail_queues = {qid: _TailQueue.restored(q) for qid, q in snap["tail_queues"].items()}
        self.tail_ids = {(q.device, q.sources, q.widths): qid for qid, q in self.tail_queues.items()}
        self.pools = {q.device: qid for qid, q in self.tail_queues.items() if q.pool}
        # Ids only grow: a queue made from here on must not take the id of one in the snapshot.
        self._next_tail_id = max(self._next_tail_id, snap["next_tail_id"])
        self.scheduled = snap["scheduled"]
        self.last_time = snap["last_time"]


def run_list_scheduler(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    policy: Policy,
    *,
    method: str,
    initial_group_device: Optional[Sequence[int]] = None,
    persistent_headroom: float = 0.0,
    cutoff_us: float = math.inf,
) -> Schedule:
    """Schedules every op under `policy`; raises `InfeasiblePlacementError` when stuck.

    `initial_group_device` places groups up front (the simulator places all of them): their
    persistent memory is then held from the start. `persistent_headroom` is the share of each
    device that placing a group's persistent memory must leave free. `ScheduleCutOff` when an op
    would start after `cutoff_us`; `OverWorkCap` when the run takes the work of a `work.metered`
    body past its cap.
    """
    scheduler = make_list_scheduler(
        graph, cluster, groups, policy, initial_group_device, persistent_headroom, cutoff_us=cutoff_us
    )
    label = f"simulating {method}" if isinstance(policy, FixedPolicy) else f"{method}: scheduling"
    meter = current_meter()
    try:
        with Progress(label, graph.num_ops, unit="ops") as bar:
            scheduler.run(bar, meter)
    finally:
        if meter is not None:  # a run stopped for the cap counts as the cap (`place_auto`)
            meter.used += scheduler.scheduled + scheduler_work(scheduler)
    if meter is not None:
        meter.check(0)  # stopped exactly when its whole work passes the cap, whatever the engine
    return scheduler.schedule(method)


def make_list_scheduler(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    policy: Policy,
    initial_group_device: Optional[Sequence[int]] = None,
    persistent_headroom: float = 0.0,
    tables: Optional[GraphTables] = None,
    cutoff_us: float = math.inf,
):
    """A `ListScheduler`, or a `native_scheduler.NativeListScheduler` when the compiled engine
    runs this policy (`native_scheduler.native_for`): the same steps and schedules either way."""
    from baechi_tf.placer import native_scheduler  # it builds on this module

    native = native_scheduler.native_for(graph, cluster, policy)
    if native is not None:
        return native_scheduler.NativeListScheduler(
            native, graph, cluster, groups, policy, initial_group_device, persistent_headroom, cutoff_us
        )
    return ListScheduler(
        graph, cluster, groups, policy, initial_group_device, persistent_headroom, tables, cutoff_us
    )


HEADROOMS = (0.0, 0.25, 0.5, 0.75)
"""Shares of each device that placing groups' persistent memory must leave free, tried in turn
when a greedy run runs out of memory (it can fill devices with weights early)."""


def run_with_headroom(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    make_policy: Callable[[], Policy],
    *,
    method: str,
    headrooms: Sequence[float] = HEADROOMS,
    initial_group_device: Optional[Sequence[int]] = None,
    cutoff_us: float = math.inf,
) -> Schedule:
    """`run_list_scheduler` with a fresh policy per headroom in `headrooms` until one run fits;
    the first run's `InfeasiblePlacementError` when none does (`ScheduleCutOff` ends at once)."""
    first_error: Optional[InfeasiblePlacementError] = None
    for headroom in headrooms:
        try:
            return run_list_scheduler(
                graph, cluster, groups, make_policy(), method=method,
                initial_group_device=initial_group_device, persistent_headroom=headroom,
                cutoff_us=cutoff_us,
            )
        except InfeasiblePlacementError as e:
            first_error = first_error or e
    assert first_error is not None
    raise first_error


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _place_pinned(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    state: SchedulerState,
    given: Optional[Sequence[int]] = None,
) -> None:
    """Places the groups of pinned ops on their devices (raising on unknown devices), but for
    the groups `given` another device: those go where given, as the simulator runs the
    placement it is handed (that it keeps the pins is `check_placement`'s to say)."""
    for op, name in enumerate(graph.pinned_device):
        if name is None:
            continue
        dev = pinned_device_index(graph, cluster, op)
        g = state.group_of[op]
        if state.group_device[g] >= 0 or given is not None and given[g] >= 0 and given[g] != dev:
            continue
        p = state.group_persistent[g]
        if p > state.capacity[dev]:
            raise InfeasiblePlacementError(
                f"op {graph.names[op]!r} is pinned to {cluster.names[dev]!r}, but its group "
                f"{groups.names[g]!r} holds {format_bytes(p)} of persistent memory and the device "
                f"has {format_bytes(state.capacity[dev])}: unpin it or give the device more memory"
            )
        state.place_group(g, dev)


def pinned_device_index(graph: OpGraph, cluster: Cluster, op: int) -> int:
    """The cluster index of the device `op` is pinned to; `ConfigError` if there is none."""
    name = graph.pinned_device[op]
    dev = cluster.find(name) if name is not None else None
    if dev is None:
        raise ConfigError(
            f"op {graph.names[op]!r} is pinned to {name!r}, "
            + ((name is not None and cluster.ambiguity(name)) or f"which is not in the cluster "
               f"({', '.join(cluster.names)}): pin it to one of those devices or add the device")
        )
    return dev


def pinned_group_devices(graph: OpGraph, cluster: Cluster, groups: Groups) -> np.ndarray:
    """The cluster index of the device each group is pinned to (by its first pinned op), -1 for
    groups with no pinned op; `ConfigError` for a pin to a device not in the cluster."""
    out = np.full(groups.num_groups, -1, dtype=np.int64)
    for op, name in enumerate(graph.pinned_device):
        g = int(groups.group_of[op])
        if name is not None and out[g] < 0:
            out[g] = pinned_device_index(graph, cluster, op)
    return out


def _stuck(graph: OpGraph, cluster: Cluster, groups: Groups, state: SchedulerState) -> InfeasiblePlacementError:
    """The error for a run in which no remaining op can fit anywhere, naming the first such op."""
    ready = [
        op for op in range(graph.num_ops) if state.device[op] < 0 and state.preds_left[op] == 0
    ]
    op = min(ready, key=lambda o: state.topo[o]) if ready else next(
        o for o in range(graph.num_ops) if state.device[o] < 0
    )
    g = state.group_of[op]
    gdev = state.group_device[g]
    devices = [gdev] if gdev >= 0 else list(range(cluster.num_devices))
    persistent = state.group_persistent[g] if gdev < 0 else 0
    need = {d: state.alloc[op] + state.ready_time(op, d)[1] + persistent for d in devices}
    d_best = min(devices, key=lambda d: (need[d], d))
    fmt = byte_formatter(need[d_best], *(state.free_bytes(d) for d in range(cluster.num_devices)))
    parts = [f"{fmt(state.alloc[op])} for outputs and scratch"]
    received = need[d_best] - state.alloc[op] - persistent
    if received:
        parts.append(f"{fmt(received)} of inputs to receive")
    if persistent:
        parts.append(
            f"{fmt(persistent)} of persistent memory of its group {groups.names[g]!r} "
            f"({len(groups.members[g])} ops)"
        )
    where = f" on {cluster.names[gdev]!r}, where its group is" if gdev >= 0 else ""
    free = ", ".join(
        f"{cluster.names[d]}: {fmt(state.free_bytes(d))} free of {fmt(state.capacity[d])}"
        for d in range(cluster.num_devices)
    )
    return InfeasiblePlacementError(
        f"op {graph.names[op]!r} needs {fmt(need[d_best])}{where} "
        f"({', '.join(parts)}), but no device can hold it once earlier ops hold theirs ({free}); "
        "use more devices, give them more memory (--memory_per_device, a larger --memory_fraction "
        "or --placer_memory_fraction where it is below 1, memory_bytes in place-json's input), or "
        "split the group"
    )
