"""m-TOPO: topological slices balanced by memory (Baechi, SoCC 2020, section 4.1).

Ops are visited in topological order and placed on the current device until the next op's group
would push the device past its share of memory; then the next device is filled. The share is the
total memory over the number of devices plus the largest group, capped by each device's real
capacity (the original Baechi ignored real capacities, and checked another quantity than the one it
charged). A group that fits no later device goes to the device with the
most room left; when none has room, `InfeasiblePlacementError` names the group and every device's
free bytes.

The share is counted statically (persistent, output and temporary bytes of the group's ops);
whether a group fits a device is checked against real capacities with the memory the device holds
when the ops run one after another in topological order (tensors freed after their last reader),
the order m-TOPO's slices run in; the simulator, which has the last word, confirms it. Compute
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
from baechi_tf.placer.buffers import free_at_end_bytes
from baechi_tf.placer.pins import pinned_device_index
from baechi_tf.placer.scheduler_state import format_bytes
from baechi_tf.placer.schedule import Placement

__all__ = ["MTopoOptions", "place_m_topo", "static_group_bytes"]


@dataclasses.dataclass(frozen=True)
class MTopoOptions:
    uniform: bool = True  # cap each device at an equal share of memory (else fill to capacity)


def static_group_bytes(graph: OpGraph, groups: Groups) -> np.ndarray:
    """int64 [num_groups]: persistent, output and temporary bytes of a group's ops, summed."""
    per_op = graph.persistent_bytes + graph.output_total_bytes + graph.temp_bytes
    return groups.byte_sums(per_op)


def place_m_topo(
    graph: OpGraph, cluster: Cluster, groups: Groups, *, options: MTopoOptions = MTopoOptions()
) -> Placement:
    """Places `graph` on `cluster` by m-TOPO."""
    nd = cluster.num_devices
    own = static_group_bytes(graph, groups).tolist()
    capacity = [d.memory_bytes for d in cluster.devices]
    share = sum(own) // nd + max(own, default=0) if options.uniform else float("inf")
    live = _LiveMemory(graph, cluster, groups)
    group_device = live.group_device
    used = [0] * nd  # static bytes per device, for the balance
    for op, name in enumerate(graph.pinned_device):
        g = live.group_of[op]
        if name is not None and group_device[g] < 0:
            dev = pinned_device_index(graph, cluster, op)
            live.place_group(g, dev)
            used[dev] += own[g]

    current = 0
    for op in graph.topo_order.tolist():
        g = live.group_of[op]
        if group_device[g] < 0:
            while current < nd and (used[current] + own[g] > share or not live.fits(op, current)):
                if used[current] == 0 and live.fits(op, current):
                    break  # an empty device takes a group larger than the share
                current += 1
            if current < nd:
                dev = current
            else:
                dev = max(range(nd), key=lambda d: (live.room(op, d), -d))
                if live.room(op, dev) < 0:
                    free = ", ".join(
                        f"{cluster.names[d]}: {format_bytes(max(capacity[d] - live.peak[d], 0))} free"
                        for d in range(nd)
                    )
                    raise InfeasiblePlacementError(
                        f"op {graph.names[op]!r} (group {groups.names[g]!r}, "
                        f"{len(groups.members[g])} ops) needs {format_bytes(live.need(op, dev))} "
                        f"when it runs in topological order, but no device has room ({free}); "
                        "use more devices or more memory per device"
                    )
            live.place_group(g, dev)
            used[dev] += own[g]
        live.run(op)
    return Placement(np.asarray(group_device, dtype=np.int32)[groups.group_of], "m_topo")


class _LiveMemory:
    """Memory of each device when the ops run one after another in topological order.

    Persistent bytes count from the start; an op's outputs and scratch from when it runs; a
    tensor read on another device is copied there when its first reader there runs; a tensor is
    freed when its last reader has run. This is the order m-TOPO's slices run in, so a placement
    that fits here usually fits in the simulator, which has the final word.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, groups: Groups) -> None:
        self.graph = graph
        self.capacity = [d.memory_bytes for d in cluster.devices]
        nd = cluster.num_devices
        self.live = [0] * nd
        self.peak = [0] * nd
        self.group_of = groups.group_of.tolist()
        self.group_device = [-1] * groups.num_groups
        self.group_persistent = groups.byte_sums(graph.persistent_bytes).tolist()
        self.alloc = (graph.output_total_bytes + graph.temp_bytes).tolist()
        self.tensor_src = graph.tensor_src.tolist()
        self.tensor_bytes = graph.tensor_bytes.tolist()
        edge_tensor = graph.edge_tensor.tolist()
        self.inputs: list[list[int]] = [[] for _ in range(graph.num_ops)]
        readers = [0] * graph.num_tensors
        for e, d in enumerate(graph.edge_dst.tolist()):
            self.inputs[d].append(edge_tensor[e])
            readers[edge_tensor[e]] += 1
        self.readers_left = readers
        self.copies: dict[int, set[int]] = {}  # tensor -> devices holding a received copy
        self.free_at_end = free_at_end_bytes(graph)

    def _device(self, op: int) -> int:
        return self.group_device[self.group_of[op]]

    def need(self, op: int, dev: int) -> int:
        """Bytes that running `op` on `dev` adds, its group's persistent bytes included."""
        g = self.group_of[op]
        extra = self.group_persistent[g] if self.group_device[g] < 0 else 0
        for t in self.inputs[op]:
            src_dev = self._device(self.tensor_src[t])
            if src_dev != dev and dev not in self.copies.get(t, ()):
                extra += self.tensor_bytes[t]
        return self.alloc[op] + extra

    def room(self, op: int, dev: int) -> int:
        g = self.group_of[op]
        persistent = self.group_persistent[g] if self.group_device[g] < 0 else 0
        return min(
            self.capacity[dev] - self.live[dev] - self.need(op, dev),
            self.capacity[dev] - self.peak[dev] - persistent,
        )

    def fits(self, op: int, dev: int) -> bool:
        return self.room(op, dev) >= 0

    def place_group(self, g: int, dev: int) -> None:
        self.group_device[g] = dev
        p = self.group_persistent[g]
        self.live[dev] += p
        self.peak[dev] += p  # held for the whole step

    def run(self, op: int) -> None:
        dev = self._device(op)
        for t in self.inputs[op]:
            src_dev = self._device(self.tensor_src[t])
            held = self.copies.setdefault(t, set())
            if src_dev != dev and dev not in held:
                held.add(dev)
                self.live[dev] += self.tensor_bytes[t]
        self.live[dev] += self.alloc[op]
        self.peak[dev] = max(self.peak[dev], self.live[dev])
        self.live[dev] -= self.free_at_end[op]
        for t in self.inputs[op]:
            self.readers_left[t] -= 1
            if self.readers_left[t] == 0:
                nbytes = self.tensor_bytes[t]
                for d in self.copies.pop(t, ()):
                    self.live[d] -= nbytes
                src = self.tensor_src[t]
                if nbytes and self.graph.tensor_src_output[t] >= 0:
                    self.live[self._device(src)] -= nbytes
