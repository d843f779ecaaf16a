"""LP back ends (baechi_tf.sct.solvers): agreement, statuses, MOSEK up to its licence."""

import dataclasses
import logging
import re

import numpy as np
import pytest

import graphs
from baechi_tf.errors import ConfigError, SolverError
from baechi_tf.sct.lp import build_sct_lp
from baechi_tf.sct.solvers import _mosek_task, choose_solver, mosek_licence_problem, solve_lp

mosek = pytest.importorskip("mosek")
LICENCE_PROBLEM = mosek_licence_problem()
BACKENDS = ["highs", "cvxopt"] + ([] if LICENCE_PROBLEM else ["mosek"])

LPS = {
    "diamond": lambda: build_sct_lp(graphs.diamond(), graphs.cluster(2)),
    "fork_join": lambda: build_sct_lp(graphs.fork_join(5), graphs.cluster(4)),
    "chain": lambda: build_sct_lp(graphs.chain(6), graphs.cluster(2)),
    **{
        f"random{seed}": (lambda seed=seed: build_sct_lp(
            graphs.random_dag(seed, 60 + 40 * seed, edge_prob=0.08, max_bytes=8 << 20), graphs.cluster(3)
        ))
        for seed in range(4)
    },
}


@pytest.mark.parametrize("name", sorted(LPS))
def test_back_ends_agree_on_the_optimum(name):
    lp = LPS[name]()
    results = {b: solve_lp(lp, b) for b in BACKENDS}
    reference = results["highs"].w_us
    for backend, sol in results.items():
        assert sol.solver == backend
        # cvxopt is an interior-point method: optimal to its relative gap of 1e-6.
        assert sol.w_us == pytest.approx(reference, rel=2e-6), backend
        assert sol.x.shape == (lp.num_arcs,) and ((sol.x >= 0) & (sol.x <= 1)).all()
        # Each answer is feasible for the LP (to the solver's tolerance).
        z = np.concatenate([sol.x, sol.s_us, [sol.w_us]]) / np.r_[np.ones(lp.num_arcs), np.full(lp.num_ops + 1, lp.time_unit_us)]
        assert (lp.A_ub @ z <= lp.b_ub + 1e-6).all(), backend


def infeasible(lp):
    """The same LP with w capped at 0 while ops take time: no solution."""
    upper = lp.upper.copy()
    upper[lp.w_index] = 0.0
    return dataclasses.replace(lp, upper=upper)


def test_highs_infeasible_raises_with_its_words():
    with pytest.raises(SolverError, match=r"HiGHS did not solve the m-SCT LP \(9 variables, 7 rows\): .*infeasible"):
        solve_lp(infeasible(LPS["diamond"]()), "highs")


def test_cvxopt_infeasible_raises_with_its_status():
    with pytest.raises(SolverError, match=r"cvxopt did not solve .*status 'primal infeasible'.*--lp_solver=highs"):
        solve_lp(infeasible(LPS["diamond"]()), "cvxopt")


def test_unknown_solver():
    with pytest.raises(ConfigError, match="unknown LP solver 'gurobi'; choose one of auto, mosek, highs, cvxopt"):
        solve_lp(LPS["diamond"](), "gurobi")


def test_mosek_task_holds_the_lp():
    # Building the task needs no licence: everything up to optimize() runs here.
    lp = LPS["fork_join"]()
    with mosek.Env() as env, _mosek_task(env, lp) as task:
        assert task.getnumvar() == lp.num_vars
        assert task.getnumcon() == lp.num_rows
        assert task.getnumanz() == lp.A_ub.nnz
        rows, cols, vals = task.getacolslicetrip(0, lp.num_vars)
        dense = np.zeros((lp.num_rows, lp.num_vars))
        dense[np.asarray(rows), np.asarray(cols)] = vals
        np.testing.assert_array_equal(dense, lp.A_ub.toarray())
        np.testing.assert_array_equal(task.getcslice(0, lp.num_vars), lp.c)
        keys, lower, upper = task.getvarboundslice(0, lp.num_vars)
        assert keys == [mosek.boundkey.ra] * lp.num_arcs + [mosek.boundkey.lo] * (lp.num_ops + 1)
        np.testing.assert_array_equal(lower, lp.lower)
        np.testing.assert_array_equal(np.asarray(upper)[: lp.num_arcs], 1.0)
        keys, _, upper = task.getconboundslice(0, lp.num_rows)
        assert set(keys) == {mosek.boundkey.up}
        np.testing.assert_array_equal(upper, lp.b_ub)
        assert task.getobjsense() == mosek.objsense.minimize


