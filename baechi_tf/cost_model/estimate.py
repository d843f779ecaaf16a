"""Compute time of an op of a type no run measured, from its shapes.

An op that ran in no profiled step takes the median time of the measured ops of its type (the
importer does that); when no op of its type was measured, its time comes from what it reads,
writes and computes: ``base_us + us_per_byte * bytes + us_per_flop * flops``, with the three
coefficients fitted to the measured ops of the same profile (non-negative least squares over
relative errors, so that the many small ops count as much as the few large ones).

`op_flops` counts the multiply-adds of the contractions (MatMul, BatchMatMul, convolutions and
their gradients) from static shapes, and one operation per output element for any other op;
unknown dimensions count as 1, as the importer counts bytes.

Pure: numpy and scipy, no TensorFlow. Fitting is O(samples); an estimate O(1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

__all__ = ["DEFAULT_SHAPE_COST", "ShapeCost", "fit_shape_cost", "op_flops"]

Shape = Optional[Sequence[Optional[int]]]  # None: unknown rank; None in it: an unknown dimension


@dataclasses.dataclass(frozen=True)
class ShapeCost:
    """Compute time from an op's bytes (read and written) and operations."""

    base_us: float  # any op's own cost (scheduling, kernel launch)
    us_per_byte: float  # per byte of its inputs and outputs
    us_per_flop: float  # per floating-point operation

    def estimate_us(self, nbytes: float, flops: float) -> float:
        return self.base_us + self.us_per_byte * nbytes + self.us_per_flop * flops


DEFAULT_SHAPE_COST = ShapeCost(base_us=5.0, us_per_byte=1e-4, us_per_flop=1e-4)
"""For a profile with too few measured ops to fit: 5 us an op, 10 GB/s and 10 GFLOP/s (a CPU
core's order of magnitude)."""

_MIN_SAMPLES = 8


def fit_shape_cost(nbytes: Sequence[float], flops: Sequence[float], compute_us: Sequence[float]) -> ShapeCost:
    """The `ShapeCost` that best explains the measured ops (one entry of each sequence per op),
    each op's error relative to its own time; `DEFAULT_SHAPE_COST` from fewer than 8 ops."""
    from scipy.optimize import nnls

    b, f, us = (np.asarray(v, dtype=np.float64) for v in (nbytes, flops, compute_us))
    keep = np.isfinite(b) & np.isfinite(f) & np.isfinite(us) & (us >= 0)
    if int(keep.sum()) < _MIN_SAMPLES:
        return DEFAULT_SHAPE_COST
    b, f, us = b[keep], f[keep], us[keep]
    weight = 1.0 / np.maximum(us, 1.0)
    scale = np.array([1.0, max(b.max(), 1.0), max(f.max(), 1.0)])  # columns of like size for nnls
    matrix = np.column_stack([np.ones_like(b), b, f]) / scale * weight[:, None]
    coef, _ = nnls(matrix, us * weight)
    coef = coef / scale
    return ShapeCost(float(coef[0]), float(coef[1]), float(coef[2]))


def _elements(shape: Shape) -> int:
    if shape is None:
        return 1
    return math.prod(d if d is not None and d >= 0 else 1 for d in shape)


def _dim(shape: Shape, index: int) -> int:
    if shape is None or not shape or len(shape) < abs(index):
        return 1
    d = shape[index]
    return d if d is not None and d > 0 else 1


def op_flops(op_type: str, inputs: Sequence[Shape], outputs: Sequence[Shape]) -> float:
    """Floating-point operations of one op of `op_type` with these input and output shapes."""
    out = _elements(outputs[0]) if outputs else 0
    if op_type in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3") and inputs and outputs:
        return 2.0 * _elements(inputs[0]) * _dim(outputs[0], -1)
    if op_type in ("Conv2D", "Conv3D") and len(inputs) >= 2:
        return 2.0 * out * _elements(inputs[1]) / _dim(inputs[1], -1)
    if op_type == "DepthwiseConv2dNative" and len(inputs) >= 2:
        return 2.0 * out * _elements(inputs[1]) / (_dim(inputs[1], -1) * _dim(inputs[1], -2))
    if op_type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2") and len(inputs) >= 3:
        return 2.0 * _elements(inputs[2]) * _elements(inputs[1]) / _dim(inputs[1], -1)
    if op_type in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2") and len(inputs) >= 3 and outputs:
        return 2.0 * _elements(inputs[2]) * out / _dim(outputs[0], -1)
    return float(max((_elements(s) for s in outputs), default=0))
