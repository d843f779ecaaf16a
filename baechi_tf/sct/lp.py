"""The m-SCT linear program: Hanen and Munier's small-communication-time relaxation.

m-SCT (Baechi, SoCC 2020, section 4.3) starts from the LP of Hanen and Munier ("An approximation
algorithm for scheduling dependent tasks on m processors with small communication delays", ETFA
1995; Discrete Applied Mathematics 108(3), 2001). The LP schedules the graph on as many devices as
it likes and decides, for each arc i -> j, whether j runs right after i on i's device (j is i's
*favourite child*: no communication) or pays the communication time. Each op has at most one
favourite child and at most one favourite parent. The LP relaxes that 0/1 choice to ``[0, 1]``;
`baechi_tf.sct.rounding` turns a solution back into favourite children. The LP has no device count
and no memory: the list scheduler enforces both.

An *arc* is a distinct pair (i, j) of ops joined by at least one edge: several tensors between the
same two ops make one arc, as in the original's networkx graph. Names follow the paper; the
variable vector is ``z = [x_0 .. x_{A-1}, s_0 .. s_{V-1}, w, b_0 .. b_{B-1}]`` for A arcs with an
x, V ops and B barriers (below):

=========  ===========================  ===========================================================
paper      here                         meaning
=========  ===========================  ===========================================================
``x_ij``   ``z[a]``, arc a = (i, j)     0: j is i's favourite child; 1: the arc pays ``c_ij``
``s_i``    ``z[A + i]``                 start time of op i, in units of ``time_unit_us``
``w``      ``z[A + V]``                 makespan, in units of ``time_unit_us``; the objective
           ``z[A + V + 1 + k]``         barrier k of control-only arcs, in units of ``time_unit_us``
``p_i``    ``SctLP.p_us[i]``            compute time of op i (``OpGraph.compute_us``)
``c_ij``   ``SctLP.c_us[a]``            transfer time of arc a (`arc_comm_us`)
=========  ===========================  ===========================================================

An arc that carries control edges alone (`control_only_arcs`) orders two ops and moves no data:
it has no ``x``, pays its message ``c_ij`` always, and no op is its favourite child through it.
The ``tf.control_dependencies(update_ops)`` idiom gives such arcs from every op of a set P to
every op of a set C (every batch-norm update to every backward op that reads from outside the
block: 173k arcs in a NASNetMobile step); as rows ``s_i + p_i + c_i <= s_j`` they are |P| |C| rows,
and the same rows through one *barrier* variable ``b``, ``s_i + p_i + c_i <= b`` and ``b <= s_j``,
are |P| + |C|, and exact: some b satisfies both halves exactly when the direct rows hold. The
builder gives a barrier to each set of control-only predecessors, with their messages, that two
or more ops share, where that takes fewer rows.

Constraints, blocks of rows of ``A_ub z <= b_ub`` in this order:

1. precedence, one row per arc (i, j) with an x:   ``s_i + p_i + c_ij x_ij <= s_j``
2. favourite child, per op i with outdeg(i) >= 2: ``sum_j x_ij >= outdeg(i) - 1``
3. favourite parent, per op j with indeg(j) >= 2: ``sum_i x_ij >= indeg(j) - 1``
4. makespan, per sink i (no successor):           ``s_i + p_i <= w``
5. control-only arcs (i, j): ``s_i + p_i + c_ij <= s_j``, or through a barrier b,
   ``s_i + p_i + c_ij <= b`` and ``b <= s_j``

where degrees count the arcs with an x, and sinks have no arc of either kind; the bounds are
``0 <= x_ij <= 1``, ``s_i >= s_lower_i`` (0 unless a caller sets a release time), ``w >= 0`` and
``b >= 0``. The original also writes (2) and (3) for degree 1, where they only say ``x >= 0``,
and (4) for every op, where (1) implies it for ops with successors (compute times are >= 0);
leaving those rows out keeps the same feasible ``(x, s, w)`` with fewer rows.

Times enter the matrix divided by ``time_unit_us`` (the largest compute or transfer time), so
that every coefficient is at most 1 and interior-point solvers meet their tolerances;
`baechi_tf.sct.solvers` reports results in microseconds.

Size: A + V + 1 + B variables for A arcs with an x and B barriers, at most A + 2V + F rows and
5A + 2V + 2F non-zeros for the F rows of block 5. Built with numpy and `scipy.sparse` from the
`OpGraph` arrays in O(E log E) time for E edges; the barriers take one pass over the control-only
arcs.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import scipy.sparse as sp

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph

__all__ = ["SctLP", "arc_comm_us", "build_sct_lp", "control_only_arcs", "sct_lp"]


@dataclasses.dataclass(frozen=True, eq=False)
class SctLP:
    """``minimize c @ z`` subject to ``A_ub @ z <= b_ub`` and ``lower <= z <= upper``."""

    c: np.ndarray  # float64 [num_vars], 1 on w
    A_ub: sp.csr_matrix  # [num_rows, num_vars]
    b_ub: np.ndarray  # float64 [num_rows]
    lower: np.ndarray  # float64 [num_vars]
    upper: np.ndarray  # float64 [num_vars], inf where unbounded
    arc_src: np.ndarray  # int32 [num_arcs], i of arc (i, j), the arcs with an x
    arc_dst: np.ndarray  # int32 [num_arcs], j of arc (i, j)
    c_us: np.ndarray  # float64 [num_arcs], c_ij in microseconds
    p_us: np.ndarray  # float64 [num_ops], p_i in microseconds
    time_unit_us: float  # microseconds per unit of s and w in the matrix
    rows_per_block: tuple[int, int, int, int, int]  # rows of constraint blocks 1-5
    # The control-only arcs (block 5), as given, and how many barriers their rows use.
    fixed_src: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    fixed_dst: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    fixed_c_us: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    num_barriers: int = 0

    @property
    def num_arcs(self) -> int:
        return int(self.arc_src.shape[0])

    @property
    def num_ops(self) -> int:
        return int(self.p_us.shape[0])

    @property
    def num_vars(self) -> int:
        return self.num_arcs + self.num_ops + 1 + self.num_barriers

    @property
    def num_rows(self) -> int:
        return int(self.b_ub.shape[0])

    @property
    def all_arcs(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of every arc: those with an x, then the control-only ones (block 5)."""
        return np.concatenate([self.arc_src, self.fixed_src]), np.concatenate([self.arc_dst, self.fixed_dst])

    @property
    def w_index(self) -> int:
        """Column of w."""
        return self.num_arcs + self.num_ops


