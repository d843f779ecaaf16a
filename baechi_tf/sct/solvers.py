"""LP back ends for m-SCT: MOSEK, HiGHS and cvxopt, chosen with ``--lp_solver``.

* ``mosek``: MOSEK through its own Python API (``pip install Mosek``); needs a licence.
* ``highs``: HiGHS; no licence. Dual simplex (``scipy.optimize.linprog``, ``method="highs-ds"``)
  solves every LP of at most 5000 arcs. A larger LP gets as many simplex pivots as it has rows;
  if simplex is not done by then, HiGHS's interior-point method (``"highs-ipm"``, IPX through
  ``highspy``, HiGHS's own Python API) solves it from the start, on the dual LP
  (``ipx_dualize_strategy=1``) and without crossover to a vertex. Simplex needed 0.45-0.65
  pivots per row on model-shaped LPs (the pieces of bench/lp_scaling.py's ``model`` graphs and of
  the GNMT, Inception and Transformer profiles, up to 39k arcs) but 2.6-4.7 on
  bench/layered.py's graphs of 5k-10k ops (9k-18k arcs), at a cost per pivot growing with the LP,
  while on model shapes interior point is 1.3-4 times slower than simplex. The budget counts
  pivots, not seconds, so the choice does not depend on the machine. `LPSolution.method` says
  which method solved.

  Interior point without crossover returns a point inside the optimal face, not a vertex, optimal
  only to IPX's tolerances, so its answer is certified (`_certified_gap`): the makespan of its x
  (a longest path, so a feasible value) and, by weak duality from its row duals, a lower bound
  of the optimum, which `LPSolution.bound_us` reports. A solve whose makespan is more than
  `_IPM_CERTIFIED_RTOL` (relative) above its bound raises `SolverError`. Simplex and MOSEK
  report their own optimum as the bound. The LP has many optimal points and the methods may end
  at different ones, hence at different favourite children: under ``highs`` every LP of
  bench/quality.py's graphs is solved by simplex. An interior point has fewer arcs at or below the rounding
  threshold than a vertex (about 30% fewer favourite children on bench/layered.py's graphs of
  3k-10k ops), and m-SCT's makespans there were within -4.7% to +0.9% of those from a vertex.
  On those LPs (10k-20k arcs) IPX on the dual LP takes 0.55-0.65 of the time it takes on the
  primal one, and crossover would add about 10%. Model-shaped LPs rarely get here (simplex
  finishes them within budget), and on them the dual LP is the slower one.
* ``cvxopt``: ``cvxopt.solvers.lp``, a primal-dual interior-point method that factors its
  normal equations with CHOLMOD's sparse Cholesky. cvxopt has no bounds, so they become rows,
  except the lower bounds that the rows already imply (`_cvxopt_rows`: a start behind a
  predecessor, w behind a sink): the same feasible set, with one row fewer per op to factor.
  Its answer is an interior point too, certified as HiGHS's is.
* ``auto``: MOSEK when it is importable and licensed, else HiGHS; logs which. A back end that
  fails or runs out of time hands the LP to the next of MOSEK, HiGHS, cvxopt. Without MOSEK, an
  LP of more than `_LARGE_LP_ARCS` arcs (5000, the size from which HiGHS gives simplex a budget)
  whose normal equations are sparse (`normal_density` at most `_CVXOPT_MAX_DENSITY`) goes to
  cvxopt first and to HiGHS if cvxopt fails (`back_ends`). cvxopt factors the normal equations
  directly (CHOLMOD): on bench/layered.py's graphs, where no op cuts the LP and simplex spends
  its whole budget before interior point starts afresh, and on the GNMT profile's 9k-arc LP, that
  took less time than either of HiGHS's methods (IPX's iterative linear solves are slow there).
  Where an op has many arcs, the normal equations hold a clique of them and their Cholesky factor
  fills in: the LPs of tf_keras ResNet50, MobileNetV2 and DenseNet121 training steps have a
  density of 69, 177 and 470, against 8-10 for the others, and cvxopt spends seconds to minutes
  and gigabytes on them where HiGHS's simplex finishes within its budget or IPX within bounded
  memory; they stay with HiGHS (`bench/lp_backends.py` times each back end). With
  ``--lp_time_limit`` the order stays HiGHS first, since cvxopt cannot stop at a time limit. The
  LP has many optimal points and the back ends end at different ones (different favourite
  children).

Every solve checks the solver's status; a failed, infeasible or unfinished solve raises
`SolverError` with the solver's own words. The result is in microseconds, with ``x`` clipped to
``[0, 1]`` (solvers may return values a tolerance outside).

Baechi's original solved the LP with ``cvxopt.solvers.lp(..., solver='mosek')`` and never looked
at the status, so a failed solve went on as if it had an optimum.

Cost: the rows for cvxopt and the certificate are O(A + V) for A arcs and V ops; an interior
point takes some tens of steps, each factoring a sparse symmetric matrix of order about A + V
whose fill depends on the graph's shape (small for graphs of narrow layers or cut ops).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np
import scipy.sparse as sp

from baechi_tf.errors import ConfigError, SolverError
from baechi_tf.sct.lp import SctLP

__all__ = ["LPSolution", "SOLVERS", "back_ends", "choose_solver", "mosek_licence_problem", "normal_density", "solve_lp"]

log = logging.getLogger(__name__)

SOLVERS = ("auto", "mosek", "highs", "cvxopt")

_MOSEK_HOWTO = (
    "get a licence file (free for academic use at https://www.mosek.com/products/academic-licenses/, "
    "a 30-day trial at https://www.mosek.com/try/) and put it at ~/mosek/mosek.lic or point "
    "MOSEKLM_LICENSE_FILE at it; or use --lp_solver=highs, which needs no licence"
)


@dataclasses.dataclass(frozen=True, eq=False)
class LPSolution:
    """An optimal solution of an `SctLP`, in microseconds."""

    x: np.ndarray  # float64 [num_arcs], x_ij in [0, 1]
    s_us: np.ndarray  # float64 [num_ops], start times
    w_us: float  # the makespan of the solution: the optimum (to the solver's tolerance)
    solver: str  # 'mosek', 'highs' or 'cvxopt'
    method: str  # how: 'highs-ds' or 'highs-ipm' (HiGHS's dual simplex or interior point), else = solver
    bound_us: float  # a lower bound of the optimum: certified for 'highs-ipm' and 'cvxopt', else w_us


def mosek_licence_problem() -> Optional[str]:
    """None when MOSEK can solve here; otherwise why not (not installed, or no licence)."""
    if importlib.util.find_spec("mosek") is None:
        return "the mosek package is not installed (pip install Mosek)"
    import mosek

    try:
        with mosek.Env() as env:
            env.checkoutlicense(mosek.feature.pts)
    except mosek.Error as e:
        return f"MOSEK has no usable licence ({e.errno}{': ' + e.msg if e.msg else ''})"
    return None


def choose_solver(solver: str) -> str:
    """The back end that `solver` names; ``auto`` picks MOSEK, HiGHS or cvxopt and logs why."""
    if solver not in SOLVERS:
        raise ConfigError(f"unknown LP solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if solver != "auto":
        return solver
    problem = mosek_licence_problem()
    chosen = "mosek" if problem is None else "highs"  # scipy (pinned in setup.py) brings HiGHS
    log.info("m-SCT LP solver: %s%s", chosen, "" if problem is None else f" ({problem})")
    return chosen


def back_ends(solver: str, chosen: str, lp: SctLP, time_limit_s: Optional[float] = None) -> tuple[str, ...]:
    """The back ends to try on `lp`, in order, for the `solver` option when `choose_solver` gave
    `chosen`: that one alone when the user named a solver. ``auto`` tries the later ones of
    MOSEK, HiGHS, cvxopt after `chosen` fails; without MOSEK, an LP of more than
    `_LARGE_LP_ARCS` arcs whose `normal_density` is at most `_CVXOPT_MAX_DENSITY` goes to cvxopt
    first and HiGHS after, unless a time limit is set (cvxopt has none). See the module
    docstring."""
    if solver != "auto":
        return (chosen,)
    if (chosen == "highs" and lp.num_arcs > _LARGE_LP_ARCS and time_limit_s is None
            and normal_density(lp) <= _CVXOPT_MAX_DENSITY):
        return ("cvxopt", "highs")
    order = ("mosek", "highs", "cvxopt")
    return order[order.index(chosen) :]


def normal_density(lp: SctLP) -> float:
    """Sum over the LP's rows of (nonzeros in the row) squared, per variable: a bound of the
    nonzeros per column of the normal equations (``A^T D A``) that an interior point factors,
    each row making a clique of its variables. The bound rows that cvxopt adds (one nonzero
    each) add about one. Time O(rows)."""
    counts = np.diff(lp.A_ub.indptr).astype(np.float64)
    return float(counts @ counts) / max(1, lp.num_vars)


def solve_lp(
    lp: SctLP,
    solver: str = "auto",
    *,
    time_limit_s: Optional[float] = None,
    fallbacks: Sequence[str] = (),
) -> LPSolution:
    """Solves `lp` with the named back end (see the module docstring).

    `time_limit_s` bounds HiGHS's and MOSEK's solve (cvxopt has no time limit); a back end that
    fails or runs out of time raises `SolverError`, unless `fallbacks` name back ends to try next,
    in which case a warning says so and the next one solves.
    """
    name = choose_solver(solver)
    try:
        return _solve_with(lp, name, time_limit_s)
    except SolverError as e:
        if not fallbacks:
            raise
        log.warning("LP solver %s failed (%s); falling back to %s", name, e, fallbacks[0])
        return solve_lp(lp, fallbacks[0], time_limit_s=time_limit_s, fallbacks=fallbacks[1:])


def _solve_with(lp: SctLP, name: str, time_limit_s: Optional[float]) -> LPSolution:
    solve = {"mosek": _solve_mosek, "highs": _solve_highs, "cvxopt": _solve_cvxopt}[name]
    z, method, bound = solve(lp, time_limit_s)
    z = np.asarray(z, dtype=np.float64).reshape(-1)
    if z.shape != (lp.num_vars,) or not np.isfinite(z).all():
        raise SolverError(f"{name} returned no finite solution of the m-SCT LP ({_size(lp)})")
    a, v = lp.num_arcs, lp.num_ops
    return LPSolution(
        x=np.clip(z[:a], 0.0, 1.0),
        s_us=z[a : a + v] * lp.time_unit_us,
        w_us=float(z[a + v]) * lp.time_unit_us,
        solver=name,
        method=method,
        bound_us=(float(z[a + v]) if bound is None else bound) * lp.time_unit_us,
    )


def _size(lp: SctLP) -> str:
    return f"{lp.num_vars} variables, {lp.num_rows} rows"


# ---------------------------------------------------------------- HiGHS


_HIGHS_SIMPLEX_ARCS = 5000  # LPs of at most this many arcs: dual simplex, no pivot budget
_LARGE_LP_ARCS = _HIGHS_SIMPLEX_ARCS  # auto without MOSEK: LPs of more arcs go to cvxopt first
_CVXOPT_MAX_DENSITY = 24.0  # ... when their normal equations are this sparse (`normal_density`)
_HIGHS_PIVOTS_PER_ROW = 1.0  # larger LPs: simplex pivots allowed per row before interior point


def _highs_pivot_budget(lp: SctLP) -> Optional[int]:
    """The dual simplex pivots HiGHS may spend on `lp` before interior point takes over; None for
    no limit (see the module docstring)."""
    if lp.num_arcs <= _HIGHS_SIMPLEX_ARCS:
        return None
    return max(1, int(_HIGHS_PIVOTS_PER_ROW * lp.num_rows))


def _linprog_highs(lp: SctLP, time_limit_s: Optional[float], max_pivots: Optional[int]):
    """One ``scipy.optimize.linprog`` call by HiGHS's dual simplex."""
    from scipy.optimize import linprog

    options = {}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    if max_pivots is not None:
        options["maxiter"] = max_pivots
    return linprog(
        lp.c,
        A_ub=lp.A_ub,
        b_ub=lp.b_ub,
        bounds=np.column_stack((lp.lower, lp.upper)),
        method="highs-ds",
        options=options,
    )


