"""The simulator against schedules computed by hand."""

import dataclasses
import itertools
import math
import random

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import (
    Groups,
    Placement,
    check_placement,
    colocation_groups,
    lower_bound_us,
    simulate,
    single_device_schedule,
)
from baechi_tf.placer import bounds, energetic, engine
from baechi_tf.placer.bounds import critical_path_us
from baechi_tf.placer.pipeline import PlacementOptions
from baechi_tf.placer.pipeline import place as run_pipeline
from invariants import assert_valid_schedule

COMM = CommCost(0.01, 100)  # 1000 bytes: 110 us


def place(graph, devices):
    return Placement(np.asarray(devices), "test")


def _best_makespan(graph, cluster, groups=None):
    """The least simulated makespan over every placement (one device per group, with `groups`)."""
    groups = groups or Groups.singletons(graph)
    return min(
        simulate(graph, cluster, place(graph, np.asarray(d)[groups.group_of])).makespan_us
        for d in itertools.product(range(cluster.num_devices), repeat=groups.num_groups)
    )


def test_chain_on_one_device_is_the_sum():
    g = graphs.chain(4, compute_us=100)
    c = graphs.cluster(2)
    s = simulate(g, c, place(g, [0, 0, 0, 0]))
    assert s.start_us.tolist() == [0, 100, 200, 300]
    assert s.makespan_us == 400
    assert s.transfers == ()
    assert_valid_schedule(g, c, Groups.singletons(g), s)


def test_a_constant_runs_once_its_control_input_is_done_not_behind_its_devices_work():
    """
    device 0:  x (10 us) -> h1 -> h2 -> h3 (100 us each); k (1 us, a constant) after x (a control
               edge), read by u on device 1
    k and h1 are ready together at 10 us: k first, so u need not wait for the chain. (Ties by op
    id alone ran k after h3, at 310 us.)
    """
    b = OpGraphBuilder()
    b.add_op("x", 10, [4])
    for name in ("h1", "h2", "h3"):
        b.add_op(name, 100, [4])
    b.add_op("k", 1, [4])
    b.add_op("u", 10, [4])
    b.add_edge("x", "h1")
    b.add_edge("h1", "h2")
    b.add_edge("h2", "h3")
    b.add_control_edge("x", "k")
    b.add_edge("k", "u")
    g = b.build()
    c = graphs.cluster(2, comm=CommCost(0.0, 0.0))
    for name in ["python"] + (["native"] if engine.native_available() else []):
        with engine.selected(name):
            s = simulate(g, c, Placement(np.array([0, 0, 0, 0, 0, 1], np.int32), "given"))
        assert s.start_us.tolist() == [0.0, 11.0, 111.0, 211.0, 10.0, 11.0], name


def test_a_cutoff_stops_a_simulation_only_once_an_op_would_start_after_it():
    from baechi_tf.placer.policies import ScheduleCutOff

    g = graphs.chain(4, compute_us=100, nbytes=1000)
    c = graphs.cluster(2, comm=COMM)
    placement = place(g, [0, 0, 1, 1])  # starts 0, 100, 310, 410
    assert simulate(g, c, placement, cutoff_us=410).makespan_us == 510
    with pytest.raises(ScheduleCutOff, match="start at 410.0 us, after the cutoff 409.0 us"):
        simulate(g, c, placement, cutoff_us=409)


def test_chain_split_pays_one_transfer():
    #  op0 op1 | op2 op3 ; 1000 bytes cross: 110 us
    g = graphs.chain(4, compute_us=100, nbytes=1000)
    c = graphs.cluster(2, comm=COMM)
    s = simulate(g, c, place(g, [0, 0, 1, 1]))
    assert s.start_us.tolist() == [0, 100, 310, 410]
    assert s.makespan_us == 510
    (t,) = s.transfers
    assert (t.src_device, t.dst_device, t.start_us, t.end_us) == (0, 1, 200, 310)


def test_diamond_branches_in_parallel():
    #    a(10)          a on 0, b on 0, c on 1, d on 0
    #   /    \          a: 0-10; b: 10-110; a->c: 10-110 (4 B: 100.04 us); c: 110.04-210.04
    #  b(100) c(100)    c->d: 210.04-310.08; d: 310.08-320.08
    #   \    /
    #    d(10)
    g = graphs.diamond()
    c = graphs.cluster(2, comm=COMM)
    s = simulate(g, c, place(g, [0, 0, 1, 0]))
    np.testing.assert_allclose(s.start_us, [0, 10, 110.04, 310.08])
    assert s.makespan_us == pytest.approx(320.08)
    assert_valid_schedule(g, c, Groups.singletons(g), s)


def test_transfers_share_a_channel_in_time_order():
    # src on device 0 feeds x0..x2 on device 1, 2, 3: three sends leave device 0's channel one
    # after another: 10-110, 110-210, 210-310 (4 B each, 100.04 us).
    g = graphs.fork_join(3, branch_us=1000, nbytes=4)
    c = graphs.cluster(4, comm=COMM)
    dev = {"src": 0, "sink": 0, "b0": 1, "b1": 2, "b2": 3}
    s = simulate(g, c, place(g, [dev[n] for n in g.names]))
    sends = sorted((t.start_us, t.end_us) for t in s.transfers if t.src_device == 0)
    np.testing.assert_allclose(sends, [(10, 110.04), (110.04, 210.08), (210.08, 310.12)])
    assert_valid_schedule(g, c, Groups.singletons(g), s)


def _sender_chain():
    #  p(10) -> q(100) -> r(50)    p, q, r on device 0; c on device 1
    #   \
    #    c(10)                      p -> c: 4 B, 5 us
    b = OpGraphBuilder()
    for name, us in (("p", 10), ("q", 100), ("r", 50), ("c", 10)):
        b.add_op(name, us, [4])
    b.add_edge("p", "q")
    b.add_edge("q", "r")
    b.add_edge("p", "c")
    return b.build()


