"""The communication-line fit recovers known coefficients from synthetic timings."""

import math

import numpy as np
import pytest

from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.cost_model.comm_fit import (
    CommFit, InFlightFit, copies_in_flight_in_trace, fit_comm_cost, fit_copies_in_flight,
)
from baechi_tf.errors import ProfileError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer.schedule import Placement
from baechi_tf.placer.simulator import simulate

SLOPE, INTERCEPT = 0.0001754, 134.0  # the original's README line, us per byte and us
# The original benchmark's sizes: 2^0 .. 2^29 float32 elements, 20 runs each.
NBYTES = np.repeat(4.0 * 2.0 ** np.arange(30), 20)


def _noisy_times(seed: int, sigma: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (SLOPE * NBYTES + INTERCEPT) * rng.lognormal(0.0, sigma, NBYTES.size)


def test_exact_line_is_recovered_exactly():
    fit = fit_comm_cost(NBYTES, SLOPE * NBYTES + INTERCEPT)
    assert isinstance(fit, CommFit)
    assert fit.comm.slope_us_per_byte == pytest.approx(SLOPE, rel=1e-9)
    assert fit.comm.intercept_us == pytest.approx(INTERCEPT, rel=1e-9)
    assert fit.num_points == NBYTES.size
    assert fit.num_sizes == 30
    assert fit.rms_relative_error < 1e-9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_timings_recover_both_coefficients(seed):
    fit = fit_comm_cost(NBYTES, _noisy_times(seed))
    assert fit.comm.slope_us_per_byte == pytest.approx(SLOPE, rel=0.02)
    assert fit.comm.intercept_us == pytest.approx(INTERCEPT, rel=0.03)
    assert fit.rms_relative_error < 0.03  # medians of 20 runs with 5% jitter


def test_delayed_runs_do_not_move_the_line():
    # Every 10th run waited 5 ms for a busy CPU: the medians of each size ignore them.
    times = SLOPE * NBYTES + INTERCEPT
    times[::10] += 5000.0
    fit = fit_comm_cost(NBYTES, times)
    assert fit.comm.slope_us_per_byte == pytest.approx(SLOPE, rel=1e-6)
    assert fit.comm.intercept_us == pytest.approx(INTERCEPT, rel=1e-6)


def test_plain_least_squares_misses_the_intercept_that_the_relative_fit_finds():
    times = _noisy_times(0)
    relative = fit_comm_cost(NBYTES, times)
    ols = fit_comm_cost(NBYTES, times, weighting="ols")
    # Same slope to a few percent, but OLS is ruled by the 2 GiB transfers, whose jitter is
    # far larger than the intercept.
    assert ols.comm.slope_us_per_byte == pytest.approx(SLOPE, rel=0.03)
    relative_error = abs(relative.comm.intercept_us - INTERCEPT)
    ols_error = abs(ols.comm.intercept_us - INTERCEPT)
    assert ols_error > 10 * relative_error
    assert relative.rms_relative_error < ols.rms_relative_error


def test_coefficients_are_never_negative():
    # A pure bandwidth line with noise: the unconstrained intercept may come out below 0.
    rng = np.random.default_rng(3)
    x = np.repeat(4.0 * 2.0 ** np.arange(10, 20), 5)
    y = SLOPE * x * rng.lognormal(0.0, 0.05, x.size)
    fit = fit_comm_cost(x, y)
    assert fit.comm.intercept_us >= 0.0
    assert fit.comm.slope_us_per_byte == pytest.approx(SLOPE, rel=0.05)
    # Times that fall with size: the best line with slope >= 0 is flat.
    flat = fit_comm_cost([0.0, 0.0, 100.0, 100.0], [10.0, 10.0, 5.0, 5.0])
    assert flat.comm.slope_us_per_byte == 0.0
    assert 5.0 < flat.comm.intercept_us < 10.0


@pytest.mark.parametrize(
    ("nbytes", "times", "kwargs", "match"),
    [
        ([1, 2], [1.0], {}, "2 transfer sizes but 1 times"),
        ([4, 4, 4], [1.0, 2.0, 3.0], {}, "1 transfer size"),
        ([4, 8], [1.0, 0.0], {}, "<= 0 us"),
        ([4, 8], [1.0, float("nan")], {}, "finite"),
        ([-4, 8], [1.0, 2.0], {}, ">= 0 bytes"),
        ([4, 8], [1.0, 2.0], {"weighting": "l1"}, "weighting='l1'"),
    ],
)
def test_bad_measurements_are_rejected(nbytes, times, kwargs, match):
    with pytest.raises(ProfileError, match=match):
        fit_comm_cost(nbytes, times, **kwargs)


# ---------------------------------------------------------------- copies in flight

LINK = CommCost(0.0005, 150.0)
COUNTS = np.repeat([1, 2, 4, 8, 16, 32], 7)


def _together_us(link: CommCost, k: float, counts, nbytes: float = 4.0) -> np.ndarray:
    """When the last of `counts` copies sent together is in, under the simulator's model."""
    n = np.asarray(counts, dtype=np.float64)
    return (n - 1) * (link.slope_us_per_byte * nbytes + link.intercept_us / k) + link(nbytes)


def test_copies_in_flight_are_recovered_exactly_and_a_clock_offset_changes_nothing():
    for offset in (0.0, 37.5):
        fit = fit_copies_in_flight(COUNTS, _together_us(LINK, 2.5, COUNTS) + offset, LINK, 4.0)
        assert isinstance(fit, InFlightFit) and fit.num_counts == 6
        assert fit.comm.copies_in_flight == pytest.approx(2.5, rel=1e-9)
        assert fit.comm.slope_us_per_byte == LINK.slope_us_per_byte and fit.comm.intercept_us == 150
        assert fit.spacing_us == pytest.approx(0.002 + 60, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_copies_in_flight_with_delayed_runs_are_recovered_within_10_percent(seed):
    rng = np.random.default_rng(seed)
    times = _together_us(LINK, 3.0, COUNTS) * rng.lognormal(0.0, 0.05, COUNTS.size)
    times[rng.choice(COUNTS.size, 8, replace=False)] += 5000.0  # a few runs descheduled
    fit = fit_copies_in_flight(COUNTS, times, LINK, 4.0)
    assert fit.comm.copies_in_flight == pytest.approx(3.0, rel=0.1)


def test_copies_a_whole_copy_apart_are_one_in_flight_and_by_their_bytes_alone_unbounded():
    apart = fit_copies_in_flight(COUNTS, _together_us(LINK, 1.0, COUNTS) * 1.2, LINK, 4.0)
    assert apart.comm.copies_in_flight == 1.0
    flat = fit_copies_in_flight(COUNTS, np.full(COUNTS.size, 200.0), LINK, 4.0)
    assert flat.comm.copies_in_flight == math.inf


@pytest.mark.parametrize("k", [1.0, 2.0, 4.5, math.inf])
def test_the_fit_inverts_the_simulator_on_copies_sent_together(k):
    #   p --out 0..n-1 (4 B each)--> c       p on task 0, c on task 1
    # The fitted K, from the simulated times of c's start after p's end, is the link's.
    devices = tuple(Device(f"/job:worker/replica:0/task:{i}/device:CPU:0", 1 << 30, "CPU") for i in range(2))
    link = CommCost(0.0005, 150.0, copies_in_flight=k)
    counts, times = [], []
    for n in (1, 2, 4, 8, 16):
        b = OpGraphBuilder()
        b.add_op("p", 5, [4] * n)
        b.add_op("c", 5, [4])
        for i in range(n):
            b.add_edge("p", "c", i)
        g = b.build()
        s = simulate(g, Cluster(devices, link), Placement(np.array([0, 1]), "fixed"))
        counts.append(n)
        times.append(float(s.start_us[1] - s.end_us[0]))
    fit = fit_copies_in_flight(counts, times, CommCost(0.0005, 150.0), 4.0)
    assert fit.comm.copies_in_flight == (k if k in (1.0, math.inf) else pytest.approx(k, rel=1e-9))


@pytest.mark.parametrize(
    "counts, times, nbytes, match",
    [
        ([1, 2], [100.0], 4.0, "2 copy counts but 1 times"),
        ([2, 2, 2], [100.0, 110.0, 120.0], 4.0, "1 number of copies"),
        ([1, 2], [100.0, 0.0], 4.0, "<= 0 us"),
        ([1, 2], [100.0, float("inf")], 4.0, "finite"),
        ([0, 2], [100.0, 120.0], 4.0, "whole numbers >= 1"),
        ([1, 2.5], [100.0, 120.0], 4.0, "whole numbers >= 1"),
        ([1, 2], [100.0, 120.0], -1.0, "nbytes=-1.0: give the bytes of each copy"),
    ],
)
def test_bad_copies_in_flight_measurements_are_rejected(counts, times, nbytes, match):
    with pytest.raises(ProfileError, match=match):
        fit_copies_in_flight(counts, times, LINK, nbytes)


@pytest.mark.parametrize("k", [1.0, 2.0, 4.5, math.inf])
def test_copies_in_flight_are_read_off_a_trace_of_the_simulator(k):
    #   p0 --2 x 4 B--> c0    p1 --2 x 4,000 B--> c1    p0, p1 on task 0; c0, c1 on task 1
    # The copies queue on the link: the trace gives the link's K back.
    devices = tuple(Device(f"/job:worker/replica:0/task:{i}/device:CPU:0", 1 << 30, "CPU") for i in range(2))
    link = CommCost(0.0005, 150.0, copies_in_flight=k)
    b = OpGraphBuilder()
    b.add_op("p0", 5, [4, 4])
    b.add_op("p1", 5, [4000, 4000])
    for c, p in (("c0", "p0"), ("c1", "p1")):
        b.add_op(c, 5, [4])
        for i in range(2):
            b.add_edge(p, c, i)
    g = b.build()
    s = simulate(g, Cluster(devices, link), Placement(np.array([0, 0, 1, 1]), "fixed"))
    ready = [float(s.end_us[g.tensor_src[t.tensor]]) for t in s.transfers]
    arrival = [t.end_us for t in s.transfers]
    nbytes = [float(g.tensor_bytes[t.tensor]) for t in s.transfers]
    got, spacing, pairs = copies_in_flight_in_trace(ready, arrival, nbytes, CommCost(0.0005, 150.0))
    # p1's copies queue behind p0's, but for K = inf, where p0's are gone by p1's end at 10 us.
    assert pairs == (2 if k == math.inf else 3) and spacing > 0
    assert got == (k if k in (1.0, math.inf) else pytest.approx(k, rel=1e-9))


def test_a_trace_without_copies_back_to_back_gives_no_figure():
    # Each copy ready long after the one ahead of it arrived: nothing to read K from.
    k, spacing, pairs = copies_in_flight_in_trace([0, 1000, 2000], [150, 1150, 2150], [4, 4, 4], LINK)
    assert pairs == 0 and math.isnan(k) and math.isnan(spacing)
    with pytest.raises(ProfileError, match="3 ready times, 2 arrivals and 3 sizes: give one of each"):
        copies_in_flight_in_trace([0, 1, 2], [1, 2], [4, 4, 4], LINK)