def _solve_highs(lp: SctLP, time_limit_s: Optional[float] = None) -> tuple[np.ndarray, str, Optional[float]]:
    budget = _highs_pivot_budget(lp)
    start = time.monotonic()
    res = _linprog_highs(lp, time_limit_s, budget)
    message = res.message
    if res.status == 1 and budget is not None and res.nit >= budget:
        log.info(
            "HiGHS: dual simplex not done after %d pivots on an m-SCT LP of %s; solving it by "
            "interior point", budget, _size(lp),
        )
        left = None if time_limit_s is None else time_limit_s - (time.monotonic() - start)
        if left is None or left > 0:
            z, bound = _ipm_highspy(lp, left)
            return z, "highs-ipm", bound
        message = f"dual simplex used it all in {budget} pivots, leaving none for interior point"
    if res.status == 1 and time_limit_s is not None:
        raise SolverError(
            f"HiGHS did not solve the m-SCT LP ({_size(lp)}) within --lp_time_limit="
            f"{time_limit_s:g} s: {message}"
        )
    if res.status != 0 or res.x is None:
        raise SolverError(f"HiGHS did not solve the m-SCT LP ({_size(lp)}): {res.message}")
    return res.x, "highs-ds", None


_IPM_CROSSOVER = "off"  # an interior point, not a vertex (module docstring)
_IPM_CERTIFIED_RTOL = 1e-6  # largest (primal makespan - dual bound) / bound an IPM answer may have