@pytest.mark.skipif(LICENCE_PROBLEM is None, reason="MOSEK is licensed here: the licence error cannot happen")
def test_mosek_without_licence_says_how_to_get_one():
    assert "licence" in LICENCE_PROBLEM
    with pytest.raises(
        SolverError,
        match=r"MOSEK cannot solve without a licence \(rescode\.err_\w*licen\w*.*\): get a licence file .*"
        r"mosek\.com.*MOSEKLM_LICENSE_FILE.*--lp_solver=highs",
    ):
        solve_lp(LPS["diamond"](), "mosek")


def test_auto_takes_mosek_only_when_licensed(caplog):
    with caplog.at_level(logging.INFO, logger="baechi_tf.sct.solvers"):
        chosen = choose_solver("auto")
    if LICENCE_PROBLEM is None:
        assert chosen == "mosek"
    else:
        assert chosen == "highs"
        assert "m-SCT LP solver: highs (MOSEK has no usable licence" in caplog.text
    assert solve_lp(LPS["diamond"](), "auto").solver == chosen


def _layered(n):
    """bench/layered.py's seeded graph: an LP HiGHS needs more than a microsecond for."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    from layered import layered_graph

    return layered_graph(n, seed=3)


def test_auto_falls_back_when_highs_runs_out_of_time(caplog):
    """A time limit HiGHS cannot meet: `auto` warns and cvxopt solves the same LP."""
    import logging

    from baechi_tf.cluster import Cluster
    from baechi_tf.sct.relaxation import solve_sct_relaxation

    graph = _layered(600)
    cluster = Cluster.homogeneous(4, 1 << 34)
    exact = solve_sct_relaxation(graph, cluster, solver="highs")
    with caplog.at_level(logging.WARNING, logger="baechi_tf.sct.solvers"):
        fell_back = solve_sct_relaxation(graph, cluster, solver="auto", time_limit_s=1e-6)
    assert any("falling back to cvxopt" in r.getMessage() and "lp_time_limit" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert fell_back.w_us == pytest.approx(exact.w_us, rel=1e-5)


def test_a_named_solver_out_of_time_is_an_error():
    from baechi_tf.cluster import Cluster
    from baechi_tf.errors import SolverError
    from baechi_tf.sct.relaxation import solve_sct_relaxation

    with pytest.raises(SolverError, match="within --lp_time_limit"):
        solve_sct_relaxation(_layered(600), Cluster.homogeneous(4, 1 << 34),
                             solver="highs", time_limit_s=1e-6)


def _feasible(lp, sol):
    z = np.concatenate([sol.x, sol.s_us / lp.time_unit_us, [sol.w_us / lp.time_unit_us]])
    return (lp.A_ub @ z <= lp.b_ub + 1e-6).all() and (z >= lp.lower - 1e-9).all()


def test_highs_gives_simplex_a_pivot_budget_only_on_large_lps():
    from baechi_tf.cluster import Cluster
    from baechi_tf.sct.solvers import _highs_pivot_budget

    assert _highs_pivot_budget(LPS["random3"]()) is None
    assert solve_lp(LPS["random3"](), "highs").method == "highs-ds"
    big = build_sct_lp(_layered(3000), Cluster.homogeneous(4, 1 << 34))  # built, not solved
    assert big.num_arcs > 5000
    assert _highs_pivot_budget(big) == big.num_rows


def test_highs_hands_an_lp_simplex_cannot_finish_to_interior_point(monkeypatch, caplog):
    """With the budget shrunk, a small layered LP goes the way large ones go: simplex stops,
    interior point solves. Both reach the optimum; the LP has many optimal vertices, so their x
    (and favourite children) may differ, but each x is feasible at that optimum."""
    from baechi_tf.cluster import Cluster
    from baechi_tf.sct import solvers

    lp = build_sct_lp(_layered(600), Cluster.homogeneous(4, 1 << 34))
    simplex = solve_lp(lp, "highs")
    monkeypatch.setattr(solvers, "_HIGHS_SIMPLEX_ARCS", 0)
    monkeypatch.setattr(solvers, "_HIGHS_PIVOTS_PER_ROW", 0.01)
    with caplog.at_level(logging.INFO, logger="baechi_tf.sct.solvers"):
        ipm = solve_lp(lp, "highs")
    assert (simplex.method, ipm.method) == ("highs-ds", "highs-ipm")
    assert f"dual simplex not done after {int(0.01 * lp.num_rows)} pivots" in caplog.text
    assert ipm.w_us == pytest.approx(simplex.w_us, rel=1e-7)
    assert _feasible(lp, simplex) and _feasible(lp, ipm)


def test_interior_point_gets_what_simplex_left_of_the_time_limit(monkeypatch):
    """Simplex stops at its budget having used all of --lp_time_limit (a clock that jumps 10 s):
    interior point is not started, and the limit's error says why."""
    import types

    from baechi_tf.cluster import Cluster
    from baechi_tf.sct import solvers

    monkeypatch.setattr(solvers, "_HIGHS_SIMPLEX_ARCS", 0)
    monkeypatch.setattr(solvers, "_HIGHS_PIVOTS_PER_ROW", 0.01)
    monkeypatch.setattr(solvers, "time", types.SimpleNamespace(monotonic=iter([0.0, 10.0]).__next__))
    lp = build_sct_lp(_layered(600), Cluster.homogeneous(4, 1 << 34))
    with pytest.raises(SolverError, match=r"within --lp_time_limit=5 s: dual simplex used it all in \d+ pivots"):
        solve_lp(lp, "highs", time_limit_s=5.0)


