"""m-SCT: favourite-child rounding, the device rules on the shared scheduler, brute force.

The core invariant tests (tests/test_placers.py, tests/test_properties.py) run every registered
method, m-SCT included; these are the m-SCT specific checks.
"""

import random

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.errors import ConfigError, InfeasiblePlacementError, SolverError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import Groups, colocation_groups, lower_bound_us, simulate
from baechi_tf.placer.m_etf import place_m_etf
from baechi_tf.placer.m_sct import MSCTOptions, favourite_children_of, place_m_sct, schedule_m_sct
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions, place
from baechi_tf.sct.rounding import favourite_children
from baechi_tf.sct.solvers import mosek_licence_problem
from invariants import assert_valid_schedule
from test_placers import brute_force_best  # every assignment of groups, scored by simulate

# ---------------------------------------------------------------- rounding


def test_threshold_ties_are_favourite():
    # The original's round(x - 0.1 + 0.5): 0.05 and 0.1 round to 0 (favourite), 0.11 to 1.
    src, dst = np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7])
    child, parent = favourite_children(src, dst, np.array([0.05, 0.1, 0.11, 1.0]), 8, 0.1)
    assert child[:4].tolist() == [4, 5, -1, -1]
    assert parent[4:].tolist() == [0, 1, -1, -1]


def test_conflicts_keep_the_firmest_arc():
    # With threshold 0.6 both arcs out of op 0 qualify; the smaller x wins, whatever the order.
    child, parent = favourite_children(np.array([0, 0]), np.array([1, 2]), np.array([0.55, 0.45]), 3, 0.6)
    assert child.tolist() == [2, -1, -1] and parent.tolist() == [-1, -1, 0]


def test_no_stale_parent():
    # Arcs u->a, u->b, w->a, all favourite. The original let u->b overwrite u's favourite while
    # a kept parent u; then w->a cleared u's favourite (b!) and made w a's parent. Here the first
    # arc holds, and the others, which would give u two children or a two parents, are dropped.
    u, a, b, w = 0, 1, 2, 3
    child, parent = favourite_children(np.array([u, u, w]), np.array([a, b, a]), np.zeros(3), 4, 0.1)
    assert child.tolist() == [a, -1, -1, -1]
    assert parent.tolist() == [-1, u, -1, -1]


@pytest.mark.parametrize("seed", range(20))
def test_favourites_form_a_matching(seed):
    rng = np.random.default_rng(seed)
    n = 30
    src = rng.integers(0, n, 80)
    dst = rng.integers(0, n, 80)
    x = rng.random(80).round(1)
    child, parent = favourite_children(src, dst, x, n, 0.7)
    for i, j in enumerate(child.tolist()):
        if j >= 0:
            assert parent[j] == i
            assert any(s == i and d == j and v <= 0.7 for s, d, v in zip(src, dst, x))
    assert (np.bincount(child[child >= 0], minlength=n) <= 1).all()


def test_threshold_is_checked():
    with pytest.raises(ConfigError, match=r"sct_threshold 1.5 must be in \[0, 1\)"):
        favourite_children(np.array([0]), np.array([1]), np.array([0.0]), 2, 1.5)


def test_favourite_children_of_a_chain_follow_it():
    child = favourite_children_of(graphs.chain(5), graphs.cluster(2))
    assert child.tolist() == [1, 2, 3, 4, -1]
    assert (favourite_children_of(graphs.chain(5), graphs.cluster(1)) == -1).all()  # no LP


# ---------------------------------------------------------------- device rules


def fork_with_tail(pin_c=None):
    """c comes before b in topological order; b carries 64 MiB from a and has a long tail.

          a            a -> c: 4 bytes     a -> b: 64 MiB (11.8 ms)
         / \\
        c   b -> d     d: 1000 us
    """
    b = OpGraphBuilder()
    b.add_op("a", 10, [64 << 20, 4])
    b.add_op("c", 100, [4], device=pin_c)
    b.add_op("b", 100, [4])
    b.add_op("d", 1000, [4])
    b.add_edge("a", "c", 1)
    b.add_edge("a", "b", 0)
    b.add_edge("b", "d")
    return b.build()