def _ipm_highspy(lp: SctLP, time_limit_s: Optional[float]) -> tuple[np.ndarray, float]:
    """``(z, bound)``: IPX's interior point (dual LP, no crossover) and the weak-duality bound of
    its row duals, in the LP's time unit. `SolverError` when HiGHS fails or the gap between the
    makespan of the returned x and the bound passes `_IPM_CERTIFIED_RTOL`."""
    try:
        import highspy
    except ImportError:
        raise SolverError(
            "HiGHS's interior point needs highspy (pip install highspy, a requirement of "
            "baechi_tf); or use --lp_solver=cvxopt"
        ) from None
    h = _quiet_highs(highspy)
    for option, value in (("output_flag", False), ("solver", "ipm"), ("run_crossover", _IPM_CROSSOVER),
                          ("ipx_dualize_strategy", 1)):
        h.setOptionValue(option, value)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    model = highspy.HighsLp()
    model.num_col_, model.num_row_ = lp.num_vars, lp.num_rows
    model.col_cost_, model.col_lower_ = lp.c, lp.lower
    model.col_upper_ = np.where(np.isinf(lp.upper), highspy.kHighsInf, lp.upper)
    model.row_lower_, model.row_upper_ = np.full(lp.num_rows, -highspy.kHighsInf), lp.b_ub
    csc = lp.A_ub.tocsc()
    model.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    model.a_matrix_.start_, model.a_matrix_.index_, model.a_matrix_.value_ = csc.indptr, csc.indices, csc.data
    h.passModel(model)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kTimeLimit:
        raise SolverError(
            f"HiGHS did not solve the m-SCT LP ({_size(lp)}) within --lp_time_limit="
            f"{time_limit_s:g} s: interior point stopped at its time limit"
        )
    solution = h.getSolution()
    if status != highspy.HighsModelStatus.kOptimal or not solution.dual_valid:
        raise SolverError(
            f"HiGHS did not solve the m-SCT LP ({_size(lp)}) by interior point: {h.modelStatusToString(status)}"
        )
    z = np.asarray(solution.col_value, dtype=np.float64)
    return z, _certify(lp, z, np.asarray(solution.row_dual), "HiGHS's interior point", "--lp_solver=cvxopt")


