"""Reports (`baechi_tf.reports`) and the memory timeline they plot (`placer.memory_timeline`).

The timeline is recomputed from a finished schedule; its peak must be the scheduler's own
`Schedule.peak_memory_bytes` on every graph, including graphs where ops wait for memory and
graphs full of equal times. The files are checked against the schedule they report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from baechi_tf.cli import main as cli_main
from baechi_tf.cluster import CommCost
from baechi_tf.graph import OpGraph
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.json_io import load_graph_json
from baechi_tf.placer import Placement, simulate
from baechi_tf.placer.memory_timeline import (
    KEPT, ORDER_WINDOW, blocks_timeline, memory_blocks, memory_timeline, reordered_blocks, reordered_peaks,
)
from baechi_tf.placer.order_bounds import timed_bounds
from baechi_tf.placer.pipeline import PlacementOptions, place
from baechi_tf.reports import write_reports
from graphs import GiB, MiB, chain, cluster, diamond, fork_join, random_dag, too_big_for_one

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from layered import layered_graph  # noqa: E402

FORK_JOIN = os.path.join(ROOT, "examples", "fork_join.json")


def _peaks(graph, cluster_, schedule) -> tuple[int, ...]:
    return tuple(m.peak_bytes for m in memory_timeline(graph, cluster_, schedule))


def _memory_waits(graph, cluster_, schedule) -> int:
    """Ops that started later than their device and their inputs allowed: they waited for memory."""
    dev = schedule.placement.device_of
    arrival = {(t.tensor, t.dst_device): t.end_us for t in schedule.transfers}
    waits = 0
    for d in range(cluster_.num_devices):
        free = 0.0
        for op in schedule.device_ops(d).tolist():
            ready = free
            for e in graph.in_edges(op).tolist():
                p = int(graph.edge_src[e])
                ready = max(ready, schedule.end_us[p] if dev[p] == d else arrival[(int(graph.edge_tensor[e]), d)])
            waits += schedule.start_us[op] > ready + 1e-9
            free = schedule.end_us[op]
    return waits


def _points(mem) -> list[tuple[float, int]]:
    return [(round(t, 6), int(b)) for t, b in zip(mem.times_us.tolist(), mem.bytes.tolist())]


# ---------------------------------------------------------------- memory timeline, by hand


def test_timeline_of_a_chain_on_one_device():
    g = chain(3, compute_us=100.0, nbytes=MiB)  # op0 -> op1 -> op2, 1 MiB outputs
    c = cluster(1)
    s = simulate(g, c, Placement(np.zeros(3, np.int32), "hand"))
    (mem,) = memory_timeline(g, c, s)
    # op0's output lives until op1 ends, op1's until op2 ends, op2's (a sink) is kept.
    assert _points(mem) == [(0.0, MiB), (100.0, 2 * MiB), (200.0, 2 * MiB), (300.0, MiB)]
    assert mem.peak_bytes == s.peak_memory_bytes[0] == 2 * MiB


def test_timeline_of_a_transfer():
    g = chain(2, compute_us=100.0, nbytes=MiB)  # op0 on device 0 -> op1 on device 1
    c = cluster(2)
    s = simulate(g, c, Placement(np.array([0, 1], np.int32), "hand"))
    arrive = 100.0 + 0.0001754 * MiB + 134
    mem0, mem1 = memory_timeline(g, c, s)
    # The sender holds the tensor until the copy arrived (op1 starts then); the receiver holds
    # the copy while op1 runs, and op1's output after.
    assert _points(mem0) == [(0.0, MiB), (round(arrive, 6), 0)]
    assert _points(mem1) == [(0.0, 0), (round(arrive, 6), 2 * MiB), (round(arrive + 100, 6), MiB)]
    assert _peaks(g, c, s) == s.peak_memory_bytes == (MiB, 2 * MiB)
    # The blocks behind it: each tensor's with its output slot; the same timeline from them.
    blocks = memory_blocks(g, s)
    assert sorted(zip(blocks.kind, blocks.op.tolist(), blocks.slot.tolist(), blocks.device.tolist())) == [
        ("output", 0, 0, 0), ("output", 1, 0, 1), ("received", 0, 0, 1)]
    assert [_points(m) for m in blocks_timeline(blocks, 2)] == [_points(mem0), _points(mem1)]


def test_timeline_of_zero_time_ops_follows_the_commit_order():
    # Three 0 us ops at time 0: op1 holds op0's output and its own; the scheduler's peak is 2 MiB,
    # not the 3 MiB of every block of the instant at once.
    g = chain(3, compute_us=0.0, nbytes=MiB)
    c = cluster(1)
    s = simulate(g, c, Placement(np.zeros(3, np.int32), "hand"))
    (mem,) = memory_timeline(g, c, s)
    assert _points(mem) == [(0.0, 2 * MiB), (0.0, MiB)]
    assert s.peak_memory_bytes == (2 * MiB,)


def test_timeline_of_a_free_made_known_later_in_the_same_instant():
    """
    device 0:  p (1 us, 1 MiB) -> r (1 us, 2 MiB, no inputs)
                 \
    device 1:     q (1 us, reads p; free link)
    """
    b = OpGraphBuilder()
    b.add_op("p", 1, [MiB])
    b.add_op("r", 1, [2 * MiB])
    b.add_op("q", 1, [4])
    b.add_edge("p", "q")
    g = b.build()
    c = cluster(2, GiB, CommCost(0.0, 0.0))
    s = simulate(g, c, Placement(np.array([0, 0, 1], np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 1.0, 1.0] and g.names[s.order[1]] == "r"
    # r and q both start at 1 us; r is committed first, while p's output is still held for q, so
    # the scheduler counts 3 MiB on device 0. Ordering the instant by time alone (frees first)
    # would give 2 MiB: the scheduler is conservative at equal times, and the timeline says so.
    (mem0, _) = memory_timeline(g, c, s)
    assert _points(mem0) == [(0.0, MiB), (1.0, 3 * MiB), (1.0, 2 * MiB)]
    assert s.peak_memory_bytes[0] == 3 * MiB


def _wait_graph() -> OpGraph:
    """
    device 0:  long (1000 us) --\\
                                 y (10 us)
    device 1:  x (10 us, 60 MiB) /      z (10 us, 60 MiB, no inputs)
    """
    b = OpGraphBuilder()
    b.add_op("long", 1000, [4])
    b.add_op("x", 10, [60 * MiB])
    b.add_op("y", 10, [4])
    b.add_op("z", 10, [60 * MiB])
    b.add_edge("long", "y")
    b.add_edge("x", "y")
    return b.build()


def test_timeline_where_an_op_waits_for_memory():
    g = _wait_graph()
    c = cluster(2, 100 * MiB, CommCost(0.0, 100.0))
    s = simulate(g, c, Placement(np.array([0, 1, 0, 1], np.int32), "hand"))
    # x's 60 MiB stay on device 1 until y starts (1000 us), although the copy arrived at 110 us:
    # z, which needs 60 MiB more, waits until then.
    assert s.start_us.tolist() == [0.0, 0.0, 1000.0, 1000.0]
    assert _memory_waits(g, c, s) == 1
    mem0, mem1 = memory_timeline(g, c, s)
    assert _points(mem1) == [(0.0, 60 * MiB), (1000.0, 60 * MiB)]
    assert _points(mem0) == [(0.0, 4), (1000.0, 60 * MiB + 8), (1010.0, 4)]
    assert _peaks(g, c, s) == s.peak_memory_bytes == (60 * MiB + 8, 60 * MiB)


# ---------------------------------------------------------------- memory timeline, against the scheduler


@pytest.mark.parametrize(
    "name, graph, cluster_, method",
    [
        ("chain", chain(12), cluster(2), "m_etf"),
        ("chain/topo", chain(12), cluster(3), "m_topo"),
        ("fork-join", fork_join(8), cluster(3), "m_etf"),
        ("diamond", diamond(), cluster(2), "m_topo"),
        ("too big for one", *too_big_for_one(), "m_etf"),
        ("layered", layered_graph(400, seed=3), cluster(4, 64 * MiB), "m_etf"),
        ("fork_join.json", *load_graph_json(FORK_JOIN), "m_etf"),
    ],
)
def test_timeline_peak_is_the_schedule_peak(name, graph, cluster_, method):
    result = place(graph, cluster_, PlacementOptions(placement_method=method))
    assert _peaks(graph, cluster_, result.schedule) == result.schedule.peak_memory_bytes, name


def test_timeline_peak_is_the_schedule_peak_where_ops_wait_for_memory():
    # Random placements of random DAGs, simulated on devices shrunk below their unconstrained peak.
    checked = waited = 0
    for seed in range(120):
        g = random_dag(seed, 20, edge_prob=0.2, max_bytes=16 * MiB, persistent_prob=0.1)
        placement = Placement(np.random.default_rng(seed).integers(0, 3, g.num_ops), "random")
        roomy = simulate(g, cluster(3, GiB), placement)
        for fraction in (0.9, 0.8, 0.7, 0.6):
            c = cluster(3, int(max(roomy.peak_memory_bytes) * fraction))
            try:
                s = simulate(g, c, placement)
            except Exception:
                break
            checked += 1
            waited += _memory_waits(g, c, s) > 0
            assert _peaks(g, c, s) == s.peak_memory_bytes, (seed, fraction)
    assert checked >= 50 and waited >= 10, (checked, waited)


@pytest.mark.slow
def test_timeline_peak_is_the_schedule_peak_with_equal_times():
    # Integer and zero compute times and free or constant-time links make many events share an
    # instant; only the commit order then says what the scheduler counted.
    checked = 0
    for seed in range(40):
        g = random_dag(seed, 16, persistent_prob=0.2, max_bytes=8 * MiB, max_compute_us=3)
        g = OpGraph.from_arrays(
            g.names, np.round(g.compute_us) * (seed % 3 != 0), g.output_bytes, g.temp_bytes,
            g.persistent_bytes, edge_src=g.edge_src, edge_dst=g.edge_dst,
            edge_src_output=g.edge_src_output,
        )
        for comm in (CommCost(0.0, 0.0), CommCost(0.0, 5.0)):
            for memory in (GiB, 20 * MiB):
                for method in ("m_etf", "m_topo"):
                    c = cluster(3, memory, comm)
                    try:
                        result = place(g, c, PlacementOptions(placement_method=method))
                    except Exception:
                        continue
                    checked += 1
                    assert _peaks(g, c, result.schedule) == result.schedule.peak_memory_bytes, (
                        seed, comm, memory, method
                    )
    assert checked >= 150


# ---------------------------------------------------------------- ops out of the simulated order


def _two_ops(edge: bool) -> OpGraph:
    """a (100 us) and b (100 us) on one device, each with 1 MiB of scratch and 1 KiB of weights;
    b after a (a control edge) when `edge`."""
    b = OpGraphBuilder()
    for name in ("a", "b"):
        b.add_op(name, 100, [], temp_bytes=MiB, persistent_bytes=1024)
    if edge:
        b.add_control_edge("a", "b")
    return b.build()


def _two_pairs() -> OpGraph:
    """a -> ra and b -> rb (100 us each) on one device: a and b with 1 MiB of output and 1 KiB of
    weights, ra and rb sinks of 4 B. In the order a, ra, b, rb one of the outputs at a time."""
    b = OpGraphBuilder()
    for name in ("a", "ra", "b", "rb"):
        b.add_op(name, 100, [MiB if name in ("a", "b") else 4], persistent_bytes=1024 if name in ("a", "b") else 0)
    b.add_edge("a", "ra")
    b.add_edge("b", "rb")
    return b.build()


def test_an_op_may_run_a_place_away_from_the_simulated_order():
    g, c = _two_ops(edge=False), cluster(1)
    s = simulate(g, c, Placement(np.zeros(2, np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 100.0] and s.peak_memory_bytes == (2048 + MiB,)
    # With a window of 1, either op may run first: each one's scratch is held at some time from
    # the first start to the last end, while the op runs; the weights stay as they were.
    blocks = reordered_blocks(g, s, memory_blocks(g, s), 1)
    kinds = {(k, int(o)): (a, f, n) for k, o, a, f, n in
             zip(blocks.kind, blocks.op, blocks.alloc_us, blocks.free_us, blocks.at_once)}
    assert kinds == {("persistent", 0): (0.0, KEPT, 0), ("persistent", 1): (0.0, KEPT, 0),
                     ("temp", 0): (0.0, 200.0, 1), ("temp", 1): (0.0, 200.0, 1)}
    # A device that runs one op at a time holds one scratch at a time in any order; one that
    # runs two at once (a pool of threads it shares) may hold both.
    assert reordered_peaks(g, c, s, 1) == (2048 + MiB,)
    both = reordered_blocks(g, s, memory_blocks(g, s), 1, None, (2,))
    assert blocks_timeline(both, 1)[0].peak_bytes == 2048 + 2 * MiB
    # Outputs read later are held from the earliest start to the latest end of their readers: b's
    # output may be allocated while ra, which frees a's, has yet to run.
    g = _two_pairs()
    s = simulate(g, c, Placement(np.zeros(4, np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 100.0, 200.0, 300.0] and s.peak_memory_bytes == (2048 + MiB + 8,)
    assert reordered_peaks(g, c, s, 1) == (2048 + 2 * MiB + 8,)
    # A window of 0 is the schedule itself; the default window at least the schedule's peak.
    assert reordered_blocks(g, s, memory_blocks(g, s), 0).alloc_us.tolist() == memory_blocks(g, s).alloc_us.tolist()
    assert reordered_peaks(g, c, s, 0) == s.peak_memory_bytes
    assert ORDER_WINDOW >= 1 and reordered_peaks(g, c, s) == (2048 + 2 * MiB + 8,)
    with pytest.raises(ValueError, match="window must be at least 0, not -1"):
        reordered_blocks(g, s, memory_blocks(g, s), -1)
    with pytest.raises(ValueError, match="at_once must give each of the 1 devices at least 1, not \\[0\\]"):
        reordered_blocks(g, s, memory_blocks(g, s), 1, None, (0,))


def _held(g: OpGraph, blocks) -> dict:
    """(kind, op name, device) -> (alloc, free) of each block."""
    return {(k, g.names[o], int(d)): (a, f)
            for k, o, d, a, f in zip(blocks.kind, blocks.op, blocks.device, blocks.alloc_us, blocks.free_us)}


def test_an_op_never_runs_before_its_input_on_its_device():
    # b after a on the device: neither may move, whatever the window; a chain neither.
    g, c = _two_ops(edge=True), cluster(1)
    s = simulate(g, c, Placement(np.zeros(2, np.int32), "hand"))
    assert reordered_peaks(g, c, s, 8) == s.peak_memory_bytes == (2048 + MiB,)
    g = chain(6, compute_us=100.0, nbytes=MiB)
    s = simulate(g, c, Placement(np.zeros(6, np.int32), "hand"))
    assert reordered_peaks(g, c, s, 8) == s.peak_memory_bytes == (2 * MiB,)


def test_an_input_from_another_device_bounds_nothing():
    """
    device 0:  p (100 us, 1 MiB) -> q (100 us, 1 MiB, a sink); r (100 us, 1 MiB, no inputs)
    device 1:  x (10 us, 1 MiB) -> y on device 0 (100 us, 1 MiB, a sink)
    With a free link, device 0 runs p, q, r, y in turn (y is ready at 10 us, but has the highest
    topological index). y may start two places early, at p's end: its input came from device 1.
    q may not: it reads p. y's output, a sink's, is kept from its start on.
    """
    b = OpGraphBuilder()
    for name in ("p", "q", "r", "x", "y"):
        b.add_op(name, 10 if name == "x" else 100, [MiB])
    b.add_edge("p", "q")
    b.add_edge("x", "y")
    g = b.build()
    c = cluster(2, GiB, CommCost(0.0, 0.0))
    s = simulate(g, c, Placement(np.array([0, 0, 0, 1, 0], np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 100.0, 200.0, 0.0, 300.0]
    blocks = reordered_blocks(g, s, memory_blocks(g, s, c), 2)
    held = _held(g, blocks)
    assert held[("output", "y", 0)] == (100.0, KEPT)  # two places early: q's start
    assert held[("output", "q", 0)] == (100.0, KEPT)  # after p, its input
    assert held[("output", "p", 0)] == (0.0, 400.0)  # freed by q, which may end as late as y


def test_an_op_never_runs_before_its_devices_op_it_needs_through_another_device():
    """
    device 0:  a (100 us) -> x on device 1 (10 us) -> b (100 us, 1 MiB scratch); u1 and u2
               (100 us each, no edges) run between a and b
    b reads nothing of device 0, but it needs a through x: however wide the window, it may take
    no place before u1's, the place after a, nor start before x may be done, 10 us after a. With a
    on device 1 as well, b may take the first place of device 0, but still waits for a and x.
    """
    b = OpGraphBuilder()
    b.add_op("a", 100, [4])
    b.add_op("u1", 100, [4])
    b.add_op("u2", 100, [4])
    b.add_op("x", 10, [4])
    b.add_op("b", 100, [4], temp_bytes=MiB)
    b.add_edge("a", "x")
    b.add_edge("x", "b")
    g = b.build()
    c = cluster(2, GiB, CommCost(0.0, 0.0))
    s = simulate(g, c, Placement(np.array([0, 0, 0, 1, 0], np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 100.0, 200.0, 100.0, 300.0]
    for window in (3, 8, 64):
        assert _held(g, reordered_blocks(g, s, memory_blocks(g, s, c), window))[("temp", "b", 0)] == (110.0, 400.0)
    s = simulate(g, c, Placement(np.array([1, 0, 0, 1, 0], np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 0.0, 100.0, 100.0, 200.0]
    assert _held(g, reordered_blocks(g, s, memory_blocks(g, s, c), 1))[("temp", "b", 0)] == (110.0, 300.0)
    assert _held(g, reordered_blocks(g, s, memory_blocks(g, s, c), 0))[("temp", "b", 0)] == (200.0, 300.0)


def test_durations_carried_along_the_edges_bound_a_schedule_to_itself_and_a_chain_apart():
    """A schedule's own starts and ends, carried along its edges, stay as they are: every op
    starts after its inputs end. Looser bounds are pulled in along a chain: a (100 us) -> b
    (10 us) -> c (50 us), each free to start at 0 and end at 1000, give b a start of at least
    100 and an end of at most 950, c a start of at least 110, a an end of at most 940."""
    for seed in range(5):
        g = random_dag(seed, 40)
        s = simulate(g, cluster(3), Placement(np.random.default_rng(seed).integers(0, 3, g.num_ops), "random"))
        starts, ends = timed_bounds(g, s.start_us, s.end_us, s.end_us - s.start_us)
        assert starts.tolist() == s.start_us.tolist() and ends.tolist() == s.end_us.tolist()
    g = chain(3, nbytes=4)  # its own times do not matter: the durations are given
    starts, ends = timed_bounds(g, np.zeros(3), np.full(3, 1000.0), np.array([100.0, 10.0, 50.0]))
    assert starts.tolist() == [0.0, 100.0, 110.0]
    assert ends.tolist() == [940.0, 950.0, 1000.0]


def test_a_chain_moves_as_a_whole():
    """
    device 0:  u1, u2, then c1 -> c2 (100 us each; c2 with 1 MiB of scratch), by topological index
    c1 may run two places early, at u1's start, and c2 with it, one place after c1: at u1's end.
    A chain whose head cannot move does not move (test_an_op_never_runs_before_its_input...).
    """
    b = OpGraphBuilder()
    for name in ("u1", "u2", "c1", "c2"):
        b.add_op(name, 100, [4], temp_bytes=MiB if name == "c2" else 0)
    b.add_edge("c1", "c2")
    g = b.build()
    c = cluster(1)
    s = simulate(g, c, Placement(np.zeros(4, np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 100.0, 200.0, 300.0]
    held = _held(g, reordered_blocks(g, s, memory_blocks(g, s), 2))
    assert held[("temp", "c2", 0)] == (100.0, 400.0)
    assert held[("output", "c1", 0)] == (0.0, 400.0)  # read by c2, which may end as late as it does
    assert _held(g, reordered_blocks(g, s, memory_blocks(g, s), 1))[("temp", "c2", 0)] == (200.0, 400.0)


def test_a_received_copy_is_held_from_the_end_of_its_producer():
    """
    device 0:  x (10 us, 1 MiB), then z (10 us, 1 MiB); both read by y on device 1
    device 1:  busy (1000 us, 2 MiB scratch) -> y (100 us, 1 MiB, a sink)
    The copy of x holds the link from 10 to 60 us; z's, done at 20 us, waits for it and goes at
    60 us. y waits for busy. The scheduler counts both copies from y's start (1000 us); the
    reordered blocks from the earliest their producers may end, as TF, which sends a tensor when
    it is done and allocates the receiver's buffer then: 4 MiB on device 1 while busy runs. In
    the simulated order (window 0) z ends at 20 us; with a window, z may run first and end at 10.
    """
    b = OpGraphBuilder()
    b.add_op("x", 10, [MiB])
    b.add_op("z", 10, [MiB])
    b.add_op("busy", 1000, [4], temp_bytes=2 * MiB)
    b.add_op("y", 100, [MiB])
    for src in ("x", "z", "busy"):
        b.add_edge(src, "y")
    g = b.build()
    c = cluster(2, GiB, CommCost(0.0, 50.0))
    s = simulate(g, c, Placement(np.array([0, 0, 1, 1], np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 10.0, 0.0, 1000.0]
    assert sorted((g.names[g.tensor_src[t.tensor]], t.start_us) for t in s.transfers) == [("x", 10.0), ("z", 60.0)]
    given = memory_blocks(g, s, c)
    held = _held(g, given)
    assert held[("received", "x", 1)] == held[("received", "z", 1)] == (1000.0, 1100.0)
    for window in (0, 1, ORDER_WINDOW):
        blocks = reordered_blocks(g, s, given, window)
        held = _held(g, blocks)
        assert held[("received", "x", 1)] == (10.0, 1100.0), window
        assert held[("received", "z", 1)] == (20.0 if window == 0 else 10.0, 1100.0), window
    assert s.peak_memory_bytes[1] == 3 * MiB + 4
    assert reordered_peaks(g, c, s)[1] == 4 * MiB + 4


def test_an_op_is_not_held_back_past_an_idle_gap_of_its_device():
    """
    device 0:  a (100 us, 1 MiB scratch), idle, b (100 us, 1 MiB scratch, reads x)
    device 1:  x (300 us) -> b
    a ends before the device stands idle: nothing else was there to run, so it is not held back
    past the gap. b may take a's place in the order (the idle gap bounds nothing), but not run
    before x may be done, 300 us after x may start, at 0: its scratch is held from 300 us.
    """
    b = OpGraphBuilder()
    b.add_op("a", 100, [], temp_bytes=MiB)
    b.add_op("x", 300, [4])
    b.add_op("b", 100, [], temp_bytes=MiB)
    b.add_edge("x", "b")
    g = b.build()
    c = cluster(2, GiB, CommCost(0.0, 0.0))
    s = simulate(g, c, Placement(np.array([0, 1, 0], np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 0.0, 300.0]
    blocks = reordered_blocks(g, s, memory_blocks(g, s, c), 4)
    held = {(k, g.names[o]): (a, f) for k, o, a, f in zip(blocks.kind, blocks.op, blocks.alloc_us, blocks.free_us)}
    assert held[("temp", "a")] == (0.0, 100.0)
    assert held[("temp", "b")] == (300.0, 400.0)


def test_the_reordered_peak_grows_with_the_window():
    """On one device (no copies) from the schedule's own peak; on three, from the peak as TF holds
    the copies in the simulated order, which differs from the schedule's where a copy moves."""
    checked = moved = 0
    for seed in range(40):
        g = random_dag(seed, 24, edge_prob=0.15, max_bytes=16 * MiB, persistent_prob=0.1)
        c = cluster(3, GiB)
        alone = simulate(g, c, Placement(np.zeros(g.num_ops, np.int32), "single"))
        assert reordered_peaks(g, c, alone, 0) == alone.peak_memory_bytes, seed
        s = simulate(g, c, Placement(np.random.default_rng(seed).integers(0, 3, g.num_ops), "random"))
        peaks = [reordered_peaks(g, c, s, w) for w in (0, 1, 2, 4, 8, 64)]
        for lower, higher in zip(peaks, peaks[1:]):
            assert all(x <= y for x, y in zip(lower, higher)), (seed, peaks)
        checked += peaks[-1] != peaks[0]
        moved += peaks[0] != s.peak_memory_bytes
    assert checked >= 20 and moved >= 10, (checked, moved)