def test_device_is_kept_for_the_favourite_child():
    # After a (on one device), that device is kept for b, a's favourite child: c, which could
    # start there first in topological order (m-ETF runs it there), is held and goes to the
    # other device after the transfer; b then d follow a without a transfer: 10 + 100 + 1000.
    graph, cluster = fork_with_tail(), graphs.cluster(2)
    groups = Groups.singletons(graph)
    schedule = schedule_m_sct(graph, cluster, groups)
    dev = schedule.placement.device_of
    assert dev[0] == dev[2] == dev[3] != dev[1]
    assert schedule.start_us.tolist() == pytest.approx([0, 10 + CommCost()(4), 10, 110])
    assert schedule.makespan_us == pytest.approx(1110)
    assert simulate(graph, cluster, schedule.placement).makespan_us == pytest.approx(1110)
    etf = simulate(graph, cluster, place_m_etf(graph, cluster, groups))
    assert etf.makespan_us == pytest.approx(1210)  # c first on a's device, then b, then d


def test_an_urgent_op_may_take_a_kept_device():
    # c pinned to a's device can start nowhere else: it is urgent and runs at once, ahead of b.
    graph, cluster = fork_with_tail(pin_c="/device:GPU:0"), graphs.cluster(2)
    schedule = schedule_m_sct(graph, cluster, colocation_groups(graph))
    dev = schedule.placement.device_of
    assert dev[0] == dev[1] == 0
    assert schedule.start_us[1] == pytest.approx(10)


def test_the_favourite_goes_where_it_fits():
    # d's device cannot hold b's 64 MiB output: the favourite child runs elsewhere.
    mib = 1 << 20
    b = OpGraphBuilder()
    b.add_op("a", 10, [4], persistent_bytes=0, device="/device:GPU:0")
    b.add_op("b", 100, [80 * mib])
    b.add_op("c", 10, [4])
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    graph = b.build()
    small = Cluster((Device("/device:GPU:0", 64 * mib), Device("/device:GPU:1", 1 << 30)))
    schedule = schedule_m_sct(graph, small, colocation_groups(graph))
    assert schedule.placement.device_of.tolist() == [0, 1, 1]
    assert_valid_schedule(graph, small, colocation_groups(graph), schedule)


def test_solver_choice_reaches_the_lp():
    graph, cluster = graphs.fork_join(5), graphs.cluster(3)
    groups = Groups.singletons(graph)
    a = place_m_sct(graph, cluster, groups, options=MSCTOptions(lp_solver="highs"))
    b = place_m_sct(graph, cluster, groups, options=MSCTOptions(lp_solver="cvxopt"))
    for placement in (a, b):
        assert_valid_schedule(graph, cluster, groups, simulate(graph, cluster, placement))
    with pytest.raises(ConfigError, match="unknown LP solver 'glpk'"):
        place_m_sct(graph, cluster, groups, options=MSCTOptions(lp_solver="glpk"))


@pytest.mark.skipif(mosek_licence_problem() is None, reason="MOSEK is licensed here")
def test_mosek_without_licence_fails_the_step_clearly():
    with pytest.raises(SolverError, match=r"step 'place' failed.*MOSEK cannot solve without a licence.*highs"):
        place(graphs.diamond(), graphs.cluster(2), PlacementOptions(placement_method="m_sct", lp_solver="mosek"))


def test_pipeline_flags_reach_m_sct():
    graph, cluster = graphs.random_dag(3, 30, edge_prob=0.15), graphs.cluster(3)
    for threshold, solver, placer_type in [(0.0, "highs", "default"), (0.5, "cvxopt", "fusion"), (0.1, "auto", "fusion")]:
        options = PlacementOptions(
            placement_method="m_sct", sct_threshold=threshold, lp_solver=solver, placer_type=placer_type,
            grouper="coplace",
        )
        result = place(graph, cluster, options)
        assert result.placement.method == "m_sct"
        assert_valid_schedule(graph, cluster, result.groups, result.schedule)


