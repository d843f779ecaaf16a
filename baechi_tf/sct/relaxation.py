"""An optimal solution of the m-SCT LP of a whole graph, found piece by piece.

`solve_sct_relaxation` returns an optimal ``x`` of the LP of `baechi_tf.sct.lp` for a graph, and
the earliest start of every op under that ``x``. Simplex solvers need about one pivot per row of
this LP, at a cost per pivot that grows with the LP, so one LP for a whole graph of 30k ops takes
tens of seconds. Three exact steps shrink what reaches the solver. With ``head0``/``head1`` the
longest path to an op's start with no/every transfer paid, ``tail1`` the longest path from an
op's start to the end with every transfer paid, and ``CP0`` the critical path with free
communication (a lower bound of the LP optimum):

1. *Dominated arcs.* Arc (i, j) is dropped, with ``x_ij = 1``, when another arc (k, j) (the one
   with the largest ``head0_k + p_k``, which is kept) satisfies
   ``head0_k + p_k >= head1_i + p_i + c_ij``: j cannot start before k ends, and i's result is
   there by then whatever x is. Typical case: a weight read feeding an op deep in the graph.
2. *Short arcs.* Arc (i, j) is dropped, with ``x_ij = 1``, when its longest path with every
   transfer paid, ``head1_i + p_i + c_ij + tail1_j``, is at most ``CP0``.
3. *Cut ops.* An op h such that every op before it in topological order reaches h and no kept
   arc jumps over h splits the rest into a part before and a part after h, which share only h's
   start: the part before is solved first, its optimum gives h's earliest start, and the part
   after is solved with h released at that time (its optimum can only grow with h's start, so
   the earliest start is optimal). Consecutive parts are joined into pieces of at least
   `piece_ops` ops, so that each solver call has work to do.

Dropped arcs only loosen the other rows (``x = 1`` satisfies the favourite rows best), so the
pieces solve a relaxation, of optimum ``w_R <= w*``; and every path through a dropped arc is no
longer than a path without it (step 1, by induction on its last dominated arc) or than ``CP0``
(step 2). The longest path under the returned ``x`` is therefore ``<= max(w_R, CP0) <= w*``: the
solution is optimal. The code checks that certificate on every solve and falls back to one LP
for the whole graph if it ever fails (a solver tolerance beyond ours).

Forward graphs of sequential models (layers joined by one op, weights read from sources) split
into pieces of a layer or a few; graphs without cut ops (many crossing edges) are solved whole.

Time: O(E log E) with four longest-path passes in Python, plus the solver on pieces of about
`piece_ops` ops; memory O(V + E).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import SolverError
from baechi_tf.graph import OpGraph
from baechi_tf.progress import Progress
from baechi_tf.sct.lp import arc_comm_us, control_only_arcs, sct_lp
from baechi_tf.sct.solvers import back_ends, choose_solver, solve_lp

__all__ = ["SctRelaxation", "solve_sct_relaxation"]

log = logging.getLogger(__name__)

_PIECE_OPS = 300
_CERTIFICATE_RTOL = 1e-6


@dataclasses.dataclass(frozen=True, eq=False)
class SctRelaxation:
    """An optimal solution of the m-SCT LP of a graph, in microseconds."""

    arc_src: np.ndarray  # int32 [num_arcs], i of arc (i, j), arcs sorted by (i, j)
    arc_dst: np.ndarray  # int32 [num_arcs], j of arc (i, j)
    c_us: np.ndarray  # float64 [num_arcs], c_ij
    x: np.ndarray  # float64 [num_arcs], x_ij in [0, 1]; 1 on control-only arcs (`sct.lp`)
    s_us: np.ndarray  # float64 [num_ops], earliest start of each op under x
    w_us: float  # the LP optimum (the relaxed makespan): the longest path under x
    solver: str  # the back ends that solved the pieces, joined by '+' ('highs', 'cvxopt+highs')
    num_lps: int  # solver calls
    lp_arcs: int  # arcs that reached a solver
    bound_us: float  # a lower bound of the LP optimum, within _CERTIFICATE_RTOL of w_us


def solve_sct_relaxation(
    graph: OpGraph,
    cluster: Cluster,
    *,
    solver: str = "auto",
    reduce: bool = True,
    piece_ops: int = _PIECE_OPS,
    max_lp_arcs: Optional[int] = None,
    time_limit_s: Optional[float] = None,
) -> SctRelaxation:
    """Solves the m-SCT LP of `graph`; `reduce=False` hands the whole LP to the solver at once.

    With `max_lp_arcs`, an LP (a piece, or the whole) larger than that, its arcs with a choice and
    its rows of control-only arcs counted (`_check_size`), is not attempted: `SolverError` (a
    deterministic bound on the solver's work, for callers that have other placers to try).
    `time_limit_s` bounds each solve; with ``solver='auto'`` a back end that fails or runs out of
    time hands the LP to the next one (MOSEK, HiGHS, cvxopt) with a warning.
    """
    name = choose_solver(solver)

    def solve(lp, bar, what=""):
        order = back_ends(solver, name, lp, time_limit_s)
        bar.update(note=f"{what}{lp.num_arcs:,} arcs, {order[0]}")
        return solve_lp(lp, order[0], time_limit_s=time_limit_s, fallbacks=order[1:])

    arc_src, arc_dst, c_us = arc_comm_us(graph, cluster)
    control = control_only_arcs(graph, arc_src, arc_dst)
    p = graph.compute_us
    topo = graph.topo_index
    by_dst = np.argsort(topo[arc_dst], kind="stable")
    if not reduce:
        return _whole(graph, arc_src, arc_dst, c_us, control, by_dst, name, solve, max_lp_arcs)

    head0 = _longest_starts(graph.num_ops, arc_src, arc_dst, by_dst, p, np.zeros_like(c_us))
    head1 = _longest_starts(graph.num_ops, arc_src, arc_dst, by_dst, p, c_us)
    tail1 = _longest_tails(arc_src, arc_dst, topo, p, c_us)
    cp0 = float((head0 + p).max(initial=0.0))
    keep = ~(_dominated(graph.num_ops, arc_src, arc_dst, c_us, p, head0, head1)
             | (head1[arc_src] + p[arc_src] + c_us + tail1[arc_dst] <= cp0))

    x = np.ones_like(c_us)
    w_pieces = 0.0
    num_lps = 0
    used = set()
    pieces = []
    for ops, arcs, release in _pieces(graph.num_ops, arc_src, arc_dst, keep, topo, piece_ops):
        # `arcs` index the graph's arcs; ops are renumbered 0.. in the piece. A released piece's
        # first op gets its earliest start once the piece before is solved.
        local = np.full(graph.num_ops, -1, dtype=np.int64)
        local[ops] = np.arange(ops.shape[0])
        lp = sct_lp(p[ops], local[arc_src[arcs]], local[arc_dst[arcs]], c_us[arcs], control=control[arcs])
        _check_size(lp, max_lp_arcs)
        pieces.append((ops, arcs, release, lp))
    with Progress(f"m-SCT LP ({name})", len(pieces), unit="pieces", tick=True) as bar:
        for ops, arcs, release, lp in pieces:
            if release:  # the cut op starts when the last piece found it ends
                lower = lp.lower.copy()
                lower[lp.num_arcs] = (w_pieces - p[ops[0]]) / lp.time_unit_us
                lp = dataclasses.replace(lp, lower=lower)
            sol = solve(lp, bar)
            x[arcs[~control[arcs]]] = sol.x  # a control-only arc has x = 1
            used.add(sol.solver)
            w_pieces = sol.bound_us  # a lower bound of the piece's optimum: the solver's, or certified
            num_lps += 1
            bar.update(advance=1)

    s = _longest_starts(graph.num_ops, arc_src, arc_dst, by_dst, p, c_us * x)
    w = float((s + p).max(initial=0.0))
    bound = max(w_pieces, cp0)
    if w > bound * (1 + _CERTIFICATE_RTOL) + _CERTIFICATE_RTOL:
        log.warning(
            "m-SCT LP pieces give a makespan of %.6g us above their bound %.6g us; solving the "
            "LP of the whole graph instead",
            w,
            bound,
        )
        return _whole(graph, arc_src, arc_dst, c_us, control, by_dst, name, solve, max_lp_arcs)
    solved_by = "+".join(sorted(used)) or name
    log.info(
        "m-SCT LP: %d of %d arcs in %d LPs by %s, optimum %.6g us (lower bound %.6g us)",
        int(keep.sum()), arc_src.shape[0], num_lps, solved_by, w, bound,
    )
    return SctRelaxation(arc_src, arc_dst, c_us, x, s, w, solved_by, num_lps, int(keep.sum()), min(bound, w))


def _check_size(lp, limit: Optional[int]) -> None:
    """`SolverError` when `lp` is larger than `limit`: its arcs with an x and its rows of
    control-only arcs (`sct.lp`, block 5) count, the work a solver has with it."""
    size = lp.num_arcs + lp.rows_per_block[4]
    if limit is not None and size > limit:
        raise SolverError(
            f"the m-SCT LP has a piece of {lp.num_ops} ops and {lp.num_arcs} arcs with a choice and "
            f"{lp.rows_per_block[4]} rows of control-only arcs that no op cuts, {size} in all, above "
            f"the limit of {limit}; no LP was attempted"
        )


def _whole(graph, arc_src, arc_dst, c_us, control, by_dst, name, solve, max_lp_arcs) -> SctRelaxation:
    lp = sct_lp(graph.compute_us, arc_src, arc_dst, c_us, control=control)
    _check_size(lp, max_lp_arcs)
    with Progress(f"m-SCT LP ({name})", tick=True) as bar:
        sol = solve(lp, bar, "the whole graph, ")
    x = np.ones_like(c_us)
    x[~control] = sol.x
    s = _longest_starts(graph.num_ops, arc_src, arc_dst, by_dst, graph.compute_us, c_us * x)
    return SctRelaxation(
        arc_src, arc_dst, c_us, x, s, sol.w_us, sol.solver, 1, arc_src.shape[0], sol.bound_us
    )


def _longest_starts(n, arc_src, arc_dst, by_dst, p, arc_us) -> np.ndarray:
    """Earliest start of each op when arc (i, j) takes ``arc_us``: one pass over arcs sorted by
    the topological index of j (so every arc into i comes before the arcs out of i)."""
    start = [0.0] * n
    length = (p[arc_src] + arc_us)[by_dst].tolist()
    for i, j, w in zip(arc_src[by_dst].tolist(), arc_dst[by_dst].tolist(), length):
        v = start[i] + w
        if v > start[j]:
            start[j] = v
    return np.asarray(start)


def _longest_tails(arc_src, arc_dst, topo, p, arc_us) -> np.ndarray:
    """Longest path from each op's start to the end (its own compute included)."""
    tail = p.tolist()
    order = np.argsort(-topo[arc_src], kind="stable")
    length = (p[arc_src] + arc_us)[order].tolist()
    for i, j, w in zip(arc_src[order].tolist(), arc_dst[order].tolist(), length):
        v = w + tail[j]
        if v > tail[i]:
            tail[i] = v
    return np.asarray(tail)


def _dominated(n, arc_src, arc_dst, c_us, p, head0, head1) -> np.ndarray:
    """Step 1 of the module docstring, as a mask over arcs."""
    sure = head0[arc_src] + p[arc_src]  # j starts no earlier than this, whatever x is
    worst = head1[arc_src] + p[arc_src] + c_us  # i's result is on any device by then
    best = np.full(n, -np.inf)
    np.maximum.at(best, arc_dst, sure)
    tops = np.flatnonzero(sure >= best[arc_dst])
    _, first = np.unique(arc_dst[tops], return_index=True)
    kept = np.zeros(arc_src.shape[0], dtype=bool)
    kept[tops[first]] = True  # the dominating arc of each op stays
    return (worst <= best[arc_dst]) & ~kept


def _pieces(n, arc_src, arc_dst, keep, topo, piece_ops):
    """Yields (ops in topological order, arc ids, whether ops[0] is a cut released by the piece
    before) for the kept arcs (step 3 of the module docstring)."""
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        return
    touched = np.zeros(n, dtype=bool)
    touched[arc_src[kept]] = True
    touched[arc_dst[kept]] = True
    ops = np.flatnonzero(touched)
    ops = ops[np.argsort(topo[ops], kind="stable")]
    m = ops.shape[0]
    pos = np.full(n, -1, dtype=np.int64)
    pos[ops] = np.arange(m)
    ps, pd = pos[arc_src[kept]], pos[arc_dst[kept]]
    reach = np.full(m, -1, dtype=np.int64)
    np.maximum.at(reach, ps, pd)
    # jump[k]: the furthest position an arc from before position k reaches.
    jump = np.maximum.accumulate(np.concatenate(([-1], reach[:-1])))
    first_sink = int(np.flatnonzero(np.bincount(ps, minlength=m) == 0)[0])
    k = np.arange(m)
    cuts = np.flatnonzero((jump <= k) & (k <= first_sink) & (k > 0) & (k < m - 1)).tolist()
    bounds = [0]
    for c in cuts:
        if c - bounds[-1] >= piece_ops:
            bounds.append(c)
    order = np.argsort(ps, kind="stable")
    ps_sorted = ps[order]
    for b, lo in enumerate(bounds):
        last = b == len(bounds) - 1
        hi = m - 1 if last else bounds[b + 1]
        a0, a1 = np.searchsorted(ps_sorted, [lo, hi + 1 if last else hi])
        yield ops[lo : hi + 1], kept[order[a0:a1]], b > 0