def test_scratch_is_counted_for_as_many_ops_as_run_at_once():
    """
    device 0:  six independent ops of 100 us, each with 4 MiB of scratch (as a convolution's
               gradient has on some CPUs), in turn
    Any of them may run in any of the first places with a window of 8, but a device runs one op at
    a time (two on a pool of two threads): one scratch is held at a time (two), not six.
    """
    import os

    from baechi_tf.placer.block_timeline import blocks_held_at
    from baechi_tf.placer.memory_timeline import running_at_once

    b = OpGraphBuilder()
    for i in range(6):
        b.add_op(f"g{i}", 100, [], temp_bytes=4 * MiB)
    g, c = b.build(), cluster(1)
    s = simulate(g, c, Placement(np.zeros(6, np.int32), "hand"))
    given = memory_blocks(g, s)
    for at_once, expected in ((1, 4 * MiB), (2, 8 * MiB), (6, 24 * MiB), (9, 24 * MiB)):
        blocks = reordered_blocks(g, s, given, 8, None, (at_once,))
        assert blocks_timeline(blocks, 1)[0].peak_bytes == expected, at_once
        # The blocks the timeline counts at the third op's start: as many ops' as run at once.
        counted = blocks_held_at(blocks, 0, float(s.start_us[2]))
        assert int(blocks.nbytes[counted].sum()) == expected and len(set(blocks.op[counted].tolist())) == min(at_once, 6)
    assert reordered_peaks(g, c, s) == (4 * MiB,)  # a GPU: one op at a time
    # Devices of one pool run as many ops at once as the process has threads, TF's default: the
    # CPUs it may run on.
    threads = len(os.sched_getaffinity(0))
    assert running_at_once((0, 0, 2)) == (threads, threads, 1)


