"""Outputs that reuse a buffer (`OpGraph.output_alias`) in the scheduler's memory model, both
engines: hand-drawn graphs with their peaks worked out by hand, the memory timeline's blocks, and
the import from a profile.

Model (`buffers.buffer_tables`): an output that is its input's buffer allocates nothing on
its op's device; that buffer is freed when the last reader of either is done. A view of persistent
memory (HELD) allocates nothing. A copy to another device is a buffer of its own. A sink's outputs
and an output larger than the input it names are buffers of their own.
"""

import numpy as np
import pytest

import graphs
from baechi_tf.errors import InvalidGraphError
from baechi_tf.graph import HELD, VIEW_OP_TYPES
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import Placement, engine, simulate
from baechi_tf.placer import buffers
from baechi_tf.placer.buffers import HELD_VIEW, OWN, buffer_tables, free_at_end_bytes, always_reused_tensors
from baechi_tf.placer.memory_timeline import memory_blocks, memory_timeline

MiB = graphs.MiB
ENGINES = ["python"] + (["native"] if engine.native_available() else [])


def _peaks(graph, devices, nd=None):
    cluster = graphs.cluster(nd or max(devices) + 1)
    schedule = simulate(graph, cluster, Placement(np.asarray(devices, dtype=np.int32), "given"))
    timeline = tuple(m.peak_bytes for m in memory_timeline(graph, cluster, schedule))
    assert timeline == schedule.peak_memory_bytes
    return schedule.peak_memory_bytes, schedule


def _view_chain(alias=True, sink_alias=False):
    """a (1 MiB) -> i (its view, 10 us) -> c (100 us, 4 bytes out) -> s (sink, view of c's)

    a -> d (10 us, 2 MiB out, read by c)
    """
    b = OpGraphBuilder()
    b.add_op("a", 10, [MiB])
    b.add_op("i", 10, [MiB], output_alias=[("a", 0)] if alias else [])
    b.add_op("d", 10, [2 * MiB])
    b.add_op("c", 100, [4])
    b.add_op("s", 1, [4], output_alias=[("c", 0)] if sink_alias else [])
    for src, dst in [("a", "i"), ("a", "d"), ("i", "c"), ("d", "c"), ("c", "s")]:
        b.add_edge(src, dst)
    return b.build()


@pytest.mark.parametrize("name", ENGINES)
def test_a_view_allocates_nothing_and_holds_its_input_until_its_readers_are_done(name):
    with engine.selected(name):
        # Own buffers: a, i and d live together at d (4 MiB), then c's 4 bytes join i and d.
        (own,), _ = _peaks(_view_chain(alias=False), [0] * 5)
        assert own == 4 * MiB
        (peak,), schedule = _peaks(_view_chain(), [0] * 5)
        assert peak == 3 * MiB + 4  # a's buffer, read through i by c, with d's and c's output
    blocks = memory_blocks(_view_chain(), schedule)
    kinds = {(int(o), k): (float(a), float(f)) for o, k, a, f in zip(blocks.op, blocks.kind, blocks.alloc_us, blocks.free_us)}
    assert (1, "output") not in kinds  # i has no block of its own
    assert kinds[(0, "output")] == (0.0, float(schedule.end_us[3]))  # a's lives until c is done


@pytest.mark.parametrize("name", ENGINES)
def test_a_view_on_another_device_reuses_the_copy_it_receives(name):
    with engine.selected(name):
        # i on device 1 receives a copy of a (1 MiB) and is a view of that copy, which c then
        # reads through i: the copy, d's copy and c's output. a stays on device 0 with d.
        peaks, schedule = _peaks(_view_chain(), [0, 1, 0, 1, 1])
        assert peaks == (3 * MiB, 3 * MiB + 4)
        # Own buffers: the copy goes after i, whose own 1 MiB c reads instead.
        peaks_own, schedule_own = _peaks(_view_chain(alias=False), [0, 1, 0, 1, 1])
        assert peaks_own == (3 * MiB, 3 * MiB + 4)
    for s, graph, freed_after in ((schedule, _view_chain(), 3), (schedule_own, _view_chain(alias=False), 1)):
        blocks = memory_blocks(graph, s)
        copy = [i for i, (o, k) in enumerate(zip(blocks.op, blocks.kind)) if o == 0 and k == "received"]
        assert len(copy) == 1 and blocks.free_us[copy[0]] == s.end_us[freed_after]
        assert blocks.nbytes[copy[0]] == MiB


