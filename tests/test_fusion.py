"""Operator fusion (baechi_tf.placer.fusion): the original's seven cases, cycles, the way back."""

import dataclasses
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphs
from baechi_tf.errors import ConfigError
from baechi_tf.graph import CONTROL
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.json_io import load_graph_json
from baechi_tf.placer import Placement, colocation_groups, coplace
from baechi_tf.placer.fusion import FusionOptions, fuse
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions, place
from invariants import assert_valid_schedule
from test_properties import graphs_with_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from lp_scaling import unrolled_rnn  # noqa: E402

# op -> (compute_us, temp_bytes, persistent_bytes, output_bytes)
CHAIN = {0: (2, 1, 2, [1]), 1: (3, 2, 3, [2]), 2: (3, 4, 0, [3])}
FAN_IN = {0: (2, 1, 2, [1]), 1: (3, 2, 3, [2]), 2: (3, 4, 5, [3])}


def build(ops, edges, colocated):
    """edges: (src, dst[, src_output]); colocated: op -> op whose group it joins."""
    b = OpGraphBuilder()
    for i, (us, temp, persistent, outs) in sorted(ops.items()):
        b.add_op(f"op{i}", us, outs, temp_bytes=temp, persistent_bytes=persistent,
                 colocation=[f"op{colocated[i]}"] if i in colocated else ())
    for s, d, *out in edges:
        b.add_edge(f"op{s}", f"op{d}", out[0] if out else 0)
    graph = b.build()
    return graph, colocation_groups(graph)


def nodes(fused):
    """(name, compute, temp, persistent, outputs) of each fused op."""
    g = fused.graph
    return [
        (g.names[i], float(g.compute_us[i]), int(g.temp_bytes[i]), int(g.persistent_bytes[i]), list(g.output_bytes[i]))
        for i in range(g.num_ops)
    ]


def edges(fused):
    g = fused.graph
    return list(zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_src_output.tolist()))


# ---------------------------------------------------------------- placer_lib_test's seven cases


def test_1_chain_in_one_group_becomes_one_op():
    # op0 -> op1 -> op2, one group: compute 2+3+3, temp max 4, persistent 5, no outputs left.
    fused = fuse(*build(CHAIN, [(0, 1), (1, 2)], {1: 0, 2: 0}))
    assert nodes(fused) == [("op0", 8.0, 4, 5, [])]
    assert edges(fused) == []
    assert fused.members[0].tolist() == [0, 1, 2]


def test_2_chain_with_the_last_op_in_another_group():
    fused = fuse(*build(CHAIN, [(0, 1), (1, 2)], {1: 0}))
    assert nodes(fused) == [("op0", 5.0, 2, 5, [2]), ("op2", 3.0, 4, 0, [3])]
    assert edges(fused) == [(0, 1, 0)]  # carries op1:0 (2 bytes)
    assert fused.graph.tensor_bytes.tolist() == [2]


def test_3_fan_in_consumer_folds_into_its_grouped_producer():
    # op0 -> op2 <- op1, op0 and op2 grouped: op2 folds into op0; op1 -> op0 now.
    fused = fuse(*build(FAN_IN, [(0, 2), (1, 2)], {2: 0}))
    assert nodes(fused) == [("op0", 5.0, 4, 7, []), ("op1", 3.0, 2, 3, [2])]
    assert edges(fused) == [(1, 0, 0)]


def test_4_fan_in_in_one_group_cascades():
    fused = fuse(*build(FAN_IN, [(0, 2), (1, 2)], {1: 0, 2: 0}))
    assert [n[1:] for n in nodes(fused)] == [(8.0, 4, 10, [])]