def test_ops_that_run_at_once_bound_the_peak_from_the_schedule_to_every_block_held_throughout():
    """On random DAGs: the peak grows with how many ops may run at once, from at least the peak
    in the simulated order (window 0) to, with as many as there are ops, the peak with every
    block held over the whole span its op may run in."""
    import dataclasses

    below = 0
    for seed in range(40):
        g = random_dag(seed, 30, edge_prob=0.12, max_bytes=16 * MiB, persistent_prob=0.1)
        c = cluster(3, GiB)
        s = simulate(g, c, Placement(np.random.default_rng(seed).integers(0, 3, g.num_ops), "random"))
        given = memory_blocks(g, s, c)
        in_order = reordered_peaks(g, c, s, 0)
        for window in (1, 4, 8):
            peaks = [[t.peak_bytes for t in blocks_timeline(reordered_blocks(g, s, given, window, None, (k,) * 3), 3)]
                     for k in (1, 2, 4, g.num_ops)]
            for lower, higher in zip([list(in_order)] + peaks, peaks):
                assert all(x <= y for x, y in zip(lower, higher)), (seed, window, in_order, peaks)
            every = reordered_blocks(g, s, given, window, None, (g.num_ops,) * 3)
            assert peaks[-1] == [t.peak_bytes for t in blocks_timeline(dataclasses.replace(every, at_once=None), 3)]
            below += sum(x < y for x, y in zip(peaks[0], peaks[-1]))
    assert below >= 40, below