def _certify(lp: SctLP, z: np.ndarray, row_dual: np.ndarray, who: str, instead: str) -> float:
    """The certified lower bound of the optimum (`_certified_gap`) that an interior point `z`
    and its row multipliers give; `SolverError` naming `who` and the option to use `instead` when
    the makespan of z's x passes it by more than `_IPM_CERTIFIED_RTOL`."""
    makespan, bound = _certified_gap(lp, np.clip(z[: lp.num_arcs], 0.0, 1.0), row_dual)
    if makespan > bound + _IPM_CERTIFIED_RTOL * abs(bound):
        raise SolverError(
            f"{who} left the m-SCT LP ({_size(lp)}) with x of makespan "
            f"{makespan * lp.time_unit_us:.9g} us above its dual bound {bound * lp.time_unit_us:.9g} us; "
            f"use {instead}"
        )
    return bound


def _quiet_highs(highspy):
    """A new ``highspy.Highs``. The first one of a process prints HiGHS's banner on file
    descriptor 1, where it would mix with a command's own output (JSON on stdout); it goes to
    /dev/null instead."""
    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _certified_gap(lp: SctLP, x: np.ndarray, row_dual: np.ndarray) -> tuple[float, float]:
    """``(makespan, bound)`` in the LP's time unit: the longest path when arc a takes
    ``p_i + c_a x_a`` (x in [0, 1], so a feasible makespan) and a control-only arc ``p_i + c_ij``,
    and a lower bound of the optimum by weak duality from any row multipliers (HiGHS's sign: <= 0
    on ``<=`` rows, clipped there).

    The bound is ``min over the box of c z + lam (A z - b)`` for ``lam = -row_dual >= 0``. The box
    caps every start, w and barrier at the feasible makespan: the earliest starts of an optimal x
    end by the optimum, and each barrier at its predecessors' latest end is no later than the
    starts that wait on it, so some optimal point lies in it, and the minimum over the box is
    finite. Time O(V + A + F) (one pass in topological order) for F control-only arcs."""
    unit = lp.time_unit_us
    p = lp.p_us / unit
    src, dst = lp.all_arcs
    arc_us = np.concatenate([lp.c_us * x, lp.fixed_c_us]) / unit
    start = lp.lower[lp.num_arcs : lp.w_index].tolist()
    order = _topological_arcs(src, dst, lp.num_ops)
    length = (p[src] + arc_us)[order].tolist()
    for i, j, w in zip(src[order].tolist(), dst[order].tolist(), length):
        if start[i] + w > start[j]:
            start[j] = start[i] + w
    makespan = float(max((np.asarray(start) + p).max(initial=0.0), lp.lower[lp.w_index]))
    lam = np.maximum(-row_dual, 0.0)
    reduced = lp.c + lp.A_ub.T @ lam
    upper = lp.upper.copy()
    upper[lp.num_arcs :] = makespan
    bound = float(-lam @ lp.b_ub + np.minimum(reduced * lp.lower, reduced * upper).sum())
    return makespan, bound


