"""Energetic lower bounds: the devices cannot all be busy while few ops are ready.

In a window at the start of a set of ops (a phase of the graph), the devices do no more work than
the ops released by then bring (each op's head, the earliest it can start), and likewise in a
window before its end (tails); the rest of the work runs between the windows. `energetic_bounds`
gives, for each set, the least span these windows allow (see its docstring), `energetic_us` the
same for one set without anchors. Used by `bounds.lower_bound_us`. Time O(V log V) for all sets.
"""

from __future__ import annotations

import numpy as np

__all__ = ["energetic_bounds", "energetic_us"]


def energetic_us(compute: np.ndarray, head: np.ndarray, tail: np.ndarray, num_devices: int) -> float:
    """`energetic_bounds` of one set of ops, without anchors."""
    one = np.zeros(compute.shape[0], dtype=np.int64)
    no = np.zeros(1, dtype=bool)
    return float(
        energetic_bounds(one, compute, head, tail, num_devices, remote_head=head, remote_tail=tail,
                         anchored_head=no, anchored_tail=no)[0]
    )


def energetic_bounds(
    set_of: np.ndarray,
    compute: np.ndarray,
    head: np.ndarray,
    tail: np.ndarray,
    num_devices: int,
    *,
    remote_head: np.ndarray,
    remote_tail: np.ndarray,
    anchored_head: np.ndarray,
    anchored_tail: np.ndarray,
) -> np.ndarray:
    """The energetic bound of each set of ops: the least span M on `num_devices` devices that
    each run one op at a time, when op i starts no earlier than head[i] after the set's start and
    ends no later than tail[i] before its end. Op i is in set set_of[i] (ascending from 0).

    In [0, t1] op i runs at most min(compute_i, (t1 - head_i)+), so the devices do at most
    A(t1) = min(k t1, the sum of those) there; in [M - t2, M] at most B(t2), the same with
    tails. If A(t1) + B(t2) < W, the set's work, the two windows cannot cover [0, M] (the work
    would not fit), so M >= t1 + t2, and the rest of the work runs between them on k devices:
    M >= t1 + t2 + (W - A(t1) - B(t2)) / k. The bound is the max of that over t1 and t2 at the
    breakpoints of A and B (any value taken is valid; between breakpoints the expression is
    convex in each, so no larger value is missed but where the constraint cuts in).

    Where anchored_head[set] (an op that ends at the set's start, see `bounds._PhaseSpans`), remote_head
    is the ops' least start off that op's device: that device does at most t1 in [0, t1] and the
    other k - 1 at most the same sum with remote heads, so A(t1) is also at most
    t1 + min((k - 1) t1, that sum); anchored_tail and remote_tail likewise for B. Time
    O(V log V) for all sets together.
    """
    k = num_devices
    num_sets = int(set_of[-1]) + 1
    work = np.bincount(set_of, weights=compute, minlength=num_sets)
    t1, a, set1 = _window_work(set_of, compute, head, remote_head, anchored_head, k)
    t2, b, set2 = _window_work(set_of, compute, tail, remote_tail, anchored_tail, k)
    # For each t1, the best t2 with b < W - a (strictly, with room for rounding): b rises with
    # t2 inside a set, so that is a running max of t2 - b / k up to the last t2 below the limit.
    second = _running_max(t2 - b / k, set2)
    # a and b are differences of sums of up to 2m values as large as the set's breakpoints (a
    # copy can take 1e9 us beside ops of 0.1 us), taken beside the lifts that keep the sets
    # apart: the room is many times their rounding, so that W - a - b > 0 is never rounding.
    size = np.bincount(set_of, minlength=num_sets)
    reach = np.zeros(num_sets)
    np.maximum.at(reach, set1, t1)
    np.maximum.at(reach, set2, t2)
    lifts = float((reach + work + 1.0).sum())
    room = 1e-9 * (work + 1.0) + 1e-12 * (size * reach + lifts)
    limit = work[set1] - a - room[set1]
    last = _last_below(b, set2, limit, set1)
    fits = last >= 0
    gain = np.zeros(num_sets)
    np.maximum.at(gain, set1[fits], t1[fits] - a[fits] / k + second[last[fits]])
    return work / k + gain


