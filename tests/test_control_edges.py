"""Control edges implied by other paths (`baechi_tf.control_edges`), against a brute force."""

from __future__ import annotations

import random

import numpy as np
import pytest

from baechi_tf import control_edges
from baechi_tf.control_edges import drop_implied_control_edges, implied_control_edges
from baechi_tf.graph import CONTROL, OpGraph


def _graph(num_ops: int, edges) -> OpGraph:
    """Ops op0.. of 1 us and one 4-byte output; `edges` as (src, dst, slot), CONTROL for control."""
    src, dst, slot = zip(*edges) if edges else ((), (), ())
    return OpGraph.from_arrays(
        [f"op{i}" for i in range(num_ops)], [1.0] * num_ops, [[4]] * num_ops,
        edge_src=src, edge_dst=dst, edge_src_output=slot,
    )


def _reach(num_ops: int, pairs) -> list[set[int]]:
    """Ops reachable from each op by one edge or more, by depth-first search."""
    succ = [set() for _ in range(num_ops)]
    for u, v in pairs:
        succ[u].add(v)
    out = []
    for u in range(num_ops):
        seen, stack = set(), list(succ[u])
        while stack:
            k = stack.pop()
            if k not in seen:
                seen.add(k)
                stack.extend(succ[k])
        out.append(seen)
    return out


def _brute(graph: OpGraph) -> np.ndarray:
    """A control edge u -> v is implied when some successor k of u other than v reaches v."""
    pairs = list(zip(graph.edge_src.tolist(), graph.edge_dst.tolist()))
    reach = _reach(graph.num_ops, pairs)
    succ = graph.successors
    return np.array([
        bool(graph.edge_src_output[e] == CONTROL and any(v in reach[k] for k in succ[u] if k != v))
        for e, (u, v) in enumerate(pairs)
    ], dtype=bool)


def test_a_control_edge_beside_a_longer_path_is_implied_and_a_data_edge_never_is():
    # 0 -> 1 -> 2 by data; 0 -> 2 by control (implied) and 0 -> 3 by data beside 0 -> 1 -> 3.
    graph = _graph(4, [(0, 1, 0), (1, 2, 0), (0, 2, CONTROL), (1, 3, 0), (0, 3, 0)])
    assert implied_control_edges(graph).tolist() == [False, False, True, False, False]
    reduced, dropped = drop_implied_control_edges(graph)
    assert dropped == 1 and reduced.num_edges == 4
    assert (0, 2) not in set(zip(reduced.edge_src.tolist(), reduced.edge_dst.tolist()))
    assert reduced.names == graph.names and reduced.compute_us is graph.compute_us
    assert graph.num_edges == 5  # the graph given is left as it was


def test_a_path_of_control_edges_implies_a_control_edge():
    graph = _graph(3, [(0, 1, CONTROL), (1, 2, CONTROL), (0, 2, CONTROL)])
    assert implied_control_edges(graph).tolist() == [False, False, True]


def test_update_ops_before_a_backward_pass_keep_the_edges_no_path_implies():
    """The `control_dependencies(update_ops)` pattern: each update op (0, 1) orders each op of
    the block (2, 3, 4); 2 -> 3 -> 4 by data. Only the edges into 3 and 4 are implied, through 2."""
    edges = [(u, v, CONTROL) for u in (0, 1) for v in (2, 3, 4)] + [(2, 3, 0), (3, 4, 0), (5, 2, 0)]
    graph = _graph(6, edges)
    implied = implied_control_edges(graph)
    kept = {(int(graph.edge_src[e]), int(graph.edge_dst[e])) for e in np.flatnonzero(~implied)}
    assert kept == {(0, 2), (1, 2), (2, 3), (3, 4), (5, 2)}


def test_no_control_edge_leaves_the_graph_as_it_is():
    graph = _graph(3, [(0, 1, 0), (1, 2, 0), (0, 2, 0)])
    assert not implied_control_edges(graph).any()
    assert drop_implied_control_edges(graph) == (graph, 0)


@pytest.mark.parametrize("block", [control_edges.BLOCK_HEADS, 3])
@pytest.mark.parametrize("seed", range(25))
def test_random_graphs_agree_with_the_brute_force_and_keep_every_path(seed, block, monkeypatch):
    monkeypatch.setattr(control_edges, "BLOCK_HEADS", block)  # 3: several sweeps of heads
    rng = random.Random(seed)
    n = rng.randint(2, 40)
    p = rng.uniform(0.05, 0.4)
    # Op ids are shuffled against the order of the edges, so that the sweep's topological
    # order is not the id order.
    perm = list(range(n))
    rng.shuffle(perm)
    edges = [(perm[i], perm[j], CONTROL if rng.random() < 0.5 else 0)
             for j in range(n) for i in range(j) if rng.random() < p]
    graph = _graph(n, edges)
    implied = implied_control_edges(graph)
    assert implied.tolist() == _brute(graph).tolist()
    reduced, dropped = drop_implied_control_edges(graph)
    assert dropped == int(implied.sum())
    before = _reach(n, zip(graph.edge_src.tolist(), graph.edge_dst.tolist()))
    after = _reach(n, zip(reduced.edge_src.tolist(), reduced.edge_dst.tolist()))
    assert before == after
    assert int((reduced.edge_src_output != CONTROL).sum()) == int((graph.edge_src_output != CONTROL).sum())
    assert not implied_control_edges(reduced).any()  # nothing left to drop