def _two(sends_on_compute):
    return Cluster(tuple(Device(f"/job:worker/replica:0/task:{i}/device:CPU:0", 1 << 30, "CPU",
                                sends_on_compute=sends_on_compute) for i in range(2)), CommCost(0, 5))


@pytest.mark.parametrize("engine_name", ["python", "native"])
def test_a_copy_from_a_device_that_sends_on_compute_waits_until_it_runs_nothing(engine_name):
    # A GPU copies at once: p -> c at 10-15, c 15-25. A CPU worker task serves the copy when
    # its thread is free: q and r run back to back after p (0-160), so the copy is 160-165; and
    # the copy's 5 us are compute time of both tasks: c runs 165-180 (10 us and the copy in).
    from baechi_tf.placer import engine

    if engine_name == "native" and not engine.native_available():
        pytest.skip("the compiled engine is not built")
    g = _sender_chain()
    with engine.selected(engine_name):
        gpu = simulate(g, _two(False), place(g, [0, 0, 0, 1]))
        cpu = simulate(g, _two(True), place(g, [0, 0, 0, 1]))
    assert gpu.start_us.tolist() == [0, 10, 110, 15]
    ((_, _, _, start, end),) = [dataclasses.astuple(t) for t in gpu.transfers]
    assert (start, end) == (10, 15)
    assert cpu.start_us.tolist() == [0, 10, 110, 165]
    ((_, _, _, start, end),) = [dataclasses.astuple(t) for t in cpu.transfers]
    assert (start, end) == (160, 165)
    assert cpu.makespan_us == 180
    assert gpu.end_us[3] == 25  # a GPU's copies take none of its compute
    assert cpu.end_us[3] == 180
    assert_valid_schedule(g, _two(True), Groups.singletons(g), cpu)


@pytest.mark.parametrize("engine_name", ["python", "native"])
def test_a_copy_from_a_device_that_sends_on_compute_takes_its_idle_time(engine_name):
    # Device 0 runs p (0-10) and is idle until q: p -> c goes at 10-15. Device 1 runs x (0-50)
    # and then c (50-65: 10 us and the 5 us of the copy in) on the same thread: x -> q waits for
    # c, 65-70, and q runs 70-175.
    from baechi_tf.placer import engine

    if engine_name == "native" and not engine.native_available():
        pytest.skip("the compiled engine is not built")
    b = OpGraphBuilder()
    for name, us in (("p", 10), ("x", 50), ("q", 100), ("c", 10)):
        b.add_op(name, us, [4])
    b.add_edge("x", "q")
    b.add_edge("p", "c")
    g = b.build()
    with engine.selected(engine_name):
        s = simulate(g, _two(True), place(g, [0, 1, 0, 1]))
    assert s.start_us.tolist() == [0, 0, 70, 50]
    assert s.end_us.tolist() == [10, 50, 175, 65]
    assert sorted((t.start_us, t.end_us) for t in s.transfers) == [(10, 15), (65, 70)]


def test_a_placement_that_moves_a_pinned_op_is_simulated_where_it_puts_it():
    #  a(10, pinned to GPU:1) -> b(10), c(10) alone; the placement puts all three on device 0.
    #  check_placement refuses it, but simulate must give this placement's schedule: a 0-10,
    #  b 10-20, c 20-30 on device 0, no copy. It ran a on its pin, device 1, and reported it on
    #  device 0 beside c at 0-10 (two ops at once on one device) and b after a copy, at 50.
    b = OpGraphBuilder()
    b.add_op("a", 10, [40], device="/device:GPU:1")
    b.add_op("b", 10, [4])
    b.add_op("c", 10, [4])
    b.add_edge("a", "b")
    g = b.build()
    c = graphs.cluster(2, comm=CommCost(0.5, 20))
    s = simulate(g, c, place(g, [0, 0, 0]))
    assert s.placement.device_of.tolist() == [0, 0, 0]
    assert s.start_us.tolist() == [0, 10, 20]
    assert s.transfers == ()
    assert s.makespan_us == 30
    # Where the placement keeps the pin, the pin changes nothing: a 0-10 on device 1, its 40 B
    # copy 10-50, c 0-10 and b 50-60 on device 0.
    s = simulate(g, c, place(g, [1, 0, 0]))
    assert s.start_us.tolist() == [0, 50, 0]
    assert [(t.src_device, t.start_us, t.end_us) for t in s.transfers] == [(1, 10, 50)]
    assert_valid_schedule(g, c, Groups.singletons(g), s)


def test_a_pinned_op_placed_on_its_pin_whose_weights_exceed_the_device_is_named():
    # w (3 MiB of persistent memory) is pinned to GPU:0 of 2 MiB and placed there: the error
    # names the pin and the fix, not a read of 8 B by a device with -1 MiB free.
    b = OpGraphBuilder()
    b.add_op("x", 1, [4])
    b.add_op("w", 1, [4], persistent_bytes=3 * (1 << 20), device="/device:GPU:0")
    b.add_edge("x", "w")
    g = b.build()
    c = graphs.cluster(2, memory_bytes=2 * (1 << 20))
    with pytest.raises(InfeasiblePlacementError, match="'w' is pinned to '/device:GPU:0', but its group 'w' "
                       "holds 3.00 MiB of persistent memory and the device has 2.00 MiB: unpin it"):
        simulate(g, c, place(g, [1, 0]))


@pytest.mark.parametrize("device", [-1, 2])
def test_a_placement_on_a_device_the_cluster_lacks_is_refused(device):
    # Device -1 ran op1 on the last device (Python's index from the end) and then failed an
    # assertion; device 2 of two ended in an IndexError.
    g = graphs.chain(3, compute_us=100, nbytes=1000)
    with pytest.raises(ValueError, match=f"op 'op1' is placed on device index {device}, but the cluster has devices 0..1"):
        simulate(g, graphs.cluster(2), place(g, [0, device, 0]))