@pytest.mark.parametrize("name", ENGINES)
def test_a_view_of_persistent_memory_allocates_nothing_here_and_a_copy_there(name):
    b = OpGraphBuilder()
    b.add_op("v", 1, [8], persistent_bytes=4 * MiB)  # a variable's handle
    b.add_op("r", 1, [4 * MiB], output_alias=[HELD])  # its value
    b.add_op("m", 10, [MiB])
    for src, dst in [("v", "r"), ("r", "m")]:
        b.add_edge(src, dst)
    graph = b.build()
    with engine.selected(name):
        assert _peaks(graph, [0, 0, 0])[0] == (5 * MiB,)  # the handle is freed before m runs
        assert _peaks(graph, [0, 0, 1])[0] == (4 * MiB + 8, 5 * MiB)


def test_a_sinks_outputs_and_an_output_larger_than_its_input_have_buffers_of_their_own():
    chain = _view_chain(sink_alias=True)
    own, alias, reused = buffer_tables(chain)
    assert own.tolist() == [MiB, 0, 2 * MiB, 4, 4]  # s is a sink: kept, its own
    assert reused == {(1, 0)}
    tensor_of = {int(s): t for t, s in enumerate(chain.tensor_src.tolist())}
    assert alias[tensor_of[1]] == tensor_of[0]
    assert [alias[tensor_of[op]] for op in (0, 2, 3)] == [OWN] * 3
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_op("big", 1, [8], output_alias=[("a", 0)])
    b.add_op("v", 1, [8])
    b.add_op("r", 1, [8], output_alias=[HELD])
    b.add_op("z", 1, [])
    for src, dst in [("a", "big"), ("big", "z"), ("v", "r"), ("r", "z")]:
        b.add_edge(src, dst)
    graph = b.build()
    own, alias, reused = buffer_tables(graph)
    assert own.tolist() == [4, 8, 8, 0, 0] and reused == {(3, 0)}
    t_r = next(t for t, s in enumerate(graph.tensor_src.tolist()) if s == 3)
    assert alias[t_r] == HELD_VIEW and (alias == OWN).sum() == graph.num_tensors - 1
    # An unread view frees nothing at its op's end; an unread own output does.
    b = OpGraphBuilder()
    b.add_op("a", 1, [MiB])
    b.add_op("i", 1, [MiB, 2 * MiB], output_alias=[("a", 0), None])
    b.add_op("z", 1, [])
    b.add_edge("a", "i")
    b.add_control_edge("i", "z")
    assert free_at_end_bytes(b.build()) == [0, 2 * MiB, 0]


@pytest.mark.parametrize("name", ENGINES)
def test_a_chain_of_views_is_one_buffer(name):
    """a -> i1 -> i2 -> i3 (views) -> c; a's 1 MiB is the only buffer until c."""
    b = OpGraphBuilder()
    b.add_op("a", 1, [MiB])
    prev = "a"
    for k in (1, 2, 3):
        b.add_op(f"i{k}", 1, [MiB], output_alias=[(prev, 0)])
        b.add_edge(prev, f"i{k}")
        prev = f"i{k}"
    b.add_op("c", 5, [4])
    b.add_edge(prev, "c")
    with engine.selected(name):
        assert _peaks(b.build(), [0] * 5)[0] == (MiB + 4,)
        assert _peaks(b.build(), [0, 0, 1, 1, 1])[0] == (MiB, MiB + 4)


def test_an_output_can_reuse_only_a_data_inputs_buffer():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_op("b", 1, [4])
    b.add_op("i", 1, [4], output_alias=[("b", 0)])
    b.add_edge("a", "i")
    b.add_control_edge("b", "i")
    with pytest.raises(InvalidGraphError, match="output 0 of op 'i' reuses the buffer of output 0 of op 1, which it does not read"):
        b.build()
    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    b.add_op("i", 1, [4, 4], output_alias=[("a", 0)])
    b.add_edge("a", "i")
    with pytest.raises(InvalidGraphError, match="op 'i' has 2 outputs but 1 entries in output_alias"):
        b.build()


