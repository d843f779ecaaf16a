"""Window balancing: a fast surrogate search that cuts transfers while keeping each device busy.

On graphs where communication is not negligible, the simulated step time of a good list-scheduled
placement is set by the busiest resource over time: a device's compute or its channel (every
transfer occupies the channels of both ends). `balance_windows` cuts the schedule of a placement
into time windows (by each op's start) and minimises

    cost = sum over windows w of  max over devices d of  (compute of d in w + channel time of d in w)

(plus a small term that favours even loads; with ``overlap`` compute and channel are separate
resources, as when a device computes while its channel transfers)
where a transfer is charged to the window of the op that produces it, on both channels, and a
tensor is sent to a device once however many of its ops read it; its channel time is what it holds
the channels (`Cluster.channel_tables`: less than its whole time on a link of several copies in
flight). Moving a group changes a few
terms, so a move is evaluated in O(degree) without simulating: the search makes greedy passes
over the groups (seeded order), moving each to the device that lowers the cost most, while the
device keeps room for the persistent memory moved there, until a pass gains less than 1% of the
cost. The caller simulates the result and keeps
it only when the simulated makespan drops (`refine.refine` does).

The search runs on the engine `baechi_tf.placer.engine` selects: the compiled one
(`native/windows.hpp`) makes the same moves, float for float, and returns the same placement and
count (tests/test_engines.py); sums are taken in a fixed order (windows ascending, devices in
order) so that both can.

Time: O(passes * (V + E) * D^2) for V ops, E edges, D devices (each group tries every device, and
a try costs O(D)).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import weakref
from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer import engine
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.schedule import Schedule

__all__ = ["balance_windows"]

_EVEN = 0.05  # weight of the sum-of-squares term of a window's cost
# A pass that gains less than this share of the cost ends the search: later passes gain less
# still, and the refiner's budget buys more from other window settings (bench/quality.py at 3 s:
# layered-2000 -2.6%, Transformer -0.9%, other graphs unchanged; 0.005 the same, 0.03 worse).
_MIN_PASS_GAIN = 0.01
_DEVICES_PER_MOVE = 6  # devices per op move counted, beyond the first six
_INT64_LIMIT = 1 << 62  # byte counts the compiled engine takes (with room for their sums)


class _Loads:
    """Per-window, per-device load, and the consumer counts that say which transfers exist."""

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        device_of: list[int],
        window: list[int],
        num_windows: int,
        overlap: bool,
    ):
        nd = cluster.num_devices
        self.nd = nd
        self.overlap = overlap
        self.dev = device_of
        self.win = window
        self.compute = graph.compute_us.tolist()
        self.slope, self.intercept, _ = cluster.channel_tables()  # what a copy holds the channels
        self.tbytes = graph.tensor_bytes.tolist()
        self.tsrc = graph.tensor_src.tolist()
        self.ins = graph.input_tensors  # cached on the graph: built once for every call
        self.outs = graph.output_tensors
        self.cnt = [[0] * nd for _ in range(graph.num_tensors)]
        self.load = [[0.0] * (2 * nd) for _ in range(num_windows)]
        self.touched: set[int] = set()
        for op, d in enumerate(device_of):
            self.load[window[op]][d] += self.compute[op]
        for t, cs in enumerate(graph.tensor_consumers):
            for c in cs:
                self._count(t, device_of[c], +1)
        self.top = [self._top(row) for row in self.load]
        self.touched.clear()

    def _top(self, row: list[float]) -> float:
        """The window's cost: its busiest resource, plus a little of the root of the sum of
        squares so that evening out the other devices counts too (the max alone has plateaus)."""
        nd = self.nd
        busy = row if self.overlap else [row[d] + row[nd + d] for d in range(nd)]
        squares = 0.0
        for v in busy:  # summed in order, as the compiled engine sums (not `sum`'s own way)
            squares += v * v
        return max(busy) + _EVEN * math.sqrt(squares)

    def _transfer(self, t: int, a: int, b: int, sign: int) -> None:
        tt = sign * (self.slope[a][b] * self.tbytes[t] + self.intercept[a][b])  # its hold
        w = self.win[self.tsrc[t]]
        row = self.load[w]
        row[self.nd + a] += tt
        row[self.nd + b] += tt
        self.touched.add(w)

    def _count(self, t: int, d: int, delta: int) -> None:
        """One more (delta=+1) or one fewer (-1) consumer of tensor t on device d."""
        c = self.cnt[t]
        before = c[d]
        c[d] = before + delta
        src_dev = self.dev[self.tsrc[t]]
        if d != src_dev and (before == 0) != (c[d] == 0):
            self._transfer(t, src_dev, d, delta)

    def move_op(self, op: int, b: int) -> None:
        a = self.dev[op]
        if a == b:
            return
        w = self.win[op]
        self.load[w][a] -= self.compute[op]
        self.load[w][b] += self.compute[op]
        self.touched.add(w)
        for t in self.ins[op]:
            self._count(t, a, -1)
        for t in self.outs[op]:
            c = self.cnt[t]
            for d in range(self.nd):
                if c[d] and d != a:
                    self._transfer(t, a, d, -1)
        self.dev[op] = b
        for t in self.ins[op]:
            self._count(t, b, +1)
        for t in self.outs[op]:
            c = self.cnt[t]
            for d in range(self.nd):
                if c[d] and d != b:
                    self._transfer(t, b, d, +1)

    def delta(self) -> float:
        """Change of the cost since the touched set was last cleared (tops not yet updated),
        summed over the touched windows in ascending order."""
        change = 0.0
        for w in sorted(self.touched):
            change += self._top(self.load[w]) - self.top[w]
        return change

    def settle(self) -> None:
        for w in self.touched:
            self.top[w] = self._top(self.load[w])
        self.touched.clear()

    def cost(self) -> float:
        total = 0.0
        for top in self.top:
            total += top
        return total


def balance_windows(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    schedule: Schedule,
    num_windows: int,
    *,
    pinned: Sequence[bool],
    overlap: bool = False,
    seed: int = 0,
    max_passes: int = 8,
    max_moves: Optional[int] = None,
    min_pass_gain: float = _MIN_PASS_GAIN,
    free_devices: Optional[int] = None,
) -> tuple[np.ndarray, int]:
    """A placement of lower window cost than `schedule`'s, and the number of op moves made.

    `pinned[g]` marks groups that must not move; the others move only to the first
    `free_devices` devices (all by default: a host that runs only its own ops comes last). The
    search stops after `max_passes` passes over the groups, a pass that lowers the cost by less
    than `min_pass_gain` of it, or `max_moves` op moves (tried and undone count; on more than 11
    devices an op move counts as ``D // _DEVICES_PER_MOVE``, its cost in time).
    """
    nd = cluster.num_devices
    targets = nd if free_devices is None else free_devices
    device_of = [int(d) for d in schedule.placement.device_of]
    span = schedule.makespan_us or 1.0
    window = [min(num_windows - 1, int(s / span * num_windows)) for s in schedule.start_us.tolist()]
    members = [m.tolist() for m in groups.members]
    group_persistent = groups.byte_sums(graph.persistent_bytes).tolist()
    on_device = [0] * nd
    for g, m in enumerate(members):
        on_device[device_of[m[0]]] += group_persistent[g]
    transient = max(
        (p - q for p, q in zip(schedule.peak_memory_bytes, on_device)), default=0
    )
    room = [d.memory_bytes - transient for d in cluster.devices]
    # The passes' group orders, drawn up front: the same whichever engine searches.
    rng = random.Random(seed)
    movable = [g for g in range(groups.num_groups) if not pinned[g]]
    orders = []
    for _ in range(max_passes):
        rng.shuffle(movable)
        orders.append(list(movable))
    # An op move costs O(D) (a window's cost is a max over devices): on many devices it counts
    # as more than one, so that `max_moves` keeps bounding the time (measured: about 3 us per op
    # move on 4 devices, 100 us on 200).
    per_move = max(1, nd // _DEVICES_PER_MOVE)
    search = _Search(members, group_persistent, on_device, room, orders, targets, per_move,
                     max_moves, min_pass_gain)
    module = engine.native_module() if engine.current() == "native" else None
    if module is not None and search.fits_int64():
        return _native_balance(module, graph, cluster, groups, device_of, window, num_windows,
                               overlap, search)
    loads = _Loads(graph, cluster, device_of, window, num_windows, overlap)
    evaluated = _balance(loads, search)
    return np.asarray(loads.dev, dtype=np.int32), evaluated


@dataclasses.dataclass
class _Search:
    """What the greedy passes need besides the loads; `on_device` changes as groups move."""

    members: list[list[int]]
    group_persistent: list[int]
    on_device: list[int]
    room: list[int]
    orders: list[list[int]]
    targets: int
    per_move: int
    max_moves: Optional[int]
    min_pass_gain: float

    def fits_int64(self) -> bool:
        """Whether the byte counts (and their sums) stay in the compiled engine's int64."""
        values = self.group_persistent + self.on_device + self.room
        return max((abs(v) for v in values), default=0) * 2 < _INT64_LIMIT and (
            self.max_moves is None or self.max_moves < _INT64_LIMIT
        ) and sum(abs(v) for v in self.group_persistent) < _INT64_LIMIT


def _balance(loads: _Loads, search: _Search) -> int:
    """The greedy passes (the module docstring) on `loads`; returns the op moves evaluated."""
    on_device, room, members, group_persistent = (
        search.on_device, search.room, search.members, search.group_persistent
    )
    evaluated = 0
    for order in search.orders:
        before = loads.cost()
        improved = False
        for g in order:
            if search.max_moves is not None and evaluated >= search.max_moves:
                break
            m = members[g]
            a = loads.dev[m[0]]
            best: Optional[tuple[float, int]] = None
            for b in range(search.targets):
                if b == a or on_device[b] + group_persistent[g] > room[b]:
                    continue
                evaluated += 2 * len(m) * search.per_move
                for o in m:
                    loads.move_op(o, b)
                gain = loads.delta()
                if gain < -1e-6 and (best is None or gain < best[0]):
                    best = (gain, b)
                for o in m:
                    loads.move_op(o, a)
                loads.touched.clear()  # back where it was: the tops still hold
            if best is not None:
                b = best[1]
                for o in m:
                    loads.move_op(o, b)
                loads.settle()
                on_device[a] -= group_persistent[g]
                on_device[b] += group_persistent[g]
                improved = True
        if not improved or before - loads.cost() < search.min_pass_gain * before:
            break
    return evaluated


def _rows(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Compressed rows (ptr int64, idx int32) of a sequence of sequences."""
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    idx = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(ptr[-1]))
    return ptr, idx


# The compiled engine's copies of a graph's tensor tables, made once per graph.
_native_graphs: "weakref.WeakKeyDictionary[OpGraph, tuple]" = weakref.WeakKeyDictionary()


def _native_balance(module, graph, cluster, groups, device_of, window, num_windows, overlap, search):
    tables = _native_graphs.get(graph)
    if tables is None:
        tables = (
            graph.compute_us.astype(np.float64), graph.tensor_bytes.astype(np.int64),
            graph.tensor_src.astype(np.int32), *_rows(graph.input_tensors),
            *_rows(graph.output_tensors), *_rows(graph.tensor_consumers),
        )
        _native_graphs[graph] = tables
    compute, tbytes, tsrc, ins_ptr, ins, outs_ptr, outs, cons_ptr, cons = tables
    slope, intercept = (np.asarray(t, dtype=np.float64).reshape(-1) for t in cluster.channel_tables()[:2])
    members_ptr, members = _rows(search.members)
    i64 = np.int64
    placed, evaluated = module.balance_windows(
        cluster.num_devices, num_windows, overlap, compute, np.asarray(device_of, dtype=np.int32),
        np.asarray(window, dtype=np.int32), slope, intercept, tbytes, tsrc, ins_ptr, ins,
        outs_ptr, outs, cons_ptr, cons, members_ptr, members,
        np.asarray(search.group_persistent, dtype=i64), np.asarray(search.on_device, dtype=i64),
        np.asarray(search.room, dtype=i64),
        np.asarray(search.orders, dtype=np.int32).reshape(-1), len(search.orders),
        len(search.orders[0]) if search.orders else 0, search.targets, search.per_move,
        -1 if search.max_moves is None else max(search.max_moves, 0), search.min_pass_gain,  # -1: none
    )
    return placed, int(evaluated)