def test_tensor_is_sent_once_per_device():
    #  a -> b, a -> c, both b and c on the other device: one transfer of a.
    b = OpGraphBuilder()
    b.add_op("a", 10, [1000])
    b.add_op("b", 10, [4])
    b.add_op("c", 10, [4])
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    g = b.build()
    s = simulate(g, graphs.cluster(2, comm=COMM), place(g, [0, 1, 1]))
    assert len(s.transfers) == 1


def test_control_edge_costs_the_intercept():
    b = OpGraphBuilder()
    b.add_op("a", 10, [1000])
    b.add_op("b", 10, [4])
    b.add_control_edge("a", "b")
    g = b.build()
    s = simulate(g, graphs.cluster(2, comm=COMM), place(g, [0, 1]))
    assert s.start_us[1] == pytest.approx(110.0)


def test_memory_is_freed_after_the_last_consumer():
    # a(1 MiB out) -> b -> c, all on one device: a's output dies when b ends.
    b = OpGraphBuilder()
    mib = 1 << 20
    b.add_op("a", 10, [mib], persistent_bytes=100)
    b.add_op("b", 10, [2 * mib], temp_bytes=mib)
    b.add_op("c", 10, [4])
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    g = b.build()
    s = simulate(g, graphs.cluster(1), place(g, [0, 0, 0]))
    # During b: persistent 100 + a's 1 MiB + b's 2 MiB + 1 MiB temp.
    assert s.peak_memory_bytes == (100 + 4 * mib,)


def test_op_waits_for_memory():
    # Device of 10 MiB. a and b (independent, 6 MiB output each) cannot be alive together:
    # the second waits until the first's consumer has finished.
    mib = 1 << 20
    b = OpGraphBuilder()
    b.add_op("a", 10, [6 * mib])
    b.add_op("ca", 10, [4])
    b.add_op("b", 10, [6 * mib])
    b.add_op("cb", 10, [4])
    b.add_edge("a", "ca")
    b.add_edge("b", "cb")
    g = b.build()
    c = graphs.cluster(1, memory_bytes=10 * mib)
    s = simulate(g, c, place(g, [0, 0, 0, 0]))
    assert s.start_us.tolist() == [0, 10, 20, 30]
    assert s.peak_memory_bytes[0] <= 10 * mib


def test_placement_that_cannot_fit_raises():
    g, c = graphs.too_big_for_one()
    # The fix names the flags the commands have (--memory_fraction alone is train.py's).
    with pytest.raises(InfeasiblePlacementError, match="no device can hold it.*--memory_per_device"):
        simulate(g, c, place(g, [0, 0, 0, 0]))
    assert single_device_schedule(g, c) is None


def test_lower_bound():
    g = graphs.fork_join(4, branch_us=1000)
    # Critical path 10 + 1000 + 10; total 4020 / 4 devices = 1005.
    assert lower_bound_us(g, graphs.cluster(4, comm=CommCost(0, 0))) == 1020
    assert lower_bound_us(g, graphs.cluster(1)) == 4020
    # At the default cost a 4096 B copy takes C = CommCost()(4096). The branches are a phase
    # between src and sink: for C after src ends only src's device can work (the others wait for
    # its copy), for the last C before sink starts only sink's (theirs would arrive late), so
    # 2C of those 4000 us run on one device and the rest on four: 1000 + 1.5C.
    assert lower_bound_us(g, graphs.cluster(4)) == pytest.approx(1020 + 1.5 * CommCost()(4096))


@pytest.mark.parametrize("k, expected", [(1, 460), (4, 235), (math.inf, 160)])
def test_lower_bound_pays_the_fixed_cost_of_copies_in_flight_once(k, expected):
    #   u(10) --4 outputs of 1000 B--> v(10)     u pinned to device 0, v to device 1
    # A copy: 0.01 us/B * 1000 B + 100 us. K = 4: each holds the channels 10 + 25 us, the last
    # is in 75 us after its hold, 10 + 4 * 35 + 75 = 225; v ends at 235 (K = 1: 10 + 4 * 110 + 10;
    # K = inf: 10 + 4 * 10 + 100 + 10). The bound is the schedule: copies in flight overlap
    # their fixed cost, so the bound pays it once and the holds of each copy.
    b = OpGraphBuilder()
    b.add_op("u", 10, [1000] * 4, device="/device:GPU:0")
    b.add_op("v", 10, [4], device="/device:GPU:1")
    for i in range(4):
        b.add_edge("u", "v", i)
    g = b.build()
    c = graphs.cluster(2, comm=CommCost(0.01, 100, copies_in_flight=k))
    assert simulate(g, c, place(g, [0, 1])).makespan_us == expected
    assert lower_bound_us(g, c) == expected


def _two_phases():
    #        s                  four 100 us branches, then one of 300 us beside one of 10 us;
    #    / | | \\                s, m and t are cut ops (every op reaches them or is reached)
    #   b0 b1 b2 b3
    #    \\ | | /
    #        m ----.
    #       / \\    |   (m -> t also directly: an edge past the last phase's ops)
    #     c0   c1  |
    #       \\ /    |
    #        t <---'
    b = OpGraphBuilder()
    for name, us in [("s", 10), ("m", 10), ("t", 10), ("c0", 300), ("c1", 10)]:
        b.add_op(name, us, [4])
    for i in range(4):
        b.add_op(f"b{i}", 100, [4])
        b.add_edge("s", f"b{i}")
        b.add_edge(f"b{i}", "m")
    for c in ("c0", "c1"):
        b.add_edge("m", c)
        b.add_edge(c, "t")
    b.add_edge("m", "t")
    return b.build()