def _topological_arcs(arc_src: np.ndarray, arc_dst: np.ndarray, n: int) -> np.ndarray:
    """The arcs ordered by a topological order of their heads' ops (Kahn), so that every arc into
    an op comes before the arcs out of it."""
    by_src = np.argsort(arc_src, kind="stable")
    first = np.searchsorted(arc_src[by_src], np.arange(n + 1)).tolist()
    dst = arc_dst[by_src].tolist()
    waiting = np.bincount(arc_dst, minlength=n).tolist()
    ready = [i for i in range(n) if waiting[i] == 0]
    rank = [0] * n
    for position, i in enumerate(ready):  # `ready` grows as ops are freed
        rank[i] = position
        for k in range(first[i], first[i + 1]):
            j = dst[k]
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    return np.argsort(np.asarray(rank)[arc_src], kind="stable")


# ---------------------------------------------------------------- cvxopt


def _solve_cvxopt(lp: SctLP, time_limit_s: Optional[float] = None) -> tuple[np.ndarray, str, float]:
    """``(z, "cvxopt", bound)``: cvxopt's interior point on `_cvxopt_rows`, certified like
    HiGHS's (`_certify`)."""
    if importlib.util.find_spec("cvxopt") is None:
        raise SolverError("cvxopt is not installed: pip install cvxopt, or use --lp_solver=highs")
    import cvxopt
    import cvxopt.solvers

    G, h = _cvxopt_rows(lp)
    G_cvx = cvxopt.spmatrix(
        cvxopt.matrix(G.data.astype(np.float64)),
        cvxopt.matrix(G.row.astype(np.int64)),
        cvxopt.matrix(G.col.astype(np.int64)),
        G.shape,
    )
    sol = cvxopt.solvers.lp(
        cvxopt.matrix(lp.c), G_cvx, cvxopt.matrix(h), options={"show_progress": False}
    )
    if sol["status"] != "optimal":
        raise SolverError(
            f"cvxopt did not solve the m-SCT LP ({_size(lp)}): status {sol['status']!r} after "
            f"{sol['iterations']} iterations (gap {sol['gap']}, relative gap {sol['relative gap']}, "
            f"primal infeasibility {sol['primal infeasibility']}, dual infeasibility "
            f"{sol['dual infeasibility']}); try --lp_solver=highs"
        )
    z = np.array(sol["x"]).reshape(-1)
    # cvxopt's multipliers of G z <= h are >= 0; `_certify` takes HiGHS's sign (<= 0).
    row_dual = -np.array(sol["z"]).reshape(-1)[: lp.num_rows]
    return z, "cvxopt", _certify(lp, z, row_dual, "cvxopt's interior point", "--lp_solver=highs")


