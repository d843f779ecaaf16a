"""Control edges that other paths imply, and the graph without them.

A control edge u -> v orders v after u and carries nothing. When another path leads from u to v,
the edge orders nothing that the path does not: Grappler's dependency optimizer removes such
edges before a step runs (TF's default), and so does the import (`drop_implied_control_edges`),
since they can make up most of a graph's edges. The usual source is
``with tf.control_dependencies(update_ops): optimizer.minimize(loss)``: every op of the
backward pass whose inputs come from outside that block gets a control input from each of the
batch-norm updates. A tf_keras NASNetMobile step has 572k control edges for 31k ops, 97% of its
edges; 250k of them are implied (the rest join each update to the first ops of the block, which
no other path does).

Only control edges are dropped: a data edge carries a tensor even where a path implies its order.
Removing every implied edge of a DAG at once keeps which op reaches which (the transitive
reduction), so no order between ops is lost.

Time O(E * T / w) for E edges, T distinct heads of the candidate edges (control edges into ops
with another predecessor) and machine words of w bits: one sweep in reverse topological order
with a bit set of the reachable heads per op; the heads are taken in blocks of `BLOCK_HEADS`,
which bounds memory by O(V * BLOCK_HEADS) bits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from baechi_tf.graph import OpGraph, _frozen

__all__ = ["BLOCK_HEADS", "drop_implied_control_edges", "implied_control_edges"]

BLOCK_HEADS = 1 << 14  # heads per sweep: a bit set of at most 2 KiB per op


def implied_control_edges(graph: OpGraph) -> np.ndarray:
    """bool [num_edges]: the control edges u -> v of `graph` for which another path leads from u
    to v (through any edges, data or control). Raises `InvalidGraphError` on a cycle."""
    implied = np.zeros(graph.num_edges, dtype=bool)
    control = graph.is_control
    if not control.any():
        return implied
    preds = graph.predecessors
    src, dst = graph.edge_src, graph.edge_dst
    # An edge into an op with no other predecessor has no other path to be implied by.
    many = np.fromiter((len(p) > 1 for p in preds), dtype=bool, count=graph.num_ops)
    candidates = np.flatnonzero(control & many[dst])
    if candidates.size == 0:
        return implied
    heads = np.unique(dst[candidates])
    succ = graph.successors
    reverse_topo = graph.topo_order[::-1].tolist()
    for first in range(0, heads.size, BLOCK_HEADS):
        block = heads[first : first + BLOCK_HEADS]
        bit = [0] * graph.num_ops  # 1 << (position of the op among the block's heads), else 0
        for i, h in enumerate(block.tolist()):
            bit[h] = 1 << i
        in_block = candidates[np.isin(dst[candidates], block)]
        by_tail: dict[int, list[tuple[int, int]]] = {}
        for e, u, v in zip(in_block.tolist(), src[in_block].tolist(), dst[in_block].tolist()):
            by_tail.setdefault(u, []).append((e, bit[v]))
        below = [0] * graph.num_ops  # heads reachable from an op by a path of one edge or more
        for u in reverse_topo:
            through = 0  # heads reachable from u's successors by a path of one edge or more
            direct = 0
            for k in succ[u]:
                through |= below[k]
                direct |= bit[k]
            below[u] = through | direct
            for e, b in by_tail.get(u, ()):
                if through & b:
                    implied[e] = True
    return implied


def drop_implied_control_edges(graph: OpGraph) -> tuple[OpGraph, int]:
    """`graph` without the edges of `implied_control_edges`, and how many were dropped (the
    same graph when none)."""
    implied = implied_control_edges(graph)
    dropped = int(implied.sum())
    if dropped == 0:
        return graph, 0
    keep = ~implied
    return dataclasses.replace(
        graph,
        edge_src=_frozen(graph.edge_src[keep]),
        edge_dst=_frozen(graph.edge_dst[keep]),
        edge_src_output=_frozen(graph.edge_src_output[keep]),
    ), dropped

