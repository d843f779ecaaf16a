"""An independent checker of schedules: what every placement and schedule must satisfy.

It re-derives everything from the graph, the cluster and the schedule's own times, without using
the scheduler's internals, so that a bug in the scheduler cannot hide itself.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer import Groups, Schedule, check_placement, lower_bound_us

EPS = 1e-6


def assert_valid_schedule(graph: OpGraph, cluster: Cluster, groups: Groups, schedule: Schedule) -> None:
    placement = schedule.placement
    check_placement(graph, cluster, groups, placement, schedule)
    dev = placement.device_of
    start, end = schedule.start_us, schedule.end_us
    # Every op placed on a real device, durations equal compute times plus, on a device that
    # serves copies on its compute thread, the channel time of the copies in that the op brought
    # (it is their first reader there, in the order the schedule was made).
    assert dev.shape == (graph.num_ops,)
    assert ((dev >= 0) & (dev < cluster.num_devices)).all()
    rank = np.empty(graph.num_ops, dtype=np.int64)
    rank[schedule.order] = np.arange(graph.num_ops)
    receiving = np.zeros(graph.num_ops)
    latency = cluster.channel_tables()[2]
    on_compute = cluster.sends_on_compute()
    for t in schedule.transfers:
        if on_compute[t.dst_device]:
            readers = [int(graph.edge_dst[e]) for e in np.flatnonzero(graph.edge_tensor == t.tensor)
                       if dev[graph.edge_dst[e]] == t.dst_device]
            first = min(readers, key=lambda op: rank[op])
            receiving[first] += t.end_us - t.start_us - latency[t.src_device][t.dst_device]
    np.testing.assert_allclose(end - start, graph.compute_us + receiving, atol=1e-3)
    assert (start >= -EPS).all()
    # Groups together; pinned ops where pinned.
    for members in groups.members:
        assert len(set(dev[members].tolist())) == 1
    for op, name in enumerate(graph.pinned_device):
        if name is not None:
            assert dev[op] == cluster.find(name)
    # One op at a time per device.
    for d in range(cluster.num_devices):
        ops = np.flatnonzero(dev == d)
        ops = ops[np.lexsort((end[ops], start[ops]))]
        for a, b in zip(ops[:-1], ops[1:]):
            assert end[a] <= start[b] + EPS, (graph.names[a], graph.names[b])
    # Edges: same device -> after the producer; else after a transfer of that tensor to the
    # consumer's device that starts after the producer and lasts the link's time.
    arrivals: dict[tuple[int, int], list] = defaultdict(list)
    channel: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t in schedule.transfers:
        src = int(graph.tensor_src[t.tensor])
        assert t.src_device == dev[src] and t.dst_device != t.src_device
        assert t.start_us >= end[src] - EPS
        expected = cluster.transfer_us(t.src_device, t.dst_device, int(graph.tensor_bytes[t.tensor]))
        assert abs((t.end_us - t.start_us) - expected) < 1e-3
        arrivals[(t.tensor, t.dst_device)].append(t.end_us)
        # On a link that overlaps K copies' fixed costs, the channels are held for the bytes and
        # intercept / K: the transfer ends (arrives) the rest of the intercept after they are free.
        held_end = t.end_us - cluster.channel_tables()[2][t.src_device][t.dst_device]
        if held_end > t.start_us:  # a copy too short to move the clock (s + w == s) holds none
            channel[t.src_device].append((t.start_us, held_end))
            channel[t.dst_device].append((t.start_us, held_end))
    for key, times in arrivals.items():
        assert len(times) == 1, f"tensor {key[0]} sent twice to device {key[1]}"
    for d, slots in channel.items():
        slots.sort()
        for (s0, e0), (s1, e1) in zip(slots[:-1], slots[1:]):
            assert e0 <= s1 + EPS, f"channel of device {d} double-booked"
    for e in range(graph.num_edges):
        p, c = int(graph.edge_src[e]), int(graph.edge_dst[e])
        if dev[p] == dev[c]:
            assert start[c] >= end[p] - EPS
        else:
            (arrived,) = arrivals[(int(graph.edge_tensor[e]), int(dev[c]))]
            assert start[c] >= arrived - EPS
    # Memory within capacity; makespan at least the lower bound.
    for d, peak in enumerate(schedule.peak_memory_bytes):
        assert peak <= cluster.devices[d].memory_bytes
        assert peak >= int(graph.persistent_bytes[dev == d].sum())
    assert schedule.makespan_us >= lower_bound_us(graph, cluster) - EPS