def _window_work(
    set_of: np.ndarray,
    compute: np.ndarray,
    release: np.ndarray,
    remote: np.ndarray,
    anchored: np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t, most work in [0, t], set) at every breakpoint t of `energetic_bounds`' A (0, and each
    op's release, and in an anchored set its remote release, and those plus its compute), by set,
    then t. A set's points do not depend on the other sets, so neither does its bound."""
    num_sets = anchored.shape[0]
    parts, part_sets = [np.zeros(num_sets), release, release + compute], [np.arange(num_sets), set_of, set_of]
    if anchored.any():
        mine = anchored[set_of]
        parts += [remote[mine], remote[mine] + compute[mine]]
        part_sets += [set_of[mine], set_of[mine]]
    t, sets = np.concatenate(parts), np.concatenate(part_sets)
    order = np.argsort(t + _lift(t, sets, num_sets)[1][sets], kind="stable")
    t, sets = t[order], sets[order]
    most = np.minimum(k * t, _released_work(set_of, compute, release, t, sets))
    if anchored.any():
        off_anchor = t + np.minimum((k - 1) * t, _released_work(set_of, compute, remote, t, sets))
        most = np.where(anchored[sets], np.minimum(most, off_anchor), most)
    return t, _running_max(most, sets), sets  # rounding must not make it fall


def _released_work(
    set_of: np.ndarray, compute: np.ndarray, release: np.ndarray, t: np.ndarray, t_set: np.ndarray
) -> np.ndarray:
    """Sum over the ops of t's set of min(compute, (t - release)+), at each t: ramps that start
    at release and stop at release + compute."""
    return _ramps(set_of, release, t, t_set) - _ramps(set_of, release + compute, t, t_set)


def _ramps(set_of: np.ndarray, starts: np.ndarray, t: np.ndarray, t_set: np.ndarray) -> np.ndarray:
    """Sum over the starts s of t's set of (t - s)+, at each t: count * t - sum of the starts at
    or below t, in the set. `set_of` (of the starts) ascending."""
    num = int(max(set_of[-1], t_set.max())) + 1
    _, lift = _lift(np.concatenate([starts, t]), np.concatenate([set_of, t_set]), num)
    order = np.argsort(starts + lift[set_of], kind="stable")
    lifted = (starts + lift[set_of])[order]
    # Running sums of the sorted starts, 0 before each set's first.
    total = np.concatenate([[0.0], _segment_cumsum(starts[order], set_of)])
    first = np.searchsorted(set_of, t_set, side="left")
    upto = np.searchsorted(lifted, t + lift[t_set], side="right")  # starts at or below t
    below = np.where(upto > first, total[upto], 0.0)
    return (upto - first) * t - below


def _segment_cumsum(values: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """Running sums that restart at each set (`sets` ascending): each set's first value also
    takes back the sum of the set before, so the running total, and its rounding, stays the
    size of one set's values."""
    adjusted = values.astype(np.float64)
    first = np.flatnonzero(np.concatenate([[True], sets[1:] != sets[:-1]]))
    sums = np.add.reduceat(adjusted, first)
    adjusted[first[1:]] -= sums[:-1]
    return np.cumsum(adjusted)


def _lift(values: np.ndarray, sets: np.ndarray, num_sets: int) -> tuple[np.ndarray, np.ndarray]:
    """(peak, lift) per set: its largest value, and an offset that puts the set's `values`
    (>= 0) above every earlier set's, the sum of the earlier peaks plus 1 each. A sort or search
    on the lifted values is one by set, then value."""
    peak = np.zeros(num_sets)
    np.maximum.at(peak, sets, values)
    return peak, np.concatenate([[0.0], np.cumsum(peak + 1.0)[:-1]])


def _running_max(values: np.ndarray, sets: np.ndarray) -> np.ndarray:
    """Running max of `values` (>= 0) that restarts at each set (`sets` ascending)."""
    lift = _lift(values, sets, int(sets[-1]) + 1)[1][sets]
    return np.maximum.accumulate(values + lift) - lift


def _last_below(
    values: np.ndarray, sets: np.ndarray, limit: np.ndarray, limit_set: np.ndarray
) -> np.ndarray:
    """For each limit, the last index i of its set with values[i] < limit, or -1; `values`
    (>= 0) rise inside each set, `sets` ascending."""
    peak, lift = _lift(values, sets, int(sets[-1]) + 1)
    first = np.searchsorted(sets, limit_set, side="left")
    # A limit above the set's peak stops at its last value, not in the next set.
    query = np.minimum(limit, peak[limit_set] + 0.5) + lift[limit_set]
    last = np.searchsorted(values + lift[sets], query, side="left") - 1
    return np.where(last >= first, last, -1)
