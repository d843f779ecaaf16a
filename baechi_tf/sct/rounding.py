"""From LP values to favourite children (Baechi, SoCC 2020, section 4.3; Hanen and Munier 1995).

An arc (i, j) is *favourite* when its LP value is at most the threshold θ (``--sct_threshold``,
0.1 by default): ``x_ij <= θ``. This is the original's ``round(x - θ + 0.5) == 0`` with Python's
round-half-to-even, ties included (0.1 is favourite at θ = 0.1, 0.11 is not).

Each op may have at most one favourite child and at most one favourite parent. With θ < 0.5 and
an exact LP optimum the favourite arcs already satisfy that (the row ``sum_j x_ij >= outdeg - 1``
leaves room for only one ``x_ij < 0.5``); with θ >= 0.5, or a solver's tolerance, two favourite
arcs may share an end. Favourite arcs are then taken in increasing order of x (the LP's firmest
choices first; ties by arc order), and an arc is kept only if neither its parent already has a
child nor its child a parent. The result is a matching: ``child[i] == j`` exactly when
``parent[j] == i``.

The original instead let the last arc visited win and cleared only the previous parent's pointer,
which could leave a stale ``parent`` naming an op whose favourite had since moved on, and a later
arc into that child would then clear the wrong op's favourite.

Time: O(A log A) for A arcs.
"""

from __future__ import annotations

import numpy as np

from baechi_tf.errors import ConfigError

__all__ = ["favourite_children"]


def favourite_children(
    arc_src: np.ndarray, arc_dst: np.ndarray, x: np.ndarray, num_ops: int, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(child, parent)``: int32 [num_ops] arrays, -1 where an op has no favourite."""
    if not 0.0 <= threshold < 1.0:
        raise ConfigError(f"sct_threshold {threshold!r} must be in [0, 1)")
    x = np.asarray(x, dtype=np.float64)
    favourite = np.flatnonzero(x <= threshold)
    favourite = favourite[np.argsort(x[favourite], kind="stable")]
    child = [-1] * num_ops
    parent = [-1] * num_ops
    for i, j in zip(np.asarray(arc_src)[favourite].tolist(), np.asarray(arc_dst)[favourite].tolist()):
        if child[i] < 0 and parent[j] < 0:
            child[i] = j
            parent[j] = i
    return np.asarray(child, dtype=np.int32), np.asarray(parent, dtype=np.int32)
