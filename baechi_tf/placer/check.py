"""`check_placement`: the invariants every placement must satisfy, checked at the boundary."""

from __future__ import annotations

from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError, InvalidGraphError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.pins import pinned_device_index
from baechi_tf.placer.scheduler_state import format_bytes
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.simulator import simulate

__all__ = ["check_placement"]


def check_placement(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    placement: Placement,
    schedule: Optional[Schedule] = None,
) -> Schedule:
    """Raises unless every op is placed on a device of `cluster`, each group sits on one device,
    pinned ops are where they were pinned, and the simulated peak memory of every device is within
    its capacity. Returns the schedule it checked (simulating `placement` when none is given; a
    given one must be a schedule of this placement).
    """
    problem = placement.problem(graph, cluster)
    if problem:
        raise InvalidGraphError(problem)
    device_of = placement.device_of
    for g, members in enumerate(groups.members):
        devices = np.unique(device_of[members])
        if devices.size > 1:
            raise InvalidGraphError(
                f"group {groups.names[g]!r} is split over devices "
                f"{', '.join(cluster.names[d] for d in devices.tolist())}"
            )
    for op, name in enumerate(graph.pinned_device):
        if name is not None and device_of[op] != pinned_device_index(graph, cluster, op):
            raise InvalidGraphError(
                f"op {graph.names[op]!r} is pinned to {name!r} but placed on "
                f"{cluster.names[int(device_of[op])]!r}"
            )
    if schedule is None:
        schedule = simulate(graph, cluster, placement)
    elif not np.array_equal(schedule.placement.device_of, device_of):
        raise ValueError("the schedule given to check_placement is of another placement")
    for d, peak in enumerate(schedule.peak_memory_bytes):
        if peak > cluster.devices[d].memory_bytes:
            raise InfeasiblePlacementError(
                f"device {cluster.names[d]!r} peaks at {format_bytes(peak)} but holds "
                f"{format_bytes(cluster.devices[d].memory_bytes)}"
            )
    return schedule
