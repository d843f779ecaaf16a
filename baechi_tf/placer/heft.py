"""HEFT: Heterogeneous Earliest Finish Time list scheduling, as an extra candidate for ``auto``.

Topcuoglu, Hariri and Wu, "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 13(3), 2002. Ops are taken in decreasing upward rank (the
longest chain of compute and communication from the op to the end of the graph), which favours the
critical path, and each goes to the device where it would finish first, counting the transfers of
its inputs. Colocation groups follow their first op; pinned groups stay where they are pinned.

Unlike m-ETF (which picks the op that can start first), HEFT looks ahead along the critical path;
on graphs with costly communication it often keeps a chain together where m-ETF spreads it.
Memory: a group goes only where its persistent bytes plus its largest op's outputs and scratch
still fit beside the persistent bytes already placed there; the simulator then checks the whole
placement (``auto`` drops it when it does not fit).

Time: O((V + E) * D + V log V) for V ops, E edges and D devices weighed (those given an op or a
pinned group, and one of each set of untouched twins, `UntouchedTwins`), plus O(D^2) once per
cluster for its link tables; memory O(V + E).
"""

from __future__ import annotations

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.pins import pinned_device_index
from baechi_tf.placer.scheduler_state import format_bytes
from baechi_tf.placer.twins import UntouchedTwins
from baechi_tf.placer.schedule import Placement

__all__ = ["place_heft", "upward_rank"]


def upward_rank(graph: OpGraph, cluster: Cluster) -> list[float]:
    """Compute plus the mean transfer time along the longest path to a sink, per op."""
    slope, intercept = (float(np.mean(p)) if len(p) else 0.0 for p in cluster.pair_links())
    compute = graph.compute_us.tolist()
    rank = list(compute)
    out_ptr, out_idx = graph._out_csr
    dst = graph.edge_dst.tolist()
    nbytes = graph.edge_bytes.tolist()
    for op in reversed(graph.topo_order.tolist()):
        best = 0.0
        for e in out_idx[out_ptr[op] : out_ptr[op + 1]].tolist():
            r = slope * nbytes[e] + intercept + rank[dst[e]]
            if r > best:
                best = r
        rank[op] = compute[op] + best
    return rank


def place_heft(graph: OpGraph, cluster: Cluster, groups: Groups) -> Placement:
    """Places `graph` by HEFT (without insertion into idle gaps). An op is weighed on one of each
    set of untouched twins (`UntouchedTwins`), where it would end alike."""
    n, nd = graph.num_ops, cluster.num_devices
    rank = upward_rank(graph, cluster)
    topo = graph.topo_index.tolist()
    order = sorted(range(n), key=lambda o: (-rank[o], topo[o]))
    # Ranks strictly decrease along edges when compute > 0; zero-cost ops can tie, so make the
    # order topological by placing an op only after its predecessors (stable repair).
    order = _topological_repair(graph, order)
    group_of = groups.group_of.tolist()
    group_persistent = groups.byte_sums(graph.persistent_bytes).tolist()
    alloc = (graph.output_total_bytes + graph.temp_bytes).tolist()
    group_alloc = [0] * groups.num_groups
    for op in range(n):
        group_alloc[group_of[op]] = max(group_alloc[group_of[op]], alloc[op])
    capacity = [d.memory_bytes for d in cluster.devices]
    persistent_used = [0] * nd
    group_device = [-1] * groups.num_groups
    twins = UntouchedTwins(cluster)
    for op, name in enumerate(graph.pinned_device):
        g = group_of[op]
        if name is not None and group_device[g] < 0:
            group_device[g] = pinned_device_index(graph, cluster, op)
            persistent_used[group_device[g]] += group_persistent[g]
            twins.touch(group_device[g])
    slope, intercept = cluster.link_tables()
    in_ptr, in_idx = graph._in_csr
    src = graph.edge_src.tolist()
    nbytes = graph.edge_bytes.tolist()
    compute = graph.compute_us.tolist()
    device = [-1] * n
    finish = [0.0] * n
    free = [0.0] * nd
    for op in order:
        g = group_of[op]
        if group_device[g] >= 0:
            candidates = [group_device[g]]
        else:
            need = group_persistent[g] + group_alloc[g]
            candidates = [d for d in twins.distinct if persistent_used[d] + need <= capacity[d]]
            if not candidates:
                free = ", ".join(
                    f"{cluster.names[d]}: {format_bytes(capacity[d] - persistent_used[d])} free"
                    for d in range(nd)
                )
                raise InfeasiblePlacementError(
                    f"op {graph.names[op]!r}: its group {groups.names[g]!r} needs "
                    f"{format_bytes(need)} (persistent memory and its largest op), but no device "
                    f"has that much beside the weights already placed ({free}); use more devices "
                    "or more memory per device"
                )
        edges = in_idx[in_ptr[op] : in_ptr[op + 1]].tolist()
        best_d, best_end = -1, float("inf")
        for d in candidates:
            ready = free[d]
            for e in edges:
                p = src[e]
                pd = device[p]
                t = finish[p] if pd == d else finish[p] + (slope[pd][d] * nbytes[e] + intercept[pd][d])
                if t > ready:
                    ready = t
            end = ready + compute[op]
            if end < best_end:
                best_d, best_end = d, end
        if group_device[g] < 0:
            group_device[g] = best_d
            persistent_used[best_d] += group_persistent[g]
        device[op] = best_d
        twins.touch(best_d)
        finish[op] = best_end
        free[best_d] = best_end
    return Placement(np.asarray(device, dtype=np.int32), "heft")


def _topological_repair(graph: OpGraph, order: list[int]) -> list[int]:
    """`order`, with each op moved after its predecessors (a stable topological sort by it)."""
    import heapq

    position = {op: i for i, op in enumerate(order)}
    indeg = [len(p) for p in graph.predecessors]
    heap = [(position[o], o) for o in range(graph.num_ops) if indeg[o] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, op = heapq.heappop(heap)
        out.append(op)
        for s in graph.successors[op]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (position[s], s))
    return out