def test_interior_point_answer_is_certified_by_its_dual_bound(monkeypatch):
    """Interior point stops inside the optimal face, without crossover: its bound is a lower bound
    of simplex's optimum and within the certified gap of the makespan of its own x."""
    from baechi_tf.cluster import Cluster
    from baechi_tf.sct import solvers

    lp = build_sct_lp(_layered(600), Cluster.homogeneous(4, 1 << 34))
    simplex = solve_lp(lp, "highs")
    assert simplex.bound_us == simplex.w_us
    monkeypatch.setattr(solvers, "_HIGHS_SIMPLEX_ARCS", 0)
    monkeypatch.setattr(solvers, "_HIGHS_PIVOTS_PER_ROW", 0.01)
    ipm = solve_lp(lp, "highs")
    assert ipm.method == "highs-ipm"
    assert ipm.bound_us <= simplex.w_us * (1 + 1e-12)
    assert ipm.bound_us >= simplex.w_us * (1 - solvers._IPM_CERTIFIED_RTOL)
    makespan, bound = solvers._certified_gap(lp, ipm.x, np.zeros(lp.num_rows))
    assert makespan * lp.time_unit_us >= simplex.w_us * (1 - 1e-9)  # the x's own makespan, feasible
    assert bound == 0.0  # no multipliers: only w >= 0

    monkeypatch.setattr(solvers, "_IPM_CERTIFIED_RTOL", -1.0)
    with pytest.raises(SolverError, match=r"interior point left the m-SCT LP .* above its dual bound .*--lp_solver=cvxopt"):
        solve_lp(lp, "highs")


@pytest.mark.parametrize("name", sorted(LPS))
def test_any_nonnegative_row_multipliers_bound_the_optimum(name):
    """Weak duality over the box that caps starts at a feasible makespan (that of x = 1, every
    transfer paid): never above the optimum, whatever the multipliers."""
    from baechi_tf.sct import solvers

    lp = LPS[name]()
    optimum = solve_lp(lp, "highs").w_us / lp.time_unit_us
    x = np.ones(lp.num_arcs)  # every transfer paid: feasible
    rng = np.random.default_rng(len(name))
    for _ in range(5):
        duals = -rng.exponential(rng.choice([1e-3, 0.1, 1.0]), lp.num_rows)
        makespan, bound = solvers._certified_gap(lp, x, duals)
        assert bound <= optimum * (1 + 1e-12) + 1e-12 <= makespan * (1 + 1e-12) + 1e-12


# ---------------------------------------------------------------- cvxopt's rows, auto's order


def _released_chain():
    """a -> b -> c (10, 20, 30 us), c released at 500 us: its bound is not implied by b's end.

        a --> b --> c (s_c >= 500)
    """
    from baechi_tf.sct.lp import sct_lp

    return sct_lp(np.array([10.0, 20.0, 30.0]), np.array([0, 1]), np.array([1, 2]), np.array([134.0, 134.0]),
                  s_lower_us=np.array([0.0, 0.0, 500.0]))


