"""The values placers and the simulator return: `Placement`, `Transfer`, `Schedule`."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph

__all__ = ["Placement", "Schedule", "Transfer"]


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """The device of every op, as device indices into a `Cluster`."""

    device_of: np.ndarray  # int32 [num_ops], index into cluster.devices
    method: str  # the algorithm that produced it, e.g. 'm_etf'

    def __post_init__(self) -> None:
        array = np.asarray(self.device_of, dtype=np.int32).copy()
        array.setflags(write=False)
        object.__setattr__(self, "device_of", array)

    def op_to_device(self, graph: OpGraph, cluster: Cluster) -> dict[str, str]:
        """Op name -> device name."""
        names = cluster.names
        return {op: names[d] for op, d in zip(graph.names, self.device_of.tolist())}

    def same_as(self, other: "Placement") -> bool:
        return np.array_equal(self.device_of, other.device_of)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """A tensor (or control message) moved between two devices."""

    tensor: int  # tensor id in the OpGraph
    src_device: int
    dst_device: int
    start_us: float
    end_us: float


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """When each op runs, every transfer, and memory per device."""

    placement: Placement
    start_us: np.ndarray  # float64 [num_ops]
    end_us: np.ndarray  # float64 [num_ops]
    transfers: tuple[Transfer, ...]
    peak_memory_bytes: tuple[int, ...]  # per device
    order: np.ndarray  # int32 [num_ops], ops in the order they were scheduled

    @property
    def makespan_us(self) -> float:
        return float(self.end_us.max()) if self.end_us.size else 0.0

    def device_ops(self, device: int) -> np.ndarray:
        """Ops on `device` in the order they ran."""
        return self.order[self.placement.device_of[self.order] == device]

    def critical_path(self, graph: OpGraph, cluster: Cluster) -> list[int]:
        """Ops on a longest chain of waits ending at the last op to finish.

        Walks back from the op that ends last; at each op, the predecessor (or the previous op on
        the same device) whose finish, plus the transfer when there is one, gated its start.
        """
        if graph.num_ops == 0:
            return []
        dev = self.placement.device_of
        prev_on_device = np.full(graph.num_ops, -1, dtype=np.int64)
        for d in range(cluster.num_devices):
            ops = self.device_ops(d)
            prev_on_device[ops[1:]] = ops[:-1]
        arrival: dict[tuple[int, int], float] = {
            (t.tensor, t.dst_device): t.end_us for t in self.transfers
        }
        op = int(np.argmax(self.end_us))
        path = [op]
        while True:
            best: Optional[int] = None
            best_time = -1.0
            for e in graph.in_edges(op).tolist():
                p = int(graph.edge_src[e])
                t = self.end_us[p] if dev[p] == dev[op] else arrival.get(
                    (int(graph.edge_tensor[e]), int(dev[op])), self.end_us[p]
                )
                if t > best_time:
                    best, best_time = p, t
            q = int(prev_on_device[op])
            if q >= 0 and self.end_us[q] >= best_time:
                best, best_time = q, self.end_us[q]
            if best is None:
                break
            path.append(best)
            op = best
        return path[::-1]
