"""Ranges of numbers that options and arguments must lie in, and the one check of them.

`check_range` is the range check of every flag and argument that shares a `Range`: a share of
a device's memory (`SHARE_OF_MEMORY`: ``--placer_memory_fraction``, ``--memory_fraction``,
``BaechiSession(memory_fraction=)``, `Cluster.with_memory_fraction`) is checked by it alone, with
one message naming what the user gave.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from baechi_tf.errors import ConfigError

__all__ = ["Range", "SHARE_OF_MEMORY", "check_range"]


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers from `low` to `high`, each end in or out of it."""

    low: float
    high: float
    low_in: bool = True  # `low` itself is in the range
    high_in: bool = True  # `high` itself is in the range
    meaning: str = ""  # what the number is, said after a value out of the range

    def __str__(self) -> str:
        return f"{'[' if self.low_in else '('}{self.low:g}, {self.high:g}{']' if self.high_in else ')'}"

    def __contains__(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
            return False
        above = value >= self.low if self.low_in else value > self.low
        below = value <= self.high if self.high_in else value < self.high
        return above and below


SHARE_OF_MEMORY = Range(0.0, 1.0, low_in=False)
"""A share of a device's memory: more than none, at most all of it."""


def check_range(label: str, value: Any, allowed: Range) -> None:
    """`ConfigError` unless `value` is a number in `allowed`: "`label`=`value` must be in (0, 1]"
    and, when `allowed` says, what the number is; `label` is what the user gave
    (``--placer_memory_fraction``, ``memory_fraction``). A float shows as ``%g`` does (3, not
    3.0), anything else as its repr. O(1)."""
    if value in allowed:
        return
    shown = f"{value:g}" if isinstance(value, float) else repr(value)
    meaning = f": {allowed.meaning}" if allowed.meaning else ""
    raise ConfigError(f"{label}={shown} must be in {allowed}{meaning}")
