"""The simulator: the schedule of a finished placement, and the bounds it is judged by.

`simulate` runs the shared list scheduler (`list_scheduler`) with every op's device fixed: ops
start as soon as their inputs are on their device, the device is idle and memory fits, earliest
first (ties by topological index). This is Baechi's virtual scheduler (SoCC 2020, section 6)
with transfers booked in time order on each device's channel and memory freed when a tensor's
last consumer finishes. m-ETF picks op and device by the same earliest-start rule, so the
schedule it built is one of its placement under this model; it need not be this one, which
weighs each op on its own device only (`m_etf.schedule_m_etf`).

Time and memory as `run_list_scheduler` with one device per op.

`lower_bound_us` is what every placement's simulated makespan is at least (with `groups`, every
placement that keeps each group on one device): the critical path and the compute per device (both
communication free, summed over phases where cut ops split the graph), a longest path that pays
for the copies no such placement avoids (`_comm_heads_tails`), and energetic bounds: the devices
cannot all be busy while few ops are ready at the start of the step or of a phase, nor at its end
(`_energetic_us`). Time O(V log V + E) for the first and the last, O(E log E) plus
O(min(deg, 64)^2) per op for the longest path (O(min(deg, 64) * deg) for an op with an input or
output in its own group).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph import OpGraph, csr
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import (
    FixedPolicy,
    pinned_device_index,
    pinned_group_devices,
    run_list_scheduler,
)
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = ["critical_path_us", "lower_bound_us", "simulate", "single_device_schedule"]

_EXACT_PREFIXES = 64  # local sets tried exactly per op; longer ones get a smaller bound of J


def simulate(
    graph: OpGraph, cluster: Cluster, placement: Placement, *, cutoff_us: float = math.inf
) -> Schedule:
    """The schedule of `placement`; `InfeasiblePlacementError` if its memory cannot fit,
    `ScheduleCutOff` as soon as it is sure to end after `cutoff_us`, `ValueError` if it does not
    put every op of `graph` on a device of `cluster`."""
    problem = placement.problem(graph, cluster)
    if problem:
        raise ValueError(problem)
    device_of = placement.device_of
    singletons = Groups.singletons(graph)
    schedule = run_list_scheduler(
        graph,
        cluster,
        singletons,
        FixedPolicy(device_of.tolist()),
        method=placement.method,
        initial_group_device=device_of.tolist(),
        cutoff_us=cutoff_us,
    )
    return dataclasses.replace(schedule, placement=placement)


def critical_path_us(graph: OpGraph) -> float:
    """The longest chain of compute times, communication free (one pass in topological order)."""
    finish = [0.0] * graph.num_ops
    compute = graph.compute_us.tolist()
    preds = graph.predecessors
    for op in graph.topo_order.tolist():
        p = preds[op]
        finish[op] = compute[op] + (max(finish[q] for q in p) if p else 0.0)
    return max(finish, default=0.0)


def lower_bound_us(graph: OpGraph, cluster: Cluster, *, groups: Optional[Groups] = None) -> float:
    """A bound no placement's simulated makespan beats, the largest of:

    - the critical path, communication free (`critical_path_us`);
    - total compute / number of devices;
    - the sum over phases, where cut ops split the graph, of the larger of each phase's critical
      path and its energetic bound (`_phase_bound_us`, `_energetic_us`);
    - on more than one device, max over ops v of head(v) + compute(v) + tail(v)
      (`_comm_heads_tails`): head(v) = min over the sets L of predecessors on v's device of
      max(J(L), max over the other predecessors u of head(u) + compute(u) + comm(u, v)), where
      J(L) is the end of L run one at a time, none before its head, and comm(u, v) the least
      intercept plus the least slope times the bytes, summed over the edges u -> v; tail is the
      same on the reversed graph;
    - on more than one device, the energetic bound of the whole graph with those heads and tails;
    - on more than one device, the lesser of keeping and splitting (`_keep_or_split_us`): a
      placement that keeps each connected part of the graph on one device takes at least the
      compute of the largest part, one that splits a pair u -> v takes at least head(u) +
      compute(u) + comm(u, v) + compute(v) + tail(v).

    Ops pinned to devices of the cluster stay there in every placement: a pair pinned to two
    devices always pays its copy, and a pair pinned to one never does (`_pins`).

    Without `groups` it bounds every placement. With `groups` (TF's colocation groups,
    `colocation_groups`, are the ones every accepted placement keeps; heuristic groupings such as
    ``coplace`` are not) it bounds only the placements that keep each group on one device: a
    predecessor in v's group is always in L (a successor, for tail), so the bound can only rise.
    """
    compute = graph.compute_us.astype(np.float64)
    # Nothing is remote on one device or without edges: no pairs, only the critical path counts.
    pairs = _pair_comm(graph, cluster) if cluster.num_devices > 1 and graph.num_edges else None
    bounds = [
        critical_path_us(graph),
        float(compute.sum()) / cluster.num_devices,
        _phase_bound_us(graph, cluster.num_devices, pairs),
    ]
    pins = _pins(graph, cluster, groups) if pairs is not None else None
    heads_tails = _comm_heads_tails(graph, pairs, groups=groups, pins=pins)
    if heads_tails is not None:
        head, tail = heads_tails
        bounds.append(float((head + compute + tail).max()))
        bounds.append(_energetic_us(compute, head, tail, cluster.num_devices))
        bounds.append(_keep_or_split_us(graph, pairs, head, tail, groups, pins))
    return max(bounds)


def _pins(graph: OpGraph, cluster: Cluster, groups: Optional[Groups]) -> Optional[np.ndarray]:
    """The device every placement puts each op on, -1 where it may vary (None: no pins): an op's
    pin, or with `groups` its group's. Pins to devices not in `cluster` count as none."""
    if all(d is None for d in graph.pinned_device):
        return None
    try:
        if groups is not None:
            pins = pinned_group_devices(graph, cluster, groups)[groups.group_of]
        else:
            pins = np.array([
                -1 if d is None else pinned_device_index(graph, cluster, op)
                for op, d in enumerate(graph.pinned_device)
            ])
    except ConfigError:  # a pin to a device elsewhere (a host outside the cluster)
        return None
    return pins.astype(np.int64) if (pins >= 0).any() else None