def test_lower_bound_adds_up_phases():
    g = _two_phases()
    # Critical path 10 + 100 + 10 + 300 + 10 = 430; total 740 / 2 = 370. By phases:
    # 10 + max(100, 400 / 2) + 10 + max(300, 310 / 2) + 10 = 530, and a schedule reaches it.
    c = graphs.cluster(2, comm=CommCost(0, 0))
    assert lower_bound_us(g, c) == 530
    names = g.names
    device_of = [1 if n in ("b2", "b3", "c1") else 0 for n in names]
    assert simulate(g, c, place(g, device_of)).makespan_us == 530
    # An op beside the phases is no cut op: with x from s to t the bound falls to what x allows.
    b = OpGraphBuilder()
    for name in names:
        b.add_op(name, float(g.compute_us[g.op_id(name)]), [4])
    for src, dst in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
        b.add_edge(names[src], names[dst])
    b.add_op("x", 1, [4])
    b.add_edge("s", "x")
    b.add_edge("x", "t")
    # Phases now: s, then everything but t (721 us of compute, path 100 + 10 + 300), then t:
    # 10 + max(410, 721 / 2) + 10 = 430 is the critical path. The energetic bound of the middle
    # phase still finds 530: its first 190 us hold at most 2 * 190 us of work, its last 310 at
    # most c0, c1, x and m (321 us; the branches end before m, 310 before the end), so the other
    # 20 us need 10 more on two devices: 10 + 190 + 10 + 310 + 10. The same schedule reaches it.
    g2 = b.build()
    assert lower_bound_us(g2, c) == 530
    device_of = [1 if n in ("b2", "b3", "c1", "x") else 0 for n in g2.names]
    assert simulate(g2, c, place(g2, device_of)).makespan_us == 530


@pytest.mark.parametrize("seed", range(40))
def test_lower_bound_never_beats_a_placement(seed):
    # Free communication, so every placement's schedule is a schedule of the bound's model.
    g = graphs.random_dag(seed, 3 + seed % 5, edge_prob=0.3 + 0.1 * (seed % 4))
    c = graphs.cluster(2 + seed % 2, comm=CommCost(0, 0))
    bound = lower_bound_us(g, c)
    best = _best_makespan(g, c)
    assert best >= bound - 1e-6


def _fan_in(sources, v_us):
    """Sources ``s{i}`` of (compute_us, output bytes), each feeding op ``v`` of `v_us`."""
    b = OpGraphBuilder()
    for i, (us, nbytes) in enumerate(sources):
        b.add_op(f"s{i}", us, [nbytes])
    b.add_op("v", v_us, [4])
    for i in range(len(sources)):
        b.add_edge(f"s{i}", "v")
    return b.build()


def test_lower_bound_pays_for_unavoidable_communication():
    #  u1(100)   u2(100)     v waits for both: on v's device they run one after the other
    #       \   /            (v starts >= 200), or one is elsewhere and its 40 B cost
    #        v(10)           20 + 0.5 * 40 = 40 us (v starts >= 100 + 40). Bound 140 + 10 = 150,
    #                        where the communication-free bounds give 110 (path, and phases).
    g = _fan_in([(100, 40), (100, 40)], v_us=10)
    c = graphs.cluster(2, comm=CommCost(0.5, 20))
    assert lower_bound_us(g, c) == 150
    # u1 and v on device 0, u2 on 1: u2's copy 100-140, v 140-150, so the bound is reached.
    assert simulate(g, c, place(g, [0, 1, 0])).makespan_us == 150
    assert lower_bound_us(g, graphs.cluster(2, comm=CommCost(0, 0))) == 110
    assert lower_bound_us(g, graphs.cluster(1, comm=CommCost(0.5, 20))) == 210


def _square(extra_us=0.0):
    """a, b (100 us) each feed c and d (10 us) 1 MiB: no op is a cut op, and at the default cost
    a copy (318 us) takes longer than the 100 us a second device saves; with `extra_us`, a lone
    op x apart from them."""
    b = OpGraphBuilder()
    for name, us in [("a", 100), ("b", 100), ("c", 10), ("d", 10)]:
        b.add_op(name, us, [1 << 20])
    for u in "ab":
        for v in "cd":
            b.add_edge(u, v)
    if extra_us:
        b.add_op("x", extra_us, [4], colocation=("a",))
    return b.build()


def test_lower_bound_is_one_device_where_every_split_costs_more():
    # Kept whole, the square runs its 220 us on one device. Split, some copy a|b -> c|d of
    # 318 us lies between 100 and 10 us of compute: 428 us. The bound is the lesser, 220 (the
    # heads alone give 210: c waits for a and b run one after the other).
    g = _square()
    for k in (2, 4):
        c = graphs.cluster(k)
        assert lower_bound_us(g, c) == 220 == single_device_schedule(g, c).makespan_us
        assert _best_makespan(g, c) == 220
    # x apart is a second part: kept parts take at least the largest part's 220 us, which
    # x on another device reaches; x colocated with a joins a's part, and only 270 is left.
    g = _square(extra_us=50)
    c = graphs.cluster(2)
    assert lower_bound_us(g, c) == 220 == _best_makespan(g, c)
    groups = colocation_groups(g)
    assert lower_bound_us(g, c, groups=groups) == 270 == _best_makespan(g, c, groups)
    assert simulate(g, c, place(g, [0, 0, 0, 0, 1])).makespan_us == 220


@pytest.mark.parametrize("seed", range(30))
def test_lower_bound_never_beats_a_placement_that_pays_for_copies(seed):
    # Copies of 1 kB to 3 MB at 0, 20 or 134 us a message: splitting a pair may or may not pay.
    g = graphs.random_dag(
        seed, 3 + seed % 4, edge_prob=0.1 + 0.1 * (seed % 5), max_bytes=[1000, 100_000, 3_000_000][seed % 3],
        group_prob=0.3 if seed % 2 else 0.0,
    )
    c = graphs.cluster(2 + seed % 2, comm=CommCost(0.0001754, [0, 20, 134][seed % 3]))
    groups = colocation_groups(g)
    assert _best_makespan(g, c) >= lower_bound_us(g, c) - 1e-6
    assert _best_makespan(g, c, groups) >= lower_bound_us(g, c, groups=groups) - 1e-6


