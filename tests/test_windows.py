"""Window balancing: the incremental cost is the recounted cost, hand-computed costs, and the
search lowers its cost without breaking groups, pins or persistent memory."""

import random

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import CommCost
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import Placement, colocation_groups, place_m_etf, simulate
from baechi_tf.placer.auto.refine import RefineOptions, refine
from baechi_tf.placer.auto.windows import _Loads, balance_windows
from invariants import assert_valid_schedule

MiB = 1 << 20


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_cost_is_the_recounted_cost(seed, overlap):
    graph = graphs.random_dag(seed, 30, edge_prob=0.15, max_bytes=4 * MiB)
    cluster = graphs.cluster(3)
    rng = random.Random(seed)
    num_windows = 5
    window = [rng.randrange(num_windows) for _ in range(graph.num_ops)]
    loads = _Loads(graph, cluster, [rng.randrange(3) for _ in range(graph.num_ops)], window, num_windows, overlap)
    for _ in range(60):
        loads.move_op(rng.randrange(graph.num_ops), rng.randrange(3))
        loads.settle()
    fresh = _Loads(graph, cluster, list(loads.dev), window, num_windows, overlap)
    np.testing.assert_allclose(loads.load, fresh.load, atol=1e-6)
    assert loads.cost() == pytest.approx(fresh.cost())


def _window(*busy):
    """A window's cost from each device's busy time: the max, plus 5% of the root sum of squares."""
    return max(busy) + 0.05 * sum(v * v for v in busy) ** 0.5


def test_hand_computed_cost():
    # a (100 us) on device 0 sends 1 MB to b (300 us) and c (50 us) on device 1: one transfer of
    # 0.0001754 * 1e6 + 134 = 309.4 us on both channels, charged to a's window (0); b and c are
    # in window 1.
    b = OpGraphBuilder()
    b.add_op("a", 100, [1_000_000])
    b.add_op("b", 300, [4])
    b.add_op("c", 50, [4])
    b.add_edge("a", "b")
    b.add_edge("a", "c")
    graph = b.build()
    cluster = graphs.cluster(2)
    tt = 0.0001754 * 1_000_000 + 134
    summed = _Loads(graph, cluster, [0, 1, 1], [0, 1, 1], 2, overlap=False)
    assert summed.cost() == pytest.approx(_window(100 + tt, tt) + _window(0, 350))
    # With overlap, compute and channel are separate resources.
    overlapped = _Loads(graph, cluster, [0, 1, 1], [0, 1, 1], 2, overlap=True)
    assert overlapped.cost() == pytest.approx(_window(100, 0, tt, tt) + _window(0, 350, 0, 0))
    # b joins a on device 0: the tensor still goes to device 1 for c.
    summed.move_op(1, 0)
    summed.settle()
    assert summed.cost() == pytest.approx(_window(100 + tt, tt) + _window(300, 50))
    # c too: no transfer left.
    summed.move_op(2, 0)
    summed.settle()
    assert summed.cost() == pytest.approx(_window(100, 0) + _window(350, 0))
    # On a link of 4 copies in flight the copy holds the channels for its bytes and 134 / 4 us.
    held = 0.0001754 * 1_000_000 + 134 / 4
    flying = _Loads(graph, graphs.cluster(2, comm=CommCost(copies_in_flight=4)), [0, 1, 1], [0, 1, 1], 2,
                    overlap=False)
    assert flying.cost() == pytest.approx(_window(100 + held, held) + _window(0, 350))


def _schedule(graph, cluster, device_of):
    return simulate(graph, cluster, Placement(np.asarray(device_of), "test"))


def test_spreads_independent_ops():
    graph = graphs.independent(4, compute_us=1000)
    cluster = graphs.cluster(4)
    groups = colocation_groups(graph)
    device_of, moved = balance_windows(
        graph, cluster, groups, _schedule(graph, cluster, [0] * 4), 1, pinned=[False] * 4
    )
    assert sorted(device_of.tolist()) == [0, 1, 2, 3]
    assert moved > 0


def test_moves_groups_only_to_the_free_devices():
    """The last device is a host that runs only the ops pinned to it: nothing moves there, though
    four devices would spread the ops further."""
    graph = graphs.independent(6, compute_us=1000)
    cluster = graphs.cluster(4)
    groups = colocation_groups(graph)
    schedule = _schedule(graph, cluster, [0] * 6)
    spread, _ = balance_windows(graph, cluster, groups, schedule, 1, pinned=[False] * 6)
    assert spread.max() == 3  # unrestricted, it does use the last device
    device_of, _ = balance_windows(graph, cluster, groups, schedule, 1, pinned=[False] * 6, free_devices=3)
    assert sorted(device_of.tolist()) == [0, 0, 1, 1, 2, 2]