def _cvxopt_rows(lp: SctLP) -> tuple[sp.coo_matrix, np.ndarray]:
    """``(G, h)`` with ``{z : G z <= h}`` the feasible set of `lp`, for a solver without bounds:
    the rows of ``A_ub``, then ``-z <= -lower`` for the finite lower bounds that the rows do not
    imply (`_implied_lower`), then ``z <= upper`` where finite. Leaving out implied bounds keeps
    the feasible set and shrinks the system an interior point factors at each step (one row per
    op with a predecessor, and w's). Time O(A + V)."""
    n = lp.num_vars
    upper = np.flatnonzero(np.isfinite(lp.upper))
    lower = np.flatnonzero(np.isfinite(lp.lower) & ~_implied_lower(lp))
    identity = sp.identity(n, format="csr")
    G = sp.vstack([lp.A_ub, -identity[lower], identity[upper]]).tocoo()
    return G, np.concatenate([lp.b_ub, -lp.lower[lower], lp.upper[upper]])


def _implied_lower(lp: SctLP) -> np.ndarray:
    """bool [num_vars]: the variables whose lower bound the rows imply, given every lower bound
    holds: ``s_j >= lower_j`` when some arc (i, j), with an x or control-only, has ``lower_i +
    p_i >= lower_j`` (the precedence row gives ``s_j >= s_i + p_i``, and ``c_ij x_ij >= 0``; a
    barrier between them is at least ``s_i + p_i``), ``w >= lower_w`` when some sink i has
    ``lower_i + p_i >= lower_w`` (its makespan row), and every barrier's ``b >= 0`` (each has a
    predecessor, whose start and compute are >= 0). By induction over a topological order every
    bound then holds, whether by its own row or so."""
    a, v = lp.num_arcs, lp.num_ops
    src, dst = lp.all_arcs
    s_lower = lp.lower[a : a + v]
    p = lp.p_us / lp.time_unit_us
    ends = s_lower + p  # the earliest end of each op that its bound alone gives
    earliest = np.full(v, -np.inf)
    np.maximum.at(earliest, dst, ends[src])
    implied = np.zeros(lp.num_vars, dtype=bool)
    implied[a : a + v] = earliest >= s_lower
    sinks = np.bincount(src, minlength=v) == 0
    implied[lp.w_index] = bool(sinks.any()) and ends[sinks].max() >= lp.lower[lp.w_index]
    implied[lp.w_index + 1 :] = lp.lower[lp.w_index + 1 :] <= 0.0
    return implied


