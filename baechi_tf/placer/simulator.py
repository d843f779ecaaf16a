"""The simulator: the schedule of a finished placement.

`simulate` runs the shared list scheduler (`list_scheduler`) with every op's device fixed: ops
start as soon as their inputs are on their device, the device is idle and memory fits, earliest
first (ties by topological index). This is Baechi's virtual scheduler (SoCC 2020, section 6)
with transfers booked in time order on each device's channel and memory freed when a tensor's
last consumer finishes. m-ETF picks op and device by the same earliest-start rule, so the
schedule it built is one of its placement under this model; it need not be this one, which
weighs each op on its own device only (`m_etf.schedule_m_etf`).

Time and memory as `run_list_scheduler` with one device per op.

The lower bounds that placements are judged by are in `bounds`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.policies import FixedPolicy
from baechi_tf.placer.run_scheduler import run_list_scheduler
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = ["simulate", "single_device_placements", "single_device_schedule"]


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
    from baechi_tf.placer.pins import pinned_device_index

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
