"""Compute time of ops of unmeasured types from their shapes (baechi_tf.cost_model.estimate)."""

import numpy as np
import pytest

from baechi_tf.cost_model.estimate import DEFAULT_SHAPE_COST, ShapeCost, fit_shape_cost, op_flops


def test_the_fit_recovers_the_coefficients_that_made_the_times():
    rng = np.random.default_rng(0)
    nbytes = rng.integers(1_000, 10_000_000, 200).astype(float)
    flops = rng.integers(0, 50_000_000, 200).astype(float)
    truth = ShapeCost(base_us=4.0, us_per_byte=2e-4, us_per_flop=5e-5)
    times = [truth.estimate_us(b, f) for b, f in zip(nbytes, flops)]
    fitted = fit_shape_cost(nbytes, flops, times)
    assert fitted.base_us == pytest.approx(4.0, rel=1e-3)
    assert fitted.us_per_byte == pytest.approx(2e-4, rel=1e-3)
    assert fitted.us_per_flop == pytest.approx(5e-5, rel=1e-3)


def test_no_coefficient_is_negative_and_too_few_ops_give_the_default():
    # Times that fall with size would fit a negative slope: it stays at 0.
    fitted = fit_shape_cost([1e3, 1e4, 1e5, 1e6] * 3, [0.0] * 12, [50, 40, 30, 20] * 3)
    assert fitted.us_per_byte == 0 and fitted.us_per_flop == 0 and fitted.base_us > 0
    assert fit_shape_cost([1.0, 2.0], [1.0, 2.0], [1.0, 2.0]) == DEFAULT_SHAPE_COST
    assert DEFAULT_SHAPE_COST.estimate_us(1e6, 1e6) == pytest.approx(5 + 100 + 100)


def test_flops_of_contractions_and_of_other_ops():
    assert op_flops("MatMul", [[8, 32], [32, 16]], [[8, 16]]) == 2 * 8 * 32 * 16
    assert op_flops("BatchMatMulV2", [[4, 8, 32], [4, 32, 16]], [[4, 8, 16]]) == 2 * 4 * 8 * 32 * 16
    # NHWC 2x8x8x3 convolved with a 3x3x3x4 kernel: each of 2*8*8*4 outputs takes 3*3*3 products.
    assert op_flops("Conv2D", [[2, 8, 8, 3], [3, 3, 3, 4]], [[2, 8, 8, 4]]) == 2 * (2 * 8 * 8 * 4) * 27
    assert op_flops("DepthwiseConv2dNative", [[2, 8, 8, 3], [3, 3, 3, 2]], [[2, 8, 8, 6]]) == 2 * (2 * 8 * 8 * 6) * 9
    assert op_flops("Conv2DBackpropFilter", [[2, 8, 8, 3], [4], [2, 8, 8, 4]], [[3, 3, 3, 4]]) == 2 * (2 * 8 * 8 * 4) * 27
    assert op_flops("Relu", [[2, 8]], [[2, 8]]) == 16
    assert op_flops("Relu", [None], [[None, 8]]) == 8  # unknown dimensions count as 1
    assert op_flops("NoOp", [], []) == 0
