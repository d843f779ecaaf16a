"""Memory-first packing: the fallback when a time-driven placer runs out of memory.

Groups are packed by decreasing static memory (persistent, output and temporary bytes of their
ops plus every input received from another group, nothing freed), each onto the device with the
most room left (worst fit, which also spreads the load). Because nothing is counted as freed, a
packing that fits can never run out of memory in the simulator, whatever the order ops run in.
It ignores compute and communication; ``auto`` and the placers' fallback use it only to have a
placement where the others found none.

Time: O(G log G + G * D + E) for G groups, D devices and E edges.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.pins import pinned_device_index
from baechi_tf.placer.scheduler_state import format_bytes
from baechi_tf.placer.m_topo import static_group_bytes
from baechi_tf.placer.schedule import Placement

__all__ = ["place_packed"]


def place_packed(
    graph: OpGraph, cluster: Cluster, groups: Groups, free_devices: Optional[int] = None
) -> Placement:
    """Places whole groups so that their static memory fits; `InfeasiblePlacementError` if not.

    `free_devices`: the groups that no pin holds go to the first this many devices of `cluster`
    only (all when None); the others (a host CPU) take the groups pinned there."""
    need = static_group_bytes(graph, groups)
    # Received copies, counted as if every input came from another device (an upper bound).
    g_src = groups.group_of[graph.tensor_src[graph.edge_tensor]]
    g_dst = groups.group_of[graph.edge_dst]
    outside = g_src != g_dst
    if outside.any():
        pairs = np.unique(np.stack([graph.edge_tensor[outside], g_dst[outside]]), axis=1)
        need = need + np.bincount(
            pairs[1], weights=graph.tensor_bytes[pairs[0]], minlength=groups.num_groups
        ).astype(np.int64)
    need = need.tolist()
    room = [d.memory_bytes for d in cluster.devices]
    group_device = [-1] * groups.num_groups
    for op, name in enumerate(graph.pinned_device):
        g = int(groups.group_of[op])
        if name is not None and group_device[g] < 0:
            group_device[g] = pinned_device_index(graph, cluster, op)
            room[group_device[g]] -= need[g]
    for g in sorted(range(groups.num_groups), key=lambda g: (-need[g], g)):
        if group_device[g] >= 0:
            continue
        d = max(range(cluster.num_devices if free_devices is None else free_devices), key=lambda d: (room[d], -d))
        if room[d] < need[g]:
            op = int(groups.members[g][0])
            raise InfeasiblePlacementError(
                f"group {groups.names[g]!r} (op {graph.names[op]!r}, {len(groups.members[g])} "
                f"ops) needs {format_bytes(need[g])} counted with nothing freed, but no device "
                f"has that much left ({', '.join(f'{n}: {format_bytes(max(r, 0))} free' for n, r in zip(cluster.names, room))}); "
                "use more devices or more memory per device"
            )
        group_device[g] = d
        room[d] -= need[g]
    if any(r < 0 for r in room):
        d = min(range(cluster.num_devices), key=lambda d: room[d])
        raise InfeasiblePlacementError(
            f"the ops pinned to {cluster.names[d]!r} need {format_bytes(cluster.devices[d].memory_bytes - room[d])} "
            f"counted with nothing freed, more than its {format_bytes(cluster.devices[d].memory_bytes)}"
        )
    return Placement(np.asarray(group_device, dtype=np.int32)[groups.group_of], "packed")