def test_a_sent_tensor_is_freed_on_its_producer_once_its_copy_is_done():
    """
    device 0:  x (10 us, 1 MiB), then v (100 us), then w (500 us, 2 MiB scratch), in a chain of
               control edges
    device 1:  busy (1000 us) -> y (100 us, reads x)
    x's copy is done at 60 us, before w starts, but the scheduler learns that x can go only when it commits y, at
    1000 us: it holds x on device 0 while w runs, 3 MiB. TF frees the sender's buffer once the
    copy is sent: 2 MiB. Had y been on device 0, x would be held until y ends there.
    """
    b = OpGraphBuilder()
    b.add_op("x", 10, [MiB])
    b.add_op("v", 100, [4])
    b.add_op("w", 500, [4], temp_bytes=2 * MiB)
    b.add_op("busy", 1000, [4])
    b.add_op("y", 100, [4])
    b.add_control_edge("x", "v")
    b.add_control_edge("v", "w")
    b.add_edge("x", "y")
    b.add_edge("busy", "y")
    g = b.build()
    c = cluster(2, GiB, CommCost(0.0, 50.0))
    s = simulate(g, c, Placement(np.array([0, 0, 0, 1, 1], np.int32), "hand"))
    assert s.start_us.tolist() == [0.0, 10.0, 110.0, 0.0, 1000.0]
    assert [(t.start_us, t.end_us) for t in s.transfers if t.dst_device == 1] == [(10.0, 60.0)]
    given = memory_blocks(g, s, c)
    columns = zip(given.kind, given.op, given.device, given.free_us, given.sent_free_us)
    x_home = [(float(f), float(sf)) for k, o, d, f, sf in columns if (k, int(o), int(d)) == ("output", 0, 0)]
    assert x_home == [(1000.0, 60.0)]
    assert s.peak_memory_bytes[0] == 3 * MiB + 4
    for window in (0, 1, ORDER_WINDOW):
        assert reordered_peaks(g, c, s, window)[0] == 2 * MiB + 4, window
    local = simulate(g, c, Placement(np.array([0, 0, 0, 1, 0], np.int32), "hand"))
    assert reordered_peaks(g, c, local)[0] >= 3 * MiB


def test_a_shared_pool_warns_of_the_peak_its_threads_may_reach(caplog):
    # The two pairs on the first of two CPU stand-ins of one process's pool: the pool may run a
    # and b at once on its threads, 2 MiB, where the simulated order holds one output at a time.
    from baechi_tf.cluster import Cluster, Device

    g = _two_pairs()
    c = Cluster(tuple(Device(f"/job:w/replica:0/task:0/device:CPU:{i}", MiB + MiB // 2, "CPU", shared_memory=True)
                      for i in range(2)), CommCost())
    options = PlacementOptions(placement_method="expert", expert={name: c.names[0] for name in g.names})
    with caplog.at_level("WARNING", logger="baechi_tf"):
        result = place(g, c, options)
    assert result.schedule.peak_memory_bytes[0] == 2048 + MiB + 8
    assert result.reordered_peak_bytes[0] == 2048 + 2 * MiB + 8
    assert "in an order of its own: as a shared pool of threads takes them, it peaks at 2.00 MiB on " in caplog.text


def test_the_placement_reports_the_reordered_peak_and_warns_above_memory(caplog):
    # Two outputs of 1 MiB fit a device of 1.5 MiB one after the other; in a window of another
    # order they are held at once, 2 MiB: the result says so, and a warning names the device.
    g = _two_pairs()
    c = cluster(1, MiB + MiB // 2)
    with caplog.at_level("WARNING", logger="baechi_tf"):
        result = place(g, c, PlacementOptions(placement_method="m_etf"))
    assert result.schedule.peak_memory_bytes == (2048 + MiB + 8,)
    assert result.reordered_peak_bytes == (2048 + 2 * MiB + 8,)
    assert "TensorFlow runs a device's ready ops in an order of its own: with each op up to 4 places" in caplog.text
    assert "2.00 MiB on /device:GPU:0 (of 1.50 MiB)" in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="baechi_tf"):
        result = place(g, cluster(1, 4 * MiB), PlacementOptions(placement_method="m_etf"))
    assert result.reordered_peak_bytes == (2048 + 2 * MiB + 8,)
    assert "order of its own" not in caplog.text
    # On a device that holds the whole graph no order can run out: placing leaves the peak to its
    # first use; where memory is tight it is the one the warning was judged by.
    assert result.reordered_peaks_known is None
    tight = place(g, c, PlacementOptions(placement_method="m_etf"))
    assert tight.reordered_peaks_known == tight.reordered_peak_bytes == (2048 + 2 * MiB + 8,)
    # Its time is a step of its own, beside the peak with no op held back.
    assert {"memory", "memory out of order"} <= set(tight.step_seconds)
    assert "memory out of order" not in result.step_seconds


# ---------------------------------------------------------------- the files


@pytest.fixture(scope="module")
def fork_join_reports(tmp_path_factory):
    graph, c = load_graph_json(FORK_JOIN)
    result = place(graph, c, PlacementOptions(placement_method="m_etf"))
    folder = str(tmp_path_factory.mktemp("reports"))
    return result, folder, write_reports(result, folder)


def _check_png(path: str, min_width: int, min_height: int) -> None:
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape[0] >= min_height and image.shape[1] >= min_width, image.shape
    colours = np.unique(image.reshape(-1, image.shape[2])[::7], axis=0)
    assert len(colours) > 8  # more than a blank canvas and a frame


@pytest.mark.slow
def test_reports_files(fork_join_reports):
    result, folder, paths = fork_join_reports
    nd = result.cluster.num_devices
    names = {"gantt.png", "trace.json", "summary.json"} | {f"memory_{d}.png" for d in range(nd)}
    assert {os.path.basename(p) for p in paths.values()} == names
    assert set(os.listdir(folder)) == names  # nothing else, no temporary file left
    _check_png(paths["gantt"], 1200, 300)
    for d in range(nd):
        _check_png(paths[f"memory_{d}"], 800, 300)


@pytest.mark.slow
def test_reports_are_deterministic(fork_join_reports, tmp_path):
    result, _, paths = fork_join_reports
    again = write_reports(result, str(tmp_path))
    for key, path in paths.items():
        if key != "summary":  # placement_seconds are in both, but the same here too
            with open(path, "rb") as a, open(again[key], "rb") as b:
                assert a.read() == b.read(), key



@pytest.mark.slow
def test_reports_of_fewer_devices_remove_the_earlier_reports_extra_files(tmp_path):
    # A report of 2 devices written over one of 4 left memory_2.png and memory_3.png behind.
    graph, c = load_graph_json(FORK_JOIN)
    four = place(graph, c, PlacementOptions(placement_method="m_etf"))
    assert c.num_devices == 4
    write_reports(four, str(tmp_path))
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "memory_9.png").write_text("mine too")  # not one of the report's
    two = place(graph, cluster(2), PlacementOptions(placement_method="m_etf"))
    paths = write_reports(two, str(tmp_path))
    names = {"gantt.png", "trace.json", "summary.json", "memory_0.png", "memory_1.png"}
    assert {os.path.basename(p) for p in paths.values()} == names
    assert set(os.listdir(tmp_path)) == names | {"notes.txt", "memory_9.png"}
    with open(paths["summary"]) as f:
        assert json.load(f)["files"] == sorted(names)


