import numpy as np
import pytest

import graphs
from baechi_tf.errors import InvalidGraphError
from baechi_tf.graph import CONTROL, OpGraph
from baechi_tf.graph_builder import OpGraphBuilder


def test_builder_arrays_and_tensors():
    b = OpGraphBuilder()
    b.add_op("a", 10, [100, 200])
    b.add_op("b", 5, [8])
    b.add_op("c", 1)
    b.add_edge("a", "b", 1)
    b.add_edge("a", "c", 1)  # same tensor a:1, second consumer
    b.add_edge("a", "c", 0)
    b.add_control_edge("b", "c")
    g = b.build()
    assert g.num_ops == 3 and g.num_edges == 4
    assert g.edge_bytes.tolist() == [200, 200, 100, 0]
    assert g.is_control.tolist() == [False, False, False, True]
    # a:1 is one tensor read twice; a:0 another; ^b a control message.
    assert g.edge_tensor.tolist() == [0, 0, 1, 2]
    assert g.tensor_bytes.tolist() == [200, 100, 0]
    assert g.tensor_src_output.tolist() == [1, 0, CONTROL]
    assert g.tensor_consumers == ((1, 2), (2,), (2,))
    assert g.input_tensors == ((), (0,), (0, 1, 2))
    assert g.output_tensors == ((0, 1), (2,), ())
    assert g.successors == ((1, 2), (2,), ())
    ptr, ids = g.successor_rows
    assert ptr.tolist() == [0, 2, 3, 3] and ids.tolist() == [1, 2, 2] and not ids.flags.writeable
    assert g.predecessors == ((), (0,), (0, 1))
    assert g.output_total_bytes.tolist() == [300, 8, 0]
    assert g.topo_order.tolist() == [0, 1, 2]


def test_repeated_edge_is_kept_once():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_op("b", 1)
    b.add_edge("a", "b")
    b.add_edge("a", "b")
    assert b.build().num_edges == 1


def test_edges_by_id_keep_their_order_and_drop_repeats_as_by_name():
    by_name, by_id = OpGraphBuilder(), OpGraphBuilder()
    for b in (by_name, by_id):
        b.add_op("a", 1, [4, 8])
        b.add_op("b", 1)
        b.add_op("c", 1)
    for s, d, o in (("a", "c", 1), ("a", "b", 0), ("a", "c", 1), ("b", "c", CONTROL)):
        (by_name.add_control_edge(s, d) if o == CONTROL else by_name.add_edge(s, d, o))
    ids = by_id.ids
    assert dict(ids) == {"a": 0, "b": 1, "c": 2}
    by_id.add_edges_by_id([0, 0, 0, 1], [2, 1, 2, 2], [1, 0, 1, CONTROL])
    one, two = by_name.build(), by_id.build()
    assert one.edge_src.tolist() == two.edge_src.tolist() == [0, 0, 1]
    assert one.edge_dst.tolist() == two.edge_dst.tolist() == [2, 1, 2]
    assert one.edge_src_output.tolist() == two.edge_src_output.tolist() == [1, 0, CONTROL]
    with pytest.raises(TypeError):
        ids["d"] = 3  # the builder's own table is not exposed for writing


def test_edges_by_id_are_checked_with_the_ops_names():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_op("b", 1)
    with pytest.raises(InvalidGraphError, match="2 sources, 1 destinations"):
        b.add_edges_by_id([0, 0], [1], [0, 0])
    b.add_edges_by_id([0], [1], [3])
    with pytest.raises(InvalidGraphError, match=r"reads output 3 of 'a', which has 1 output"):
        b.build()
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_edges_by_id([0], [5], [0])
    with pytest.raises(InvalidGraphError, match="destination op id 5"):
        b.build()


def test_arrays_are_read_only():
    g = graphs.chain()
    with pytest.raises(ValueError):
        g.compute_us[0] = 5.0


def test_topo_order_breaks_ties_by_id():
    g = graphs.independent(5)
    assert g.topo_order.tolist() == [0, 1, 2, 3, 4]
    assert g.topo_index.tolist() == [0, 1, 2, 3, 4]


def test_topo_order_puts_an_op_with_control_inputs_alone_first_of_the_ready_ops():
    # a -> b -> d, a -> c (data); k, the last op, has a control input from a alone: it is ready
    # with b and c and comes before them, as TF runs a constant once its control inputs are done.
    # s, with no inputs at all, keeps its place by id.
    b = OpGraphBuilder()
    for name in "abcdks":
        b.add_op(name, 1, [4])
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    b.add_edge("b", "d")
    b.add_control_edge("a", "k")
    g = b.build()
    assert [g.names[i] for i in g.topo_order] == ["a", "k", "b", "c", "d", "s"]
    # Reading a tensor puts it back among the others, by id.
    b.add_edge("c", "k")
    g = b.build()
    assert [g.names[i] for i in g.topo_order] == ["a", "b", "c", "d", "k", "s"]


def test_cycle_names_its_ops():
    b = OpGraphBuilder()
    for n in "xabc":
        b.add_op(n, 1, [4])
    b.add_edge("x", "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", "a")
    with pytest.raises(InvalidGraphError, match=r"cycle: 'a' -> 'b' -> 'c' -> 'a'"):
        b.build()


