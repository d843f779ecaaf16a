"""The m-SCT LP (baechi_tf.sct.lp) and its exact piecewise solve (baechi_tf.sct.relaxation)."""

import dataclasses

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.sct.lp import arc_comm_us, build_sct_lp, sct_lp
from baechi_tf.sct.relaxation import solve_sct_relaxation
from baechi_tf.sct.solvers import solve_lp

COMM = CommCost(0.0001754, 134)
C4 = COMM(4)  # a 4-byte tensor: 134.0007016 us


def build(ops, edges):
    """ops: name -> compute_us (4-byte output); edges: 'ab' strings."""
    b = OpGraphBuilder()
    for name, us in ops.items():
        b.add_op(name, us, [4])
    for s, d in edges:
        b.add_edge(s, d)
    return b.build()


def solve(graph, cluster=None):
    lp = build_sct_lp(graph, cluster or graphs.cluster(2, comm=COMM))
    return lp, solve_lp(lp, "highs")


# ---------------------------------------------------------------- known optima


def test_chain_pays_no_communication():
    # a -> b -> c: every op is its parent's only child, so x = 0 and w is the compute sum.
    lp, sol = solve(build({"a": 10, "b": 20, "c": 30}, ["ab", "bc"]))
    assert sol.w_us == pytest.approx(60)
    np.testing.assert_allclose(sol.x, 0, atol=1e-9)
    np.testing.assert_allclose(sol.s_us, [0, 10, 30], atol=1e-6)


def test_fork_splits_the_favourite_in_half():
    #     a          one favourite child at most: x_ab + x_ac >= 1, and the two paths
    #    / \\         10 + c x + 100 balance at x = 1/2: w = 110 + c/2.
    #   b   c
    lp, sol = solve(build({"a": 10, "b": 100, "c": 100}, ["ab", "ac"]))
    assert sol.w_us == pytest.approx(110 + C4 / 2)
    np.testing.assert_allclose(sol.x, [0.5, 0.5], atol=1e-6)


def test_join_splits_the_favourite_parent_in_half():
    #   a   b
    #    \\ /
    #     c
    lp, sol = solve(build({"a": 100, "b": 100, "c": 10}, ["ac", "bc"]))
    assert sol.w_us == pytest.approx(110 + C4 / 2)


def test_diamond_pays_one_transfer():
    #     a
    #    / \\      x_ab + x_ac >= 1 and x_bd + x_cd >= 1: some path pays one transfer in total,
    #   b   c     w = 30 + c (the original's toy diamond had x in {0, 1} too).
    #    \\ /
    #     d
    lp, sol = solve(build({"a": 10, "b": 10, "c": 10, "d": 10}, ["ab", "ac", "bd", "cd"]))
    assert sol.w_us == pytest.approx(30 + C4)


def test_independent_ops():
    lp, sol = solve(build({"a": 5, "b": 50, "c": 7}, []))
    assert lp.num_arcs == 0
    assert sol.w_us == pytest.approx(50)


def test_heavy_branch_becomes_the_favourite():
    # a -> b carries 64 MiB (C = 11.8 ms), a -> c 4 bytes (c): the paths balance where
    # C x_ab = c x_ac with x_ab + x_ac = 1, so x_ab = c / (C + c) ~ 0.011: b is the favourite.
    b = OpGraphBuilder()
    b.add_op("a", 10, [64 << 20, 4])
    b.add_op("b", 100, [4])
    b.add_op("c", 100, [4])
    b.add_edge("a", "b", 0)
    b.add_edge("a", "c", 1)
    lp, sol = solve(b.build())
    big = COMM(64 << 20)
    assert sol.w_us == pytest.approx(110 + big * C4 / (big + C4))
    np.testing.assert_allclose(sol.x, [C4 / (big + C4), big / (big + C4)], atol=1e-6)


# ---------------------------------------------------------------- c_ij and structure


def test_arc_costs_count_each_tensor_once_and_control_messages():
    b = OpGraphBuilder()
    b.add_op("a", 1, [1000, 2000])
    b.add_op("b", 1, [4])
    b.add_op("c", 1, [4])
    b.add_edge("a", "b", 0)
    b.add_edge("a", "b", 1)  # a second tensor on the same arc: a second transfer
    b.add_edge("a", "c", 0)
    b.add_control_edge("b", "c")  # a control message: the intercept
    src, dst, c = arc_comm_us(b.build(), graphs.cluster(2, comm=COMM))
    assert list(zip(src.tolist(), dst.tolist())) == [(0, 1), (0, 2), (1, 2)]
    np.testing.assert_allclose(c, [COMM(1000) + COMM(2000), COMM(1000), COMM(0)])