def _keep_or_split_us(
    graph: OpGraph,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
    head: np.ndarray,
    tail: np.ndarray,
    groups: Optional[Groups],
    pins: Optional[np.ndarray] = None,
) -> float:
    """min(the compute of the largest part, the least split pair's path), a bound of every
    placement (with `groups`, of those that keep each group on one device; `pins`, -1 or the
    device of each op, as `_pins`).

    Either no pair (`_pair_comm`) has its ends on two devices: then each part (a weakly connected
    component of the graph, parts joined by a group counting as one) is on one device, which
    runs all of its ops one after the other. Or some pair u -> v has: v starts no earlier than u
    ends plus comm(u, v), so the step takes at least head(u) + compute(u) + comm(u, v) +
    compute(v) + tail(v) (`_comm_heads_tails`). A pair inside a group, or pinned to one device,
    is never split; a part holding ops pinned to two devices is never kept. On graphs whose
    copies cost more than the parallelism saves, this is where the bound meets the one-device
    makespan.
    """
    src, dst, comm = pairs
    compute = graph.compute_us.astype(np.float64)
    n = graph.num_ops
    through = head[src] + compute[src] + comm + compute[dst] + tail[dst]
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    # The parts: connected components of the pairs, and of each op with its group's node n + g.
    ends_a, ends_b = [src], [dst]
    if groups is not None:
        through = through[groups.group_of[src] != groups.group_of[dst]]
        ends_a.append(np.arange(n))  # a group's ops are in one part
        ends_b.append(n + groups.group_of)
    nodes = n + (groups.num_groups if groups is not None else 0)
    a, b = np.concatenate(ends_a), np.concatenate(ends_b)
    _, labels = connected_components(
        coo_matrix((np.ones(a.size, dtype=np.int8), (a, b)), shape=(nodes, nodes)), directed=False
    )
    part = labels[:n]
    if pins is not None:
        kept = (pins[src] >= 0) & (pins[src] == pins[dst])
        if groups is not None:
            kept = kept[groups.group_of[src] != groups.group_of[dst]]
        through = through[~kept]
    split_us = float(through.min()) if through.size else math.inf
    if pins is not None:
        pinned = pins >= 0
        devices_per_part = np.unique(np.stack([part[pinned], pins[pinned]]), axis=1)[0]
        if np.unique(devices_per_part).size < devices_per_part.size:  # a part pinned apart
            return split_us
    keep_us = float(np.bincount(part, weights=compute).max())
    return min(keep_us, split_us)