def test_out_of_memory_is_reported_like_m_etf():
    graph, cluster = graphs.too_big_for_one(memory_bytes=50 << 20)
    with pytest.raises(InfeasiblePlacementError, match="no device can hold it"):
        place_m_sct(graph, cluster, colocation_groups(graph))


# ---------------------------------------------------------------- brute force


@pytest.mark.parametrize("seed", range(40))
def test_never_beats_brute_force(seed):
    n = 2 + seed % 6  # 2..7 ops
    graph = graphs.random_dag(seed, n, edge_prob=0.4, max_bytes=16 << 20, group_prob=0.2)
    cluster = graphs.cluster(2 + seed % 2)
    groups = colocation_groups(graph)
    schedule = simulate(graph, cluster, place_m_sct(graph, cluster, groups))
    assert_valid_schedule(graph, cluster, groups, schedule)
    best = brute_force_best(graph, cluster, groups)
    assert lower_bound_us(graph, cluster) - 1e-6 <= best <= schedule.makespan_us + 1e-6


def sct_graph(seed: int, n: int):
    """Random DAG meeting Hanen and Munier's condition: every transfer (<= 187 us) is shorter
    than every op (>= 300 us)."""
    rng = random.Random(seed)
    b = OpGraphBuilder()
    for i in range(n):
        b.add_op(f"op{i}", rng.uniform(300, 1000), [rng.randrange(4, 300_000)])
    for j in range(n):
        for i in range(j):
            if rng.random() < 0.4:
                b.add_edge(f"op{i}", f"op{j}")
    return b.build()


@pytest.mark.parametrize("seed", range(40))
def test_within_hanen_munier_factor_on_sct_graphs(seed):
    # Their bound for m processors, 1 + (1 - 1/m) * 4/3, proved without channel contention or
    # memory; it holds here with room to spare on small graphs.
    n, m = 3 + seed % 5, 2 + seed % 2
    graph, cluster = sct_graph(seed, n), graphs.cluster(m)
    groups = Groups.singletons(graph)
    makespan = simulate(graph, cluster, place_m_sct(graph, cluster, groups)).makespan_us
    best = brute_force_best(graph, cluster, groups)
    assert best - 1e-6 <= makespan <= (1 + (1 - 1 / m) * 4 / 3) * best


# ---------------------------------------------------------------- the LP size limit


def crossing_layers(layers: int, width: int):
    """Each op reads three ops of the layer before (no op cuts the graph)."""
    b = OpGraphBuilder()
    for layer in range(layers):
        for k in range(width):
            b.add_op(f"l{layer}/op{k}", 50 + (7 * k + layer) % 40, [4096])
            if layer:
                for d in (0, 1, 5):
                    b.add_edge(f"l{layer - 1}/op{(k + d) % width}", f"l{layer}/op{k}")
    return b.build()


def test_lp_size_limit_refuses_before_solving():
    graph = crossing_layers(6, 8)
    groups = Groups.singletons(graph)
    with pytest.raises(SolverError, match=r"piece of \d+ ops and \d+ arcs with a choice and 0 rows of control-only arcs that no op cuts, "
                       r"\d+ in all, above the limit of 10; no LP was attempted"):
        place_m_sct(graph, graphs.cluster(2), groups, options=MSCTOptions(max_lp_arcs=10))
    place_m_sct(graph, graphs.cluster(2), groups, options=MSCTOptions(max_lp_arcs=1000))


def test_auto_portfolio_gives_up_on_a_huge_uncut_lp():
    # 2400 ops, about 7000 arcs and no cut op: in auto, m-SCT refuses at once (auto skips it);
    # asked for by name it would solve the LP, however long that takes.
    graph = crossing_layers(60, 40)
    run = PLACEMENT_METHODS["m_sct"]
    with pytest.raises(SolverError, match="above the limit of 5000; no LP was attempted"):
        run(graph, graphs.cluster(2), Groups.singletons(graph), PlacementOptions(placement_method="auto"))