@pytest.mark.slow
def test_reports_written_over_keep_their_mode(tmp_path):
    # A report file made private (0600) became 0644 when the next report replaced it.
    graph, c = load_graph_json(FORK_JOIN)
    result = place(graph, c, PlacementOptions(placement_method="m_topo"))
    write_reports(result, str(tmp_path))
    (tmp_path / "trace.json").chmod(0o600)
    (tmp_path / "summary.json").chmod(0o640)
    write_reports(result, str(tmp_path))
    assert (tmp_path / "trace.json").stat().st_mode & 0o7777 == 0o600
    assert (tmp_path / "summary.json").stat().st_mode & 0o7777 == 0o640


@pytest.mark.slow
def test_reports_need_only_their_folder_writable(tmp_path):
    # The temporary folder was made beside the report folder: a writable folder in a parent the
    # user cannot write ended in a traceback after the placement.
    graph, c = load_graph_json(FORK_JOIN)
    result = place(graph, c, PlacementOptions(placement_method="m_topo"))
    parent = tmp_path / "locked"
    folder = parent / "reports"
    folder.mkdir(parents=True)
    if subprocess.run(["chattr", "+i", str(parent)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here to make a folder that root cannot write")
    try:
        with pytest.raises(OSError):
            (parent / "probe").write_text("")  # the parent is locked
        paths = write_reports(result, str(folder))
    finally:
        subprocess.run(["chattr", "-i", str(parent)], check=True)
    assert set(os.listdir(folder)) == {os.path.basename(p) for p in paths.values()}
    assert os.listdir(parent) == ["reports"]


def _trace(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    pids = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    return events, pids


def test_trace_matches_the_schedule(fork_join_reports):
    result, _, paths = fork_join_reports
    graph, c, s = result.graph, result.cluster, result.schedule
    events, pids = _trace(paths["trace"])
    pid = [pids[f"simulated {name}"] for name in c.names]
    assert len(set(pid)) == c.num_devices
    ops = [e for e in events if e.get("cat") == "op"]
    assert sorted(e["name"] for e in ops) == sorted(graph.names)  # every op, once
    dev = s.placement.device_of
    for e in ops:
        op = graph.op_id(e["name"])
        assert e["ph"] == "X" and e["tid"] == 0 and e["pid"] == pid[dev[op]]
        assert e["ts"] == s.start_us[op] and e["dur"] == pytest.approx(graph.compute_us[op])
        assert e["args"]["op"] == graph.names[op]
        assert e["args"]["output_bytes"] == list(graph.output_bytes[op])
    for what, device in (("send", "src_device"), ("receive", "dst_device")):
        got = sorted((e["pid"], e["ts"], round(e["ts"] + e.get("dur", 0.0), 6), e["args"]["bytes"])
                     for e in events if e.get("cat") == what)
        want = sorted((pid[getattr(t, device)], t.start_us, round(t.end_us, 6),
                       int(graph.tensor_bytes[t.tensor])) for t in s.transfers)
        assert len(got) == len(s.transfers) > 0
        assert got == want
        assert all(e["tid"] == 1 for e in events if e.get("cat") == what)
    for d in range(c.num_devices):
        counter = [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["pid"] == pid[d]]
        assert max(counter) == s.peak_memory_bytes[d]
        for tid in (0, 1):  # complete events of one thread never overlap (viewers nest them)
            spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                           if e["ph"] == "X" and e["pid"] == pid[d] and e["tid"] == tid)
            assert all(end <= nxt + 1e-6 for (_, end), (nxt, _) in zip(spans, spans[1:]))


def test_a_copy_that_takes_no_time_is_an_instant_on_its_channel(tmp_path):
    #   a (dev 0, 1 MB) ----> b (dev 1)      the copy of a's output holds both channels 100 us
    #   c (dev 0) - - - - -> d (dev 1)      control copy, 0 bytes: 0 us, at c's end, inside it
    # A copy of no duration books no channel time, so it fell inside the other copy, and the
    # trace's channel thread had a complete event inside another (a fuzzed place-json document).
    b = OpGraphBuilder()
    b.add_op("a", 10, [1_000_000], device="/device:GPU:0")
    b.add_op("c", 20, [4], device="/device:GPU:0")
    b.add_op("b", 10, [4], device="/device:GPU:1")
    b.add_op("d", 10, [4], device="/device:GPU:1")
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    b.add_control_edge("c", "d")
    c = cluster(2, comm=CommCost(0.0001, 0.0))
    result = place(b.build(), c, PlacementOptions(placement_method="m_etf"))
    s = result.schedule
    assert sorted((t.start_us, t.end_us) for t in s.transfers) == [(10.0, 110.0), (30.0, 30.0)]
    events, pids = _trace(write_reports(result, str(tmp_path))["trace"])
    copies = [e for e in events if e.get("cat") in ("send", "receive")]
    assert sorted((e["ph"], e["ts"], e.get("dur"), e["pid"], e["tid"]) for e in copies) == [
        ("X", 10.0, 100.0, 1, 1), ("X", 10.0, 100.0, 2, 1), ("i", 30.0, None, 1, 1), ("i", 30.0, None, 2, 1)]
    assert all(e["s"] == "t" for e in copies if e["ph"] == "i")
    assert {e["args"]["tensor"] for e in copies if e["ph"] == "i"} == {"^c"}


def test_summary_matches_the_result(fork_join_reports):
    result, _, paths = fork_join_reports
    with open(paths["summary"]) as f:
        summary = json.load(f)
    graph, c, s = result.graph, result.cluster, result.schedule
    assert summary["method"] == result.placement.method
    assert summary["makespan_us"] == result.makespan_us
    assert summary["lower_bound_us"] == result.lower_bound_us
    assert summary["single_device_makespan_us"] == result.single_device_makespan_us
    assert summary["placement_seconds"] == result.placement_seconds
    dev = s.placement.device_of
    for d, row in enumerate(summary["devices"]):
        assert row["name"] == c.names[d]
        assert row["ops"] == int((dev == d).sum())
        assert row["compute_us"] == pytest.approx(graph.compute_us[dev == d].sum())
        assert row["peak_memory_bytes"] == s.peak_memory_bytes[d]
        assert row["reordered_peak_bytes"] == reordered_peaks(graph, c, s)[d] >= s.peak_memory_bytes[d]
        assert row["capacity_bytes"] == c.devices[d].memory_bytes
    assert summary["num_transfers"] == len(s.transfers)
    assert summary["transfer_bytes"] == sum(int(graph.tensor_bytes[t.tensor]) for t in s.transfers)
    assert summary["critical_path"] == [graph.names[op] for op in s.critical_chain(graph, c)[0]]


@pytest.mark.slow
def test_reports_draw_names_with_dollar_signs_as_they_are(tmp_path):
    # matplotlib parses text with an even number of '$' as mathtext: an op named '$$' raised
    # ValueError (place-json --report_dir ended in a traceback after the placement), '$x$' was
    # drawn as a formula. Op names and types are text. (A job may not hold a '$': `Device`
    # refuses the names TF's runtime cannot parse.)
    from baechi_tf.cluster import Cluster, Device

    b = OpGraphBuilder()
    b.add_op("$$", 100, [4], op_type="$x$")
    b.add_op("b", 50, [4], op_type="$$")
    b.add_edge("$$", "b")
    g = b.build()
    c = Cluster(tuple(Device(f"/job:w/replica:0/task:0/device:GPU:{i}", GiB) for i in range(2)))
    result = place(g, c, PlacementOptions(placement_method="m_etf"))
    paths = write_reports(result, str(tmp_path))
    _check_png(paths["gantt"], 1200, 300)
    _check_png(paths["memory_0"], 800, 300)


@pytest.mark.slow
def test_reports_of_a_large_graph(tmp_path):
    graph = layered_graph(2000, seed=0)
    c = cluster(4, GiB)
    result = place(graph, c, PlacementOptions(placement_method="m_etf"))
    paths = write_reports(result, str(tmp_path))
    _check_png(paths["gantt"], 1200, 300)
    _check_png(paths["memory_0"], 800, 300)
    events, _ = _trace(paths["trace"])
    assert sum(e.get("cat") == "op" for e in events) == 2000


@pytest.mark.slow
def test_place_json_report_dir(tmp_path, capsys):
    out = tmp_path / "reports"
    assert cli_main(["place-json", FORK_JOIN, "--placement_method", "m_etf", "--report_dir", str(out)]) == 0
    assert "reports written to" in capsys.readouterr().out
    assert {"gantt.png", "trace.json", "summary.json", "memory_0.png"} <= set(os.listdir(out))


@pytest.mark.slow
def test_reports_import_neither_tensorflow_nor_pyplot(tmp_path):
    code = (
        "import sys\n"
        "from baechi_tf.json_io import load_graph_json\n"
        "from baechi_tf.placer.pipeline import PlacementOptions, place\n"
        "from baechi_tf.reports import write_reports\n"
        f"g, c = load_graph_json({FORK_JOIN!r})\n"
        f"write_reports(place(g, c, PlacementOptions('m_etf')), {str(tmp_path)!r})\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow'\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


# ---------------------------------------------------------------- TensorFlow ends


@pytest.mark.tf
def test_tensorflow_graph_and_step_stats(tmp_path):
    tf = pytest.importorskip("tensorflow")
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/device:CPU:0"):
            a = tf.compat.v1.placeholder(tf.float32, [64, 64], name="a")
            b = tf.linalg.matmul(a, a, name="b")
            c_ = tf.math.tanh(b, name="c")
    run_metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(
            c_,
            {a: np.ones((64, 64), np.float32)},
            options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
            run_metadata=run_metadata,
        )
    graph_def = graph.as_graph_def()
    ops = OpGraphBuilder()
    for name, us in (("a", 1), ("b", 50), ("c", 5)):
        ops.add_op(name, us, [16384])
    ops.add_edge("a", "b")
    ops.add_edge("b", "c")
    result = place(ops.build(), cluster(2), PlacementOptions(placement_method="m_etf"))
    step_stats = run_metadata.step_stats
    paths = write_reports(result, str(tmp_path), graph_def=graph_def, tf_step_stats=step_stats)

    events, pids = _trace(paths["trace"])
    tf_pids = {p for name, p in pids.items() if name.startswith("TensorFlow ")}
    assert len(tf_pids) == len(step_stats.dev_stats) > 0 and min(tf_pids) > 1000
    tf_events = [e for e in events if e.get("cat") == "tensorflow"]
    want = sorted(ns.node_name for dev in step_stats.dev_stats for ns in dev.node_stats)
    assert sorted(e["name"] for e in tf_events) == want
    assert "b" in want and min(e["ts"] for e in tf_events) == 0
    assert all(e["dur"] >= 0 and e["pid"] in tf_pids for e in tf_events)

    with open(paths["graph_pbtxt"]) as f:
        text = f.read()
    assert 'name: "b"' in text and 'device: "/device:CPU:0"' in text
    records = list(tf.compat.v1.train.summary_iterator(paths["graph_events"]))
    assert records[0].file_version == "brain.Event:2"
    written = tf.compat.v1.GraphDef.FromString(records[1].graph_def)
    assert written == graph_def


def test_device_labels_drop_a_task_that_every_device_shares():
    from baechi_tf.reports.gantt import _device_label

    # A session's devices all live in '/job:localhost/replica:0/task:0': the Gantt rows say only
    # 'CPU:1' (the whole name did not fit the margin); devices of several tasks keep theirs.
    assert _device_label("/job:localhost/replica:0/task:0/device:CPU:1", one_task=True) == "CPU:1"
    assert _device_label("/job:w/replica:0/task:1/device:GPU:0", one_task=False) == "w/r0/t1 GPU:0"
    assert _device_label("/device:GPU:2") == "GPU:2"


def _red_pixels(png: bytes) -> np.ndarray:
    """bool [height, width]: where the image is the red of the critical path and the capacity
    (#d62728, lighter where a thin line is smoothed; the palette's orange has more green)."""
    import io

    import matplotlib.image

    image = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    return (image[..., 0] > 0.6) & (image[..., 1] < 0.4) & (image[..., 2] < 0.4)


def test_the_summaries_say_what_refinement_gained_from_the_placement_auto_names():
    # auto(m_etf) said which placer won, not that refinement then moved groups (a placement
    # named auto(single) ran on two devices); neither summary gave the start's step time.
    import re

    from baechi_tf.report import summary_table
    from baechi_tf.reports import summary

    graph = random_dag(0, 40, edge_prob=0.08)
    c = cluster(3)
    result = place(graph, c, PlacementOptions(refine_seconds=0.5))
    stats = result.refine_stats
    start = re.fullmatch(r"auto\((.+)\)", result.placement.method).group(1)  # the placer that won
    assert stats.initial_makespan_us == result.candidates[start] > result.makespan_us
    before, after = stats.initial_makespan_us / 1e3, result.makespan_us / 1e3
    change = 100 * (after / before - 1)
    line = f"refinement             {before:.3f} -> {after:.3f} ms ({change:+.1f}%) in {stats.seconds:.1f} s"
    assert line in summary_table(result).splitlines()
    figures = summary(result)
    assert figures["refinement"] == {"initial_makespan_us": stats.initial_makespan_us, "seconds": stats.seconds}
    json.dumps(figures)
    # A method that does not refine says nothing of it.
    m_etf = place(graph, c, PlacementOptions(placement_method="m_etf"))
    assert m_etf.makespan_us == pytest.approx(result.candidates["m_etf"])
    assert "refinement" not in summary_table(m_etf) and summary(m_etf)["refinement"] is None
    # Nor does auto told not to refine; one that found nothing better says so.
    assert "refinement" not in summary_table(place(graph, c, PlacementOptions(refine_seconds=0)))
    stuck = place(chain(4), cluster(2), PlacementOptions(refine_seconds=0.2))
    assert re.search(r"^refinement +no gain in [0-9.]+ s$", summary_table(stuck), re.M), summary_table(stuck)


def test_the_critical_path_of_the_reports_accounts_for_the_whole_step(fork_join_reports):
    # Its copies that waited for a busy channel were counted from their producer's end: 5.7 ms
    # of this 15.9 ms step (m-ETF on the fork-join example) lay between the path's ops and
    # copies, unexplained. The trace marks the path's ops and copies, which now follow one
    # another from the step's start to its end.
    result, _, paths = fork_join_reports
    s = result.schedule
    with open(paths["trace"]) as f:
        events = json.load(f)["traceEvents"]
    marked = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events
        if e["ph"] == "X" and e["pid"] < 1000 and e["args"].get("critical_path") and e["cat"] != "send"
    )
    assert [e for e in events if e.get("cat") == "receive" and e["args"]["critical_path"]]  # copies too
    unexplained, reached = 0.0, 0.0
    for start, end in marked:
        unexplained += max(0.0, start - reached)
        reached = max(reached, end)
    assert reached == pytest.approx(s.makespan_us)
    assert unexplained == pytest.approx(0.0, abs=1e-6)
    # What the path through producers leaves out on this placement.
    ops = s.critical_path(result.graph, result.cluster)
    gaps = [s.start_us[b] - s.end_us[a] for a, b in zip(ops, ops[1:])]
    assert max(gaps) > 0.3 * s.makespan_us


def test_gantt_highlights_the_critical_path_across_the_step(fork_join_reports):
    from baechi_tf.reports.gantt import _gantt_png

    result, _, paths = fork_join_reports
    critical = result.schedule.critical_path(result.graph, result.cluster)
    assert len(critical) > 2
    with open(paths["gantt"], "rb") as f:
        red = _red_pixels(f.read())
    plain = _red_pixels(_gantt_png(result, []))  # no path: only the legend's patch is red
    assert red.sum() > 5 * plain.sum() > 0
    # The path runs from the step's start to its end: red over most of the time axis.
    assert red.any(axis=0).mean() > 0.5 and plain.any(axis=0).mean() < 0.05


def test_memory_png_draws_the_capacity_as_a_line_above_the_curve(fork_join_reports):
    _, _, paths = fork_join_reports
    with open(paths["memory_0"], "rb") as f:
        red = _red_pixels(f.read())
    rows = red.sum(axis=1)
    line = int(np.argmax(rows))
    assert rows[line] > 0.4 * red.shape[1]  # dashed, across the plot
    assert rows[line + 3 :].sum() < 0.05 * rows[line]  # nothing red under it: the curve is not red


@pytest.mark.slow
def test_reports_are_written_all_at_once_or_not_at_all(tmp_path):
    # Files were written one by one into the folder: an error (or Ctrl-C) part way left some new
    # reports beside old ones.
    graph, c = fork_join(4, 3), cluster(2)
    result = place(graph, c, PlacementOptions(placement_method="m_etf"))
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "summary.json").write_text("old")
    with pytest.raises(Exception):
        write_reports(result, str(folder), graph_def=object())  # fails after the other reports
    assert [p.name for p in folder.iterdir()] == ["summary.json"]
    assert (folder / "summary.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]  # no temporary folder left
    paths = write_reports(result, str(folder))
    assert sorted(p.name for p in folder.iterdir()) == sorted(os.path.basename(p) for p in paths.values())
    assert json.loads((folder / "summary.json").read_text())["makespan_us"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]


def test_names_the_font_cannot_draw_give_no_warnings(tmp_path):
    # Each missing glyph of a name in CJK script was a matplotlib UserWarning on stderr.
    import warnings

    b = OpGraphBuilder()
    b.add_op("层一", 10, [4])
    b.add_op("层二", 10, [4])
    b.add_edge("层一", "层二")
    result = place(b.build(), cluster(2), PlacementOptions(placement_method="m_etf"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = write_reports(result, str(tmp_path))
    assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]
    assert os.path.getsize(paths["gantt"]) > 0


@pytest.mark.tf
def test_tensorflow_ops_that_ran_side_by_side_get_lanes_of_their_own():
    # TF runs a CPU device's independent ops at once on its threads, but its step stats give
    # every op thread_id 0: the real step's events overlapped on one trace thread (an op inside a
    # longer one, or starting inside it and ending after), which viewers draw as nesting or drop.
    pytest.importorskip("tensorflow")
    from tensorflow.core.framework import step_stats_pb2

    from baechi_tf.reports.trace import _tf_events

    stats = step_stats_pb2.StepStats()
    dev = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:1")
    for name, start, dur in (("long", 100, 50), ("inside", 110, 10), ("across", 140, 30),
                             ("after", 150, 5), ("later", 300, 1)):
        dev.node_stats.add(node_name=name, all_start_micros=1000 + start, op_end_rel_micros=dur)
    other = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:2")
    other.node_stats.add(node_name="alone", all_start_micros=1000, op_end_rel_micros=7)

    events = _tf_events(stats)
    ops = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in ops) == ["across", "after", "alone", "inside", "later", "long"]
    by_name = {e["name"]: e for e in ops}
    assert (by_name["long"]["ts"], by_name["long"]["dur"]) == (100.0, 50.0)
    assert by_name["alone"]["ts"] == 0.0
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    threads: dict = {}
    for e in ops:
        assert (e["pid"], e["tid"]) in named
        threads.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in threads.values():  # complete events of one thread never overlap
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), spans
    assert len({t for p, t in threads if p == by_name["long"]["pid"]}) == 2  # two at once at most
    assert by_name["later"]["tid"] == by_name["long"]["tid"] == 0


def test_memory_png_zooms_a_low_curve_in_a_unit_of_its_own():
    # The zoomed inset kept the capacity's unit: a peak of 300 KiB on an 8 GiB device had ticks
    # of 0 to 3 under a '1e-4' offset (GiB) that ran into the inset's title.
    from baechi_tf.reports.memory import _memory_figure

    graph = chain(4, nbytes=100 * 1024)
    c = cluster(1, 8 * GiB)
    result = place(graph, c, PlacementOptions(placement_method="m_etf"))
    (mem,) = memory_timeline(graph, c, result.schedule)
    assert 0 < mem.peak_bytes < 1 * MiB
    fig = _memory_figure(result, 0, mem)
    (ax,) = fig.axes[:1]
    (inset,) = ax.child_axes
    assert ax.get_ylabel() == "memory in use (GiB)"
    assert inset.get_title(loc="left") == "zoomed (KiB)"
    top = inset.get_ylim()[1]
    assert top == pytest.approx(mem.peak_bytes / 1024 * 1.12)
    fig.canvas.draw()
    assert inset.yaxis.get_offset_text().get_text() == ""  # no '1e-4' over the ticks
    curve = inset.lines[0].get_ydata()
    assert max(curve) == pytest.approx(mem.peak_bytes / 1024)


def test_gantt_legend_names_ops_without_a_type():
    # Where some ops had a type and others none, the legend's entry of the untyped ones was '?'.
    from baechi_tf.reports.gantt import _colour_keys

    b = OpGraphBuilder()
    b.add_op("src", 10, [4])
    b.add_op("mm", 100, [4], op_type="MatMul")
    b.add_edge("src", "mm")
    keys, colours = _colour_keys(b.build())
    assert keys == ["(no type)", "MatMul"]
    assert set(colours) == {"(no type)", "MatMul"}


def test_reports_show_the_placer_s_share_of_each_device(tmp_path):
    # With --placer_memory_fraction the terminal's table showed the share the placer could fill;
    # summary.json and memory_<i>.png showed only the whole capacity, far above it.
    from baechi_tf.reports import summary
    from baechi_tf.reports.memory import _memory_figure

    graph, c = load_graph_json(FORK_JOIN)
    result = place(graph, c, PlacementOptions(placement_method="m_etf", memory_fraction=0.2))
    figures = summary(result)
    assert figures["memory_fraction"] == 0.2
    shares = c.with_memory_fraction(0.2).devices
    for d, row in enumerate(figures["devices"]):
        assert row["capacity_bytes"] == c.devices[d].memory_bytes
        assert row["placer_share_bytes"] == shares[d].memory_bytes
        assert row["peak_memory_bytes"] <= row["placer_share_bytes"]
    mem = memory_timeline(graph, c, result.schedule)
    ax = _memory_figure(result, 0, mem[0]).axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "placer's share 51.20 MiB (20%)" in labels, labels
    full = place(graph, c, PlacementOptions(placement_method="m_etf"))
    assert summary(full)["memory_fraction"] == 1.0
    assert all(row["placer_share_bytes"] == row["capacity_bytes"] for row in summary(full)["devices"])
    ax = _memory_figure(full, 0, memory_timeline(graph, c, full.schedule)[0]).axes[0]
    assert not [t for t in ax.get_legend().get_texts() if "share" in t.get_text()]


def test_a_step_of_minutes_is_drawn_in_seconds():
    # A 40-minute step had an axis 'time (ms)' of 0 to 2.4 under a '1e6' offset, and the Gantt's
    # title said 'makespan 2.4e+03 s'.
    from baechi_tf.reports.drawing import _time_unit, _us
    from baechi_tf.reports.memory import _memory_figure

    assert _time_unit(9_999.0) == (1.0, "us")
    assert _time_unit(9_999_999.0) == (1e-3, "ms")
    assert _time_unit(2.4e9) == (1e-6, "s")
    assert (_us(2.4e9), _us(3.5e6), _us(1234.0)) == ("2,400 s", "3.5 s", "1.234 ms")
    g = chain(3, compute_us=8e8)
    c = cluster(1)
    result = place(g, c, PlacementOptions(placement_method="m_etf"))
    fig = _memory_figure(result, 0, memory_timeline(g, c, result.schedule)[0])
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (s)"
    fig.canvas.draw()
    assert ax.xaxis.get_offset_text().get_text() == ""


def test_the_readme_lists_every_figure_of_summary_json(fork_join_reports):
    # The README named summary.json's files only: its figures were documented in a docstring.
    import re

    _, _, paths = fork_join_reports
    with open(paths["summary"]) as f:
        figures = json.load(f)
    with open(os.path.join(ROOT, "docs", "reports.md"), encoding="utf-8") as f:  # once the README
        readme = f.read()
    start = readme.index("`summary.json` (of `--report_dir`) holds")
    paragraph = readme[start : readme.index("\n\n", start)]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert set(figures) <= named, set(figures) - named
    assert set(figures["devices"][0]) <= named, set(figures["devices"][0]) - named


def test_gantt_rows_of_several_tasks_keep_their_whole_label():
    # The margin had room for about 18 characters: 'parameter_server/r0/t0 CPU:0' was cut
    # to '_server/r0/t0 CPU:0' at the figure's left edge, 'worker/r0/t12 GPU:0' to 'orker...'.
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.reports.gantt import _gantt_figure

    c = Cluster((Device("/job:parameter_server/replica:0/task:0/device:CPU:0", GiB, "CPU"),
                 Device("/job:worker/replica:0/task:12/device:GPU:0", GiB, "GPU")), CommCost())
    graph = fork_join(2, 100.0)
    result = place(graph, c, PlacementOptions(placement_method="m_etf"))
    fig = _gantt_figure(result, result.schedule.critical_path(graph, c))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.get_yticklabels() if t.get_text() != "channel"]
    assert [t.get_text() for t in labels] == ["parameter_server/r0/t0 CPU:0", "worker/r0/t12 GPU:0"]
    for label in labels:
        assert label.get_window_extent(renderer).x0 >= 0, label.get_text()
    # One task: the margin is the usual one, the labels short.
    result = place(graph, cluster(2), PlacementOptions(placement_method="m_etf"))
    fig = _gantt_figure(result, [])
    assert fig.axes[0].get_position().x0 == pytest.approx(0.085)