def test_slowest_line_and_single_device():
    graph = build({"a": 1, "b": 1}, ["ab"])
    two_tasks = Cluster(
        (Device("/job:w/replica:0/task:0/device:GPU:0", 1 << 30), Device("/job:w/replica:0/task:1/device:GPU:0", 1 << 30)),
        comm=COMM,
        inter_task_comm=CommCost(0.001, 500),
    )
    assert arc_comm_us(graph, two_tasks)[2][0] == pytest.approx(0.001 * 4 + 500)
    assert arc_comm_us(graph, graphs.cluster(1))[2][0] == 0


def dense_reference(p, arcs, c):
    """The LP rows written out one by one, for comparison with the vectorised builder."""
    n, a = len(p), len(arcs)
    nv = a + n + 1
    rows, rhs = [], []
    for k, (i, j) in enumerate(arcs):  # (1) precedence
        r = np.zeros(nv)
        r[a + i], r[a + j], r[k] = 1, -1, c[k]
        rows.append(r)
        rhs.append(-p[i])
    for end in (0, 1):  # (2) favourite child, (3) favourite parent
        for v in range(n):
            ks = [k for k, arc in enumerate(arcs) if arc[end] == v]
            if len(ks) >= 2:
                r = np.zeros(nv)
                r[ks] = -1
                rows.append(r)
                rhs.append(1 - len(ks))
    for v in range(n):  # (4) makespan
        if not any(i == v for i, _ in arcs):
            r = np.zeros(nv)
            r[a + v], r[-1] = 1, -1
            rows.append(r)
            rhs.append(-p[v])
    return np.array(rows), np.array(rhs)


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_rows_match_the_rows_written_out(seed):
    graph = graphs.random_dag(seed, 12, edge_prob=0.3)
    src, dst, c = arc_comm_us(graph, graphs.cluster(2))
    lp = sct_lp(graph.compute_us, src, dst, c)
    unit = lp.time_unit_us
    A, b = dense_reference(graph.compute_us / unit, list(zip(src.tolist(), dst.tolist())), c / unit)
    np.testing.assert_allclose(lp.A_ub.toarray(), A)
    np.testing.assert_allclose(lp.b_ub, b)
    assert sum(lp.rows_per_block) == lp.num_rows
    assert lp.num_vars == lp.num_arcs + graph.num_ops + 1
    assert (lp.lower == 0).all() and (lp.upper[: lp.num_arcs] == 1).all()
    assert np.isinf(lp.upper[lp.num_arcs :]).all()
    assert lp.c[lp.w_index] == 1 and lp.c.sum() == 1
    assert np.abs(lp.A_ub.data).max() <= 1 + 1e-12  # times in units of the largest one


def test_release_times_bound_the_starts():
    graph = build({"a": 10, "b": 20}, ["ab"])
    src, dst, c = arc_comm_us(graph, graphs.cluster(2))
    sol = solve_lp(sct_lp(graph.compute_us, src, dst, c, s_lower_us=np.array([100.0, 0.0])), "highs")
    assert sol.w_us == pytest.approx(130)
    assert sol.s_us[0] == pytest.approx(100)


# ---------------------------------------------------------------- the piecewise solve


def layers(num_layers, width=3, weights=True):
    """Blocks joined by one op, each block `width` parallel two-op branches; a weight (a source)
    feeds the first op of every branch. Every join is a cut op.

        j0 -> (b0 -> c0 | b1 -> c1 | ...) -> j1 -> ...      w -> b
    """
    b = OpGraphBuilder()
    b.add_op("j0", 5, [4096])
    for layer in range(num_layers):
        join = f"j{layer + 1}"
        b.add_op(join, 5 + layer, [4096])
        for k in range(width):
            first, second = f"l{layer}/b{k}", f"l{layer}/c{k}"
            b.add_op(first, 100 + 10 * k + layer, [1 << 20])
            b.add_op(second, 50 + 7 * k, [8192])
            b.add_edge(f"j{layer}", first)
            b.add_edge(first, second)
            b.add_edge(second, join)
            if weights:
                b.add_op(f"l{layer}/w{k}", 2, [4 << 20])
                b.add_edge(f"l{layer}/w{k}", first)
    return b.build()


@pytest.mark.parametrize(
    "graph",
    [layers(12), layers(6, width=5, weights=False), graphs.fork_join(6), graphs.diamond()]
    + [graphs.random_dag(seed, 40, edge_prob=0.12) for seed in range(6)],
)
def test_pieces_reach_the_optimum_of_the_whole_lp(graph):
    cluster = graphs.cluster(4)
    whole = solve_sct_relaxation(graph, cluster, solver="highs", reduce=False)
    pieces = solve_sct_relaxation(graph, cluster, solver="highs", piece_ops=10)
    assert pieces.w_us == pytest.approx(whole.w_us, rel=1e-9)
    # The returned x is feasible for the whole LP and reaches its optimum.
    full = sct_lp(graph.compute_us, pieces.arc_src, pieces.arc_dst, pieces.c_us)
    z = np.concatenate([pieces.x, pieces.s_us / full.time_unit_us, [pieces.w_us / full.time_unit_us]])
    assert (full.A_ub @ z <= full.b_ub + 1e-9).all()


