"""The devices of pinned ops: the cluster index of each op's or group's pin, and the groups of
pinned ops placed on them before a schedule starts.

An op pinned to a device (`OpGraph.pinned_device`, a name `Cluster.find` resolves) stays there; a
pin to a device not in the cluster is a `ConfigError` that names both and the fix. Every placer
and the simulator read pins from here. Time O(V) for V ops.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.scheduler_state import SchedulerState, format_bytes

__all__ = ["pinned_device_index", "pinned_group_devices", "place_pinned"]


def place_pinned(
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