def test_lower_bound_past_the_exact_local_sets():
    # 200 sources of 1 us into v (1 us); source i sends 2 * (200 - i) bytes, 300 - i us at
    # CommCost(0.5, 100). With the k sources that arrive last (sorted by 1 + comm, descending)
    # on v's device, v starts >= max(k, 301 - k): 151 at k = 150, past the 64 local sets tried
    # exactly, where max(J(first 64), least release + sum of compute) = k still gives it.
    # Trying only k <= 64 would claim v starts >= 301 - 64 = 237, after the 201 us that all on
    # one device takes.
    g = _fan_in([(1, 2 * (200 - i)) for i in range(200)], v_us=1)
    c = graphs.cluster(3, comm=CommCost(0.5, 100))
    assert lower_bound_us(g, c) == 152
    placements = [
        [0] * 201,
        [i % 3 for i in range(200)] + [0],
        [0 if i >= 50 else 1 for i in range(200)] + [0],
    ]
    spans = [simulate(g, c, place(g, d)).makespan_us for d in placements]
    assert spans[0] == 201 and min(spans) >= 152


def _random_comm_dag(rng, num_ops):
    """Ops of 10-300 us with two outputs of up to 400 B; each forward pair of ops is joined with
    probability 0.5 by any of: output 0, output 1, a control edge."""
    b = OpGraphBuilder()
    for i in range(num_ops):
        b.add_op(f"op{i}", round(rng.uniform(10, 300), 1), [rng.randrange(401), rng.randrange(401)])
    for j in range(num_ops):
        for i in range(j):
            if rng.random() < 0.5:
                kinds = rng.sample(["0", "1", "control"], rng.randint(1, 3))
                for kind in kinds:
                    if kind == "control":
                        b.add_control_edge(f"op{i}", f"op{j}")
                    else:
                        b.add_edge(f"op{i}", f"op{j}", int(kind))
    return b.build()


def _two_tasks(slow):
    # Devices 0 and 1 on one host (20 + 0.5 us per byte), device 2 on another (`slow`).
    names = ["/job:w/replica:0/task:0/device:GPU:0", "/job:w/replica:0/task:0/device:GPU:1",
             "/job:w/replica:0/task:1/device:GPU:0"]
    return Cluster(tuple(Device(n, 1 << 30) for n in names), CommCost(0.5, 20), slow)


@pytest.mark.parametrize("seed", range(60))
def test_lower_bound_with_communication_never_beats_a_placement(seed):
    # Transfers of 20-220 us beside ops of 10-300 us, every placement on 2 or 3 devices (one case
    # in three on two hosts, whose slower line the bound must not count on).
    rng = random.Random(seed)
    if seed % 3 == 0:
        c = _two_tasks(CommCost(1.0, 60))
    else:
        c = graphs.cluster(3 if seed % 3 == 1 else 2, comm=CommCost(0.5, 20))
    g = _random_comm_dag(rng, rng.randint(3, 6 if c.num_devices == 3 else 7))
    bound = lower_bound_us(g, c)
    best = _best_makespan(g, c)
    assert best >= bound - 1e-6


def _colocated_input(mirror=False):
    """u1(100 us, 40 B) and u2(30 us, 4 B) feed v(10 us); v is colocated with u2.
    With `mirror`, v(10 us) feeds w1(100 us) with 40 B and w2(30 us, colocated) with 4 B."""
    b = OpGraphBuilder()
    if not mirror:
        b.add_op("u1", 100, [40])
        b.add_op("u2", 30, [4])
        b.add_op("v", 10, [4], colocation=["u2"])
        b.add_edge("u1", "v")
        b.add_edge("u2", "v")
    else:
        b.add_op("v", 10, [40, 4])
        b.add_op("w1", 100, [4])
        b.add_op("w2", 30, [4], colocation=["v"])
        b.add_edge("v", "w1", 0)
        b.add_edge("v", "w2", 1)
    return b.build()


@pytest.mark.parametrize("mirror", [False, True])
def test_lower_bound_keeps_colocated_inputs_local(mirror):
    #  u1(100) u2(30)      At CommCost(0.5, 20) u1's copy takes 40 us, u2's 22 us.
    #     \     /  [u2 v]  Free to split, u2 goes elsewhere (v >= max(J{u1} = 100, 30 + 22)):
    #       v(10)          bound 110, the critical path. With u2 on v's device, L holds u2:
    #                      L = {u2} gives max(J = 30, 100 + 40) = 140, L = {u1, u2} gives
    #                      J = 130, so v starts >= 130: bound 140. Mirrored (v feeds w1, w2 with
    #                      w2 in v's group) the tail pass gives the same numbers.
    g = _colocated_input(mirror)
    c = graphs.cluster(2, comm=CommCost(0.5, 20))
    groups = colocation_groups(g)
    assert groups.num_groups == 2
    assert lower_bound_us(g, c) == 110
    assert lower_bound_us(g, c, groups=groups) == 140
    # All on one device reaches 140 and keeps the group; splitting it reaches 110.
    assert check_placement(g, c, groups, place(g, [0, 0, 0])).makespan_us == 140
    split = [0, 0, 1] if mirror else [0, 1, 0]  # the 30 us op away from v
    assert simulate(g, c, place(g, split)).makespan_us == 110
    # The best placement that keeps the group: u1 (w1) away adds its 40 us copy.
    keep = [0, 1, 0] if mirror else [1, 0, 0]
    assert simulate(g, c, place(g, keep)).makespan_us == 150


def test_grouped_lower_bound_past_the_exact_local_sets():
    # The 200 sources of test_lower_bound_past_the_exact_local_sets, plus f (50 us) colocated
    # with v. With the k last-arriving sources local, v starts >= max(50 + k, 301 - k): 176 at
    # k = 126, past the 64 exact local sets, where the bound of J must count f's 50 us (else
    # max(k, 301 - k) gives 151 again). Free to send f elsewhere (50 + 102 us), v starts >= 152.
    b = OpGraphBuilder()
    for i in range(200):
        b.add_op(f"s{i}", 1, [2 * (200 - i)])
    b.add_op("f", 50, [4])
    b.add_op("v", 1, [4], colocation=["f"])
    for i in range(200):
        b.add_edge(f"s{i}", "v")
    b.add_edge("f", "v")
    g = b.build()
    c = graphs.cluster(3, comm=CommCost(0.5, 100))
    groups = colocation_groups(g)
    assert lower_bound_us(g, c) == 153
    assert lower_bound_us(g, c, groups=groups) == 177
    placements = [
        [0] * 202,
        [i % 3 for i in range(200)] + [0, 0],
        [0 if i < 126 else 1 + i % 2 for i in range(200)] + [0, 0],
    ]
    spans = [check_placement(g, c, groups, place(g, d)).makespan_us for d in placements]
    assert spans[0] == 251 and min(spans) >= 177


