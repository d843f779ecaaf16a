"""The values placers and the simulator return: `Placement`, `Transfer`, `Schedule`."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Optional, Sequence

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

    def problem(self, graph: OpGraph, cluster: Cluster) -> Optional[str]:
        """Why this cannot be a placement of `graph` on `cluster` (another number of ops, a device
        index the cluster lacks), for an error message; None when it can."""
        device_of = self.device_of
        if device_of.shape != (graph.num_ops,):
            return f"the placement covers {device_of.shape[0]} ops but the graph has {graph.num_ops}"
        bad = np.flatnonzero((device_of < 0) | (device_of >= cluster.num_devices))
        if bad.size:
            op = int(bad[0])
            return (
                f"op {graph.names[op]!r} is placed on device index {int(device_of[op])}, but the "
                f"cluster has devices 0..{cluster.num_devices - 1}"
            )
        return None


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
        the same device) whose finish, plus the transfer when there is one, gated its start. A
        copy that waited for a busy channel counts from its producer (`critical_chain` follows
        the channel instead).
        """
        return self._walk_back(graph, cluster, through_channels=False)[0]

    def critical_chain(self, graph: OpGraph, cluster: Cluster) -> tuple[list[int], list[Transfer]]:
        """The chain of waits that ends the step: (ops, copies on it), as `critical_path` walks
        it, but a copy that started after its producer's end, because a channel it needs was busy,
        is followed to the copy that held that channel until it started, and so on back, to the
        producer of the first copy that did not wait. The copies come in time order; the ops are
        the ones the chain runs through, so that a long wait for a channel is explained by the
        copies ahead of it, not by a producer that ended long before."""
        return self._walk_back(graph, cluster, through_channels=True)

    def _walk_back(
        self, graph: OpGraph, cluster: Cluster, *, through_channels: bool
    ) -> tuple[list[int], list[Transfer]]:
        if graph.num_ops == 0:
            return [], []
        dev = self.placement.device_of
        prev_on_device = np.full(graph.num_ops, -1, dtype=np.int64)
        for d in range(cluster.num_devices):
            ops = self.device_ops(d)
            prev_on_device[ops[1:]] = ops[:-1]
        arrival = {(t.tensor, t.dst_device): t for t in self.transfers}
        ending = _ChannelEnds(self.transfers, cluster.num_devices) if through_channels else None
        producer = graph.tensor_src
        op = int(np.argmax(self.end_us))
        path, copies = [op], []
        while True:
            best: Optional[int] = None
            best_time = -1.0
            gate: Optional[Transfer] = None
            for e in graph.in_edges(op).tolist():
                p = int(graph.edge_src[e])
                copy = None if dev[p] == dev[op] else arrival.get((int(graph.edge_tensor[e]), int(dev[op])))
                t = self.end_us[p] if copy is None else copy.end_us
                if t > best_time:
                    best, best_time, gate = p, t, copy
            q = int(prev_on_device[op])
            if q >= 0 and self.end_us[q] >= best_time:
                best, best_time, gate = q, self.end_us[q], None
            if best is None:
                break
            if gate is not None and ending is not None:
                seen = set()
                while True:
                    copies.append(gate)
                    seen.add(id(gate))
                    if gate.start_us <= self.end_us[int(producer[gate.tensor])] + _TIME_TOLERANCE_US:
                        break
                    ahead = ending.before(gate, seen)
                    if ahead is None:
                        break
                    gate = ahead
                best = int(producer[gate.tensor])
            path.append(best)
            op = best
        return path[::-1], copies[::-1]


# Times that differ by less than this are the same instant (sums of floats).
_TIME_TOLERANCE_US = 1e-6


class _ChannelEnds:
    """The copies that use each device's channel (sending or receiving), by end time."""

    def __init__(self, transfers: Sequence[Transfer], num_devices: int) -> None:
        by_device: list[list[Transfer]] = [[] for _ in range(num_devices)]
        for t in transfers:
            by_device[t.src_device].append(t)
            by_device[t.dst_device].append(t)
        self.copies = [sorted(c, key=lambda t: (t.end_us, t.start_us, t.tensor, t.dst_device)) for c in by_device]
        self.ends = [[t.end_us for t in c] for c in self.copies]

    def before(self, copy: Transfer, seen: set[int]) -> Optional[Transfer]:
        """A copy not in `seen` (by id) that held one of `copy`'s channels until `copy` started:
        it ends then; of those, the one that started first. None when the channels were free."""
        found: Optional[Transfer] = None
        for d in (copy.src_device, copy.dst_device):
            ends = self.ends[d]
            i = bisect.bisect_right(ends, copy.start_us + _TIME_TOLERANCE_US)
            while i > 0 and ends[i - 1] >= copy.start_us - _TIME_TOLERANCE_US:
                i -= 1
                other = self.copies[d][i]
                if id(other) not in seen and (found is None or other.start_us < found.start_us):
                    found = other
        return found