def test_5_only_the_middle_pair_fuses():
    # op0, op1 -> op2 -> op3 -> op4 with groups {op0, op1, op4} and {op2, op3}.
    ops = {0: (1, 1, 1, [1]), 1: (1, 1, 1, [1]), 2: (1, 7, 1, [5]), 3: (3, 2, 2, [4]), 4: (1, 1, 1, [1])}
    fused = fuse(*build(ops, [(0, 2), (1, 2), (2, 3), (3, 4)], {1: 0, 4: 0, 3: 2}))
    assert nodes(fused) == [
        ("op0", 1.0, 1, 1, [1]), ("op1", 1.0, 1, 1, [1]), ("op2", 4.0, 7, 3, [4]), ("op4", 1.0, 1, 1, [1]),
    ]
    assert edges(fused) == [(0, 2, 0), (1, 2, 0), (2, 3, 0)]  # op4 is now op 3
    assert fused.fused_of.tolist() == [0, 1, 2, 2, 3]


DIAMOND_OPS = {0: (1, 1, 1, [7, 2]), 1: (1, 1, 1, [3]), 2: (1, 1, 1, [1]), 3: (1, 1, 1, [1])}


def test_6_diamond_keeps_both_tensors_between_the_fused_ops():
    # op0 -> op1 (op0:0), op0 -> op2 (op0:1), op1 -> op3, op2 -> op3; groups {op0, op1}, {op2, op3}.
    fused = fuse(*build(DIAMOND_OPS, [(0, 1, 0), (0, 2, 1), (1, 3), (2, 3)], {1: 0, 3: 2}))
    assert [n[0] for n in nodes(fused)] == ["op0", "op2"]
    # The internal op0:0 is no longer an output; op0:1 and op1:0 (2 + 3 bytes) cross.
    assert nodes(fused)[0][4] == [2, 3]
    assert edges(fused) == [(0, 1, 0), (0, 1, 1)]


def test_7_merge_that_could_close_a_cycle_is_refused():
    # op0 -> op1, op0 -> op2, op3 -> op1, op2 -> op3: op0 ~> op2 -> op3 -> op1, so op0 and op1
    # stay apart; op2 and op3 fuse.
    for check in ("auto", "exact", "conservative"):
        fused = fuse(*build(DIAMOND_OPS, [(0, 1, 0), (0, 2, 1), (3, 1), (2, 3)], {1: 0, 3: 2}),
                     options=FusionOptions(path_check=check))
        assert [n[0] for n in nodes(fused)] == ["op0", "op1", "op2"]
        assert sorted(edges(fused)) == [(0, 1, 0), (0, 2, 1), (2, 1, 0)]


def test_exact_check_fuses_where_the_conservative_rule_refuses():
    #   op0 -> op1 (grouped), op0 -> op2, op3 -> op1: op0 has another successor and op1 another
    #   predecessor, but no other op0 ~> op1 path exists.
    ops = {i: (1, 0, 0, [4]) for i in range(4)}
    graph, groups = build(ops, [(0, 1), (0, 2), (3, 1)], {1: 0})
    exact = fuse(graph, groups, options=FusionOptions(path_check="exact"))
    conservative = fuse(graph, groups, options=FusionOptions(path_check="conservative"))
    assert exact.graph.num_ops == 3 and exact.fused_of.tolist() == [0, 0, 1, 2]
    assert conservative.graph.num_ops == 4
    assert fuse(graph, groups).graph.num_ops == 3  # auto: exact while its budget lasts
    assert fuse(graph, groups, options=FusionOptions(search_budget=0)).graph.num_ops == 4


def test_unknown_check():
    with pytest.raises(ConfigError, match="unknown path check 'maybe'"):
        fuse(*build(CHAIN, [], {}), options=FusionOptions(path_check="maybe"))


# ---------------------------------------------------------------- never a cycle; the way back


@st.composite
def grouped_dags(draw):
    graph = draw(graphs_with_memory())[0]  # groups, pins, control edges
    pinned = any(pin is not None for pin in graph.pinned_device)  # coplace may join two pins
    groups = coplace(graph) if not pinned and draw(st.booleans()) else colocation_groups(graph)
    return graph, groups, draw(st.sampled_from(["auto", "exact", "conservative"]))