def test_groups_whole_pins_kept_and_persistent_room():
    # Three groups of two heavy ops on device 0 of three; group "p" is pinned; group "w" holds
    # 80 MiB of weights and devices have 100 MiB, of which device 2 already holds 60 MiB.
    b = OpGraphBuilder()
    b.add_op("w", 1000, [4], persistent_bytes=80 * MiB, colocation=["w"])
    b.add_op("w2", 1000, [4], colocation=["w"])
    b.add_op("p", 1000, [4], colocation=["p"], device="/device:GPU:0")
    b.add_op("p2", 1000, [4], colocation=["p"])
    b.add_op("h", 10, [4], persistent_bytes=60 * MiB)
    graph = b.build()
    cluster = graphs.cluster(3, memory_bytes=100 * MiB)
    groups = colocation_groups(graph)
    pinned = [bool(graph.pinned_device[int(m[0])]) for m in groups.members]
    start = _schedule(graph, cluster, [0, 0, 0, 0, 2])
    device_of, _ = balance_windows(graph, cluster, groups, start, 1, pinned=pinned)
    d = device_of.tolist()
    assert d[0] == d[1] and d[2] == d[3] == 0
    assert d[0] == 1  # off the busy device, and not onto device 2 (60 + 80 MiB > 100 MiB)
    assert_valid_schedule(graph, cluster, groups, _schedule(graph, cluster, d))


@pytest.mark.parametrize("seed", range(4))
def test_refinement_keeps_only_window_results_that_simulate_faster(seed):
    # Communication-heavy random graphs: window balancing proposes placements and refinement
    # keeps those the simulator confirms; the result is never worse than the start and valid.
    graph = graphs.random_dag(seed, 80, edge_prob=0.06, max_bytes=16 * MiB, max_compute_us=400)
    cluster = graphs.cluster(4, comm=CommCost(0.0002, 50))
    groups = colocation_groups(graph)
    start = place_m_etf(graph, cluster, groups)
    before = simulate(graph, cluster, start).makespan_us
    out, schedule, stats = refine(graph, cluster, groups, start, options=RefineOptions(0.5, seed))
    assert stats.windows_tried >= 1
    assert 0 <= stats.windows_accepted <= stats.windows_tried
    assert schedule.makespan_us <= before + 1e-6
    np.testing.assert_allclose(simulate(graph, cluster, out).end_us, schedule.end_us)
    assert_valid_schedule(graph, cluster, groups, schedule)


def test_stops_at_max_moves():
    graph = graphs.independent(40, compute_us=1000)
    cluster = graphs.cluster(4)
    groups = colocation_groups(graph)
    start = _schedule(graph, cluster, [0] * 40)
    free = [False] * 40
    _, unbounded = balance_windows(graph, cluster, groups, start, 1, pinned=free)
    device_of, moved = balance_windows(graph, cluster, groups, start, 1, pinned=free, max_moves=12)
    assert 12 <= moved < unbounded
    assert moved <= 12 + 2 * 3  # the group under way finishes its three devices
    assert np.count_nonzero(device_of) <= 2  # at most two moves made in that many tries


def test_a_pass_that_gains_little_ends_the_search():
    """The first pass over 60 ops piled on one device spreads them; later passes only polish.
    With a gain threshold of 100% of the cost every pass is the last; with none, passes go on
    while they improve anything."""
    graph = graphs.random_dag(7, 60, edge_prob=0.1, max_bytes=4 * MiB)
    cluster = graphs.cluster(4)
    groups = colocation_groups(graph)
    start = simulate(graph, cluster, Placement(np.zeros(60, dtype=np.int32), "one device"))
    free = [False] * groups.num_groups
    one_pass = 2 * 3 * 60  # each op tried on three devices and moved back
    _, moved = balance_windows(graph, cluster, groups, start, 8, pinned=free, min_pass_gain=1.0)
    assert moved == one_pass
    _, moved = balance_windows(graph, cluster, groups, start, 8, pinned=free, min_pass_gain=0.0)
    assert moved > one_pass
