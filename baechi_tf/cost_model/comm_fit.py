"""Fitting the linear communication cost ``a * bytes + b`` (us) to measured transfer times.

The communication benchmark (``utils/communication_benchmark.py``, Baechi SoCC 2020, section 7 of
the reference description) times transfers of 2^0 .. 2^(k-1) float32 elements between two devices
and fits a line through (bytes, microseconds). The original used ordinary least squares. With sizes
spread geometrically, OLS is dominated by the largest tensors: it minimises the sum of *squared
absolute* residuals, and at 2 GiB a transfer takes ~350 ms whose few-percent jitter (~10 ms) is a
hundred times the whole intercept (~134 us). The half of the sizes whose time is mostly the
intercept contributes nothing comparable, so the intercept comes out anywhere within the noise
of the largest sizes, negative included.

Here the runs of each size are first reduced to their median (a run delayed by the OS or by
another process is an outlier, not a slower link), and the line is fitted to the medians by least
squares on the *relative* error, i.e. each residual is divided by the median time (weights
1/time^2 on the squared residuals): every size counts alike in proportion to its own time, the
small sizes (time ~ b) pin the intercept and the large ones (time ~ a*bytes) the slope. Dividing
by each single run's time instead would favour the runs that happened to be fast. The solution
is constrained to ``a >= 0`` and ``b >= 0``, since a cost line must not be negative.

`fit_copies_in_flight` fits the link's `CommCost.copies_in_flight` K to copies sent together:
N tensors ready at once on one device, all read by one op on the other, timed from the producer's
end to the consumer's start for several N. The simulator books such copies one after another,
each holding the link for ``slope * bytes + intercept / K``, so the last is in after
``(N - 1) * (slope * bytes + intercept / K) + slope * bytes + intercept``: the slope h of the
time over N (least squares over the per-N medians) gives ``K = intercept / (h - slope * bytes)``,
the K for which the simulated copies follow each other as the measured ones do. A time offset
common to all N (two hosts' clocks) leaves h as it is. `copies_in_flight_in_trace` reads the same
h off a traced step instead: the median gap between the arrivals of copies on one link that were
ready before the one ahead of them could have started (which the model books back to back).

Cost: O(n log n) time and O(n) memory in the number of measurements n (sorting by size, then a
2-column least-squares problem over the distinct sizes or counts).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from baechi_tf.cluster import CommCost
from baechi_tf.errors import ProfileError

__all__ = ["CommFit", "InFlightFit", "copies_in_flight_in_trace", "fit_comm_cost", "fit_copies_in_flight"]

_WEIGHTINGS = ("relative", "ols")


@dataclasses.dataclass(frozen=True)
class CommFit:
    """A fitted communication line and how well it matches the measurements."""

    comm: CommCost  # slope_us_per_byte and intercept_us, both >= 0
    num_points: int  # measurements used
    num_sizes: int  # distinct transfer sizes among them
    rms_relative_error: float  # sqrt(mean(((a*x + b - y) / y)^2)) over the per-size medians


def fit_comm_cost(
    nbytes: Sequence[float],
    time_us: Sequence[float],
    *,
    weighting: str = "relative",
) -> CommFit:
    """Fits ``time_us ~ a * nbytes + b`` with ``a, b >= 0``.

    `nbytes[i]` is the size of transfer i in bytes and `time_us[i]` its measured time in
    microseconds; repeated sizes are expected (several runs per size) and are reduced to their
    median. `weighting` is ``'relative'`` (least squares on the relative error; the default, see
    the module docstring) or ``'ols'`` (plain least squares, as the original, for comparison).
    """
    if weighting not in _WEIGHTINGS:
        raise ProfileError(f"weighting={weighting!r}; use one of {', '.join(_WEIGHTINGS)}")
    x = np.asarray(nbytes, dtype=np.float64).ravel()
    y = np.asarray(time_us, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ProfileError(
            f"{x.size} transfer sizes but {y.size} times: give one time per measured transfer"
        )
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ProfileError("transfer sizes and times must be finite numbers (found NaN or inf)")
    if np.any(x < 0):
        raise ProfileError("transfer sizes must be >= 0 bytes")
    if np.any(y <= 0):
        raise ProfileError(
            f"{int(np.sum(y <= 0))} transfer time(s) are <= 0 us: drop the failed measurements "
            "before fitting"
        )
    sizes, medians = _medians(x, y, "transfer size")
    w = 1.0 / medians if weighting == "relative" else np.ones_like(medians)
    design = np.stack([sizes * w, w], axis=1)
    slope, intercept = _nonnegative_lstsq(design, medians * w)
    residual = (slope * sizes + intercept - medians) / medians
    return CommFit(
        comm=CommCost(slope_us_per_byte=float(slope), intercept_us=float(intercept)),
        num_points=int(x.size),
        num_sizes=int(sizes.size),
        rms_relative_error=float(np.sqrt(np.mean(residual * residual))),
    )


@dataclasses.dataclass(frozen=True)
class InFlightFit:
    """`fit_copies_in_flight`'s answer: the link with its fitted K, and what K came from."""

    comm: CommCost  # the line given, with copies_in_flight fitted
    spacing_us: float  # h: how much later the last copy is in per copy more sent together
    num_counts: int  # distinct numbers of copies timed
    rms_relative_error: float  # of the line a + h * N over the per-N medians