@pytest.mark.slow
@given(grouped_dags())
@settings(max_examples=300, deadline=None)
def test_fused_graph_is_a_dag_that_keeps_costs_and_edges(case):
    graph, groups, check = case
    fused = fuse(graph, groups, options=FusionOptions(path_check=check))
    g = fused.graph
    g.validate()  # acyclic, well formed
    # Members partition the ops; each fused op lies in one group, named after the op the others
    # were folded into.
    assert sorted(np.concatenate(fused.members).tolist()) == list(range(graph.num_ops))
    for f, members in enumerate(fused.members):
        assert (fused.fused_of[members] == f).all()
        assert len(set(groups.group_of[members].tolist())) == 1
        assert fused.groups.group_of[f] == groups.group_of[members[0]]
        assert g.names[f] in [graph.names[m] for m in members.tolist()]
        assert g.compute_us[f] == pytest.approx(graph.compute_us[members].sum())
        assert g.persistent_bytes[f] == graph.persistent_bytes[members].sum()
        assert g.temp_bytes[f] == graph.temp_bytes[members].max()
    # Every edge between two fused ops survives, carrying its tensor once.
    kept = {(s, d, int(g.tensor_bytes[t]) if o != CONTROL else -1)
            for s, d, o, t in zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_src_output.tolist(), g.edge_tensor.tolist())}
    for e in range(graph.num_edges):
        s, d = int(fused.fused_of[graph.edge_src[e]]), int(fused.fused_of[graph.edge_dst[e]])
        if s != d:
            nbytes = -1 if graph.edge_src_output[e] == CONTROL else int(graph.edge_bytes[e])
            assert (s, d, nbytes) in kept
    # The way back: each original op gets its fused op's device.
    device_of = np.arange(g.num_ops) % 3
    back = fused.expand(Placement(device_of, "m_etf"))
    assert back.method == "m_etf"
    assert (back.device_of == device_of[fused.fused_of]).all()


def test_expand_checks_the_size():
    fused = fuse(*build(CHAIN, [(0, 1), (1, 2)], {1: 0, 2: 0}))
    with pytest.raises(ValueError, match="placement has 3 ops, the fused graph 1"):
        fused.expand(Placement(np.zeros(3, dtype=np.int32), "x"))


def test_unrolled_rnn_at_least_halves():
    graph = unrolled_rnn(steps=20, layers=2)
    fused = fuse(graph, coplace(graph))
    assert fused.graph.num_ops * 2 <= graph.num_ops


def test_single_with_fusion_is_the_one_device_placement_of_the_unfused_graph():
    # fork_join's coplace groups fuse into 6 ops that need 133 MiB on one device, the graph 101
    # MiB: single with fusion said 'the graph does not fit on one device' under 128 MiB.
    graph, cluster = load_graph_json(os.path.join(ROOT, "examples", "fork_join.json"))
    options = PlacementOptions("single", placer_type="fusion", grouper="coplace", memory_fraction=0.5)
    result = place(graph, cluster, options)
    plain = place(graph, cluster, dataclasses.replace(options, placer_type="default"))
    assert result.placement.method == "single"
    assert result.placement.device_of.tolist() == plain.placement.device_of.tolist() == [0] * graph.num_ops
    assert result.makespan_us == plain.makespan_us
    assert_valid_schedule(graph, cluster.with_memory_fraction(0.5), result.groups, result.schedule)


METHODS = sorted(m for m in PLACEMENT_METHODS if m not in ("expert", "layers"))  # see test_placers


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(4))
def test_every_placer_on_a_fused_graph_places_the_original(method, seed):
    graph = graphs.random_dag(seed, 30, edge_prob=0.12, group_prob=0.3, persistent_prob=0.2)
    cluster = graphs.cluster(3, memory_bytes=256 << 20)
    options = PlacementOptions(placement_method=method, placer_type="fusion", grouper="coplace", refine_seconds=0.05)
    result = place(graph, cluster, options)
    assert result.placement.device_of.shape == (graph.num_ops,)
    assert_valid_schedule(graph, cluster, result.groups, result.schedule)
