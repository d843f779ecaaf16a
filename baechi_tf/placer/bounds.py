"""The lower bounds every placement is judged by.

`lower_bound_us` is what every placement's simulated makespan is at least (with `groups`, every
placement that keeps each group on one device): the critical path and the compute per device (both
communication free, summed over phases where cut ops split the graph), a longest path that pays
for the copies no such placement avoids (`_comm_heads_tails`), and energetic bounds: the devices
cannot all be busy while few ops are ready at the start of the step or of a phase, nor at its end
(`energetic.energetic_us`). Time O(V log V + E) for the first and the last, O(E log E) plus
O(min(deg, 64)^2) per op for the longest path (O(min(deg, 64) * deg) for an op with an input or
output in its own group).

The model is the simulator's (`simulator`, Baechi, SoCC 2020, section 6): an op runs on one
device at a time, a copy costs the cluster's linear communication time and is booked on both
ends' channels.
"""

from __future__ import annotations

import bisect
import math
from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import ConfigError
from baechi_tf.graph import OpGraph, csr
from baechi_tf.placer.energetic import energetic_bounds, energetic_us
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.pins import pinned_device_index, pinned_group_devices

__all__ = ["critical_path_us", "lower_bound_us"]

_EXACT_PREFIXES = 64  # local sets tried exactly per op; longer ones get a smaller bound of J


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
      path and its energetic bound (`_phase_bound_us`, `energetic.energetic_us`);
    - on more than one device, max over ops v of head(v) + compute(v) + tail(v)
      (`_comm_heads_tails`): head(v) = min over the sets L of predecessors on v's device of
      max(J(L), max over the other predecessors u of head(u) + compute(u) + comm(u, v)), where
      J(L) is the end of L run one at a time, none before its head, and comm(u, v) the least
      time the copies u -> v hold the channels, summed, plus the least latency paid once
      (`_pair_comm`); tail is the same on the reversed graph;
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
        bounds.append(energetic_us(compute, head, tail, cluster.num_devices))
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
    least cost of all its edges between two devices: the least time each holds the channels
    summed (least held part of the intercept + least slope * bytes, least over ordered device
    pairs; a control edge holds them the held part), plus the least rest of the intercept, paid
    in flight once (`Cluster.channel_tables`; 0 for links of one copy in flight, where this is
    the intercept summed). The copies from a producer u to a consumer v share the channels of the
    same two devices, so a remote u delays v by at least comm(u, v)."""
    n = graph.num_ops
    slope = float(cluster.pair_links()[0].min())
    apart = ~np.eye(cluster.num_devices, dtype=bool)
    _, held, latency = (float(np.asarray(t, dtype=np.float64)[apart].min()) for t in cluster.channel_tables())
    key = graph.edge_src.astype(np.int64) * n + graph.edge_dst
    pair, edge_pair = np.unique(key, return_inverse=True)
    comm = np.bincount(edge_pair.ravel(), weights=held + slope * graph.edge_bytes) + latency
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
    larger of its critical path and its energetic bound (`energetic.energetic_bounds`, of all phases at
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
        # The other phases, for `energetic.energetic_bounds`: per phase, then per op in phase order.
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
        energetic = energetic_bounds(
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