def _pair_comm(graph: OpGraph, cluster: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, comm): one entry per (producer, consumer) pair, ascending by producer, with the
    least cost of all its edges between two devices summed (least intercept + least slope * bytes,
    least over ordered device pairs; a control edge costs the intercept). The copies from a
    producer u to a consumer v share the channels of the same two devices, so a remote u delays v
    by at least comm(u, v)."""
    n = graph.num_ops
    slope, intercept = (float(p.min()) for p in cluster.pair_links())
    key = graph.edge_src.astype(np.int64) * n + graph.edge_dst
    pair, edge_pair = np.unique(key, return_inverse=True)
    comm = np.bincount(edge_pair.ravel(), weights=intercept + slope * graph.edge_bytes)
    return pair // n, pair % n, comm


def _phase_bound_us(
    graph: OpGraph, num_devices: int, pairs: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> float:
    """Sum over the graph's phases of max(critical path, energetic bound) (`_PhaseSpans`).

    A *cut op* is one that every other op reaches or is reached from: all ops before it in a
    topological order must finish before it starts, all after start after it ends. Cut ops split
    the order into phases that run one after the other with nothing else beside them, so the step
    takes at least the cut ops' compute plus, per phase, a bound of the time from the end of the
    cut op before it to the start of the cut op after it. In a topological order an op at position
    p is a cut op when no op's span to its earliest successor, or from its latest predecessor,
    strictly contains p (a sink spans to the end, a source from the start): such an op would be
    neither before nor after the op at p. `pairs` is `_pair_comm`'s, None when nothing is remote.
    Time O(V + E) plus O(V log V) for the energetic bounds.
    """
    n = graph.num_ops
    if n == 0:
        return 0.0
    order = graph.topo_order
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    src_pos, dst_pos = pos[graph.edge_src], pos[graph.edge_dst]
    first_succ = np.full(n, n, dtype=np.int64)  # position of the earliest successor
    np.minimum.at(first_succ, graph.edge_src, dst_pos)
    last_pred = np.full(n, -1, dtype=np.int64)  # position of the latest predecessor
    np.maximum.at(last_pred, graph.edge_dst, src_pos)
    covered = np.zeros(n + 1, dtype=np.int64)  # +1 on each open span (a, b): positions a+1..b-1
    for a, b in ((pos, first_succ), (last_pred, pos)):
        wide = b - a > 1
        np.add.at(covered, a[wide] + 1, 1)
        np.add.at(covered, b[wide], -1)
    is_cut = np.cumsum(covered[:n]) == 0
    spans = _PhaseSpans(graph, num_devices, pairs)
    order_l = order.tolist()
    cut_us, start, before = 0.0, 0, None
    for p in range(n + 1):
        if p < n and not is_cut[p]:
            continue
        after = order_l[p] if p < n else None
        if p > start:  # the phase at positions start..p-1, between cut ops `before` and `after`
            spans.add(order_l[start:p], before, after)
        if p < n:
            cut_us += spans.compute[after]
        start, before = p + 1, after
    return cut_us + spans.total_us()


class _PhaseSpans:
    """The least time each phase of `_phase_bound_us` takes, from the end of the cut op before it
    (`before`) to the start of the one after it (`after`; None at the graph's start or end): the
    larger of its critical path and its energetic bound (`_energetic_bounds`, of all phases at
    once: a graph can have tens of thousands of small phases).

    Inside a phase, head(v) (tail(v)) is v's longest communication-free path from the phase's
    start (to its end). An op v that is not on `before`'s device waits for a copy: every phase op
    is reached from `before`, so some path from it crosses devices. Its remote head r(v) is the
    max over v's predecessors u in the phase of min(r(u) + compute(u), u on v's device, so not on
    `before`'s either; head(u) + compute(u) + comm(u, v), u elsewhere), and comm(before, v) for
    `before` itself (predecessors in earlier phases end before `before` starts and are left out:
    the bound only falls). The remote tail towards `after` is the same on the reversed phase.
    """

    def __init__(
        self, graph: OpGraph, num_devices: int, pairs: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]
    ):
        n = graph.num_ops
        self.num_devices = num_devices
        self.compute = graph.compute_us.astype(np.float64).tolist()
        # Pair tables as CSR lists: (pair ops, pair comm) per consumer and per producer.
        if pairs is not None:
            src, dst, comm = pairs
        else:  # nothing is remote: pairs with no cost, which only the critical path uses
            src, dst = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
            comm = np.zeros(src.shape[0])
        self.preds = _csr(dst, n, src, comm)
        self.succs = _csr(src, n, dst, comm)
        self.stamp = [-1] * n  # the phase an op is in (ops of earlier phases keep old stamps)
        self.head, self.tail = [0.0] * n, [0.0] * n
        self.phase = 0
        self.settled_us = 0.0  # the spans of the phases that need no energetic bound
        # The other phases, for `_energetic_bounds`: per phase, then per op in phase order.
        self.critical: list[float] = []
        self.anchored_head: list[bool] = []
        self.anchored_tail: list[bool] = []
        self.ops: list[int] = []
        self.set_of: list[int] = []
        self.remote_head: list[float] = []
        self.remote_tail: list[float] = []

    def add(self, ops: list[int], before: Optional[int], after: Optional[int]) -> None:
        self.phase += 1
        stamp, c = self.stamp, self.compute
        for op in ops:
            stamp[op] = self.phase
        head = self._longest(ops, self.preds, self.head)
        tail = self._longest(ops[::-1], self.succs, self.tail)
        critical = max(head[op] + c[op] + tail[op] for op in ops)
        work = sum(c[op] for op in ops)
        k = self.num_devices
        # On one device, or for a chain, nothing beats the critical path / the work. A phase
        # with no cut op on either side is the whole graph, whose energetic bound
        # `lower_bound_us` takes with heads and tails that pay for copies, never lower.
        if k == 1 or len(ops) < 2 or work <= critical or before is None and after is None:
            self.settled_us += max(critical, work / k)
            return
        self.set_of.extend([len(self.critical)] * len(ops))
        self.critical.append(critical)
        self.ops.extend(ops)
        self.anchored_head.append(before is not None)
        self.anchored_tail.append(after is not None)
        if before is None:  # not used: no anchor
            self.remote_head.extend(head[op] for op in ops)
        else:
            self.remote_head.extend(self._remote(ops, self.preds, before, head))
        if after is None:
            self.remote_tail.extend(tail[op] for op in ops)
        else:
            self.remote_tail.extend(self._remote(ops[::-1], self.succs, after, tail)[::-1])

    def total_us(self) -> float:
        if not self.critical:
            return self.settled_us
        ops = np.array(self.ops, dtype=np.int64)
        energetic = _energetic_bounds(
            np.array(self.set_of, dtype=np.int64),
            np.array(self.compute)[ops],
            np.array(self.head)[ops],
            np.array(self.tail)[ops],
            self.num_devices,
            remote_head=np.array(self.remote_head),
            remote_tail=np.array(self.remote_tail),
            anchored_head=np.array(self.anchored_head),
            anchored_tail=np.array(self.anchored_tail),
        )
        return self.settled_us + float(np.maximum(energetic, self.critical).sum())

    def _longest(self, ops: list[int], table, out: list[float]) -> list[float]:
        """head (with `preds`) or tail (with `succs`) of each op of the phase, into `out`; `ops`
        in a topological order of the phase (for `preds`) or its reverse (for `succs`)."""
        ptr, other, _ = table
        stamp, phase, c = self.stamp, self.phase, self.compute
        for v in ops:
            t = 0.0
            for u in other[ptr[v] : ptr[v + 1]]:
                if stamp[u] == phase:
                    t = max(t, out[u] + c[u])
            out[v] = t
        return out

    def _remote(self, ops: list[int], table, anchor: int, free: list[float]) -> list[float]:
        """Remote head (tail) of each op in `ops`' order: its least delay when it is not on
        `anchor`'s device; `free` is the communication-free head (tail)."""
        ptr, other, comm = table
        stamp, phase, c = self.stamp, self.phase, self.compute
        remote: dict[int, float] = {}
        out = []
        for v in ops:
            t = 0.0
            for i in range(ptr[v], ptr[v + 1]):
                u = other[i]
                if u == anchor:
                    t = max(t, comm[i])
                elif stamp[u] == phase:
                    t = max(t, min(remote[u], free[u] + comm[i]) + c[u])
            remote[v] = t
            out.append(t)
        return out


def _csr(key: np.ndarray, n: int, *columns: np.ndarray) -> tuple[list, ...]:
    """(ptr, *columns) as lists, the columns grouped by `key` (`graph.csr`): the entries of op v
    are ptr[v]:ptr[v + 1]."""
    ptr, order = csr(key, n)
    return (ptr.tolist(), *(column[order].tolist() for column in columns))


def _energetic_us(compute: np.ndarray, head: np.ndarray, tail: np.ndarray, num_devices: int) -> float:
    """`_energetic_bounds` of one set of ops, without anchors."""
    one = np.zeros(compute.shape[0], dtype=np.int64)
    no = np.zeros(1, dtype=bool)
    return float(
        _energetic_bounds(one, compute, head, tail, num_devices, remote_head=head, remote_tail=tail,
                          anchored_head=no, anchored_tail=no)[0]
    )


def _energetic_bounds(
    set_of: np.ndarray,
    compute: np.ndarray,
    head: np.ndarray,
    tail: np.ndarray,
    num_devices: int,
    *,
    remote_head: np.ndarray,
    remote_tail: np.ndarray,
    anchored_head: np.ndarray,
    anchored_tail: np.ndarray,
) -> np.ndarray:
    """The energetic bound of each set of ops: the least span M on `num_devices` devices that
    each run one op at a time, when op i starts no earlier than head[i] after the set's start and
    ends no later than tail[i] before its end. Op i is in set set_of[i] (ascending from 0).

    In [0, t1] op i runs at most min(compute_i, (t1 - head_i)+), so the devices do at most
    A(t1) = min(k t1, the sum of those) there; in [M - t2, M] at most B(t2), the same with
    tails. If A(t1) + B(t2) < W, the set's work, the two windows cannot cover [0, M] (the work
    would not fit), so M >= t1 + t2, and the rest of the work runs between them on k devices:
    M >= t1 + t2 + (W - A(t1) - B(t2)) / k. The bound is the max of that over t1 and t2 at the
    breakpoints of A and B (any value taken is valid; between breakpoints the expression is
    convex in each, so no larger value is missed but where the constraint cuts in).

    Where anchored_head[set] (an op that ends at the set's start, see `_PhaseSpans`), remote_head
    is the ops' least start off that op's device: that device does at most t1 in [0, t1] and the
    other k - 1 at most the same sum with remote heads, so A(t1) is also at most
    t1 + min((k - 1) t1, that sum); anchored_tail and remote_tail likewise for B. Time
    O(V log V) for all sets together.
    """
    k = num_devices
    num_sets = int(set_of[-1]) + 1
    work = np.bincount(set_of, weights=compute, minlength=num_sets)
    t1, a, set1 = _window_work(set_of, compute, head, remote_head, anchored_head, k)
    t2, b, set2 = _window_work(set_of, compute, tail, remote_tail, anchored_tail, k)
    # For each t1, the best t2 with b < W - a (strictly, with room for rounding): b rises with
    # t2 inside a set, so that is a running max of t2 - b / k up to the last t2 below the limit.
    second = _running_max(t2 - b / k, set2)
    # a and b are differences of sums of up to 2m values as large as the set's breakpoints (a
    # copy can take 1e9 us beside ops of 0.1 us), taken beside the lifts that keep the sets
    # apart: the room is many times their rounding, so that W - a - b > 0 is never rounding.
    size = np.bincount(set_of, minlength=num_sets)
    reach = np.zeros(num_sets)
    np.maximum.at(reach, set1, t1)
    np.maximum.at(reach, set2, t2)
    lifts = float((reach + work + 1.0).sum())
    room = 1e-9 * (work + 1.0) + 1e-12 * (size * reach + lifts)
    limit = work[set1] - a - room[set1]
    last = _last_below(b, set2, limit, set1)
    fits = last >= 0
    gain = np.zeros(num_sets)
    np.maximum.at(gain, set1[fits], t1[fits] - a[fits] / k + second[last[fits]])
    return work / k + gain


def _window_work(
    set_of: np.ndarray,
    compute: np.ndarray,
    release: np.ndarray,
    remote: np.ndarray,
    anchored: np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, most work in [0, t], set) at every breakpoint t of `_energetic_bounds`' A (0, and each
    op's release, and in an anchored set its remote release, and those plus its compute), by set,
    then t. A set's points do not depend on the other sets, so neither does its bound."""
    num_sets = anchored.shape[0]
    parts, part_sets = [np.zeros(num_sets), release, release + compute], [np.arange(num_sets), set_of, set_of]
    if anchored.any():
        mine = anchored[set_of]
        parts += [remote[mine], remote[mine] + compute[mine]]
        part_sets += [set_of[mine], set_of[mine]]
    t, sets = np.concatenate(parts), np.concatenate(part_sets)
    order = np.argsort(t + _lift(t, sets, num_sets)[1][sets], kind="stable")
    t, sets = t[order], sets[order]
    most = np.minimum(k * t, _released_work(set_of, compute, release, t, sets))
    if anchored.any():
        off_anchor = t + np.minimum((k - 1) * t, _released_work(set_of, compute, remote, t, sets))
        most = np.where(anchored[sets], np.minimum(most, off_anchor), most)
    return t, _running_max(most, sets), sets  # rounding must not make it fall


def _released_work(
    set_of: np.ndarray, compute: np.ndarray, release: np.ndarray, t: np.ndarray, t_set: np.ndarray
) -> np.ndarray:
    """Sum over the ops of t's set of min(compute, (t - release)+), at each t: ramps that start
    at release and stop at release + compute."""
    return _ramps(set_of, release, t, t_set) - _ramps(set_of, release + compute, t, t_set)


def _ramps(set_of: np.ndarray, starts: np.ndarray, t: np.ndarray, t_set: np.ndarray) -> np.ndarray:
    """Sum over the starts s of t's set of (t - s)+, at each t: count * t - sum of the starts at
    or below t, in the set. `set_of` (of the starts) ascending."""
    num = int(max(set_of[-1], t_set.max())) + 1
    _, lift = _lift(np.concatenate([starts, t]), np.concatenate([set_of, t_set]), num)
    order = np.argsort(starts + lift[set_of], kind="stable")
    lifted = (starts + lift[set_of])[order]
    # Running sums of the sorted starts, 0 before each set's first.
    total = np.concatenate([[0.0], _segment_cumsum(starts[order], set_of)])
    first = np.searchsorted(set_of, t_set, side="left")
    upto = np.searchsorted(lifted, t + lift[t_set], side="right")  # starts at or below t
    below = np.where(upto > first, total[upto], 0.0)
    return (upto - first) * t - below


def _segment_cumsum(values: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """Running sums that restart at each set (`sets` ascending): each set's first value also
    takes back the sum of the set before, so the running total, and its rounding, stays the
    size of one set's values."""
    adjusted = values.astype(np.float64)
    first = np.flatnonzero(np.concatenate([[True], sets[1:] != sets[:-1]]))
    sums = np.add.reduceat(adjusted, first)
    adjusted[first[1:]] -= sums[:-1]
    return np.cumsum(adjusted)


def _lift(values: np.ndarray, sets: np.ndarray, num_sets: int) -> tuple[np.ndarray, np.ndarray]:
    """(peak, lift) per set: its largest value, and an offset that puts the set's `values`
    (>= 0) above every earlier set's, the sum of the earlier peaks plus 1 each. A sort or search
    on the lifted values is one by set, then value."""
    peak = np.zeros(num_sets)
    np.maximum.at(peak, sets, values)
    return peak, np.concatenate([[0.0], np.cumsum(peak + 1.0)[:-1]])


def _running_max(values: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """Running max of `values` (>= 0) that restarts at each set (`sets` ascending)."""
    lift = _lift(values, sets, int(sets[-1]) + 1)[1][sets]
    return np.maximum.accumulate(values + lift) - lift


def _last_below(
    values: np.ndarray, sets: np.ndarray, limit: np.ndarray, limit_set: np.ndarray
) -> np.ndarray:
    """For each limit, the last index i of its set with values[i] < limit, or -1; `values`
    (>= 0) rise inside each set, `sets` ascending."""
    peak, lift = _lift(values, sets, int(sets[-1]) + 1)
    first = np.searchsorted(sets, limit_set, side="left")
    # A limit above the set's peak stops at its last value, not in the next set.
    query = np.minimum(limit, peak[limit_set] + 0.5) + lift[limit_set]
    last = np.searchsorted(values + lift[sets], query, side="left") - 1
    return np.where(last >= first, last, -1)


def _comm_heads_tails(
    graph: OpGraph,
    pairs: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]],
    *,
    groups: Optional[Groups] = None,
    pins: Optional[np.ndarray] = None,
) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """head(v) and tail(v) of every op, communication paid where unavoidable, from `_pair_comm`'s
    `pairs`; None without them (nothing is remote: they are the critical path's).

    A remote predecessor u delays v by comm(u, v) (`_pair_comm`). head(v) bounds v's start in any
    placement, in topological order. A predecessor u on another device gives v >= a_u = head(u) +
    compute(u) + comm(u, v). The local ones, L, run on v's device one at a time, none before its
    head, so v >= J(L), their end in order of head (t = max(t, head(u)) + compute(u); Jackson's
    rule, exact on one machine with release dates). Hence head(v) = min over L of max(J(L), max
    a_u over u not in L). A best L is a prefix of the predecessors sorted by a_u descending: it
    holds every u with a_u above the largest remote one, any other can leave without raising
    that, and J only grows with L. The prefixes are tried in order until J reaches the next a_u;
    past `_EXACT_PREFIXES` of them J is replaced by max(J(first _EXACT_PREFIXES), least head + sum
    of compute), a bound of J, so the min stays a bound. tail(v) bounds makespan - end(v): the
    same recursion on the reversed graph.

    With `groups`, only placements that keep each group on one device count: the predecessors in
    v's group, F, are on v's device, so L ranges over the sets that contain F. A best one is F plus
    a prefix of the others sorted by a_u descending (the argument above, on the others; the empty
    prefix now counts), and J(F + prefix) runs F too; past `_EXACT_PREFIXES` the bound of J counts
    F's least head and compute. Successors in v's group are forced the same way for tail.

    With `pins` (-1 or the device of each op, `_pins`), a predecessor pinned to v's device is
    forced into L as one of its group is, and one pinned to another device is never in L: head(v)
    is then the max of its a_u and the min over L of the others, since max(R, .) distributes over
    the min.

    Time O(E log E) plus O(min(deg, _EXACT_PREFIXES)^2 + deg log deg) per op, or
    O(min(deg, _EXACT_PREFIXES) * deg) for an op with a pair in its own group; memory O(V + E).
    """
    if pairs is None:
        return None
    src, dst, comm = pairs
    # Pairs inside one group: the producer is always local to the consumer (and vice versa).
    same = None if groups is None else groups.group_of[src] == groups.group_of[dst]
    apart = None
    if pins is not None:
        pinned = (pins[src] >= 0) & (pins[dst] >= 0)
        together = pinned & (pins[src] == pins[dst])
        same = together if same is None else same | together
        apart = pinned & (pins[src] != pins[dst])
        if not apart.any():
            apart = None
    if same is not None and not same.any():
        same = None
    compute = graph.compute_us.astype(np.float64)
    order = graph.topo_order.tolist()
    head = _head_us(order, src, dst, comm, compute, same, apart)
    tail = _head_us(order[::-1], dst, src, comm, compute, same, apart)
    return head, tail


def _head_us(
    order: list[int],
    src: np.ndarray,
    dst: np.ndarray,
    comm: np.ndarray,
    compute: np.ndarray,
    same: Optional[np.ndarray] = None,
    apart: Optional[np.ndarray] = None,
) -> np.ndarray:
    """head(v) of `_comm_heads_tails` for pairs src -> dst, visited in `order`; the pairs
    where `same` is true keep src local to dst, those where `apart` is true keep it remote."""
    n = compute.shape[0]
    ptr_r: list[int] = [0] * (n + 1)
    if apart is not None:
        ptr_r, pred_r, comm_r = _csr(dst[apart], n, src[apart], comm[apart])
        keep = ~apart
        src, dst, comm = src[keep], dst[keep], comm[keep]
        same = same[keep] if same is not None else None
    if same is None:
        ptr_l, pred, comm_l = _csr(dst, n, src, comm)
        forced_l, num_forced = [], [0] * n
    else:
        ptr_l, pred, comm_l, forced_l = _csr(dst, n, src, comm, same)
        num_forced = np.bincount(dst[same], minlength=n).tolist()
    c = compute.tolist()
    head = [0.0] * n
    for v in order:
        lo, hi = ptr_l[v], ptr_l[v + 1]
        if hi - lo == 1:  # one predecessor: best kept local
            u = pred[lo]
            head[v] = head[u] + c[u]
        elif num_forced[v]:
            jobs, forced = [], []
            for u, w, f in zip(pred[lo:hi], comm_l[lo:hi], forced_l[lo:hi]):
                if f:
                    forced.append((head[u], c[u]))
                else:
                    jobs.append((head[u] + c[u] + w, head[u], c[u]))
            forced.sort()
            t = 0.0
            for r, cu in forced:
                t = max(t, r) + cu
            # Mostly the forced ones alone end after every other arrives: L = forced wins.
            if not jobs or t >= max(jobs)[0]:
                head[v] = t
            else:
                jobs.sort(reverse=True)
                head[v] = _best_local_set_us(jobs, forced)
        elif hi > lo:
            jobs = [(head[u] + c[u] + w, head[u], c[u]) for u, w in zip(pred[lo:hi], comm_l[lo:hi])]
            jobs.sort(reverse=True)
            _, r, cu = jobs[0]
            # Mostly the first prefix wins already: only its op local, all others remote.
            head[v] = r + cu if r + cu >= jobs[1][0] else _best_local_set_us(jobs)
        for k in range(ptr_r[v], ptr_r[v + 1]):  # pinned to another device: always remote
            u = pred_r[k]
            head[v] = max(head[v], head[u] + c[u] + comm_r[k])
    return np.array(head)


def _best_local_set_us(
    jobs: list[tuple[float, float, float]], forced: Sequence[tuple[float, float]] = ()
) -> float:
    """Min over prefixes L of `jobs` of max(J(forced + L), a of the first job after L).

    `jobs` are (a, release, compute) by a descending, `forced` (release, compute) always local;
    J as in `_comm_heads_tails`. Without `forced` the empty prefix never wins (a of the first
    job is at least J of it and at least every other a), so it is not tried.
    """
    local = sorted(forced)  # (release, compute) of forced + the prefix, by release
    best = math.inf
    t = 0.0
    for k in range(0 if forced else 1, min(len(jobs), _EXACT_PREFIXES) + 1):
        if k:
            bisect.insort(local, jobs[k - 1][1:])
        t = 0.0
        for r, cu in local:
            t = max(t, r) + cu
        remote = jobs[k][0] if k < len(jobs) else 0.0
        if t >= remote:  # longer prefixes only raise J
            return min(best, t)
        best = remote  # the a of the next jobs only falls
    # Past the exact prefixes: J(forced + first k jobs) >= their least release + their compute.
    a, release, compute = np.array(jobs).T
    forced_release = min((r for r, _ in forced), default=math.inf)
    forced_compute = sum(cu for _, cu in forced)
    least = np.minimum(np.minimum.accumulate(release), forced_release) + np.cumsum(compute)
    floor = np.maximum.accumulate(np.maximum(least + forced_compute, t))
    remote = np.append(a[_EXACT_PREFIXES + 1 :], 0.0)
    return min(best, float(np.maximum(floor[_EXACT_PREFIXES:], remote).min()))


def single_device_schedule(
    graph: OpGraph, cluster: Cluster, groups: Optional[Groups] = None
) -> Optional[Schedule]:
    """Everything on one device, or None when the graph does not fit: the first of
    `single_device_placements` that fits."""
    for device_of in single_device_placements(graph, cluster, groups):
        try:
            return simulate(graph, cluster, Placement(device_of, "single"))
        except InfeasiblePlacementError:
            continue
    return None


def single_device_placements(
    graph: OpGraph, cluster: Cluster, groups: Optional[Groups] = None
) -> list[np.ndarray]:
    """The one-device placements to try, best first: on the device every pinned op is pinned to
    when they share one, then on the device with the most memory. Pinned ops (with their
    `groups`, when given) stay on their pinned devices."""
    from baechi_tf.placer.list_scheduler import pinned_device_index

    capacities = [d.memory_bytes for d in cluster.devices]
    pins = np.full(graph.num_ops, -1, dtype=np.int32)
    for op, name in enumerate(graph.pinned_device):
        if name is not None:
            dev = pinned_device_index(graph, cluster, op)
            if groups is not None:
                pins[groups.members[int(groups.group_of[op])]] = dev
            pins[op] = dev
    pinned = np.unique(pins[pins >= 0]).tolist()
    bases = pinned if len(pinned) == 1 else []
    bases.append(capacities.index(max(capacities)))
    return [np.where(pins >= 0, pins, base).astype(np.int32) for base in dict.fromkeys(bases)]
