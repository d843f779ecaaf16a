"""The simulator: the schedule of a finished placement, and the bounds it is judged by.

`simulate` runs the shared list scheduler (`list_scheduler`) with every op's device fixed: ops
start as soon as their inputs are on their device, the device is idle and memory fits, earliest
first (ties by topological index). This is Baechi's virtual scheduler (SoCC 2020, section 6)
with transfers booked in time order on each device's channel and memory freed when a tensor's
last consumer finishes. Because m-ETF picks op and device by the same earliest-start rule, the
simulated schedule of an m-ETF placement is the schedule m-ETF built.

Time and memory as `run_list_scheduler` with one device per op.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import FixedPolicy, run_list_scheduler
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = ["critical_path_us", "lower_bound_us", "simulate", "single_device_schedule"]


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


def lower_bound_us(graph: OpGraph, cluster: Cluster) -> float:
    """A bound no schedule beats, communication free: max(critical path, total compute / number
    of devices), taken phase by phase where the graph runs in phases (`_phase_bound_us`)."""
    total = float(graph.compute_us.sum())
    return max(
        critical_path_us(graph), total / cluster.num_devices, _phase_bound_us(graph, cluster.num_devices)
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
