"""Which outputs of an `OpGraph` allocate a buffer, in the scheduler's memory model.

TensorFlow gives some outputs no buffer of their own: ``Identity``, ``Reshape``, slices and
element-wise ops run in place return their input's buffer, and ``ReadVariableOp`` the variable's.
`OpGraph.output_alias` says which (the profile records it from the traced buffer addresses);
`buffer_tables` turns it into the tables that both scheduling engines (`list_scheduler`,
``native/scheduler.cpp``) and the memory timeline (`memory_timeline`) read, so that the three
count the same bytes. Time and memory O(V + E) for V ops and E edges.
"""

from __future__ import annotations

import numpy as np

from baechi_tf.graph import HELD, OpGraph

__all__ = ["HELD_VIEW", "OWN", "buffer_tables", "constant_tensors", "free_at_end_bytes"]

OWN, HELD_VIEW = -1, -2  # `buffer_tables`' alias of a tensor with a buffer of its own, of a held view


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


def free_at_end_bytes(graph: OpGraph) -> list[int]:
    """Per op, the bytes freed when it ends: its scratch, plus the outputs nobody reads that have
    a buffer of their own (`buffer_tables`; a sink keeps its outputs)."""
    own, alias, _ = buffer_tables(graph)
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