def test_implied_lower_bounds_are_those_behind_a_predecessor_or_a_sink():
    from baechi_tf.sct.solvers import _implied_lower

    lp = _released_chain()
    # x_ab, x_bc: no row implies x >= 0; s_a: a source; s_b: behind a; s_c: released past b's end;
    # w: behind the sink c.
    assert _implied_lower(lp).tolist() == [False, False, False, True, False, True]
    fork = LPS["fork_join"]()
    implied = _implied_lower(fork)
    has_pred = np.bincount(fork.arc_dst, minlength=fork.num_ops) > 0
    assert implied[fork.num_arcs : fork.w_index].tolist() == has_pred.tolist()
    assert not implied[: fork.num_arcs].any() and implied[fork.w_index]


@pytest.mark.parametrize("name", sorted(LPS) + ["released_chain"])
def test_lp_without_implied_lower_bounds_has_the_same_optimum(name):
    """The rows cvxopt gets (`_cvxopt_rows`: no lower bound the rows imply, every variable
    otherwise free) have the full LP's optimum, solved by each back end that runs here (HiGHS
    and cvxopt; MOSEK has no licence on the machines that run the tests)."""
    import cvxopt
    import cvxopt.solvers
    from scipy.optimize import linprog

    from baechi_tf.sct.solvers import _cvxopt_rows, _implied_lower

    lp = _released_chain() if name == "released_chain" else LPS[name]()
    optimum = solve_lp(lp, "highs").w_us / lp.time_unit_us
    G, h = _cvxopt_rows(lp)
    dropped = int(_implied_lower(lp).sum())
    assert dropped >= 2 and G.shape == (lp.num_rows + lp.num_vars - dropped + lp.num_arcs, lp.num_vars)
    highs = linprog(lp.c, A_ub=G.tocsr(), b_ub=h, bounds=(None, None), method="highs")
    assert highs.status == 0 and highs.fun == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    G_cvx = cvxopt.spmatrix(G.data.tolist(), G.row.tolist(), G.col.tolist(), G.shape)
    sol = cvxopt.solvers.lp(cvxopt.matrix(lp.c), G_cvx, cvxopt.matrix(h), options={"show_progress": False})
    assert sol["status"] == "optimal" and sol["primal objective"] == pytest.approx(optimum, rel=2e-6)
    # And the back end itself, certified.
    assert solve_lp(lp, "cvxopt").bound_us / lp.time_unit_us == pytest.approx(optimum, rel=1e-6)


def test_auto_sends_large_sparse_lps_to_cvxopt_first_unless_timed():
    from baechi_tf.sct.solvers import back_ends

    small, large = LPS["random3"](), build_sct_lp(_layered(3000), graphs.cluster(4))  # built, not solved
    assert small.num_arcs <= 5000 < large.num_arcs
    assert back_ends("auto", "highs", small) == ("highs", "cvxopt")
    assert back_ends("auto", "highs", large) == ("cvxopt", "highs")
    assert back_ends("auto", "highs", large, time_limit_s=5.0) == ("highs", "cvxopt")  # cvxopt has no limit
    assert back_ends("auto", "mosek", large) == ("mosek", "highs", "cvxopt")
    for named in ("highs", "cvxopt", "mosek"):
        assert back_ends(named, named, large) == (named,)


def test_auto_keeps_large_lps_with_dense_normal_equations_on_highs():
    """An op with thousands of arcs puts them all in one favourite-child row, a clique of the
    normal equations that cvxopt factors: such an LP stays with HiGHS (cvxopt's factor filled
    in on tf_keras MobileNetV2's and DenseNet121's LPs, which simplex finishes)."""
    from baechi_tf.sct.solvers import _CVXOPT_MAX_DENSITY, back_ends, normal_density

    sparse = build_sct_lp(_layered(3000), graphs.cluster(4))  # puts bench/ on the path
    from layered import fan_out_graph

    dense = build_sct_lp(fan_out_graph(16000), graphs.cluster(4))
    assert dense.num_arcs > 5000 and normal_density(dense) > _CVXOPT_MAX_DENSITY >= normal_density(sparse)
    assert back_ends("auto", "highs", dense) == ("highs", "cvxopt")
    assert back_ends("auto", "highs", sparse) == ("cvxopt", "highs")


