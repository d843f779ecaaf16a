"""Which outputs of an `OpGraph` allocate a buffer, in the scheduler's memory model.

TensorFlow gives some outputs no buffer of their own: ``Identity``, ``Reshape``, slices and
element-wise ops run in place return their input's buffer, and ``ReadVariableOp`` the variable's.
`OpGraph.output_alias` says which (the profile records it from the traced buffer addresses);
`buffer_tables` turns it into the tables that both scheduling engines (`list_scheduler`,
``native/scheduler.cpp``) and the memory timeline (`memory_timeline`) read, so that the three
count the same bytes. Time and memory O(V + E) for V ops and E edges.
"""

from __future__ import annotations

import typing
import weakref

import numpy as np

from baechi_tf.graph import HELD, VIEW_OP_TYPES, OpGraph

__all__ = [
    "HELD_VIEW", "OWN", "GraphBuffers", "always_reused_tensors", "buffer_tables", "constant_tensors",
    "fallback_inputs", "free_at_end_bytes", "graph_buffers",
]

OWN, HELD_VIEW = -1, -2  # `buffer_tables`' alias of a tensor with a buffer of its own, of a held view

ANCESTOR_SEARCH_LIMIT = 4096
"""Most ops `always_reused_tensors` visits for one tensor before it calls the order open."""


def buffer_tables(graph: OpGraph) -> tuple[np.ndarray, np.ndarray, frozenset[tuple[int, int]]]:
    """(own output bytes per op, alias per tensor, the (op, slot) of each output that allocates
    nothing): which outputs allocate, by `OpGraph.output_alias`.

    An output slot reuses a buffer (allocates nothing) when the graph says so, its op has a
    successor (a sink's outputs are kept past the step, so they stay buffers of their own) and,
    for an input's buffer, the input has at least its bytes. Own output bytes: an op's outputs
    that allocate (int64 [num_ops]). Alias per tensor (int64 [num_tensors]): `OWN`, `HELD_VIEW`
    (no buffer on its producer's device: a view of persistent memory), or the id of the input
    tensor whose buffer it is on its producer's device. A copy sent to another device is always
    a buffer of its own. O(V + E)."""
    own = graph.output_total_bytes.copy()
    alias = np.full(graph.num_tensors, OWN, dtype=np.int64)
    reused: set[tuple[int, int]] = set()
    if not graph.output_alias:
        return own, alias, frozenset()
    tensor_of = {
        (s, o): t for t, (s, o) in enumerate(zip(graph.tensor_src.tolist(), graph.tensor_src_output.tolist()))
        if o >= 0
    }
    tbytes = graph.tensor_bytes.tolist()
    succ = graph.successors
    for op, aliases in enumerate(graph.output_alias):
        if not succ[op]:
            continue
        for slot, a in enumerate(aliases):
            if a is None:
                continue
            nbytes = graph.output_bytes[op][slot]
            if a == HELD:
                source = HELD_VIEW
            else:
                source = tensor_of[a]
                if tbytes[source] < nbytes:
                    continue
            own[op] -= nbytes
            reused.add((op, slot))
            t = tensor_of.get((op, slot))
            if t is not None:
                alias[t] = source
    return own, alias, frozenset(reused)


class GraphBuffers(typing.NamedTuple):
    """`buffer_tables` and the tables derived from its alias, of one graph (read-only arrays)."""

    own: np.ndarray
    alias: np.ndarray
    reused: frozenset[tuple[int, int]]
    always_reused: np.ndarray  # `always_reused_tensors`
    fallback: np.ndarray  # `fallback_inputs`
    constant: np.ndarray  # `constant_tensors`


_graph_buffers: "weakref.WeakKeyDictionary[OpGraph, GraphBuffers]" = weakref.WeakKeyDictionary()


def graph_buffers(graph: OpGraph) -> GraphBuffers:
    """`GraphBuffers` of `graph`, computed once per graph (an `OpGraph` does not change) and kept
    while the graph lives: the memory timeline reads them for every schedule of the graph."""
    cached = _graph_buffers.get(graph)
    if cached is None:
        own, alias, reused = buffer_tables(graph)
        tables = (own, alias, always_reused_tensors(graph, alias), fallback_inputs(graph, alias),
                  constant_tensors(graph, alias))
        for a in tables:
            a.setflags(write=False)
        cached = _graph_buffers[graph] = GraphBuffers(own, alias, reused, *tables[2:])
    return cached


def free_at_end_bytes(graph: OpGraph) -> list[int]:
    """Per op, the bytes freed when it ends: its scratch, plus the outputs nobody reads that have
    a buffer of their own (`buffer_tables`; a sink keeps its outputs)."""
    own, alias = graph_buffers(graph)[:2]
    read = np.zeros(graph.num_ops, dtype=np.int64)
    data = (graph.tensor_src_output >= 0) & (alias == OWN)
    np.add.at(read, graph.tensor_src[data], graph.tensor_bytes[data])
    has_succ = np.asarray([bool(s) for s in graph.successors], dtype=bool)
    unread = np.where(has_succ, own - read, 0)
    return (graph.temp_bytes + unread).tolist()


def constant_tensors(graph: OpGraph, alias: np.ndarray) -> np.ndarray:
    """bool [num_tensors]: the tensors that are a constant's value, a held view (`HELD_VIEW` in
    `alias`, `buffer_tables`' second value) of its producer's own persistent memory. A device
    that reads one from another device of shared memory (`Cluster.shares_memory`) holds a
    replica as persistent memory of its own for the whole step, as TF's constant replication
    gives each CPU device that reads a small constant (larger ones, sent by reference, are
    counted so too: never less than TF holds). O(T) for T tensors."""
    held = alias == HELD_VIEW
    return held & (graph.persistent_bytes[graph.tensor_src] > 0) & (graph.tensor_src_output >= 0)


