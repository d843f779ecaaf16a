import pytest

import graphs
from baechi_tf.errors import ConfigError, InvalidGraphError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer.grouping import colocation_groups, coplace, make_groups


def by_name(graph, groups):
    """{group name: sorted op names}"""
    out = {}
    for g, members in enumerate(groups.members):
        out[groups.names[g]] = sorted(graph.names[i] for i in members)
    return out


def test_tf_groups_merge_transitively_with_shortest_name():
    # op4 names group1 and group3, so op1, op3, op4 end in one group named 'group1'.
    b = OpGraphBuilder()
    b.add_op("op0", 1, colocation=["group0"])
    b.add_op("op1", 1, colocation=["group1"])
    b.add_op("op2", 1, colocation=["group2"])
    b.add_op("op3", 1, colocation=["group3"])
    b.add_op("op4", 1, colocation=["group1", "group3"])
    g = b.build()
    groups = colocation_groups(g)
    assert by_name(g, groups) == {
        "group0": ["op0"],
        "group1": ["op1", "op3", "op4"],
        "group2": ["op2"],
    }


def test_loc_names_an_op():
    g = graphs.colocated_pair()
    groups = colocation_groups(g)
    assert by_name(g, groups) == {"v": ["r", "v"], "s": ["s"]}


def test_groups_are_numbered_by_first_op():
    g = graphs.colocated_pair()
    assert colocation_groups(g).group_of.tolist() == [0, 0, 1]


def test_coplace_chain_collapses():
    g = graphs.chain(3)
    assert by_name(g, coplace(g)) == {"op0": ["op0", "op1", "op2"]}


def test_coplace_fan_in_joins_consumer_fan_out_does_not():
    #  a   b        x
    #   \ /        / \
    #    c        y   z
    b = OpGraphBuilder()
    for n in "abcxyz":
        b.add_op(n, 1, [4])
    b.add_edge("a", "c")
    b.add_edge("b", "c")
    b.add_edge("x", "y")
    b.add_edge("x", "z")
    g = b.build()
    assert by_name(g, coplace(g)) == {"a": ["a", "b", "c"], "x": ["x"], "y": ["y"], "z": ["z"]}


def test_coplace_control_edge_counts():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_op("b", 1, [4])
    b.add_control_edge("a", "b")
    g = b.build()
    assert by_name(g, coplace(g)) == {"a": ["a", "b"]}


def test_coplace_refuses_merge_that_closes_a_cycle():
    g = graphs.group_cycle()
    groups = coplace(g)
    got = by_name(g, groups)
    # a's only successor is c, but group {a, b} reaches c through d: merging would close
    # {a, b, c} -> d -> {a, b, c}. d and b have two successors each, so nothing else merges.
    assert got == {"a": ["a", "b"], "c": ["c"], "d": ["d"], "e": ["e"], "f": ["f"]}
    _assert_group_graph_acyclic(g, groups)


def _assert_group_graph_acyclic(g, groups):
    gb = OpGraphBuilder()
    for name in groups.names:
        gb.add_op(name)
    for s, d in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
        a, b = groups.group_of[s], groups.group_of[d]
        if a != b:
            gb.add_control_edge(groups.names[a], groups.names[b])
    gb.build()  # raises InvalidGraphError on a cycle


@pytest.mark.parametrize("seed", range(40))
def test_coplace_never_creates_a_cycle(seed):
    g = graphs.random_dag(seed, 30, edge_prob=0.12)
    groups = coplace(g)
    _assert_group_graph_acyclic(g, groups)
    # Deterministic.
    assert coplace(g).group_of.tolist() == groups.group_of.tolist()
    # Every op with one successor either joined it or was refused for a reason we can re-check.
    assert groups.num_groups <= g.num_ops


def test_coplace_keeps_a_cyclic_base_no_worse():
    # Forward f->g and their "gradients" dg->df colocated with them: the TF groups {f, df} and
    # {g, dg} form a cycle already. coplace may merge inside it but adds no new cycle.
    #   f -> g -> loss -> dg -> df -> out
    b = OpGraphBuilder()
    b.add_op("f", 1, [4], colocation=["f"])
    b.add_op("g", 1, [4], colocation=["g"])
    b.add_op("loss", 1, [4])
    b.add_op("dg", 1, [4], colocation=["g"])
    b.add_op("df", 1, [4], colocation=["f"])
    b.add_op("out", 1, [4])
    for s, d in [("f", "g"), ("g", "loss"), ("loss", "dg"), ("dg", "df"), ("df", "out")]:
        b.add_edge(s, d)
    g = b.build()
    groups = coplace(g)
    assert by_name(g, groups) == {"f": ["df", "dg", "f", "g", "loss", "out"]}


def test_conflicting_pins_in_a_group():
    b = OpGraphBuilder()
    b.add_op("v", 1, device="/device:GPU:0", colocation=["v"])
    b.add_op("r", 1, device="/device:GPU:1", colocation=["v"])
    with pytest.raises(InvalidGraphError, match="'v' and 'r' must be colocated .* pinned to"):
        colocation_groups(b.build())


def test_unknown_grouper():
    with pytest.raises(ConfigError, match="unknown grouper 'nope'"):
        make_groups(graphs.chain(), "nope")
