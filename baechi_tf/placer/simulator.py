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
    """max(critical path with free communication, total compute / number of devices)."""
    total = float(graph.compute_us.sum())
    return max(critical_path_us(graph), total / cluster.num_devices)


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