def arc_comm_us(graph: OpGraph, cluster: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The arcs of `graph`, sorted by (i, j), and their transfer times: ``(arc_src, arc_dst, c_us)``.

    ``c_ij`` sums, over the distinct tensors (and control messages) that i sends to j, the time to
    move them. The LP knows no devices, so each tensor is priced on the cluster's slowest line
    (several tasks may have two lines): the LP never counts on a transfer cheaper than the
    cluster can give. With one device nothing is ever moved and every ``c_ij`` is 0.
    """
    n = max(graph.num_ops, 1)
    key = graph.edge_src.astype(np.int64) * n + graph.edge_dst
    arc_key, edge_arc = np.unique(key, return_inverse=True)
    edge_arc = edge_arc.reshape(-1)
    tensor_us = np.zeros(graph.num_tensors)
    slopes, intercepts = cluster.pair_links()
    # The distinct lines, each as the complex number slope + intercept j (exact, and one
    # np.unique over numbers, not a sort of (slope, intercept) rows).
    for line in np.unique(slopes + 1j * intercepts).tolist():
        tensor_us = np.maximum(tensor_us, line.real * graph.tensor_bytes + line.imag)
    # One term per distinct (arc, tensor) pair: a tensor read twice by one op is sent once.
    nt = max(graph.num_tensors, 1)
    pair = np.unique(edge_arc.astype(np.int64) * nt + graph.edge_tensor)
    c_us = np.bincount(pair // nt, weights=tensor_us[pair % nt], minlength=arc_key.shape[0])
    return (arc_key // n).astype(np.int32), (arc_key % n).astype(np.int32), c_us.astype(np.float64)


def control_only_arcs(graph: OpGraph, arc_src: np.ndarray, arc_dst: np.ndarray) -> np.ndarray:
    """bool [num_arcs]: whether each arc (i, j) of `graph` (as `arc_comm_us` gives them) carries
    control edges alone, no tensor. Time O(E log E)."""
    n = max(graph.num_ops, 1)
    data = ~graph.is_control
    data_keys = np.unique(graph.edge_src[data].astype(np.int64) * n + graph.edge_dst[data])
    return ~np.isin(arc_src.astype(np.int64) * n + arc_dst, data_keys, assume_unique=False)


def build_sct_lp(graph: OpGraph, cluster: Cluster) -> SctLP:
    """The LP of the module docstring for `graph`, with ``c_ij`` from `cluster` (`arc_comm_us`)."""
    arc_src, arc_dst, c_us = arc_comm_us(graph, cluster)
    return sct_lp(graph.compute_us, arc_src, arc_dst, c_us, control=control_only_arcs(graph, arc_src, arc_dst))


def sct_lp(
    p_us: np.ndarray,
    arc_src: np.ndarray,
    arc_dst: np.ndarray,
    c_us: np.ndarray,
    *,
    s_lower_us: Optional[np.ndarray] = None,
    control: Optional[np.ndarray] = None,
) -> SctLP:
    """The LP over ops ``0..len(p_us)-1`` and the given distinct arcs (which must form a DAG).

    `s_lower_us` gives each op an earliest start (default 0), for a piece of a larger graph.
    `control` (bool per arc) marks the control-only arcs (`control_only_arcs`): they get no x
    (block 5); the LP's arcs are the others, in the order given.
    """
    p_us = np.asarray(p_us, dtype=np.float64)
    arc_src = np.asarray(arc_src, dtype=np.int32)
    arc_dst = np.asarray(arc_dst, dtype=np.int32)
    c_us = np.asarray(c_us, dtype=np.float64)
    fixed = np.zeros(arc_src.shape[0], dtype=bool) if control is None else np.asarray(control, dtype=bool)
    fixed_src, fixed_dst, fixed_c_us = arc_src[fixed], arc_dst[fixed], c_us[fixed]
    arc_src, arc_dst, c_us = arc_src[~fixed], arc_dst[~fixed], c_us[~fixed]
    n = p_us.shape[0]
    num_arcs = arc_src.shape[0]
    unit = float(max(p_us.max(initial=0.0), c_us.max(initial=0.0), fixed_c_us.max(initial=0.0))) or 1.0
    p = p_us / unit
    cost = c_us / unit
    s_col = num_arcs + np.arange(n, dtype=np.int64)  # column of s_i
    w_col = num_arcs + n
    outdeg = np.bincount(arc_src, minlength=n)
    indeg = np.bincount(arc_dst, minlength=n)

    # Block (1): s_i - s_j + c_ij x_ij <= -p_i. An arc that costs nothing has no x term.
    arcs = np.arange(num_arcs, dtype=np.int64)
    paid = np.flatnonzero(cost > 0)
    rows = [arcs, arcs, paid]
    cols = [s_col[arc_src], s_col[arc_dst], paid]
    vals = [np.ones(num_arcs), -np.ones(num_arcs), cost[paid]]
    rhs = [-p[arc_src]]
    first = num_arcs

    # Blocks (2) and (3): -sum x <= 1 - degree, one row per op of degree >= 2.
    counts = []
    for end, degree in ((arc_src, outdeg), (arc_dst, indeg)):
        ops = np.flatnonzero(degree >= 2)
        row_of_op = np.full(n, -1, dtype=np.int64)
        row_of_op[ops] = first + np.arange(ops.shape[0])
        members = np.flatnonzero(degree[end] >= 2)
        rows.append(row_of_op[end[members]])
        cols.append(members)
        vals.append(-np.ones(members.shape[0]))
        rhs.append(1.0 - degree[ops])
        first += ops.shape[0]
        counts.append(int(ops.shape[0]))

    # Block (4): s_i - w <= -p_i for every sink i.
    sinks = np.flatnonzero((outdeg == 0) & (np.bincount(fixed_src, minlength=n) == 0))
    r4 = first + np.arange(sinks.shape[0], dtype=np.int64)
    rows += [r4, r4]
    cols += [s_col[sinks], np.full(sinks.shape[0], w_col, dtype=np.int64)]
    vals += [np.ones(sinks.shape[0]), -np.ones(sinks.shape[0])]
    rhs.append(-p[sinks])
    first += sinks.shape[0]

    # Block (5): u - v <= -lag, for (u, v, lag) = (s_i, s_j, p_i + c_ij), or (s_i, b, p_i + c_ij)
    # and (b, s_j, 0) through a barrier.
    u, v, lag, num_barriers = _control_rows(fixed_src, fixed_dst, p[fixed_src] + fixed_c_us / unit, n)
    col = np.concatenate([s_col, w_col + 1 + np.arange(num_barriers, dtype=np.int64)])  # s_0.., b_0..
    r5 = first + np.arange(u.shape[0], dtype=np.int64)
    rows += [r5, r5]
    cols += [col[u], col[v]]
    vals += [np.ones(u.shape[0]), -np.ones(u.shape[0])]
    rhs.append(-lag)

    num_vars = num_arcs + n + 1 + num_barriers
    A_ub = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(first + u.shape[0], num_vars),
    )
    c = np.zeros(num_vars)
    c[w_col] = 1.0
    lower = np.zeros(num_vars)
    if s_lower_us is not None:
        lower[num_arcs:w_col] = np.asarray(s_lower_us, dtype=np.float64) / unit
    upper = np.full(num_vars, np.inf)
    upper[:num_arcs] = 1.0
    return SctLP(
        c=c,
        A_ub=A_ub,
        b_ub=np.concatenate(rhs),
        lower=lower,
        upper=upper,
        arc_src=arc_src,
        arc_dst=arc_dst,
        c_us=c_us,
        p_us=p_us,
        time_unit_us=unit,
        rows_per_block=(num_arcs, counts[0], counts[1], int(sinks.shape[0]), int(u.shape[0])),
        fixed_src=fixed_src,
        fixed_dst=fixed_dst,
        fixed_c_us=fixed_c_us,
        num_barriers=num_barriers,
    )


def _control_rows(src: np.ndarray, dst: np.ndarray, lag: np.ndarray, n: int):
    """The rows of block 5 for control-only arcs ``src -> dst`` (ops ``0..n-1``) of lag ``p_i +
    c_ij``: ``(u, v, lag, B)``, each row ``z_u + lag <= z_v`` over the index ``0..n-1`` of an op's
    start and ``n + k`` of barrier k, B barriers. The ops whose sets of (predecessor, lag) are
    equal share one barrier when that takes fewer rows (a set of m shared by k ops: m + k rows,
    not m k). Time O(F log F) for F arcs."""
    if src.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), np.zeros(0), 0
    order = np.lexsort((lag, src, dst))
    src, dst, lag = src[order].astype(np.int64), dst[order].astype(np.int64), lag[order]
    cuts = np.flatnonzero(np.diff(dst)) + 1
    first = np.concatenate(([0], cuts)).tolist()
    last = np.concatenate((cuts, [dst.shape[0]])).tolist()
    sharing: dict[bytes, list[int]] = {}  # a set of (predecessor, lag) -> its ops' first arcs
    for a, e in zip(first, last):
        sharing.setdefault(src[a:e].tobytes() + lag[a:e].tobytes(), []).append(a)
    span = dict(zip(first, last))
    u, v, lags = [], [], []
    barriers = 0
    for heads in sharing.values():
        a, e = heads[0], span[heads[0]]
        m, k = e - a, len(heads)
        if m + k < m * k:  # one barrier: its predecessors, then the ops that wait on it
            b = n + barriers
            barriers += 1
            u += [src[a:e], np.full(k, b, dtype=np.int64)]
            v += [np.full(m, b, dtype=np.int64), dst[heads]]
            lags += [lag[a:e], np.zeros(k)]
        else:
            for h in heads:
                u.append(src[h : span[h]])
                v.append(dst[h : span[h]])
                lags.append(lag[h : span[h]])
    return np.concatenate(u), np.concatenate(v), np.concatenate(lags), barriers