@pytest.mark.parametrize("name", ENGINES)
def test_timeline_peak_is_the_schedule_peak_with_views(name):
    """Random DAGs with views, spread at random: the timeline's blocks give the scheduler's peak.
    With outputs all of one size, views never raise a peak above the same schedule's without
    them: a view's buffer is held from its input's allocation to the later of the two frees, which
    both buffers cover. (A smaller view of a larger buffer can: it holds the larger one.)"""
    import dataclasses
    import random

    lower = 0
    for seed in range(60):
        rng = random.Random(seed)
        base = graphs.random_dag(seed, rng.randint(2, 40))
        base = dataclasses.replace(base, output_bytes=tuple((MiB,) * len(o) for o in base.output_bytes))
        graph = graphs.with_aliases(base, random.Random(seed + 1), 0.6)
        nd = rng.randint(1, 4)
        devices = np.asarray([rng.randrange(nd) for _ in range(graph.num_ops)], dtype=np.int32)
        cluster = graphs.cluster(nd)
        with engine.selected(name):
            schedule = simulate(graph, cluster, Placement(devices, "given"))
            own = simulate(base, cluster, Placement(devices, "given"))
        timeline = tuple(m.peak_bytes for m in memory_timeline(graph, cluster, schedule))
        assert timeline == schedule.peak_memory_bytes, seed
        if schedule.start_us.tobytes() == own.start_us.tobytes():  # the same schedule
            assert all(a <= b for a, b in zip(schedule.peak_memory_bytes, own.peak_memory_bytes)), seed
            lower += schedule.peak_memory_bytes != own.peak_memory_bytes
    assert lower >= 10


def _always_reused(build) -> dict[str, bool]:
    """`always_reused_tensors` of the graph `build` adds ops to, by the name of each output's op."""
    b = OpGraphBuilder()
    build(b)
    graph = b.build()
    _, alias, _ = buffer_tables(graph)
    flags = always_reused_tensors(graph, alias)
    return {graph.names[int(graph.tensor_src[t])]: bool(flags[t]) for t in np.flatnonzero(alias >= 0)}


def test_an_output_is_its_buffers_always_reused_where_every_other_reader_is_its_ancestor():
    """a -> w (in place of a); other readers of a's buffer: none, one w depends on, one it does not."""
    def alone(b):
        b.add_op("a", 1, [MiB])
        b.add_op("w", 1, [MiB], output_alias=[("a", 0)])
        b.add_op("z", 1, [])
        b.add_edge("a", "w")
        b.add_edge("w", "z")

    def with_reader(before: bool):
        def build(b):
            alone(b)
            b.add_op("r", 1, [4])
            b.add_op("q", 1, [4])
            b.add_edge("a", "r")
            b.add_edge("r", "q")
            if before:
                b.add_control_edge("q", "w")  # r runs before w through q
        return build

    assert _always_reused(alone) == {"w": True}
    assert _always_reused(with_reader(True)) == {"w": True}
    assert _always_reused(with_reader(False)) == {"w": False}


def test_the_buffers_other_tensors_hold_it_too_and_a_variables_value_is_never_free():
    """a -> v (a view of a) -> w (in place of v): a reader of a or of v that w does not depend on
    holds the buffer; a variable's value (HELD) is held by the variable."""
    def chain(extra: str):
        def build(b):
            b.add_op("a", 1, [MiB], output_alias=[HELD] if extra == "held" else [None])
            b.add_op("v", 1, [MiB], output_alias=[("a", 0)])
            b.add_op("w", 1, [MiB], output_alias=[("v", 0)])
            b.add_op("z", 1, [])
            for src, dst in [("a", "v"), ("v", "w"), ("w", "z")]:
                b.add_edge(src, dst)
            if extra in ("a", "v"):
                b.add_op("r", 1, [])
                b.add_edge(extra, "r")
        return build

    assert _always_reused(chain("")) == {"v": True, "w": True}
    # r holds a's buffer: neither v nor w is the last holder in every order.
    assert _always_reused(chain("a")) == {"v": False, "w": False}
    assert _always_reused(chain("v")) == {"v": True, "w": False}
    flags = _always_reused(chain("held"))
    assert flags == {"v": False, "w": False}


