"""The places each op may take in its device's order when an executor runs the device's ops in an
order of its own, within a window of places of the simulated one (`memory_timeline.reordered_blocks`
holds memory by them). A chain moves as a whole: the bounds are carried along every path of the
graph, through ops of any device.

The compiled engine computes them in one pass each way (`_native.chained_bounds`), the Python one
level by level on numpy; `tests/test_engines.py` checks that both give the same. `timed_bounds`
then carries the times those places give along the edges.
"""

from __future__ import annotations

import numpy as np

from baechi_tf.graph import OpGraph
from baechi_tf.placer import engine

__all__ = ["chained_bounds", "order_bounds", "timed_bounds"]


def order_bounds(
    graph: OpGraph, group_of: np.ndarray, start: np.ndarray, end: np.ndarray, rank: np.ndarray, windows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per op, the op whose start is its earliest and the op whose end is its latest within
    `windows[g]` places of its group g's order (`memory_timeline.reordered_blocks`'s rule, a group standing for a
    device or a pool of devices). O(V log V + (V + E) G) for G groups."""
    n = graph.num_ops
    # Places by (group, start, commit rank); `first[g]` is the index into `by_place` of place 0.
    by_place = np.lexsort((rank, start, group_of))
    first = np.searchsorted(group_of[by_place], np.arange(group_of.max() + 2 if n else 1))
    place = np.empty(n, dtype=np.int64)
    place[by_place] = np.arange(n, dtype=np.int64) - first[group_of[by_place]]
    # Busy periods: a group's places from one idle gap to the next, where an op starts after
    # every op before it in the group has ended.
    latest = np.empty(n)
    for a, b in zip(first[:-1].tolist(), first[1:].tolist()):
        latest[a:b] = np.maximum.accumulate(end[by_place[a:b]])
    gap = np.ones(n, dtype=bool)
    gap[1:] = (group_of[by_place][1:] != group_of[by_place][:-1]) | (start[by_place][1:] > latest[:-1])
    period_starts = np.flatnonzero(gap)
    period_last = np.append(period_starts[1:] - 1, n - 1)[np.cumsum(gap) - 1]  # by index into by_place
    busy_until = np.empty(n, dtype=np.int64)
    busy_until[by_place] = period_last - first[group_of[by_place]]  # the period's last place
    lo, hi = chained_bounds(graph, group_of, place, windows[group_of], busy_until)
    base = first[group_of]
    return by_place[base + lo], by_place[base + hi]


def timed_bounds(
    graph: OpGraph, earliest_start: np.ndarray, latest_end: np.ndarray, duration: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per op, its earliest start, no earlier than `earliest_start`, and its latest end, no later
    than `latest_end` (its own bounds, from its device's order), carried along every edge by the
    ops' `duration`: an op starts no earlier than each op it reads from (data or control) may
    end, that op's earliest start plus its duration, and ends no later than each op that reads
    from it may start, that op's latest end less its duration. Only durations are carried, not
    the times other devices ran their ops at: an op whose input comes from another device still
    waits for that input to be done, however early the ops around it may run. With a schedule's
    own starts and ends as the bounds, the same are returned. O(V + E); the selected engine
    computes it (`engine.current`), the compiled one alike, the Python one a step per op and
    edge."""
    module = engine.native_module() if engine.current() == "native" else None
    if module is not None:
        succ_ptr, succ = graph.successor_rows  # cached on the graph: no per-call rebuild
        starts, ends = module.timed_bounds(graph.topo_order.astype(np.int64), succ_ptr, succ,
                                           np.asarray(earliest_start, dtype=np.float64),
                                           np.asarray(latest_end, dtype=np.float64),
                                           np.asarray(duration, dtype=np.float64))
        return np.asarray(starts), np.asarray(ends)
    starts, ends, took = earliest_start.astype(float).tolist(), latest_end.astype(float).tolist(), duration.tolist()
    order = graph.topo_order.tolist()
    for v in order:
        for u in graph.predecessors[v]:
            if starts[u] + took[u] > starts[v]:
                starts[v] = starts[u] + took[u]
    for v in reversed(order):
        for w in graph.successors[v]:
            if ends[w] - took[w] < ends[v]:
                ends[v] = ends[w] - took[w]
    return np.asarray(starts), np.asarray(ends)


