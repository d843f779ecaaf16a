"""Memory in use on each device over time, recomputed from a finished `Schedule`.

The list scheduler (`list_scheduler`) tracks memory as a running total while it builds the
schedule; this module derives the same quantity afterwards from the schedule's own values (start
and end times, the order ops were committed in, the transfers) as blocks of memory, each held
from an allocation to a free:

* persistent bytes of every op on the device: from 0 on, never freed in the step;
* temporary bytes of an op: from its start to its end;
* an output slot that no data edge reads: from the op's start to its end, unless the op has no
  successor at all (a sink), whose outputs are kept (never freed in the step);
* a tensor that is read, on its producer's device: from the producer's start until
  ``max(end of its last consumer on that device, end of its last transfer out,
  start of its last consumer anywhere)``;
* an output that reuses an input's buffer: nothing of its own, the input's buffer held until
  the output's readers are done too; where the input is another device's buffer that the op's
  device reads (`Cluster.shares_memory`) and the op is not that buffer's last holder in every
  order (`buffers.always_reused_tensors`), a buffer of its own as well, as for a tensor that is
  read above (`SchedulerState._cut`); where it is that buffer's last holder in every order, the
  op's other input that TF writes into when the sender still holds it (`buffers.fallback_inputs`)
  is held until the output's readers are done too (`SchedulerState._races`), and where the op
  has no such input (a ReLU), TF gives the output a buffer of its own then: a block as for a
  tensor that is read above, marked `MemoryBlocks.alternative` (at most one held at a time on a
  device, and none in the simulated order: `memory_timeline`, `reordered_blocks` with window 0);
* a received copy on another device: from the start of its first consumer there until
  ``max(end of its last consumer there, start of its last consumer anywhere)``; none on a device
  that shares memory with the producer's (`Cluster.shares_memory`), whose consumers count as
  the producer's device's instead, but for a constant's value (`buffers.constant_tensors`),
  which such a device holds a replica of: persistent memory, from 0 on.

The last term of both is the scheduler's: it learns when a tensor can be freed only once its last
consumer is scheduled, so a tensor is never freed before that consumer's start. TF frees the
producer's buffer once its readers there and its copies out are done, however late a reader
elsewhere starts: each block also carries that free (`MemoryBlocks.sent_free_us`), which
`reordered_blocks` takes.

Events of one instant happen in the order the scheduler committed ops (`Schedule.order`): an
op's allocation sees the frees up to its start that earlier commits made known, not the ones
that a later commit at the same instant makes known (such as the free of a tensor whose last
consumer starts at that instant on another device). A free therefore carries the commit that
made it known (the op itself for temporary memory and unread outputs, the tensor's last consumer
otherwise). Ordering one instant by time alone, frees first, gives lower peaks than the
scheduler's on graphs with equal times (0 us ops, integer costs); with the commit order, the
peak of the timeline is ``Schedule.peak_memory_bytes`` (checked in `tests/test_reports.py`).

Time O((V + E) log(V + E)) for V ops and E edges; memory O(V + E).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import weakref
from typing import Optional, Sequence, Union

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import VIEW_OP_TYPES, OpGraph
from baechi_tf.placer.block_timeline import DeviceMemory, MemoryBlocks, blocks_timeline, subset_blocks
from baechi_tf.placer.buffers import OWN, graph_buffers
from baechi_tf.placer.order_bounds import order_bounds, timed_bounds
from baechi_tf.placer.schedule import Schedule

__all__ = [
    "ORDER_WINDOW", "ORDER_WINDOW_OWN_POOL", "ORDER_WINDOW_PROCESS", "DeviceMemory", "MemoryBlocks", "blocks_timeline",
    "in_shared_pool", "memory_blocks", "memory_timeline", "order_windows", "reordered_blocks", "reordered_peaks",
    "running_at_once", "thread_pools",
]

KEPT = float("inf")  # free time of memory held past the end of the step

ORDER_WINDOW = 8
"""How many places of its device's order an op of a device that shares its pool of threads with
other devices (`thread_pools`: CPU devices of one process) may run away from its simulated place
in the order TensorFlow's executor takes (`reordered_blocks`), a chain of them with it. The
executor runs a device's ready ops in an order of its own, which no rule of the simulator has
matched; the window was chosen on the measured peaks of `bench/fidelity_memory.py`
(docs/fidelity.md, "Chains move as a whole")."""

ORDER_WINDOW_PROCESS = 12
"""How many places of one order of all the ops of the devices that share a pool of threads (the
CPU devices of one process) a reader on one of them may end away from its simulated place, for
the block it frees on another of them: a tensor one stand-in handed to another is held as long as
its reader there may run late in the process's order (`reordered_blocks`). Chosen on the measured
peaks of `bench/fidelity_memory.py` (docs/fidelity.md, "A reader in the process's order")."""

ORDER_WINDOW_OWN_POOL = 4
"""`ORDER_WINDOW` for a device that runs its ops on a pool of its own (a GPU, a worker task), where
no other device's ops take turns with its own on the threads; chosen on the measured peaks of
`bench/fidelity_memory_tasks.py` (docs/fidelity.md, "A window by the pool")."""


def memory_blocks(graph: OpGraph, schedule: Schedule, cluster: Optional[Cluster] = None) -> MemoryBlocks:
    """The blocks of memory the model holds on `cluster`'s devices, by the rules in the module
    docstring (no device shares memory with another when it is None)."""
    n = graph.num_ops
    dev = schedule.placement.device_of.astype(np.int64)
    start, end = schedule.start_us, schedule.end_us
    rank = np.empty(n, dtype=np.int64)
    rank[schedule.order] = np.arange(n, dtype=np.int64)
    # Column tuples: device, bytes, alloc, free, alloc rank, free rank, kind, op, slot, and the free
    # and its rank as TF frees the block.
    parts: list[tuple] = []

    def part(d, b, a, f, ra, rf, kind, op, slot, sf=None, sr=None, alternative=False) -> None:
        # `kind`: one for all, or one each
        keep = np.asarray(b) > 0
        if keep.any():
            sf, sr = (f if sf is None else sf), (rf if sr is None else sr)
            cols = [np.broadcast_to(np.asarray(x), keep.shape)[keep]
                    for x in (d, b, a, f, ra, rf, op, slot, sf, sr, np.asarray(alternative, dtype=bool))]
            kinds = (kind,) * int(keep.sum()) if isinstance(kind, str) else tuple(
                k for k, x in zip(kind, keep.tolist()) if x)
            parts.append((*cols[:6], kinds, *cols[6:]))

    ops = np.arange(n)
    part(dev, graph.persistent_bytes, 0.0, KEPT, -1, -1, "persistent", ops, -1)
    part(dev, graph.temp_bytes, start, end, rank, rank, "temp", ops, -1)

    # Data edges, one per (tensor, reader); outputs no data edge reads: held while their op runs,
    # kept when it is a sink.
    tables = graph_buffers(graph)
    alias = tables.alias
    edges = _edge_tables(graph)
    t_of, reader, read = edges.t_of, edges.reader, edges.read
    src = graph.tensor_src.astype(np.int64)
    slot_of = graph.tensor_src_output.astype(np.int64)
    op_u = edges.unread_ops
    part(dev[op_u], edges.unread_bytes, start[op_u], np.where(edges.unread_sink, KEPT, end[op_u]), rank[op_u],
         rank[op_u], "output", op_u, edges.unread_slot_of)
    if not t_of.size:
        return _stacked(parts)

    nbytes = graph.tensor_bytes
    home = dev[src]
    shares = np.asarray(cluster.shares_memory(), dtype=bool) if cluster is not None else None
    reader_dev = dev[reader]
    holder = (reader_dev.copy() if shares is None
              else np.where(shares[home[t_of], reader_dev], home[t_of], reader_dev))

    # The last reader of each tensor, by commit rank: its commit frees the tensor.
    last = np.full(graph.num_tensors, -1, dtype=np.int64)
    by_rank = np.lexsort((rank[reader], t_of))
    ends_of = np.flatnonzero(np.append(t_of[by_rank][1:] != t_of[by_rank][:-1], True))
    last[t_of[by_rank][ends_of]] = reader[by_rank][ends_of]
    last_start = np.where(last >= 0, start[np.maximum(last, 0)], 0.0)
    last_rank = np.where(last >= 0, rank[np.maximum(last, 0)], 0)
    # Held on the producer's device until its readers there and its copies out are done.
    held = np.full(graph.num_tensors, -1.0)
    for tr in schedule.transfers:
        if tr.end_us > held[tr.tensor]:
            held[tr.tensor] = tr.end_us
    copied = held.copy()
    at_home = holder == home[t_of]
    np.maximum.at(held, t_of[at_home], end[reader[at_home]])
    home_free = np.maximum(held, last_start)
    # As TF frees it: once those are done, though a reader elsewhere starts later; the free is
    # made known by the last of the readers there to end, or by the producer for a copy.
    home_end = held > copied
    last_home = np.full(graph.num_tensors, -1, dtype=np.int64)
    if at_home.any():
        t_h, r_h = t_of[at_home], reader[at_home]
        by_end = np.lexsort((end[r_h], t_h))
        t_h, r_h = t_h[by_end], r_h[by_end]
        ends_h = np.flatnonzero(np.append(t_h[1:] != t_h[:-1], True))
        last_home[t_h[ends_h]] = r_h[ends_h]
    sent_free = np.where(held >= 0, held, home_free)
    sent_rank = np.where(held < 0, last_rank, np.where(home_end, rank[np.maximum(last_home, 0)], rank[src]))

    always_reused = tables.always_reused
    alias_home = np.where(alias >= 0, home[np.maximum(alias, 0)], -1)
    # Outputs reusing a buffer another device of their device's memory handed over: counted both
    # ways where the order decides (`SchedulerState._cut`), else holding their op's fallback input
    # too (`SchedulerState._races`).
    handed_over = (alias >= 0) & (alias_home != home)
    if shares is not None:
        handed_over &= shares[np.maximum(alias_home, 0), home]
    else:
        handed_over[:] = False
    cut = handed_over & ~always_reused
    own = read & ((alias == OWN) | cut)
    raced = handed_over & always_reused
    fallback = tables.fallback
    # The others, written in place by an op with no input to fall back on (not a view, which
    # shares the buffer whatever holds it): a buffer of their own on their device in the steps
    # where the sender still holds it when they start (`MemoryBlocks.alternative`).
    alone = read & raced & (fallback < 0) & ~edges.view[src]

    # Buffers by (tensor, device): the producer's own, then copies received elsewhere. Columns:
    # tensor, device, alloc, free, alloc rank, free rank, free and rank as TF frees it,
    # alternative.
    groups: list[tuple] = []
    for t_own, alternative in ((np.flatnonzero(own), False), (np.flatnonzero(alone), True)):
        groups.append((t_own, home[t_own], start[src[t_own]], home_free[t_own], rank[src[t_own]], last_rank[t_own],
                       sent_free[t_own], sent_rank[t_own], np.full(t_own.size, alternative), "output"))
    away = ~at_home
    if away.any():
        t_a, h_a, r_a = t_of[away], holder[away], reader[away]
        order = np.lexsort((rank[r_a], h_a, t_a))
        t_a, h_a, r_a = t_a[order], h_a[order], r_a[order]
        firsts = np.flatnonzero(np.append(True, (t_a[1:] != t_a[:-1]) | (h_a[1:] != h_a[:-1])))
        latest_end = np.maximum.reduceat(end[r_a], firsts)
        t_g, h_g, first = t_a[firsts], h_a[firsts], r_a[firsts]
        free_g, rank_g = np.maximum(latest_end, last_start[t_g]), last_rank[t_g]
        groups.append((t_g, h_g, start[first], free_g, rank[first], rank_g, free_g, rank_g,
                       np.zeros(t_g.size, dtype=bool), "received"))
    # A constant's value read on a device of its producer's memory: a replica there, all step.
    constant = tables.constant
    if shares is not None:
        rep = constant[t_of] & (reader_dev != home[t_of]) & shares[home[t_of], reader_dev]
        if rep.any():
            t_r, d_r = np.unique(np.stack([t_of[rep], reader_dev[rep]]), axis=1)
            part(d_r, nbytes[t_r], 0.0, KEPT, -1, -1, "persistent", src[t_r], slot_of[t_r])

    cols = [np.concatenate([np.asarray(g[i]) for g in groups]) for i in range(9)]
    kinds = tuple(k for g in groups for k in (g[9],) * len(g[0]))
    buffer_t, buffer_d = cols[0].astype(np.int64), cols[1].astype(np.int64)
    free_cols = [cols[i].astype(np.float64) for i in (3, 5, 6, 7)]  # free, rank; as TF frees them
    # An output reusing a buffer holds it until its own readers are done (`_extended`).
    width = int(dev.max(initial=0)) + 1
    frees = np.stack([home_free, last_rank, sent_free, sent_rank], axis=1).astype(np.float64)
    key, latest = _extended(np.flatnonzero(read & (alias >= 0)), alias, raced & (fallback >= 0), fallback, home,
                            shares, frees, width)
    if key.size:
        buffer_code = buffer_t * width + buffer_d
        by_code = np.argsort(buffer_code, kind="stable")
        at = np.minimum(np.searchsorted(buffer_code[by_code], key), buffer_code.size - 1)
        found = buffer_code[by_code[at]] == key
        k = by_code[at[found]]
        for c in range(4):
            free_cols[c][k] = np.maximum(free_cols[c][k], latest[found, c])
    part(buffer_d, nbytes[buffer_t], cols[2], free_cols[0], cols[4], free_cols[1].astype(np.int64), kinds,
         src[buffer_t], slot_of[buffer_t], free_cols[2], free_cols[3].astype(np.int64), alternative=cols[8])
    return _stacked(parts)


def _extended(reusing: np.ndarray, alias: np.ndarray, races: np.ndarray, fallback: np.ndarray, home: np.ndarray,
              shares: Optional[np.ndarray], frees: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """How long the buffers that outputs reuse are held: (key, latest), a buffer's key being
    ``tensor * width + device`` and latest its (free, free rank, free and rank as TF frees it),
    each the latest over the outputs that reuse it.

    An output t of `reusing` (its tensor written into the buffer of ``alias[t]``) holds that
    buffer, on ``alias[t]``'s home where the two devices share memory (`shares`), else on t's,
    until t's own readers are done (``frees[t]``) or until the outputs that reuse t's buffer in
    turn let it go, whichever is later; an output of `races` holds its op's fallback input so too.
    An output's buffer is final once every output that reuses it is counted: those are produced
    by ops that read it, so levels of reuse are taken in turn, each a vectorized pass. O(R log R +
    L R) for R reusing outputs in L levels of reuse."""
    if not reusing.size:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 4))
    d = home[reusing]

    def target(x: np.ndarray, on: np.ndarray) -> np.ndarray:
        x_home = home[x]
        keep = shares[x_home, on] if shares is not None else np.zeros(x.size, dtype=bool)
        return x * width + np.where(keep, x_home, on)

    raced = races[reusing]
    edge_from = np.concatenate([np.arange(reusing.size), np.flatnonzero(raced)])
    edge_to = np.concatenate([target(alias[reusing], d), target(fallback[reusing[raced]], d[raced])])
    node = reusing * width + d
    keys, position = np.unique(np.concatenate([node, edge_to]), return_inverse=True)
    node_at, to_at = position[: node.size], position[node.size:]
    # A node's level: 0 when no output reuses its buffer, else one more than the highest of theirs.
    node_of_key = np.full(keys.size, -1, dtype=np.int64)
    node_of_key[node_at] = np.arange(node.size)
    to_node = node_of_key[to_at]
    inner = to_node >= 0
    level = np.zeros(node.size, dtype=np.int64)
    while True:
        raised = level.copy()
        np.maximum.at(raised, to_node[inner], level[edge_from[inner]] + 1)
        if np.array_equal(raised, level):
            break
        level = raised
    latest = np.full((keys.size, 4), -np.inf)
    edge_level = level[edge_from]
    edges_by_level = np.argsort(edge_level, kind="stable")
    bounds = np.searchsorted(edge_level[edges_by_level], np.arange(int(level.max()) + 2))
    for lv in range(int(level.max()) + 1):
        e = edges_by_level[bounds[lv]:bounds[lv + 1]]
        if not e.size:
            continue
        held = np.maximum(frees[reusing[edge_from[e]]], latest[node_at[edge_from[e]]])
        np.maximum.at(latest, to_at[e], held)
    kept = np.isfinite(latest[:, 0])
    return keys[kept], latest[kept]


EdgeTables = collections.namedtuple(
    "EdgeTables", "t_of reader read unread_ops unread_bytes unread_slot_of unread_sink view")
"""A graph's tables of `memory_blocks` that no schedule changes: per (tensor, reader) pair of its
data edges, the tensor and the reader (``t_of``, ``reader``); per tensor, whether a data edge
reads it; of the outputs no data edge reads and that have bytes, the op, the bytes, the slot,
and whether the op is a sink; per op, whether it is a view (`VIEW_OP_TYPES`)."""

_edge_tables_of: "weakref.WeakKeyDictionary[OpGraph, EdgeTables]" = weakref.WeakKeyDictionary()


def _edge_tables(graph: OpGraph) -> EdgeTables:
    """`EdgeTables` of `graph`, once per graph (an `OpGraph` does not change), read-only."""
    cached = _edge_tables_of.get(graph)
    if cached is not None:
        return cached
    n = graph.num_ops
    data = graph.edge_src_output >= 0
    pair = np.unique(graph.edge_tensor[data].astype(np.int64) * max(n, 1) + graph.edge_dst[data])
    t_of, reader = pair // max(n, 1), pair % max(n, 1)
    read = np.zeros(graph.num_tensors, dtype=bool)
    read[t_of] = True
    src = graph.tensor_src.astype(np.int64)
    counts = np.fromiter((len(outs) for outs in graph.output_bytes), dtype=np.int64, count=n)
    first_slot = np.concatenate(([0], np.cumsum(counts)[:-1])) if n else np.zeros(0, np.int64)
    slot_bytes = np.fromiter(
        itertools.chain.from_iterable(graph.output_bytes), dtype=np.int64, count=int(counts.sum()))
    slot_op = np.repeat(np.arange(n, dtype=np.int64), counts)
    unread = slot_bytes > 0
    unread[first_slot[src[read]] + graph.tensor_src_output.astype(np.int64)[read]] = False
    unread[[first_slot[op] + slot for op, slot in graph_buffers(graph).reused]] = False
    u = np.flatnonzero(unread)
    op_u = slot_op[u]
    sink = np.bincount(graph.edge_src, minlength=n)[op_u] == 0
    view = (np.fromiter((t in VIEW_OP_TYPES for t in graph.op_types), dtype=bool, count=n) if graph.op_types
            else np.zeros(n, dtype=bool))
    cached = EdgeTables(t_of, reader, read, op_u, slot_bytes[u], u - first_slot[op_u], sink, view)
    for a in cached:
        a.setflags(write=False)
    _edge_tables_of[graph] = cached
    return cached


def _stacked(parts: list[tuple]) -> MemoryBlocks:
    """The blocks of `parts` (column tuples) as one `MemoryBlocks`."""
    def col(i: int, dtype) -> np.ndarray:
        return np.concatenate([np.asarray(p[i], dtype=dtype) for p in parts]) if parts else np.zeros(0, dtype)

    alternative = col(11, bool)
    return MemoryBlocks(
        device=col(0, np.int32),
        nbytes=col(1, np.int64),
        alloc_us=col(2, np.float64),
        free_us=col(3, np.float64),
        alloc_rank=col(4, np.int64),
        free_rank=col(5, np.int64),
        kind=tuple(k for p in parts for k in p[6]),
        op=col(7, np.int32),
        slot=col(8, np.int32),
        sent_free_us=col(9, np.float64),
        sent_free_rank=col(10, np.int64),
        alternative=alternative if alternative.any() else None,
    )


def memory_timeline(graph: OpGraph, cluster: Cluster, schedule: Schedule) -> tuple[DeviceMemory, ...]:
    """Per device of `cluster`, memory in use over the step as a step function: the rules' own
    outcome, without `MemoryBlocks.alternative` blocks."""
    blocks = memory_blocks(graph, schedule, cluster)
    if blocks.alternative is not None:
        blocks = subset_blocks(blocks, ~blocks.alternative)
    return blocks_timeline(blocks, cluster.num_devices)


def reordered_blocks(
    graph: OpGraph,
    schedule: Schedule,
    blocks: MemoryBlocks,
    window: Union[int, Sequence[int], None] = None,
    pools: Optional[Sequence[int]] = None,
    at_once: Optional[Sequence[int]] = None,
    pool_window: Optional[int] = None,
) -> MemoryBlocks:
    """`blocks` of `schedule` (`memory_blocks`) held as long as an executor that runs each device's
    ops in another order, within `window` places of the simulated one, may hold them. `window` is
    one for every device, or one per device; None, `order_windows(pools)`.

    Frees start from TF's (`MemoryBlocks.sent_free_us`): a tensor sent to devices of their own
    memory leaves its producer's device once its copies out and its readers there are done,
    though a reader elsewhere starts later; that free is made known by the last of those readers
    to end, or by the producer for a copy, and moves with that op.

    A device's ops are in places 0, 1, ... by start time (commit order within an instant). The op
    at place p may start as early as the start of the op at place ``lo(p) = max(p - window, q)``
    and end as late as the end of the op at place ``hi(p) = min(p + window, r, z)``, where q is
    one past the latest ``lo`` of the ops of its device it depends on and r one short of the
    earliest ``hi`` of those that depend on it (over data and control edges, through ops of any
    device), and z the last place before the device next stands idle. So it never runs before an
    op of its device whose output it needs, nor after one that needs its own, and a chain moves
    as a whole, up to `window` places for each of its ops; nor is an op held back while its
    device has nothing else to run (an executor runs a ready op on an idle device). The times at
    which other devices ran their ops bound nothing, nor does an idle gap before the op: they are
    no more certain than the op's. Durations do (`order_bounds.timed_bounds`): the op starts no
    earlier than each op it reads from may end, that op's earliest start plus its duration, and
    ends no later than each op that reads from it may start, on any device. A block allocated by
    an op (its temporary bytes and outputs; a received copy by its first reader there) is
    allocated that much earlier; a block freed by an op (`free_rank`: the op itself, or a
    tensor's last reader) is freed that much later. A received copy is allocated no later than
    its tensor's producer may end, either: TF's receiver asks for a copy when the step starts,
    the sender sends it as soon as the tensor is done, and the receiver allocates the buffer it
    writes into then, however late its reader runs. The simulated transfer may start later,
    behind other copies on a busy link or a busy sender; TF's need not (the scheduler books a
    copy, and counts it, only when it commits the reader).
    Persistent blocks and blocks kept past the step do not move. With `window` 0, the blocks as
    given but for TF's frees and received copies: the simulated order as TF holds its memory.

    A block an op holds only while it runs (its temporary bytes, an output nothing reads) is held
    at some time within that span, not over all of it: where the device's window is above 0, the
    block is marked so (`MemoryBlocks.at_once`), and the timeline counts at each time only the
    `at_once` largest of the ops that may run then (`at_once`, per device: how many of its ops TF
    may run at once; None, `running_at_once(pools)`). Without it, ops of large scratch, such as
    convolutions' gradients, would each count as held through their neighbours' runs too.

    A block held only where TF does not do what the rules give (`MemoryBlocks.alternative`: a
    buffer of its own for an output written into a handed-over buffer) moves as the others do
    where the device's window is above 0, and is left out where it is 0: the simulated order is
    the rules' outcome.

    `pools`, per device, names the pool of threads that runs its ops (`thread_pools`: the CPU
    devices of one process share one); None, each device its own. Devices of one pool take turns
    on its threads, so a block one of them holds for a reader on another of the pool is held as
    late as that reader may end in one order of all the pool's ops, by the same rule (places by
    start over the pool, bounds by the pool's edges and its idle times) with `pool_window` places
    (None: `ORDER_WINDOW_PROCESS`; none for a pool whose devices' windows are all 0), when that is
    later than in its own device's order.

    Time O(V log V + (V + E) D + k) for V ops, E edges, k blocks and D devices.
    """
    device_of = schedule.placement.device_of
    devices = max(int(device_of.max(initial=-1)), int(blocks.device.max(initial=-1))) + 1
    windows = _device_windows(window, pools, max(devices, 0 if pools is None else len(pools)))
    running = np.asarray(running_at_once(range(windows.size) if pools is None else pools)
                         if at_once is None else at_once, dtype=np.int64)
    if running.size < windows.size or (running.size and running.min() < 1):
        raise ValueError(f"at_once must give each of the {windows.size} devices at least 1, not {running.tolist()}")
    if pool_window is not None and pool_window < 0:
        raise ValueError(f"pool_window must be at least 0, not {pool_window}")
    if not blocks.device.size:
        return blocks
    rank = np.empty(graph.num_ops, dtype=np.int64)
    rank[schedule.order] = np.arange(graph.num_ops, dtype=np.int64)
    start, end = schedule.start_us, schedule.end_us
    took = end - start
    if windows.max(initial=0) > 0:
        earliest_op, latest_op = order_bounds(graph, device_of, start, end, rank, windows)
        earliest, latest = timed_bounds(graph, start[earliest_op], end[latest_op], took)
    else:  # each op at its own place: the bounds are its own times
        earliest_op = latest_op = np.arange(graph.num_ops)
        earliest, latest = start.astype(float), end.astype(float)
    early = np.maximum(start - earliest, 0.0)
    late = np.maximum(latest - end, 0.0)

    step = blocks.alloc_rank >= 0
    order = schedule.order
    alloc_op = order[np.where(step, blocks.alloc_rank, 0)]
    alloc_us = np.where(step, blocks.alloc_us - early[alloc_op], blocks.alloc_us)
    alloc_us = np.minimum(alloc_us, _latest_allocations(earliest + took, blocks))
    # Within an instant, an op moved to the start (end) of an op of its device commits with it;
    # one that an input (a reader) bounds keeps its own commit, after that input's (before it).
    moved = step & (early[alloc_op] > 0) & (earliest[alloc_op] == start[earliest_op[alloc_op]])
    alloc_rank = np.where(moved, rank[earliest_op[alloc_op]], blocks.alloc_rank)
    base_free = blocks.free_us if blocks.sent_free_us is None else blocks.sent_free_us
    base_rank = blocks.free_rank if blocks.sent_free_rank is None else blocks.sent_free_rank
    freed = step & np.isfinite(base_free)
    free_op = order[np.where(freed, base_rank, 0)]
    free_us = np.where(freed, base_free + late[free_op], base_free)
    held_to = freed & (late[free_op] > 0) & (latest[free_op] == end[latest_op[free_op]])
    free_rank = np.where(held_to, rank[latest_op[free_op]], base_rank)
    pool = None if pools is None else np.asarray(pools, dtype=np.int64)
    if pool is not None and np.unique(pool).size < pool.size:  # some pool runs two devices
        pool_windows = np.zeros(int(pool.max()) + 1, dtype=np.int64)
        np.maximum.at(pool_windows, pool, windows[:pool.size])
        process = ORDER_WINDOW_PROCESS if pool_window is None else pool_window
        pool_windows = np.where(pool_windows > 0, process, 0)
        pool_latest = order_bounds(graph, pool[device_of], start, end, rank, pool_windows)[1]
        pool_late = np.maximum(end[pool_latest] - end, 0.0)
        handed = freed & (device_of[free_op] != blocks.device) & (pool[device_of[free_op]] == pool[blocks.device])
        later = handed & (base_free + pool_late[free_op] > free_us)
        free_us = np.where(later, base_free + pool_late[free_op], free_us)
        free_rank = np.where(later, rank[pool_latest[free_op]], free_rank)
    # Held while its op runs: allocated at its start, freed at its end, by itself.
    scoped = np.fromiter((k in ("temp", "output") for k in blocks.kind), dtype=bool, count=len(blocks.kind))
    scoped &= freed & (base_rank == blocks.alloc_rank) & (windows[blocks.device] > 0)
    scoped &= (blocks.alloc_us == start[blocks.op]) & (base_free == end[blocks.op])
    alternative = blocks.alternative
    if alternative is not None:
        scoped &= ~alternative
    reordered = dataclasses.replace(blocks, alloc_us=alloc_us, free_us=free_us, alloc_rank=alloc_rank,
                                    free_rank=free_rank, sent_free_us=None, sent_free_rank=None,
                                    at_once=np.where(scoped, running[blocks.device], 0))
    if alternative is not None and (windows[blocks.device[alternative]] == 0).any():
        reordered = subset_blocks(reordered, ~alternative | (windows[blocks.device] > 0))
    return reordered


def order_windows(pools: Sequence[int]) -> tuple[int, ...]:
    """Per device, how many places of its order `reordered_blocks` lets its ops move by default:
    `ORDER_WINDOW` where its pool of threads (`pools`, as `thread_pools` gives them) runs another
    device's ops too, `ORDER_WINDOW_OWN_POOL` where it runs this device's alone. O(D)."""
    return tuple(ORDER_WINDOW if shared else ORDER_WINDOW_OWN_POOL for shared in in_shared_pool(pools))


def running_at_once(pools: Sequence[int]) -> tuple[int, ...]:
    """Per device, how many of its ops TensorFlow may run at once: one where its pool of threads
    (`pools`, as `thread_pools` gives them) runs its ops alone (a GPU's stream, a worker task of one
    thread), as many as the process's inter-op pool has threads where the pool runs other
    devices' ops too: TF's default, the CPUs this process may run on. O(D)."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return tuple(threads if shared else 1 for shared in in_shared_pool(pools))


def _device_windows(window: Union[int, Sequence[int], None], pools: Optional[Sequence[int]],
                    devices: int) -> np.ndarray:
    """`reordered_blocks`'s `window` as one per device of `devices`, checked."""
    if window is None:
        windows = np.asarray(order_windows(range(devices) if pools is None else pools), dtype=np.int64)
    elif isinstance(window, (int, np.integer)):
        windows = np.full(devices, int(window), dtype=np.int64)
    else:
        windows = np.asarray(window, dtype=np.int64)
    if windows.size < devices:
        raise ValueError(f"window gives {windows.size} devices a window, but there are {devices}: "
                         f"give one per device, or one int for all")
    if windows.size and windows.min() < 0:
        raise ValueError(f"window must be at least 0, not {windows.min()}")
    return windows


def _latest_allocations(earliest_end: np.ndarray, blocks: MemoryBlocks) -> np.ndarray:
    """Per block, the latest TF allocates it: the earliest end of its tensor's producer (per op,
    `earliest_end`) for a received copy (the copy may arrive from then on), inf for every other
    block. O(k) for k blocks."""
    received = np.fromiter((kind == "received" for kind in blocks.kind), dtype=bool, count=len(blocks.kind))
    return np.where(received, earliest_end[blocks.op], np.inf)


def thread_pools(cluster: Cluster) -> tuple[int, ...]:
    """Per device of `cluster`, the pool of threads that runs its ops: devices that share memory
    (`Cluster.shares_memory`: CPU devices of one process) share their process's inter-op pool;
    every other device runs its own. Pools are numbered by their first device. O(D^2)."""
    shares = cluster.shares_memory()
    return tuple(next(a for a in range(d + 1) if a == d or shares[a][d]) for d in range(cluster.num_devices))


def in_shared_pool(pools: Sequence[int]) -> list[bool]:
    """Per device, whether its pool of threads (`thread_pools`) runs another device's ops too."""
    counts = collections.Counter(pools)
    return [counts[p] > 1 for p in pools]


def reordered_peaks(
    graph: OpGraph, cluster: Cluster, schedule: Schedule, window: Union[int, Sequence[int], None] = None
) -> tuple[int, ...]:
    """Per device of `cluster`, the peak of `schedule`'s memory held as `reordered_blocks` holds
    it, with the cluster's `thread_pools` (and by default their `order_windows`). It grows with
    `window`; with `window` 0 it is
    `Schedule.peak_memory_bytes` where no copy crosses from one memory to another, and may be
    above it (a copy allocated from the earliest its producer may end) or below it (a sent tensor freed once
    copied) where one does."""
    blocks = reordered_blocks(graph, schedule, memory_blocks(graph, schedule, cluster), window,
                              thread_pools(cluster))
    return tuple(t.peak_bytes for t in blocks_timeline(blocks, cluster.num_devices))
