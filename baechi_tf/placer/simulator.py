"""The simulator: the schedule of a finished placement, and the bounds it is judged by.

`simulate` runs the shared list scheduler (`list_scheduler`) with every op's device fixed: ops
start as soon as their inputs are on their device, the device is idle and memory fits, earliest
first (ties by topological index). This is Baechi's virtual scheduler (SoCC 2020, section 6)
with transfers booked in time order on each device's channel and memory freed when a tensor's
last consumer finishes. Because m-ETF picks op and device by the same earliest-start rule, the
simulated schedule of an m-ETF placement is the schedule m-ETF built.

Time and memory as `run_list_scheduler` with one device per op.

`lower_bound_us` is what every placement's simulated makespan is at least (with `groups`, every
placement that keeps each group on one device): the critical path and the compute per device (both
communication free, summed over phases where cut ops split the graph) and a longest path that pays
for the copies no such placement avoids (`_comm_path_bound_us`). Time O(V + E) for the first,
O(E log E) plus O(min(deg, 64)^2) per op for the last (O(min(deg, 64) * deg) for an op with an
input or output in its own group).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import FixedPolicy, run_list_scheduler
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = ["critical_path_us", "lower_bound_us", "simulate", "single_device_schedule"]

_EXACT_PREFIXES = 64  # local sets tried exactly per op; longer ones get a smaller bound of J


def simulate(graph: OpGraph, cluster: Cluster, placement: Placement) -> Schedule:
    """The schedule of `placement`; `InfeasiblePlacementError` if its memory cannot fit."""
    device_of = placement.device_of
    if device_of.shape != (graph.num_ops,):
        raise ValueError(f"placement has {device_of.shape[0]} ops, the graph {graph.num_ops}")
    singletons = Groups.singletons(graph)
    schedule = run_list_scheduler(
        graph,
        cluster,
        singletons,
        FixedPolicy(device_of.tolist()),
        method=placement.method,
        initial_group_device=device_of.tolist(),
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
    - the sum over phases, where cut ops split the graph, of the larger of those two
      (`_phase_bound_us`);
    - on more than one device, max over ops v of head(v) + compute(v) + tail(v)
      (`_comm_path_bound_us`): head(v) = min over the sets L of predecessors on v's device of
      max(J(L), max over the other predecessors u of head(u) + compute(u) + comm(u, v)), where
      J(L) is the end of L run one at a time, none before its head, and comm(u, v) the least
      intercept plus the least slope times the bytes, summed over the edges u -> v; tail is the
      same on the reversed graph.

    Without `groups` it bounds every placement. With `groups` (TF's colocation groups,
    `colocation_groups`, are the ones every accepted placement keeps; heuristic groupings such as
    ``coplace`` are not) it bounds only the placements that keep each group on one device: a
    predecessor in v's group is always in L (a successor, for tail), so the bound can only rise.
    """
    total = float(graph.compute_us.sum())
    return max(
        critical_path_us(graph),
        total / cluster.num_devices,
        _phase_bound_us(graph, cluster.num_devices),
        _comm_path_bound_us(graph, cluster, groups=groups),
    )