def test_dangling_edge_by_name():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    with pytest.raises(InvalidGraphError, match=r"names op 'zz', which is not in the graph"):
        b.add_edge("a", "zz")


def test_dangling_edge_by_index():
    with pytest.raises(InvalidGraphError, match="dangling edge"):
        OpGraph.from_arrays(["a"], [1.0], [[4]], edge_src=[0], edge_dst=[3], edge_src_output=[0])


def test_missing_output_slot():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_op("b", 1)
    b.add_edge("a", "b", 2)
    with pytest.raises(InvalidGraphError, match="reads output 2 of 'a', which has 1 output; give 'a' a size for output 2 \\(output_bytes\\), or make the edge a control edge"):
        b.build()


@pytest.mark.parametrize("cost", [-1.0, float("nan"), float("inf")])
def test_bad_compute_cost(cost):
    b = OpGraphBuilder()
    b.add_op("a", cost, [4])
    with pytest.raises(InvalidGraphError, match="op 'a' has compute_us=.*finite and >= 0"):
        b.build()


def test_compute_just_past_the_limit_reads_as_past_it():
    # Printed with 3 digits, 1.0000001e15 us read "1e+15 us, more than the 1e15 us".
    b = OpGraphBuilder()
    b.add_op("a", 5e14, [4])
    b.add_op("b", 5.000001e14, [4])
    with pytest.raises(InvalidGraphError, match=r"add up to 1\.0000001e\+15 us, more than the 1e15 us"):
        b.build()


def test_negative_memory():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4], temp_bytes=-3)
    with pytest.raises(InvalidGraphError, match="temp_bytes=-3"):
        b.build()
    b = OpGraphBuilder()
    b.add_op("a", 1, [-4])
    with pytest.raises(InvalidGraphError, match="output_bytes=\\[-4\\]"):
        b.build()


def test_duplicate_names():
    b = OpGraphBuilder()
    b.add_op("a", 1)
    with pytest.raises(InvalidGraphError, match="'a' is used by two ops"):
        b.add_op("a", 1)
    with pytest.raises(InvalidGraphError, match="'a' is used by two ops"):
        OpGraph.from_arrays(["a", "a"], [1, 1], [[], []])


def test_self_loop():
    with pytest.raises(InvalidGraphError, match="edge to itself"):
        OpGraph.from_arrays(["a"], [1.0], [[4]], edge_src=[0], edge_dst=[0], edge_src_output=[0])


@pytest.mark.slow
def test_long_chain_has_no_recursion_limit():
    n = 50_000
    g = OpGraph.from_arrays(
        [f"o{i}" for i in range(n)],
        np.ones(n),
        [[4]] * n,
        edge_src=np.arange(n - 1),
        edge_dst=np.arange(1, n),
        edge_src_output=np.zeros(n - 1),
    )
    assert g.topo_order[-1] == n - 1


def test_from_arrays_keeps_a_repeated_edge_once():
    # y = x + x: two edges of the same tensor. Kept once (as the builder does), so a placement
    # that puts x and y apart pays one transfer, not a phantom second one.
    from baechi_tf.cluster import Cluster, CommCost
    from baechi_tf.placer import Placement, simulate

    g = OpGraph.from_arrays(
        names=["x", "y", "z"], compute_us=[100, 100, 10], output_bytes=[[1 << 20], [4], [4]],
        edge_src=[0, 0, 1, 0], edge_dst=[1, 1, 2, 2], edge_src_output=[0, 0, 0, -1],
    )
    assert list(zip(g.edge_src.tolist(), g.edge_dst.tolist(), g.edge_src_output.tolist())) == [
        (0, 1, 0), (1, 2, 0), (0, 2, -1)
    ]
    cluster = Cluster.homogeneous(2, 1 << 30, comm=CommCost(0.001, 100))
    s = simulate(g, cluster, Placement(np.array([0, 1, 1]), "test"))
    assert [t.tensor for t in s.transfers].count(0) == 1  # x's output (the control message aside)
    assert s.start_us[1] == pytest.approx(100 + 100 + 0.001 * (1 << 20))


@pytest.mark.parametrize("seed", range(8))
def test_tensors_are_numbered_by_their_first_edge(seed):
    """One tensor per distinct (source, output slot), control messages included, numbered in the
    order of their first edges: the numbering a dict filled edge by edge gives."""
    graph = graphs.random_dag(seed, 40, edge_prob=0.2)
    ids: dict[tuple[int, int], int] = {}
    expected = [ids.setdefault((s, o), len(ids))
                for s, o in zip(graph.edge_src.tolist(), graph.edge_src_output.tolist())]
    assert graph.edge_tensor.tolist() == expected
    assert [(int(s), int(o)) for s, o in zip(graph.tensor_src, graph.tensor_src_output)] == list(ids)
    assert graph.edge_tensor.dtype == graph.tensor_src.dtype == np.int32


def test_a_graph_without_edges_has_no_tensors():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    graph = b.build()
    assert graph.num_tensors == 0 and graph.edge_tensor.size == 0