def always_reused_tensors(graph: OpGraph, alias: np.ndarray) -> np.ndarray:
    """bool [num_tensors]: the outputs that reuse an input's buffer (``alias >= 0``, from
    `buffer_tables`) in every order the step can run in.

    A view (an op of `VIEW_OP_TYPES`: Identity, Reshape, Split, ...) shares the buffer whatever
    else holds it. An op of another type writes in place only into a buffer nothing else holds:
    every other op that reads it (or reads a tensor that is the same buffer: the input's own
    source, views of it) has run. That holds in every order when each such op is an ancestor of
    the writer; otherwise it depends on the order (the profile saw it in the profiled run's
    order). Where the buffer is a persistent view (`HELD_VIEW`: a variable's value) the variable
    holds it too, and the answer is False. The scheduler counts a False output reading another
    device's buffer both ways (`SchedulerState._cut`); a True one reuses the buffer there.

    The ancestor search walks predecessors from the writer, never below the lowest topological
    index of the ops it looks for, and gives up (False: the order decides) after
    `ANCESTOR_SEARCH_LIMIT` ops. O(T + E) to group the buffers, plus, per output written in
    place, the tensors of its buffer and at most that many ops."""
    out = np.zeros(graph.num_tensors, dtype=bool)
    reusing = np.flatnonzero(alias >= 0)
    if reusing.size == 0:
        return out
    alias_of = alias.tolist()
    src = graph.tensor_src.tolist()
    types = graph.op_types
    readers: list[list[int]] = [[] for _ in range(graph.num_tensors)]
    for t, c, slot in zip(graph.edge_tensor.tolist(), graph.edge_dst.tolist(), graph.edge_src_output.tolist()):
        if slot >= 0:
            readers[t].append(c)
    children: dict[int, list[int]] = {}  # tensor -> the tensors that reuse its buffer
    for t in reusing.tolist():
        children.setdefault(alias_of[t], []).append(t)
    topo = graph.topo_index.tolist()
    preds = graph.predecessors
    for t in reusing.tolist():
        writer = src[t]
        if types and types[writer] in VIEW_OP_TYPES:
            out[t] = True
            continue
        root = t
        while alias_of[root] >= 0:
            root = alias_of[root]
        if alias_of[root] == HELD_VIEW:
            continue
        holders: set[int] = set()
        stack = [root]
        while stack:  # the buffer's tensors but t and those that reuse t's buffer
            u = stack.pop()
            holders.update(readers[u])
            stack.extend(v for v in children.get(u, ()) if v != t)
        holders.discard(writer)
        if not holders:
            out[t] = True
        elif max(topo[h] for h in holders) < topo[writer]:
            out[t] = _all_ancestors(holders, writer, preds, topo)
    return out


def fallback_inputs(graph: OpGraph, alias: np.ndarray) -> np.ndarray:
    """int64 [num_tensors]: per output written in place into an input's buffer (``alias >= 0``,
    from `buffer_tables`; not a view), the writer's other input that TF writes into when that
    buffer is not free after all; -1 for every other tensor.

    TF tries an op's candidate inputs in turn (``forward_input_or_allocate_output({0, 1}, ...)``
    for element-wise ops) and writes into the first whose buffer nothing else holds. A buffer
    another device of the process handed over can still be held by the sender's executor for a
    moment when the reader starts; the writer then takes its next candidate, which stays held
    until the output's readers are done, where it would have been freed at the writer's end.
    Seen on CPU stand-ins: Inception-v3's ``ReluGrad`` wrote into its ReLU's output instead of
    the gradient another stand-in had computed in one to three of four traced steps
    (`bench/fidelity_memory.py`). The candidate is the first other data input of at least the
    output's bytes that is not a view of persistent memory (a variable's value, which the
    variable holds). The scheduler holds it so where the written buffer is handed over
    (`SchedulerState._races`). O(V + E) for V ops and E edges, once for the graph's edge index."""
    out = np.full(graph.num_tensors, -1, dtype=np.int64)
    reusing = np.flatnonzero(alias >= 0)
    if reusing.size == 0:
        return out
    alias_of = alias.tolist()
    src = graph.tensor_src.tolist()
    tbytes = graph.tensor_bytes.tolist()
    types = graph.op_types
    for t in reusing.tolist():
        writer = src[t]
        if types and types[writer] in VIEW_OP_TYPES:
            continue
        edges = graph.in_edges(writer)  # in input order
        inputs = graph.edge_tensor[edges[graph.edge_src_output[edges] >= 0]].tolist()
        out[t] = next((c for c in inputs if c != alias_of[t] and tbytes[c] >= tbytes[t]
                       and _root(c, alias_of) != HELD_VIEW), -1)
    return out


def _root(t: int, alias_of: list[int]) -> int:
    """The tensor whose buffer tensor t is in (`HELD_VIEW` for a view of persistent memory)."""
    while alias_of[t] >= 0:
        t = alias_of[t]
    return HELD_VIEW if alias_of[t] == HELD_VIEW else t


def _all_ancestors(targets: set[int], op: int, preds, topo: list[int]) -> bool:
    """Whether every op of `targets` is an ancestor of `op`, by a search of at most
    `ANCESTOR_SEARCH_LIMIT` ops (False when it runs out)."""
    need = set(targets)
    low = min(topo[x] for x in need)
    seen = {op}
    stack = [op]
    while stack:
        for p in preds[stack.pop()]:
            if p in seen or topo[p] < low:
                continue
            if len(seen) >= ANCESTOR_SEARCH_LIMIT:
                return False
            seen.add(p)
            need.discard(p)
            if not need:
                return True
            stack.append(p)
    return False