@pytest.mark.slow
def test_gantt_rows_of_a_job_with_a_very_long_name_keep_the_end_of_their_label(tmp_path):
    # The margin grew with the widest label: a job name of 200 characters made it wider than the
    # figure, and place-json --report_dir ended in a traceback (the axes' width was negative).
    # Such a label keeps its end, where the task and device are, after '…'.
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.reports.gantt import _gantt_figure

    c = Cluster((Device(f"/job:{'x' * 200}/replica:0/task:0/device:GPU:0", GiB),
                 Device("/job:w/replica:0/task:1/device:GPU:0", GiB)), CommCost())
    graph = fork_join(2, 100.0)
    result = place(graph, c, PlacementOptions(placement_method="m_etf"))
    paths = write_reports(result, str(tmp_path))
    _check_png(paths["gantt"], 1200, 300)
    fig = _gantt_figure(result, result.schedule.critical_path(graph, c))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.get_yticklabels() if t.get_text() != "channel"]
    first, second = (t.get_text() for t in labels)
    assert first.startswith("…x") and first.endswith("x/r0/t0 GPU:0") and second == "w/r0/t1 GPU:0"
    assert 0.085 < ax.get_position().x0 <= 0.3
    for label in labels:
        assert label.get_window_extent(renderer).x0 >= 0, label.get_text()


