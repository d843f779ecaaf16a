"""The communication-line fit recovers known coefficients from synthetic timings."""

import numpy as np
import pytest

from baechi_tf.cost_model.comm_fit import CommFit, fit_comm_cost
from baechi_tf.errors import ProfileError

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
