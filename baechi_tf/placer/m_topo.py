"""m-TOPO: topological slices balanced by memory (Baechi, SoCC 2020, section 4.1).

Ops are visited in topological order and placed on the current device until the next op's group
would push the device past its share of memory; then the next device is filled. The share is the
total memory over the number of devices plus the largest group, capped by each device's real
capacity (the original ignored real capacities and checked a different quantity than it charged;
see the spec, section 10.1 item 7). A group that fits no later device goes to the device with the
most room left; when none has room, `InfeasiblePlacementError` names the group and every device's
free bytes.

Memory is counted statically, with nothing freed: persistent, output and temporary bytes of every
member plus the bytes of every tensor the group reads from a producer not on the same device. That bound is never below
what the simulator measures, so an m-TOPO placement always simulates within capacity. Compute
times and communication are ignored: m-TOPO is the fast baseline.

Time: O(V + E) for V ops and E edges; memory O(V + E).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import format_bytes, pinned_device_index
from baechi_tf.placer.schedule import Placement

__all__ = ["MTopoOptions", "place_m_topo", "static_group_bytes"]


@dataclasses.dataclass(frozen=True)
class MTopoOptions:
    uniform: bool = True  # cap each device at an equal share of memory (else fill to capacity)


def static_group_bytes(graph: OpGraph, groups: Groups) -> np.ndarray:
    """int64 [num_groups]: persistent, output and temporary bytes of a group's ops, summed."""
    per_op = graph.persistent_bytes + graph.output_total_bytes + graph.temp_bytes
    total = np.bincount(groups.group_of, weights=per_op, minlength=groups.num_groups)
    return np.rint(total).astype(np.int64)


def _external_inputs(graph: OpGraph, groups: Groups) -> list[list[tuple[int, int]]]:
    """Per group, the distinct (producer group, bytes) of tensors it reads from other groups."""
    out: list[dict[int, tuple[int, int]]] = [{} for _ in range(groups.num_groups)]
    group_of = groups.group_of.tolist()
    tensor_src = graph.tensor_src.tolist()
    tensor_bytes = graph.tensor_bytes.tolist()
    for t, d in zip(graph.edge_tensor.tolist(), graph.edge_dst.tolist()):
        gp, gd = group_of[tensor_src[t]], group_of[d]
        if gp != gd and tensor_bytes[t]:
            out[gd][t] = (gp, tensor_bytes[t])
    return [list(x.values()) for x in out]


def place_m_topo(
    graph: OpGraph, cluster: Cluster, groups: Groups, *, options: MTopoOptions = MTopoOptions()
) -> Placement:
    """Places `graph` on `cluster` by m-TOPO."""
    own = static_group_bytes(graph, groups).tolist()
    inputs = _external_inputs(graph, groups)
    capacity = [d.memory_bytes for d in cluster.devices]
    nd = cluster.num_devices
    used = [0] * nd
    group_device = [-1] * groups.num_groups
    for op, name in enumerate(graph.pinned_device):
        if name is not None:
            g = int(groups.group_of[op])
            if group_device[g] < 0:
                dev = pinned_device_index(graph, cluster, op)
                group_device[g] = dev
                used[dev] += own[g] + _copies(inputs[g], group_device, dev)
    if options.uniform:
        share = sum(own) // nd + max(own, default=0)
        cap = [min(c, share) for c in capacity]
    else:
        cap = list(capacity)

    def need(g: int, d: int) -> int:
        return own[g] + _copies(inputs[g], group_device, d)

    current = 0
    group_of = groups.group_of.tolist()
    for op in graph.topo_order.tolist():
        g = group_of[op]
        if group_device[g] >= 0:
            continue
        while current < nd and used[current] + need(g, current) > cap[current]:
            current += 1
        if current < nd:
            dev = current
        else:
            room = [capacity[d] - used[d] - need(g, d) for d in range(nd)]
            dev = max(range(nd), key=lambda d: (room[d], -d))
            if room[dev] < 0:
                free = ", ".join(
                    f"{cluster.names[d]}: {format_bytes(capacity[d] - used[d])} free"
                    for d in range(nd)
                )
                raise InfeasiblePlacementError(
                    f"op {graph.names[op]!r} (group {groups.names[g]!r}, "
                    f"{len(groups.members[g])} ops) needs {format_bytes(need(g, dev))} counted "
                    f"statically, but no device has room ({free}); use more devices, more memory "
                    "per device, or m_etf, which frees memory as tensors die"
                )
        used[dev] += need(g, dev)
        group_device[g] = dev
    return Placement(np.asarray(group_device, dtype=np.int32)[groups.group_of], "m_topo")


def _copies(inputs: list[tuple[int, int]], group_device: list[int], dev: int) -> int:
    """Bytes of received copies: inputs whose producer is not (known to be) on `dev`."""
    return sum(nbytes for gp, nbytes in inputs if group_device[gp] != dev)