# ---------------------------------------------------------------- MOSEK


def _mosek_task(env, lp: SctLP):
    """A MOSEK task holding `lp` (column-wise matrix, bounds, objective); needs no licence."""
    import mosek

    n, m = lp.num_vars, lp.num_rows
    task = env.Task(m, n)
    task.appendvars(n)
    task.appendcons(m)
    csc = lp.A_ub.tocsc()
    csc.sort_indices()
    ptr = csc.indptr.astype(np.int64)
    task.putacolslice(0, n, ptr[:-1], ptr[1:], csc.indices.astype(np.int32), csc.data)
    finite = np.isfinite(lp.upper)
    keys = [mosek.boundkey.ra if f else mosek.boundkey.lo for f in finite.tolist()]
    task.putvarboundslice(0, n, keys, lp.lower, np.where(finite, lp.upper, 0.0))
    task.putconboundslice(0, m, [mosek.boundkey.up] * m, np.zeros(m), lp.b_ub)
    task.putcslice(0, n, lp.c)
    task.putobjsense(mosek.objsense.minimize)
    return task


def _solve_mosek(lp: SctLP, time_limit_s: Optional[float] = None) -> tuple[np.ndarray, str, None]:
    if importlib.util.find_spec("mosek") is None:
        raise SolverError(
            "MOSEK is not installed: pip install Mosek (it also needs a licence), or use "
            "--lp_solver=highs"
        )
    import mosek

    with mosek.Env() as env:
        try:
            env.checkoutlicense(mosek.feature.pts)
        except mosek.Error as e:
            raise SolverError(_licence_message(e)) from None
        with _mosek_task(env, lp) as task:
            if time_limit_s is not None:
                task.putdouparam(mosek.dparam.optimizer_max_time, float(time_limit_s))
            try:
                trm = task.optimize()
            except mosek.Error as e:
                if "licen" in str(e.errno):
                    raise SolverError(_licence_message(e)) from None
                raise SolverError(f"MOSEK failed on the m-SCT LP ({_size(lp)}): {e.errno}: {e.msg}") from None
            soltype = mosek.soltype.bas if task.solutiondef(mosek.soltype.bas) else mosek.soltype.itr
            if not task.solutiondef(soltype):
                raise SolverError(f"MOSEK returned no solution of the m-SCT LP ({_size(lp)}): termination {trm}")
            solsta = task.getsolsta(soltype)
            if solsta != mosek.solsta.optimal:
                raise SolverError(
                    f"MOSEK did not solve the m-SCT LP ({_size(lp)}): solution status {solsta}, "
                    f"problem status {task.getprosta(soltype)}, termination {trm}"
                )
            return np.array(task.getxx(soltype)), "mosek", None


def _licence_message(e) -> str:
    words = f"{e.errno}{': ' + e.msg.strip() if e.msg and e.msg.strip() else ''}"
    return f"MOSEK cannot solve without a licence ({words}): {_MOSEK_HOWTO}"