def fit_copies_in_flight(
    counts: Sequence[float], time_us: Sequence[float], comm: CommCost, nbytes: float
) -> InFlightFit:
    """Fits `comm`'s `CommCost.copies_in_flight` to `time_us[i]`, the time from the producer's
    end to the consumer's start of `counts[i]` copies of `nbytes` each sent together (see the
    module docstring). K is 1 when the copies follow each other a whole copy apart or more, and
    inf when they follow each other by their bytes alone or less (no fixed cost held)."""
    x = np.asarray(counts, dtype=np.float64).ravel()
    y = np.asarray(time_us, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ProfileError(f"{x.size} copy counts but {y.size} times: give one time per timed run")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ProfileError("copy counts and times must be finite numbers (found NaN or inf)")
    if np.any(x < 1) or np.any(x != np.round(x)):
        raise ProfileError("copy counts must be whole numbers >= 1")
    if np.any(y <= 0):
        raise ProfileError(
            f"{int(np.sum(y <= 0))} time(s) are <= 0 us: drop the failed measurements before fitting"
        )
    if not (math.isfinite(nbytes) and nbytes >= 0):
        raise ProfileError(f"nbytes={nbytes!r}: give the bytes of each copy, a finite number >= 0")
    n, medians = _medians(x, y, "number of copies")
    h, a = np.polyfit(n, medians, 1)
    residual = (a + h * n - medians) / medians
    return InFlightFit(
        comm=dataclasses.replace(comm, copies_in_flight=_k(comm, h - comm.slope_us_per_byte * nbytes)),
        spacing_us=float(h),
        num_counts=int(n.size),
        rms_relative_error=float(np.sqrt(np.mean(residual * residual))),
    )


def copies_in_flight_in_trace(
    ready_us: Sequence[float], arrival_us: Sequence[float], nbytes: Sequence[float], comm: CommCost
) -> tuple[float, float, int]:
    """(K, h, pairs): `comm`'s copies in flight read off the copies of one traced step on one
    link, copy i ready (its producer's end) at `ready_us[i]` and in at `arrival_us[i]`. Sorted
    by arrival, a copy ready at least ``slope * bytes + intercept`` before the one ahead of it
    arrived was ready before that one started, so the model has them back to back, arriving
    ``h = slope * bytes + intercept / K`` apart (the bytes the later copy's): h is the median
    gap of those `pairs`, and K as in `fit_copies_in_flight` from the median over them of the gap
    less the later copy's bytes' time. (nan, nan, 0) without such a pair. O(n log n)."""
    ready, arrival, size = (np.asarray(v, dtype=np.float64).ravel() for v in (ready_us, arrival_us, nbytes))
    if not ready.size == arrival.size == size.size:
        raise ProfileError(f"{ready.size} ready times, {arrival.size} arrivals and {size.size} sizes: "
                           "give one of each per copy")
    order = np.argsort(arrival, kind="stable")
    ready, arrival, size = ready[order], arrival[order], size[order]
    queued = ready[1:] <= arrival[:-1] - comm(size[:-1])
    if not queued.any():
        return math.nan, math.nan, 0
    gaps = np.diff(arrival)[queued]
    held = float(np.median(gaps - comm.slope_us_per_byte * size[1:][queued]))
    return _k(comm, held), float(np.median(gaps)), int(queued.sum())


def _k(comm: CommCost, held: float) -> float:
    """The copies in flight for which a copy holds the link `held` us beyond its bytes: 1 for
    the whole intercept or more, inf for nothing or less."""
    if held >= comm.intercept_us:
        return 1.0
    if held <= 0:
        return math.inf
    return comm.intercept_us / held


def _medians(x: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of x, ascending, and the median of y at each; at least 2 of them."""
    values, inverse = np.unique(x, return_inverse=True)
    if values.size < 2:
        raise ProfileError(f"the measurements cover {values.size} {what}(s); a line needs at least 2")
    return values, np.array([np.median(y[inverse == i]) for i in range(values.size)])


def _nonnegative_lstsq(design: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """argmin ||design @ c - target|| over c >= 0, for a 2-column `design`.

    The columns are scaled to unit norm first: bytes and 1 differ by nine orders of magnitude.
    If the unconstrained optimum has a negative coordinate, the constrained one lies on an edge
    of the quadrant (the problem is convex), so the better of the two one-column fits wins.
    """
    norms = np.linalg.norm(design, axis=0)
    norms[norms == 0] = 1.0
    scaled = design / norms
    coef, *_ = np.linalg.lstsq(scaled, target, rcond=None)
    if np.all(coef >= 0):
        return float(coef[0] / norms[0]), float(coef[1] / norms[1])
    best: tuple[float, np.ndarray] | None = None
    for j in range(2):
        col = scaled[:, j]
        c = np.zeros(2)
        c[j] = max(0.0, float(col @ target) / float(col @ col))
        err = float(np.sum((scaled @ c - target) ** 2))
        if best is None or err < best[0]:
            best = (err, c)
    assert best is not None
    c = best[1]
    return float(c[0] / norms[0]), float(c[1] / norms[1])