def test_a_step_of_no_time_has_an_axis_of_one_microsecond():
    # Ops of 0 us: the axes ran from 0 to 1e-9 us under a '1e-9' offset.
    from baechi_tf.reports.gantt import _gantt_figure
    from baechi_tf.reports.memory import _memory_figure

    b = OpGraphBuilder()
    b.add_op("a", 0.0, [4])
    b.add_op("b", 0.0, [4])
    b.add_edge("a", "b")
    g, c = b.build(), cluster(2)
    result = place(g, c, PlacementOptions(placement_method="m_etf"))
    assert result.makespan_us == 0
    for fig in (_gantt_figure(result, result.schedule.critical_path(g, c)),
                _memory_figure(result, 0, memory_timeline(g, c, result.schedule)[0])):
        ax = fig.axes[0]
        assert ax.get_xlim()[1] == pytest.approx(1.005)
        fig.canvas.draw()
        assert ax.xaxis.get_offset_text().get_text() == ""


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.5, 0.4])
def test_memory_pngs_drawn_over_one_figure_are_each_device_s_own(fraction):
    # Each memory PNG had a figure of its own (40 ms each, most of it ticks and text that all
    # devices of one capacity share: 81 s for 1,024 devices). They are now drawn over frames of
    # one figure; each must be, byte for byte, the PNG of its device's own figure: devices of
    # more capacities than frames kept, curves zoomed or not, devices without ops, the placer's
    # share, in an order that goes back and forth between frames. At 40%, the share's line
    # crosses the labels of the zoomed inset's x axis, which were drawn under it, not over it.
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.reports.drawing import _png
    from baechi_tf.reports.memory import _MAX_FRAMES, _memory_figure, _memory_pngs

    capacities = [(64 + 32 * (d % (_MAX_FRAMES + 2))) * MiB for d in range(2 * _MAX_FRAMES + 6)]
    c = Cluster(tuple(Device(f"/device:GPU:{d}", cap) for d, cap in enumerate(capacities)))
    graph = layered_graph(120, seed=1)
    result = place(graph, c, PlacementOptions(placement_method="m_topo", memory_fraction=fraction))
    memory = memory_timeline(graph, c, result.schedule)
    pngs = _memory_pngs(result, memory)
    assert len(pngs) == c.num_devices
    used = set(result.placement.device_of.tolist())
    zoomed = {d for d, mem in enumerate(memory) if 0 < mem.peak_bytes < 0.3 * capacities[d]}
    assert used != set(range(c.num_devices)) and zoomed and used - zoomed  # every kind of device
    for d, mem in enumerate(memory):
        assert pngs[d] == _png(_memory_figure(result, d, mem)), d