def test_place_reports_the_bound_of_the_colocation_groups():
    g = _colocated_input()
    c = graphs.cluster(2, comm=CommCost(0.5, 20))
    result = run_pipeline(g, c, PlacementOptions(placement_method="m_etf", grouper="coplace"))
    assert result.lower_bound_us == lower_bound_us(g, c, groups=colocation_groups(g)) == 140
    assert lower_bound_us(g, c) == 110
    assert result.makespan_us >= result.lower_bound_us


def _random_grouped_dag(seed):
    """`graphs.random_dag` with colocation groups, 10-300 us ops and outputs of 4-400 B."""
    return graphs.random_dag(
        seed, 4 + seed % 5, edge_prob=0.4 + 0.1 * (seed % 3), max_compute_us=300, max_bytes=400,
        group_prob=0.5,
    )


@pytest.mark.parametrize("seed", range(80))
def test_grouped_lower_bound_never_beats_a_placement_that_keeps_groups(seed):
    # Every placement that keeps each colocation group whole (one device per group) on 2 or 3
    # devices, transfers of 20-220 us beside ops of 1-300 us.
    g = _random_grouped_dag(seed)
    groups = colocation_groups(g)
    c = graphs.cluster(2 + seed % 2, comm=CommCost(0.5, 20))
    bound = lower_bound_us(g, c, groups=groups)
    assert bound >= lower_bound_us(g, c)
    best = _best_makespan(g, c, groups)
    assert best >= bound - 1e-6


def test_energetic_bound_of_a_phase_waits_for_copies():
    #        s (10 us, 400 B)      At CommCost(0.5, 20) s's copy takes 220 us, a branch's 22.
    #     /  |  |  \               For 220 us after s only s's device can run a branch (the
    #   b0  b1  b2  b3 (100 us)    other waits for the copy), for the last 22 before p only p's:
    #     \  |  |  /               242 of the 400 us run on one device, the other 158 on two:
    #        p (10 us)             10 + 220 + 22 + 79 + 10 = 341. The other bounds give 220.
    b = OpGraphBuilder()
    b.add_op("s", 10, [400])
    b.add_op("p", 10, [4])
    for i in range(4):
        b.add_op(f"b{i}", 100, [4])
        b.add_edge("s", f"b{i}")
        b.add_edge(f"b{i}", "p")
    g = b.build()
    c = graphs.cluster(2, comm=CommCost(0.5, 20))
    assert lower_bound_us(g, c) == pytest.approx(341)
    spans = {
        d: simulate(g, c, place(g, list(d))).makespan_us
        for d in itertools.product(range(2), repeat=g.num_ops)
    }
    # The best: three branches with s, one with p; the third's copy reaches p at 10 + 300 + 22.
    assert min(spans.values()) == spans[(0, 1, 0, 0, 0, 1)] == 342
    assert spans[(0, 0, 0, 0, 0, 0)] == 420
    # Free copies: the plain phase bound, 10 + 400 / 2 + 10, which two and two reach.
    free = graphs.cluster(2, comm=CommCost(0, 0))
    assert lower_bound_us(g, free) == 220 == simulate(g, free, place(g, [0, 0, 0, 0, 1, 1])).makespan_us


def _between_cut_ops(rng, inner, devices):
    """Op s, then a random DAG of `inner` ops of 10-300 us with outputs of up to 400 B (each
    forward pair joined with probability 0.4), then op p: s feeds the ops without an inner
    predecessor and one more with probability 0.3, p reads the ops without an inner successor."""
    b = OpGraphBuilder()
    b.add_op("s", round(rng.uniform(1, 50), 1), [rng.randrange(401)])
    b.add_op("p", round(rng.uniform(1, 50), 1), [4])
    for i in range(inner):
        b.add_op(f"op{i}", round(rng.uniform(10, 300), 1), [rng.randrange(401)])
    has_pred, has_succ = set(), set()
    for j in range(inner):
        for i in range(j):
            if rng.random() < 0.4:
                b.add_edge(f"op{i}", f"op{j}")
                has_pred.add(j)
                has_succ.add(i)
    for i in range(inner):
        if i not in has_pred or rng.random() < 0.3:
            b.add_edge("s", f"op{i}")
        if i not in has_succ:
            b.add_edge(f"op{i}", "p")
    return b.build(), graphs.cluster(devices, comm=CommCost(0.5, 20))


@pytest.mark.slow
def test_energetic_bounds_never_beat_a_placement_and_often_rise():
    # Phases between two cut ops, every placement on 2 or 3 devices: the bound holds, and the
    # energetic bounds of the phase and of the whole graph lift it over the others in 11 of
    # these 40 cases.
    rng = random.Random(7)
    lifted = 0
    cases = 40
    for case in range(cases):
        devices = 2 + case % 2
        g, c = _between_cut_ops(rng, rng.randint(3, 5 if devices == 3 else 6), devices)
        bound = lower_bound_us(g, c)
        best = _best_makespan(g, c)
        assert best >= bound - 1e-6, case
        inner = [i for i, name in enumerate(g.names) if name.startswith("op")]
        cut = float(g.compute_us[g.op_id("s")] + g.compute_us[g.op_id("p")])
        heads_tails = bounds._comm_heads_tails(g, bounds._pair_comm(g, c))
        others = max(
            critical_path_us(g),
            cut + max(critical_path_us(g) - cut, float(g.compute_us[inner].sum()) / devices),
            float((heads_tails[0] + g.compute_us + heads_tails[1]).max()),
        )
        lifted += bound > others + 1e-6
    assert lifted >= 10, lifted