def test_auto_solves_a_large_dense_lp_by_highs():
    """The whole LP of a fan-out of 1,499 ops (6k arcs, one favourite-child row of 1,499): auto
    hands it to HiGHS, not to cvxopt."""
    from baechi_tf.cluster import Cluster
    from baechi_tf.sct.relaxation import solve_sct_relaxation
    from baechi_tf.sct.solvers import _CVXOPT_MAX_DENSITY, normal_density

    _layered(1)  # puts bench/ on the path
    from layered import fan_out_graph

    graph, cluster = fan_out_graph(4500), Cluster.homogeneous(4, 1 << 34)
    lp = build_sct_lp(graph, cluster)
    assert lp.num_arcs > 5000 and normal_density(lp) > _CVXOPT_MAX_DENSITY
    assert solve_sct_relaxation(graph, cluster, solver="auto", reduce=False).solver == "highs"


@pytest.mark.parametrize("shape", ["layered", "fan_out"])
def test_normal_density_bounds_the_normal_equations_per_column(shape):
    """`normal_density` is at least the nonzeros per column of A^T A, which it stands for."""
    from baechi_tf.sct.solvers import normal_density

    graph = _layered(600)
    if shape == "fan_out":
        from layered import fan_out_graph

        graph = fan_out_graph(300)
    lp = build_sct_lp(graph, graphs.cluster(4))
    a = lp.A_ub.tocsc()
    a.data[:] = 1.0
    assert (a.T @ a).nnz / lp.num_vars <= normal_density(lp) <= lp.A_ub.nnz * lp.A_ub.shape[0] / lp.num_vars


def test_a_large_piece_is_solved_by_cvxopt_and_certified(monkeypatch):
    """With the size threshold at 0, a small layered graph's piece goes the way large ones go
    under auto: cvxopt solves it, and its bound is a certified lower bound of simplex's optimum
    within the certified gap of its makespan."""
    from baechi_tf.cluster import Cluster
    from baechi_tf.sct import solvers
    from baechi_tf.sct.relaxation import solve_sct_relaxation

    graph, cluster = _layered(600), Cluster.homogeneous(4, 1 << 34)
    simplex = solve_sct_relaxation(graph, cluster, solver="highs")
    monkeypatch.setattr(solvers, "_LARGE_LP_ARCS", 0)
    ipm = solve_sct_relaxation(graph, cluster, solver="auto")
    assert (simplex.solver, ipm.solver) == ("highs", "cvxopt")
    assert ipm.w_us == pytest.approx(simplex.w_us, rel=1e-6)
    assert simplex.w_us * (1 - solvers._IPM_CERTIFIED_RTOL) <= ipm.bound_us <= simplex.w_us * (1 + 1e-12)


def test_auto_falls_back_to_highs_when_cvxopt_cannot_certify(monkeypatch, caplog):
    from baechi_tf.cluster import Cluster
    from baechi_tf.sct import solvers
    from baechi_tf.sct.relaxation import solve_sct_relaxation

    monkeypatch.setattr(solvers, "_LARGE_LP_ARCS", 0)
    monkeypatch.setattr(solvers, "_IPM_CERTIFIED_RTOL", -1.0)  # no interior point passes
    with caplog.at_level(logging.WARNING, logger="baechi_tf.sct.solvers"):
        r = solve_sct_relaxation(_layered(600), Cluster.homogeneous(4, 1 << 34), solver="auto")
    assert r.solver == "highs"  # dual simplex: a vertex, not certified by duals
    assert re.search(r"LP solver cvxopt failed \(cvxopt's interior point left the m-SCT LP .* above its "
                     r"dual bound .*--lp_solver=highs\); falling back to highs", caplog.text), caplog.text


def test_lp_scaling_solves_the_lp_with_each_highs_method_alone():
    # bench/lp_scaling.py's "highs-ds" and "highs-ipm" columns call one HiGHS method each; they
    # called a private helper with arguments it no longer took, and failed.
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import lp_scaling

    rows = {how: lp_scaling.measure_lp("layered", 200, how) for how in ("highs-ds", "highs-ipm", "highs")}
    assert rows["highs-ds"]["w"] == pytest.approx(rows["highs"]["w"], rel=1e-6)
    assert rows["highs-ipm"]["w"] == pytest.approx(rows["highs"]["w"], rel=1e-6)
    assert rows["highs-ds"]["pivots_per_row"] > 0