def chained_bounds(
    graph: OpGraph, group_of: np.ndarray, place: np.ndarray, window: np.ndarray, last: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per op, the earliest and the latest place it may take in its group's order: within its
    `window` of its own place, at most `last`, after the earliest place each op of its group that it
    depends on may take, and before the latest place each op of its group that depends on it may
    take, over paths through any group's ops. A chain moves as a whole: each op of it `window`
    places at most, and its dependents with it.

    The selected engine computes it (`engine.current`): the compiled one op by op in topological
    order, the Python one level by level (longest paths from a source); both in O((V + E) G)
    time and O(V G) memory for G groups, the Python one with a step of numpy calls per level."""
    groups = int(group_of.max()) + 1
    module = engine.native_module() if engine.current() == "native" else None
    if module is not None:
        order = graph.topo_order.astype(np.int64)
        out_ptr, out_edges = graph._out_csr  # edge ids by source, and by destination below
        in_ptr, in_edges = graph._in_csr
        out_dst, in_src = graph.edge_dst[out_edges].astype(np.int64), graph.edge_src[in_edges].astype(np.int64)
        lo, hi = module.chained_bounds(groups, order, out_ptr, out_dst, in_ptr, in_src,
                                       group_of.astype(np.int64), place.astype(np.int64),
                                       window.astype(np.int64), last.astype(np.int64))
        return np.asarray(lo), np.asarray(hi)
    return _chained_bounds_by_level(graph, group_of, place, window, last, groups)


def _chained_bounds_by_level(
    graph: OpGraph, group_of: np.ndarray, place: np.ndarray, window: np.ndarray, last: np.ndarray, groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """`chained_bounds` on numpy, level by level."""
    n = graph.num_ops
    src, dst = graph.edge_src.astype(np.int64), graph.edge_dst.astype(np.int64)
    level = np.zeros(n, dtype=np.int64)
    preds = graph.predecessors
    for v in graph.topo_order.tolist():
        if preds[v]:
            level[v] = max(level[u] for u in preds[v]) + 1
    by_level = np.argsort(level, kind="stable")
    marks = np.arange(level.max() + 2)
    level_cuts = np.searchsorted(level[by_level], marks)
    # after[v, g]: one past the latest of the earliest places in g of v's ancestors there;
    # before[v, g]: one short of the earliest of the latest places of v's descendants in g.
    after = np.zeros((n, groups), dtype=np.int64)
    before = np.full((n, groups), n, dtype=np.int64)
    lo = np.empty(n, dtype=np.int64)
    hi = np.empty(n, dtype=np.int64)
    out_of = np.argsort(level[src], kind="stable")
    out_cuts = np.searchsorted(level[src][out_of], marks)
    for k in range(len(marks) - 1):  # sources first: an op's ancestors are all on lower levels
        ops = by_level[level_cuts[k]:level_cuts[k + 1]]
        lo[ops] = np.minimum(np.maximum(place[ops] - window[ops], after[ops, group_of[ops]]), place[ops])
        e = out_of[out_cuts[k]:out_cuts[k + 1]]
        carried = after[src[e]]
        rows, own = np.arange(e.size), group_of[src[e]]
        carried[rows, own] = np.maximum(carried[rows, own], lo[src[e]] + 1)
        np.maximum.at(after, dst[e], carried)
    into = np.argsort(level[dst], kind="stable")
    into_cuts = np.searchsorted(level[dst][into], marks)
    for k in range(len(marks) - 2, -1, -1):  # sinks' levels first: descendants are on higher ones
        ops = by_level[level_cuts[k]:level_cuts[k + 1]]
        bound = np.minimum(np.minimum(place[ops] + window[ops], before[ops, group_of[ops]]), last[ops])
        hi[ops] = np.maximum(bound, place[ops])
        e = into[into_cuts[k]:into_cuts[k + 1]]
        carried = before[dst[e]]
        rows, own = np.arange(e.size), group_of[dst[e]]
        carried[rows, own] = np.minimum(carried[rows, own], hi[dst[e]] - 1)
        np.minimum.at(before, src[e], carried)
    return lo, hi