def test_energetic_bound_of_the_whole_graph_counts_the_start():
    # a and b (50 us, 40 B) feed six ops c of 100 us, on 3 devices at CommCost(0.5, 20). No op is
    # a cut op. A c starts at 90 at the earliest (a and b both on its device end at 100; one
    # across a 40 us copy at 90), so in the first 90 us only a and b can run: 100 us of work
    # where three devices could do 270; the other 600 take 200 more on three: 290. Without
    # copies to pay, c could start at 50 (the phase bound: 250); the longest path gives 190.
    b = OpGraphBuilder()
    b.add_op("a", 50, [40])
    b.add_op("b", 50, [40])
    for i in range(6):
        b.add_op(f"c{i}", 100, [4])
        b.add_edge("a", f"c{i}")
        b.add_edge("b", f"c{i}")
    g = b.build()
    c = graphs.cluster(3, comm=CommCost(0.5, 20))
    assert lower_bound_us(g, c) == 290
    assert lower_bound_us(g, graphs.cluster(3, comm=CommCost(0, 0))) == 250
    best = _best_makespan(g, c)
    assert best == 390  # the copies to a third device share its channel


def test_energetic_bounds_of_many_sets_at_once_are_each_sets_alone():
    # The phases of a graph are bounded in one vectorised pass: every set's bound must be the one
    # it gets alone, up to rounding, whatever the sets beside it (sizes 1-40, scales 1 to 10^4
    # apart, zero compute, equal releases, anchors on either side or none).
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 41, size=30)
    set_of = np.repeat(np.arange(30), sizes)
    m = set_of.shape[0]
    scale = np.repeat(10.0 ** rng.integers(0, 5, size=30), sizes)
    compute = np.where(rng.random(m) < 0.1, 0.0, rng.uniform(1, 100, m)) * scale
    head = np.round(rng.uniform(0, 50, m)) * scale  # rounded: equal releases
    tail = rng.uniform(0, 50, m) * scale
    remote_head = head + rng.uniform(0, 80, m) * scale
    remote_tail = tail + rng.uniform(0, 80, m) * scale
    anchored_head, anchored_tail = rng.random(30) < 0.6, rng.random(30) < 0.6
    for k in (2, 3, 8):
        together = energetic.energetic_bounds(
            set_of, compute, head, tail, k, remote_head=remote_head, remote_tail=remote_tail,
            anchored_head=anchored_head, anchored_tail=anchored_tail,
        )
        for i in range(30):
            mine = set_of == i
            alone = energetic.energetic_bounds(
                np.zeros(int(mine.sum()), dtype=np.int64), compute[mine], head[mine], tail[mine], k,
                remote_head=remote_head[mine], remote_tail=remote_tail[mine],
                anchored_head=anchored_head[i : i + 1], anchored_tail=anchored_tail[i : i + 1],
            )
            assert together[i] == pytest.approx(alone[0], rel=1e-9, abs=1e-6), (k, i)
            assert together[i] >= compute[mine].sum() / k - 1e-9


@pytest.mark.parametrize("intercept", [1e9, 1e11, 3e11, 1e13])
@pytest.mark.parametrize("us", [(0.1, 0.2), (100.1, 200.3)])
def test_energetic_bound_is_not_rounding_when_copies_dwarf_compute(intercept, us):
    # a (0 us) feeds b and c; a copy costs `intercept`, so one device is best (b + c). The
    # phase's breakpoints are as large as a copy: rounding their sums must not make the work
    # look as if it fit nowhere (the bound then jumped by a copy, far above one device).
    b = OpGraphBuilder()
    b.add_op("a", 0, [4])
    b.add_op("b", us[0], [4])
    b.add_op("c", us[1], [4])
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    g = b.build()
    c = graphs.cluster(2, comm=CommCost(0, intercept))
    one = simulate(g, c, place(g, [0, 0, 0])).makespan_us
    assert one == pytest.approx(sum(us))
    assert us[1] <= lower_bound_us(g, c) <= one + 1e-9


def test_critical_path_ends_at_the_last_op():
    g = graphs.chain(4, compute_us=100, nbytes=1000)
    c = graphs.cluster(2, comm=COMM)
    s = simulate(g, c, place(g, [0, 0, 1, 1]))
    assert s.critical_path(g, c) == [0, 1, 2, 3]


def test_critical_chain_follows_a_copy_that_waited_for_the_channel():
    # GPU:0 runs a (10 us) then b (20 us); a's 1 MB goes to c (1 us) and b's 100 kB to d (5 us),
    # both on GPU:1, over a link of 1 ns a byte. d can start first (b's copy, 30 to 130 us,
    # before a's could end), so a's copy waits for the channel until 130 and ends at 1,130; c
    # ends the step at 1,131. critical_path counts that copy from a's end at 10 us and leaves
    # its 120 us wait unexplained; the chain runs through b and b's copy, which held the channel.
    b = OpGraphBuilder()
    b.add_op("a", 10, [1_000_000])
    b.add_op("b", 20, [100_000])
    b.add_op("c", 1, [4])
    b.add_op("d", 5, [4])
    b.add_edge("a", "c")
    b.add_edge("b", "d")
    g = b.build()
    c = graphs.cluster(2, comm=CommCost(0.001, 0))
    s = simulate(g, c, place(g, [0, 0, 1, 1]))
    assert s.makespan_us == pytest.approx(1131)
    a, b_, c_ = (g.index[n] for n in "abc")
    assert s.critical_path(g, c) == [a, c_]
    ops, copies = s.critical_chain(g, c)
    assert ops == [a, b_, c_]
    assert [(g.names[g.tensor_src[t.tensor]], t.start_us, t.end_us) for t in copies] == [
        ("b", pytest.approx(30), pytest.approx(130)), ("a", pytest.approx(130), pytest.approx(1130))
    ]