@pytest.mark.slow
@pytest.mark.parametrize("num_devices, every", [(256, 1), (1024, 4)])
def test_gantt_of_many_devices_keeps_a_row_per_device_within_its_height(num_devices, every):
    # A row was 62 px whatever the devices: 256 devices made a PNG of 1400 x 16,027 px, 1,024 one
    # of 63,643 px (and 13 s to draw). Rows now come closer past 4,000 px; every device keeps its
    # grey row, labels that would overlap are thinned to 1 in `every`, which the title says.
    import io
    import warnings

    import matplotlib.image

    from baechi_tf.cluster import Cluster
    from baechi_tf.reports.gantt import _gantt_figure, _gantt_png

    graph = layered_graph(2 * num_devices, seed=2)
    c = Cluster.homogeneous(num_devices, GiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more devices than the placement uses
        result = place(graph, c, PlacementOptions(placement_method="m_topo"))
    critical = result.schedule.critical_chain(graph, c)
    image = matplotlib.image.imread(io.BytesIO(_gantt_png(result, *critical)), format="png")
    assert image.shape[0] <= 4000 and image.shape[1] == 1400
    fig = _gantt_figure(result, *critical)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = ax.get_yticklabels()
    assert [t.get_text() for t in labels] == [f"GPU:{d}" for d in range(0, num_devices, every)]
    boxes = sorted((t.get_window_extent().y0, t.get_window_extent().y1) for t in labels)
    assert all(top <= nxt for (_, top), (nxt, _) in zip(boxes, boxes[1:]))  # none on another
    assert ("1 in 4 labelled" in ax.get_title(loc="left")) == (every > 1)
    # Every device's row: one grey band each, down a column right of the bars.
    x0, y0, x1, y1 = ax.get_window_extent().extents
    column = image[image.shape[0] - int(y1) + 2 : image.shape[0] - int(y0) - 2, int(x1) - 3, :3]
    grey = (np.abs(column - 0xF4 / 255).max(axis=1) < 0.02).astype(int)
    if every == 1:  # rows of 15 px: bands of whole pixels
        assert int(np.sum(np.diff(grey) == 1) + grey[0]) == num_devices
    else:
        assert grey.mean() > 0.3  # rows of 4 px: smoothed, grey across the chart


def test_an_out_of_memory_error_names_the_peak_out_of_the_simulated_order_too():
    from baechi_tf.rewriter.oom import out_of_memory_error

    text = "OOM when allocating tensor with shape[4] on /device:GPU:0 by allocator GPU_0_bfc"
    result = place(_two_pairs(), cluster(1, 4 * MiB), PlacementOptions(placement_method="m_etf"))
    message = str(out_of_memory_error(RuntimeError(text), result))
    assert ("the placer expected a peak of 1.00 MiB (2.00 MiB with its ops out of the simulated order) "
            "of the 4.00 MiB it assumed there") in message, message
    # Where the order moves nothing, only the one peak.
    result = place(_two_ops(edge=True), cluster(1, 4 * MiB), PlacementOptions(placement_method="m_etf"))
    message = str(out_of_memory_error(RuntimeError(text), result))
    assert "expected a peak of 1.00 MiB of the 4.00 MiB" in message, message
