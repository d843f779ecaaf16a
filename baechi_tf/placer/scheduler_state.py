"""The state the list scheduler grows a schedule in, shared by its policies and the simulator.

`GraphTables` is an `OpGraph` as flat tables; `SchedulerState` holds, as the schedule grows, each
op's device and times, each device's memory in use and future frees, the channels' bookings and
busy blocks, and the ready ops (the interchangeable devices no op is on yet in `twins`). Also the
channels' gap merge (`_close_in`), how messages show byte sizes (`format_bytes`), and the error of
a schedule that stops with ops left (`_stuck`). The model these implement, and its complexity, is
the one documented in `baechi_tf.placer.list_scheduler`, which runs the schedule.
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.buffers import (
    HELD_VIEW, OWN, free_at_end_bytes, graph_buffers,
)
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.schedule import Transfer
from baechi_tf.placer.twins import UntouchedTwins

__all__ = ["GraphTables", "SchedulerState", "byte_formatter", "format_bytes"]


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
        buffers = graph_buffers(graph)
        own, alias = buffers.own, buffers.alias
        self.alloc = tuple((own + graph.temp_bytes).tolist())
        self.free_at_end = tuple(free_at_end_bytes(graph))
        # per tensor, OWN, HELD_VIEW or the tensor whose buffer it is on its producer's device
        self.tensor_alias = tuple(alias.tolist())
        self.tensor_src = tuple(graph.tensor_src.tolist())
        self.constant = tuple(buffers.constant.tolist())  # per tensor: a constant's value
        # per tensor: reuses an input's buffer whose last holder its op is in any order
        self.always_reused = tuple(buffers.always_reused.tolist())
        # per tensor written in place: the writer's input it writes into instead, or -1
        self.fallback = tuple(buffers.fallback.tolist())
        # per op, its outputs that are read and reuse an input's buffer (`tensor_alias`)
        aliased: list[list[int]] = [[] for _ in range(graph.num_ops)]
        for t in np.flatnonzero(alias >= 0).tolist():
            aliased[self.tensor_src[t]].append(t)
        self.aliased = tuple(tuple(a) for a in aliased)
        self.persistent = tuple(graph.persistent_bytes.tolist())
        # per op, the op whose dry runs (`SchedulerState.ready_memo`) it shares: the first op of
        # the same inputs, in order, where neither has an output in an input's buffer (a dry run
        # depends on nothing else of its op); else itself. The ops a framework put under one
        # control scope (tf_keras's batch-norm updates: hundreds of control inputs each, on
        # other devices) wait for the same copies, and each of their dry runs would search a slot
        # for every one of them again.
        first: dict[tuple[tuple[int, int, int], ...], int] = {}
        self.memo_of = tuple(
            op if aliased[op] else first.setdefault(ins, op) for op, ins in enumerate(self.inputs)
        )


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
        # A copy holds its channels slope * bytes + held us, in latency us later (channel_tables).
        self.slope, self.intercept, self.latency = cluster.channel_tables()
        self.inputs = tables.inputs
        self.memo_of = tables.memo_of
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
        self.min_transfer_us = cluster.min_hold_us()
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
        # `ListScheduler` queues such ops in `TailQueue`s.
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
        # Per ordered pair of devices, whether a tensor read on the second from the first is the
        # first's buffer (`Cluster.shares_memory`): no copy on the reader, which the sender's
        # buffer serves until it is done; a constant's value is replicated on the reader instead
        # (`buffers.constant_tensors`), persistent memory from the start, as a group's is.
        self.shares = cluster.shares_memory()
        self.constant = tables.constant
        self.always_reused = tables.always_reused
        self.fallback = tables.fallback
        self.replicated = 0  # bytes of such replicas the last committing `ready_time` made
        # Of the last committing `ready_time`: the compute time its copies take on the reader's
        # device, and (sender, send start, hold) of each copy out of a device that serves copies
        # on its compute thread (`Device.sends_on_compute`), which `commit` charges there.
        self.recv_charge = 0.0
        self.send_charges: list[tuple[int, float, float]] = []
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
        memo_op = self.memo_of[op]  # the dry runs of ops of the same inputs are one
        if not commit:
            key = version[dev]
            for p, _, _ in self.inputs[op]:
                key += version[device[p]]
            memo = self.ready_memo.get((memo_op, dev))
            if memo is not None and memo[0] == key:
                ready, new_bytes, self.tail_copy = memo[1]
                return ready, new_bytes
        ready = 0.0
        extra: dict[int, tuple[list[float], list[float]]] = {}  # tentative bookings per device
        new_bytes = 0
        self.replicated = 0
        if commit:
            self.recv_charge = 0.0
            self.send_charges.clear()
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
                arrived = s + w + self.latency[pd][dev]
                shared = pd >= 0 and self.shares[pd][dev]  # (pd < 0: `_stuck` asks of an op not ready)
                if not shared or self.constant[t]:
                    new_bytes += nbytes
                    if commit and shared:
                        self.replicated += nbytes
                if not commit:
                    copies.append((pd, w, s, arrived, self.end[p]))
                # Only a booking that moves the clock: a transfer shorter than the float spacing
                # at `s` (s + w == s: a few bytes on a free link late in a long step) occupies
                # nothing, and a zero-length booking inserted before another of the same start
                # would leave `ends` unsorted for `_slot`'s bisect, which then missed bookings
                # and let two transfers share a channel.
                _tentative(extra, (pd, dev), s, s + w, self.min_transfer_us)
                if commit:
                    self.arrival[(t, dev)] = arrived
                    copied = 1
                    if self.sends_on_compute[dev]:
                        self.recv_charge += w
                    if self.sends_on_compute[pd]:
                        self.send_charges.append((pd, s, w))
                    self.transfers.append(Transfer(t, pd, dev, s, arrived))
                    rel = self.release.setdefault(t, {})
                    if rel.get(pd, -1.0) < arrived:
                        rel[pd] = arrived
            if arrived > ready:
                ready = arrived
        for t in self.aliased[op]:
            if self._cut(t, dev):
                new_bytes += self.tensor_bytes[t]
        if commit:
            # Booked only now, so that a commit finds exactly the slots its dry run found.
            for d, (starts, ends) in extra.items():
                for s, e in zip(starts, ends):
                    self._book(d, s, e)
            version[dev] += copied  # new copies on dev (also free ones, which book nothing)
        else:
            self.tail_copy = self._at_tail(copies, dev, ready)
            if self.preds_left[op] == 0:  # inputs all placed: the key covers everything read
                self.ready_memo[(memo_op, dev)] = (key, (ready, new_bytes, self.tail_copy))
                self.memo_devices.setdefault(memo_op, set()).add(dev)
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
            arrived = s + w + self.latency[a][dev]
            _tentative(extra, (a, dev), s, s + w, self.min_transfer_us)
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
        """Records that `dev`, which sends on its compute thread, runs an op (or serves a copy)
        from start to end: copies out of it now wait for that (`_sender_idle`), so its dry runs
        are stale. Starts on a device never decrease, so the blocks stay sorted; a run that
        starts as the last ends extends that block (TF runs a successor ready then on the same
        thread)."""
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

    def _cut(self, t: int, dev: int) -> bool:
        """Whether output t of an op on `dev` that reuses an input's buffer (`tensor_alias`)
        gets a buffer of its own there too: its input is another device's buffer that dev reads
        (`shares`), and the op is not that buffer's last holder in every order
        (`buffers.always_reused_tensors`). TF writes in place only into a buffer nothing else
        holds; where another reader of it may still run, whether it does depends on the order
        of the step, and CPU stand-ins did it both ways (`bench/fidelity_memory.py`). So such an
        output is counted both ways, each on its device: a buffer of its own on `dev`, and the
        input's buffer held on its sender until the output's readers are done, as if written in
        place. Neither device holds less than either way gives it."""
        return not self.always_reused[t] and self._handed_over(t, dev)

    def _races(self, t: int, dev: int) -> bool:
        """Whether output t of an op on `dev`, written in place into a buffer that another device
        of dev's memory handed over (and not `_cut`: a buffer of its own), holds its op's
        other input too (`buffers.fallback_inputs`) until its readers are done: TF writes into
        that input instead when the sender's executor still holds the handed-over buffer."""
        return self.fallback[t] >= 0 and self.always_reused[t] and self._handed_over(t, dev)

    def _handed_over(self, t: int, dev: int) -> bool:
        """Whether output t of an op on `dev` reuses (`tensor_alias`) a buffer that another device
        of dev's memory (`shares`) holds."""
        home = self.device[self.tensor_src[self.tensor_alias[t]]]
        return home >= 0 and home != dev and self.shares[home][dev]

    def _holder(self, t: int, dev: int) -> int:
        """The device whose memory holds tensor t as read on `dev`: its producer's when the
        producer's device shares memory with dev (`shares`), else dev."""
        home = self.device[self.tensor_src[t]]
        return home if self.shares[home][dev] else dev

    def _release(self, t: int, dev: int, when: float, freed: set[int]) -> None:
        """One holder of tensor t's buffer on dev is done at `when`; frees it when none is left.
        The buffer of an output that reuses its input's, on its producer's device, is that
        input's (on the device that holds it, `_holder`): its release is one holder of the
        input's buffer less, and, when the output has a buffer of its own too (`_cut`), that
        buffer's free."""
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
            if self._cut(t, dev):
                self._free_later(dev, when, self.tensor_bytes[t])
                freed.add(dev)
            elif self._races(t, dev):
                fallback = self.fallback[t]
                self._release(fallback, self._holder(fallback, dev), when, freed)
            dev = self._holder(source, dev)
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
        end = start + self.compute[op] + self.recv_charge
        self.twins.touch(dev)
        self.device[op] = dev
        memo_op = self.memo_of[op]
        for d in self.memo_devices.pop(memo_op, ()):  # not every device: O(devices) per op
            self.ready_memo.pop((memo_op, d), None)
        self.start[op] = start
        self.end[op] = end
        self.order.append(op)
        self.device_free[dev] = end
        self.last_op[dev] = op
        if self.sends_on_compute[dev]:
            self._ran(dev, start, end)
        for pd, sent, hold in self.send_charges:
            # The sender serves the copy on its compute thread when it is sent, or after the ops
            # committed there since, if any: starts on a device never decrease.
            at = max(sent, self.device_free[pd])
            self.device_free[pd] = at + hold
            self._ran(pd, at, at + hold)
        self.usage[dev] += self.alloc[op] + new_bytes
        self.peak[dev] += self.replicated  # replicas are held from the start of the step
        if self.usage[dev] > self.peak[dev]:
            self.peak[dev] = self.usage[dev]
        freed = {dev}
        self._free_later(dev, end, self.free_at_end[op])
        for t in self.aliased[op]:  # the input's own consumers hold it until now: 2 holders at first
            source = self.tensor_alias[t]
            claim = self.claims.setdefault((source, self._holder(source, dev)), [1, -1.0])
            claim[0] += 1
            if self._races(t, dev):  # and the input written into instead, until t is released
                fallback = self.fallback[t]
                self.claims.setdefault((fallback, self._holder(fallback, dev)), [1, -1.0])[0] += 1
        seen: set[int] = set()
        for p, t, nbytes in self.inputs[op]:
            if t in seen:
                continue
            seen.add(t)
            rel = self.release.setdefault(t, {})
            holder = self._holder(t, dev)
            if rel.get(holder, -1.0) < end:
                rel[holder] = end
            self.tensor_consumers_left[t] -= 1
            if self.tensor_consumers_left[t] == 0:
                for d, when in sorted(self.release.pop(t).items()):
                    self._release(t, d, max(when, start), freed)
        for s in self.succ[op]:
            self.preds_left[s] -= 1
        return sorted(freed)


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


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