def _phase_bound_us(graph: OpGraph, num_devices: int) -> float:
    """Sum over the graph's phases of max(critical path, compute / devices).

    A *cut op* is one that every other op reaches or is reached from: all ops before it in a
    topological order must finish before it starts, all after start after it ends. Cut ops split
    the order into phases that run one after the other with nothing else beside them, so the step
    takes at least the cut ops' compute plus, per phase, the longer of its internal critical path
    and its compute spread over every device. In a topological order an op at position p is a
    cut op when no op's span to its earliest successor, or from its latest predecessor, strictly
    contains p (a sink spans to the end, a source from the start): such an op would be neither
    before nor after the op at p. Time O(V + E).
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
    compute = graph.compute_us.tolist()
    preds = graph.predecessors
    total, finish = 0.0, {}
    start = 0
    for p in range(n + 1):
        if p < n and not is_cut[p]:
            continue
        if p > start:  # the phase at positions start..p-1
            finish.clear()
            for op in order[start:p].tolist():
                finish[op] = compute[op] + max((finish.get(q, 0.0) for q in preds[op]), default=0.0)
            work = sum(compute[op] for op in order[start:p].tolist())
            total += max(max(finish.values()), work / num_devices)
        if p < n:
            total += compute[int(order[p])]
        start = p + 1
    return total


def _comm_path_bound_us(graph: OpGraph, cluster: Cluster, *, groups: Optional[Groups] = None) -> float:
    """Max over ops v of head(v) + compute(v) + tail(v), communication paid where unavoidable.

    An edge between two devices costs at least comm(e) = least intercept + least slope * bytes(e)
    (least over ordered device pairs; a control edge costs the intercept). The copies from a
    producer u to a consumer v share the channels of the same two devices, so a remote u delays v
    by comm(u, v), the sum over the edges u -> v. head(v) bounds v's start in any placement, in
    topological order. A predecessor u on another device gives v >= a_u = head(u) + compute(u) +
    comm(u, v). The local ones, L, run on v's device one at a time, none before its head, so
    v >= J(L), their end in order of head (t = max(t, head(u)) + compute(u); Jackson's rule, exact
    on one machine with release dates). Hence head(v) = min over L of max(J(L), max a_u over u not
    in L). A best L is a prefix of the predecessors sorted by a_u descending: it holds every u
    with a_u above the largest remote one, any other can leave without raising that, and J only
    grows with L. The prefixes are tried in order until J reaches the next a_u; past
    `_EXACT_PREFIXES` of them J is replaced by max(J(first _EXACT_PREFIXES), least head + sum of
    compute), a bound of J, so the min stays a bound. tail(v) bounds makespan - end(v): the same
    recursion on the reversed graph. Communication free, this is the critical path; on one device
    nothing is remote and it is skipped (0).

    With `groups`, only placements that keep each group on one device count: the predecessors in
    v's group, F, are on v's device, so L ranges over the sets that contain F. A best one is F plus
    a prefix of the others sorted by a_u descending (the argument above, on the others; the empty
    prefix now counts), and J(F + prefix) runs F too; past `_EXACT_PREFIXES` the bound of J counts
    F's least head and compute. Successors in v's group are forced the same way for tail.

    Time O(E log E) plus O(min(deg, _EXACT_PREFIXES)^2 + deg log deg) per op, or
    O(min(deg, _EXACT_PREFIXES) * deg) for an op with a pair in its own group; memory O(V + E).
    """
    nd = cluster.num_devices
    n = graph.num_ops
    if nd < 2 or graph.num_edges == 0:
        return 0.0
    links = [cluster.link(a, b) for a in range(nd) for b in range(nd) if a != b]
    intercept = min(link.intercept_us for link in links)
    slope = min(link.slope_us_per_byte for link in links)
    # One entry per (producer, consumer) pair, with the comm of all its edges summed.
    key = graph.edge_src.astype(np.int64) * n + graph.edge_dst
    pair, edge_pair = np.unique(key, return_inverse=True)
    comm = np.bincount(edge_pair.ravel(), weights=intercept + slope * graph.edge_bytes)
    src, dst = pair // n, pair % n
    # Pairs inside one group: the producer is always local to the consumer (and vice versa).
    same = None if groups is None else groups.group_of[src] == groups.group_of[dst]
    if same is not None and not same.any():
        same = None
    compute = graph.compute_us.astype(np.float64)
    order = graph.topo_order.tolist()
    head = _head_us(order, src, dst, comm, compute, same)
    tail = _head_us(order[::-1], dst, src, comm, compute, same)
    return float((head + compute + tail).max())


def _head_us(
    order: list[int],
    src: np.ndarray,
    dst: np.ndarray,
    comm: np.ndarray,
    compute: np.ndarray,
    same: Optional[np.ndarray] = None,
) -> np.ndarray:
    """head(v) of `_comm_path_bound_us` for pairs src -> dst, visited in `order`; the pairs
    where `same` is true keep src local to dst."""
    n = compute.shape[0]
    by_dst = np.argsort(dst, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    ptr_l, pred, comm_l = ptr.tolist(), src[by_dst].tolist(), comm[by_dst].tolist()
    if same is None:
        forced_l, num_forced = [], [0] * n
    else:
        forced_l = same[by_dst].tolist()
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
    return np.array(head)


def _best_local_set_us(
    jobs: list[tuple[float, float, float]], forced: Sequence[tuple[float, float]] = ()
) -> float:
    """Min over prefixes L of `jobs` of max(J(forced + L), a of the first job after L).

    `jobs` are (a, release, compute) by a descending, `forced` (release, compute) always local;
    J as in `_comm_path_bound_us`. Without `forced` the empty prefix never wins (a of the first
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
    """Everything on the device with the most memory, or None when the graph does not fit.

    Pinned ops (with their `groups`, when given) stay on their pinned devices.
    """
    from baechi_tf.placer.list_scheduler import pinned_device_index

    capacities = [d.memory_bytes for d in cluster.devices]
    device_of = np.full(graph.num_ops, capacities.index(max(capacities)), dtype=np.int32)
    for op, name in enumerate(graph.pinned_device):
        if name is not None:
            dev = pinned_device_index(graph, cluster, op)
            if groups is not None:
                device_of[groups.members[int(groups.group_of[op])]] = dev
            device_of[op] = dev
    try:
        return simulate(graph, cluster, Placement(device_of, "single"))
    except InfeasiblePlacementError:
        return None