def test_cut_ops_split_the_lp_and_weights_are_dropped():
    graph = layers(12)
    pieces = solve_sct_relaxation(graph, graphs.cluster(4), solver="highs", piece_ops=10)
    assert pieces.num_lps > 5
    assert pieces.lp_arcs < pieces.arc_src.shape[0]
    # Weight reads deep in the graph are dominated by the join before them: x = 1, no LP row.
    names = [graph.names[i] for i in pieces.arc_src.tolist()]
    late = [k for k, name in enumerate(names) if name.startswith("l11/w")]
    assert len(late) == 3 and (pieces.x[late] == 1).all()


def test_relaxation_of_an_empty_and_an_edgeless_graph():
    for graph in (build({}, []), build({"a": 3, "b": 9}, [])):
        r = solve_sct_relaxation(graph, graphs.cluster(2), solver="highs")
        assert r.num_lps == 0 and r.x.shape == (0,)
        assert r.w_us == pytest.approx(graph.compute_us.max(initial=0))


def test_time_unit_does_not_change_the_answer():
    graph = build({"a": 10, "b": 100, "c": 100}, ["ab", "ac"])
    lp, sol = solve(graph)
    # The same LP in microseconds (unit 1) by hand: the optimum is the same.
    unscaled = dataclasses.replace(
        lp,
        A_ub=lp.A_ub.multiply(np.where(np.arange(lp.num_vars) < lp.num_arcs, lp.time_unit_us, 1.0)).tocsr(),
        b_ub=lp.b_ub * lp.time_unit_us,
        time_unit_us=1.0,
    )
    assert solve_lp(unscaled, "highs").w_us == pytest.approx(sol.w_us)


def test_relaxation_reports_a_lower_bound_within_the_certificate():
    graph = layers(12)
    for reduce in (True, False):
        r = solve_sct_relaxation(graph, graphs.cluster(4), solver="highs", reduce=reduce, piece_ops=10)
        whole = solve_lp(build_sct_lp(graph, graphs.cluster(4)), "highs").w_us
        assert r.bound_us <= r.w_us
        assert r.bound_us == pytest.approx(whole, rel=1e-9)


# ---------------------------------------------------------------- control-only arcs


def control_biclique(senders=3, waiters=4, extra=True):
    """A source x feeding senders u0.. and waiters v0.. (data), every sender ordered before every
    waiter by a control edge (what ``tf.control_dependencies(update_ops)`` makes); with `extra`
    also a waiter 'lone' after u0 alone and a data arc u0 -> v0 (so that arc is not control-only)."""
    b = OpGraphBuilder()
    b.add_op("x", 5, [4096])
    for i in range(senders):
        b.add_op(f"u{i}", 10 + 10 * i, [1024])
        b.add_edge("x", f"u{i}")
    for j in range(waiters):
        b.add_op(f"v{j}", 40 + 5 * j, [4])
        b.add_edge("x", f"v{j}")
        for i in range(senders):
            b.add_control_edge(f"u{i}", f"v{j}")
    if extra:
        b.add_op("lone", 7, [4])
        b.add_control_edge("u0", "lone")
        b.add_edge("u0", "v0")
    return b.build()


def test_control_only_arcs_have_no_x_and_pay_their_message():
    # a -> b carries a tensor, a -> c only orders them: c waits for a's message whatever the LP
    # does, so b is a's favourite child and w = 10 + max(100, C + 100) with C the message's time.
    b = OpGraphBuilder()
    b.add_op("a", 10, [4])
    b.add_op("b", 100, [4])
    b.add_op("c", 100, [4])
    b.add_edge("a", "b")
    b.add_control_edge("a", "c")
    lp, sol = solve(b.build())
    assert lp.num_arcs == 1 and (lp.fixed_src.tolist(), lp.fixed_dst.tolist()) == ([0], [2])
    assert lp.num_barriers == 0 and lp.rows_per_block[4] == 1
    assert sol.w_us == pytest.approx(110 + COMM(0))
    np.testing.assert_allclose(sol.x, [0.0], atol=1e-9)  # nothing else can be the favourite