def test_the_ancestor_search_gives_up_past_its_limit(monkeypatch):
    """r -> c1 -> ... -> c20 ~> w: r is w's ancestor 20 ops up; a search of 8 ops leaves it open."""
    def build(b):
        b.add_op("a", 1, [MiB])
        b.add_op("w", 1, [MiB], output_alias=[("a", 0)])
        b.add_op("r", 1, [4])
        b.add_edge("a", "w")
        b.add_edge("a", "r")
        prev = "r"
        for i in range(20):
            b.add_op(f"c{i}", 1, [4])
            b.add_edge(prev, f"c{i}")
            prev = f"c{i}"
        b.add_control_edge(prev, "w")
        b.add_op("z", 1, [])
        b.add_edge("w", "z")

    assert _always_reused(build) == {"w": True}
    monkeypatch.setattr(buffers, "ANCESTOR_SEARCH_LIMIT", 8)
    assert _always_reused(build) == {"w": False}


@pytest.mark.parametrize("op_type", ["SplitV", "Mul", ""])
def test_a_views_outputs_reuse_the_buffer_whatever_else_holds_it(op_type):
    """a -> s (two outputs, each a part of a's buffer) -> r0, r1: each output's reader holds the
    buffer the other output is a part of. A view (`VIEW_OP_TYPES`) shares it all the same; an op
    of another type, or of none given, would write in place only as its last holder."""
    def build(b):
        b.add_op("a", 1, [MiB])
        b.add_op("s", 1, [MiB // 2, MiB // 2], op_type=op_type, output_alias=[("a", 0), ("a", 0)])
        for k in range(2):
            b.add_op(f"r{k}", 1, [])
            b.add_edge("s", f"r{k}", src_output=k)
        b.add_edge("a", "s")

    assert _always_reused(build) == {"s": op_type == "SplitV"}


def test_a_graphs_buffer_tables_are_made_once_and_read_only():
    g = _view_chain()
    tables = buffers.graph_buffers(g)
    assert buffers.graph_buffers(g) is tables
    own, alias, reused = buffer_tables(g)
    assert tables.own.tolist() == own.tolist() and tables.alias.tolist() == alias.tolist()
    assert tables.reused == reused
    assert tables.always_reused.tolist() == always_reused_tensors(g, alias).tolist()
    assert tables.fallback.tolist() == buffers.fallback_inputs(g, alias).tolist()
    assert tables.constant.tolist() == buffers.constant_tensors(g, alias).tolist()
    for array in (tables.own, tables.alias, tables.always_reused, tables.fallback, tables.constant):
        with pytest.raises(ValueError, match="read-only"):
            array[:1] = 0
    assert buffers.graph_buffers(_view_chain()) is not tables  # another graph, its own tables


def test_a_graphs_edge_tables_are_made_once_and_read_only():
    """`memory_blocks` reads what no schedule changes once per graph: each data edge's (tensor,
    reader) once, the outputs nothing reads, and the views."""
    from baechi_tf.placer import memory_timeline

    b = OpGraphBuilder()
    b.add_op("a", 10, [MiB], op_type="MatMul")
    b.add_op("i", 10, [MiB], output_alias=[("a", 0)], op_type="Identity")
    b.add_op("c", 10, [4, 8], op_type="Relu")
    b.add_op("k", 1, [4], op_type="NoOp")
    for src, dst in [("a", "i"), ("a", "c"), ("i", "c")]:
        b.add_edge(src, dst)
    b.add_control_edge("c", "k")
    g = b.build()
    edges = memory_timeline._edge_tables(g)
    assert memory_timeline._edge_tables(g) is edges
    data = g.edge_src_output >= 0
    pairs = sorted(set(zip(g.edge_tensor[data].tolist(), g.edge_dst[data].tolist())))
    assert list(zip(edges.t_of.tolist(), edges.reader.tolist())) == pairs
    assert edges.read.tolist() == [t in {p[0] for p in pairs} for t in range(g.num_tensors)]
    assert edges.view.tolist() == [False, "Identity" in VIEW_OP_TYPES, False, False]
    # c's two outputs and k's are read by no data edge; c is no sink (k follows it), k is.
    assert [(int(o), int(s)) for o, s in zip(edges.unread_ops, edges.unread_slot_of)] == [(2, 0), (2, 1), (3, 0)]
    assert edges.unread_bytes.tolist() == [4, 8, 4] and edges.unread_sink.tolist() == [False, False, True]
    for array in edges:
        with pytest.raises(ValueError, match="read-only"):
            array[:1] = 0
