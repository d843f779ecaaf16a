"""Turning TensorFlow's run-time out-of-memory error into one that says what to change."""

from __future__ import annotations

import re
from typing import Any, Optional

from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.placer.scheduler_state import format_bytes

__all__ = ["out_of_memory_error"]

_OOM = re.compile(r"\bOOM\b|out of memory|exhausted", re.IGNORECASE)
_DEVICE = re.compile(r"\bon (/job:[^\s]+?/device:[A-Za-z_]+:\d+|/device:[A-Za-z_]+:\d+)")


def out_of_memory_error(error: Any, result: Optional[Any] = None, *, when: str = "") -> InfeasiblePlacementError:
    """An `InfeasiblePlacementError` for TF's ``ResourceExhaustedError`` `error`.

    It names the device TF ran out of memory on, TF's line on the allocation, the simulated peak
    and capacity of that device in `result` (a `PlacementResult`, when the graph was placed), and
    the flags to change. Raise it ``from error``: TF's whole message stays its ``__cause__``.
    """
    text = str(getattr(error, "message", None) or error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # TF's own words: its line on the allocation ("OOM when allocating tensor with shape[...]"),
    # not the "Graph execution error:" that heads its message.
    quoted = next(
        (line for line in lines if _OOM.search(line)),
        next((line for line in lines if line != "Graph execution error:"), "ResourceExhaustedError"),
    )
    m = _DEVICE.search(text)
    device = m.group(1) if m else None
    where = f" on {device}" if device else ""
    expected = ""
    if result is not None and device is not None:
        d = result.cluster.find(device)
        if d is not None:
            reordered = result.reordered_peak_bytes
            out_of_order = (
                f" ({format_bytes(reordered[d])} with its ops out of the simulated order)"
                if reordered[d] != result.schedule.peak_memory_bytes[d] else ""
            )
            expected = (
                f"; the placer expected a peak of {format_bytes(result.schedule.peak_memory_bytes[d])}"
                f"{out_of_order} of the {format_bytes(result.cluster.devices[d].memory_bytes)} it "
                "assumed there"
            )
    return InfeasiblePlacementError(
        f"the graph ran out of memory{where}{when} ({quoted[:200]}){expected}: give the placer less "
        "memory per device to plan with (--placer_memory_fraction or memory_fraction below 1, or a "
        "smaller --memory_per_device), use more devices, or a smaller batch"
    )