def test_a_set_of_control_predecessors_that_ops_share_is_one_barrier():
    from scipy.optimize import linprog

    graph = control_biclique()
    cluster = graphs.cluster(2, comm=COMM)
    lp = build_sct_lp(graph, cluster)
    # 3 senders x 4 waiters of control-only arcs (u0 -> v0 also carries a tensor, so v0's set is
    # u1, u2 and v0 has its own rows): u0..u2 -> b -> v1..v3 is 3 + 3 rows, v0 2 rows, lone 1.
    assert lp.num_barriers == 1 and lp.rows_per_block[4] == 3 + 3 + 2 + 1
    assert lp.num_vars == lp.num_arcs + graph.num_ops + 1 + 1
    # The same LP with one row per control-only arc, written out: the same optimum.
    src, dst, c = arc_comm_us(graph, cluster)
    data = np.array([any(s == i and d == j for s, d in zip(graph.edge_src[~graph.is_control].tolist(),
                                                          graph.edge_dst[~graph.is_control].tolist()))
                     for i, j in zip(src.tolist(), dst.tolist())])
    control = ~data
    assert control.sum() == 3 * 4 - 1 + 1
    unit = lp.time_unit_us
    arcs = list(zip(src[data].tolist(), dst[data].tolist()))
    A, rhs = dense_reference(graph.compute_us / unit, arcs, c[data] / unit)
    direct = []
    for i, j, cij in zip(src[control].tolist(), dst[control].tolist(), c[control].tolist()):
        row = np.zeros(A.shape[1])
        row[len(arcs) + i], row[len(arcs) + j] = 1, -1
        direct.append((row, -(graph.compute_us[i] + cij) / unit))
    A = np.vstack([A] + [r for r, _ in direct])
    rhs = np.concatenate([rhs, [v for _, v in direct]])
    cost = np.zeros(A.shape[1])
    cost[-1] = 1
    bounds = [(0, 1)] * len(arcs) + [(0, None)] * (graph.num_ops + 1)
    reference = linprog(cost, A_ub=A, b_ub=rhs, bounds=bounds, method="highs")
    assert reference.status == 0
    for solver in ("highs", "cvxopt"):
        assert solve_lp(lp, solver).w_us == pytest.approx(reference.fun * unit, rel=1e-6), solver


def test_the_certificate_follows_control_only_arcs_through_barriers():
    from baechi_tf.sct import solvers

    graph = control_biclique()
    lp = build_sct_lp(graph, graphs.cluster(2, comm=COMM))
    best = solve_lp(lp, "highs")
    makespan, _ = solvers._certified_gap(lp, best.x, np.zeros(lp.num_rows))
    # The waiters start after every sender's message: the longest path goes through them.
    assert makespan * lp.time_unit_us == pytest.approx(best.w_us, rel=1e-9)
    assert makespan * lp.time_unit_us >= 5 + 30 + COMM(0) + 55 - 1e-6  # x, u2, message, v3
    implied = solvers._implied_lower(lp)
    assert implied[lp.w_index + 1 :].all()  # the barrier's b >= 0 follows from its rows


def test_relaxation_gives_control_only_arcs_x_one_and_reaches_the_whole_optimum():
    graph = control_biclique(senders=4, waiters=6)
    cluster = graphs.cluster(4, comm=COMM)
    whole = solve_sct_relaxation(graph, cluster, solver="highs", reduce=False)
    pieces = solve_sct_relaxation(graph, cluster, solver="highs", piece_ops=3)
    assert pieces.w_us == pytest.approx(whole.w_us, rel=1e-9)
    data = {(s, d) for s, d in zip(graph.edge_src[~graph.is_control].tolist(), graph.edge_dst[~graph.is_control].tolist())}
    control = np.array([(i, j) not in data for i, j in zip(pieces.arc_src.tolist(), pieces.arc_dst.tolist())])
    assert control.sum() == 4 * 6 - 1 + 1  # u0 -> v0 carries a tensor; u0 -> lone does not
    assert (pieces.x[control] == 1).all() and (whole.x[control] == 1).all()


def test_the_size_limit_counts_control_only_arcs_as_the_rows_they_take():
    # 8 arcs with a choice, and 11 control-only arcs written as 9 rows through a barrier: an LP of
    # 17, not 19, which a limit of 17 lets through and one of 16 refuses before solving.
    from baechi_tf.errors import SolverError

    graph = control_biclique()
    cluster = graphs.cluster(2, comm=COMM)
    solve_sct_relaxation(graph, cluster, solver="highs", reduce=False, max_lp_arcs=17)
    with pytest.raises(SolverError, match=r"piece of 9 ops and 8 arcs with a choice and 9 rows of control-only "
                       r"arcs that no op cuts, 17 in all, above the limit of 16; no LP was attempted"):
        solve_sct_relaxation(graph, cluster, solver="highs", reduce=False, max_lp_arcs=16)