def test_critical_chain_is_the_critical_path_where_no_copy_waited():
    g = graphs.chain(4, compute_us=100, nbytes=1000)
    c = graphs.cluster(2, comm=COMM)
    s = simulate(g, c, place(g, [0, 0, 1, 1]))
    ops, copies = s.critical_chain(g, c)
    assert ops == s.critical_path(g, c) == [0, 1, 2, 3]
    assert [(t.src_device, t.dst_device, t.start_us) for t in copies] == [(0, 1, s.end_us[1])]


def test_lower_bound_pays_for_a_copy_between_ops_pinned_apart():
    #  a(100) -> b(10), a pinned to GPU:0 and b to GPU:1: the 40 B copy, 0.5 * 40 + 20 = 40 us,
    #  is paid in every placement: 150 us. Without the pins a placement keeps both on one
    #  device (110 us), which the bound said too.
    b = OpGraphBuilder()
    b.add_op("a", 100, [40], device="/device:GPU:0")
    b.add_op("b", 10, [4], device="/device:GPU:1")
    b.add_edge("a", "b")
    g = b.build()
    c = graphs.cluster(2, comm=CommCost(0.5, 20))
    assert lower_bound_us(g, c) == 150 == simulate(g, c, place(g, [0, 1])).makespan_us
    for pins in ((None, None), ("/device:GPU:1", "/device:GPU:1")):  # free, or kept together
        b = OpGraphBuilder()
        b.add_op("a", 100, [40], device=pins[0])
        b.add_op("b", 10, [4], device=pins[1])
        b.add_edge("a", "b")
        assert lower_bound_us(b.build(), c) == 110


def _best_pinned_makespan(graph, cluster, groups):
    """The least simulated makespan over every placement that keeps groups whole and pins held."""
    from baechi_tf.placer.pins import pinned_group_devices

    pins = pinned_group_devices(graph, cluster, groups)
    choices = [[int(p)] if p >= 0 else range(cluster.num_devices) for p in pins]
    return min(
        simulate(graph, cluster, place(graph, np.asarray(d)[groups.group_of])).makespan_us
        for d in itertools.product(*choices)
    )


@pytest.mark.slow
def test_lower_bound_with_pins_never_beats_a_placement_that_keeps_them():
    # Random DAGs of 4-7 ops, half of them pinned, with and without colocation groups, on 2 or
    # 3 devices with copies of 20-220 us: every placement that holds the pins (and groups) is
    # tried. Not vacuous: the pins raise the bound on some of them.
    from baechi_tf.errors import InvalidGraphError

    raised = checked = 0
    for seed in range(120):
        nd = 2 + seed % 2
        c = graphs.cluster(nd, comm=CommCost(0.5, 20))
        g = graphs.random_dag(
            seed, 4 + seed % 4, edge_prob=0.5, max_compute_us=300, max_bytes=400,
            group_prob=0.3 * (seed % 2), pin_prob=0.5, num_devices=nd,
        )
        try:
            groups = colocation_groups(g)
        except InvalidGraphError:  # a group pinned to two devices
            continue
        unpinned = graphs.random_dag(
            seed, 4 + seed % 4, edge_prob=0.5, max_compute_us=300, max_bytes=400,
            group_prob=0.3 * (seed % 2), pin_prob=0.0, num_devices=nd,
        )
        for given in (None, groups):
            bound = lower_bound_us(g, c, groups=given)
            best = _best_pinned_makespan(g, c, groups)
            assert best >= bound - 1e-6, (seed, given is not None, best, bound)
            raised += bound > lower_bound_us(unpinned, c, groups=given) + 1e-6
            checked += 1
    print("pins raised the bound on", raised, "of", checked)
    assert checked > 150 and raised > 20, (checked, raised)


@pytest.mark.parametrize("engine_name", ["python", "native"])
def test_a_link_carries_at_most_k_copies_in_flight(engine_name):
    #  p(10) --out k (1000 B)--> ck(10), k = 0, 1, 2    p on device 0; c0, c1, c2 on device 1
    # A copy: 0.01 us/B * 1000 B + 100 us = 110 us.
    # K = 1: whole copies hold the channel, 10-120, 120-230, 230-340; consumers at 120, 230, 340.
    # K = 2: a copy holds it for 10 + 100 / 2 = 60 us and arrives 50 us later: 10-70 (in at
    # 120), 70-130 (180), 130-190 (240). Two are in flight from 70 to 120; the third starts at
    # 130, once the first is in.
    # K = inf: the bytes alone hold it, 10-20, 20-30, 30-40; in at 120, 130, 140.
    from baechi_tf.placer import engine

    if engine_name == "native" and not engine.native_available():
        pytest.skip("the compiled engine is not built")
    b = OpGraphBuilder()
    b.add_op("p", 10, [1000, 1000, 1000])
    for k in range(3):
        b.add_op(f"c{k}", 10, [4])
        b.add_edge("p", f"c{k}", k)
    g = b.build()
    devices = tuple(Device(f"/job:worker/replica:0/task:{i}/device:CPU:0", 1 << 30, "CPU") for i in range(2))
    expected = {  # K: (transfers, consumers' starts, makespan)
        1: ([(10, 120), (120, 230), (230, 340)], [120, 230, 340], 350),
        2: ([(10, 120), (70, 180), (130, 240)], [120, 180, 240], 250),
        math.inf: ([(10, 120), (20, 130), (30, 140)], [120, 130, 140], 150),
    }
    for k, (transfers, starts, makespan) in expected.items():
        cluster = Cluster(devices, CommCost(0.01, 100, copies_in_flight=k))
        with engine.selected(engine_name):
            s = simulate(g, cluster, place(g, [0, 1, 1, 1]))
        assert sorted((t.start_us, t.end_us) for t in s.transfers) == transfers, k
        assert s.start_us.tolist()[1:] == starts and s.makespan_us == makespan, k
        in_flight = max(sum(t.start_us <= u < t.end_us for t in s.transfers) for u, _ in transfers)
        assert in_flight == min(k, 3), k
        assert_valid_schedule(g, cluster, Groups.singletons(g), s)
