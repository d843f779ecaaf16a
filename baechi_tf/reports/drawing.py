"""What the figures of the reports share: matplotlib's settings, the size and resolution of
the figures, their PNG encoder, and the units of their axes and labels.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no global state) and come out
the same, byte for byte, for the same input.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np

__all__: list[str] = []

_DPI = 100
_CRITICAL = "#d62728"  # the critical path, and a device's capacity
# Text is drawn as given: op, type and device names may hold "$" (an even number of them made
# matplotlib parse them as mathtext, and "$$" raised ValueError).
_RC = {"font.size": 8, "axes.titlesize": 10, "text.parse_math": False}


def _time_unit(makespan_us: float) -> tuple[float, str]:
    """(scale, unit) of a time axis: ticks of at most 5 digits (matplotlib writes an offset such
    as '1e6' beside a 'time (ms)' of a 40-minute step)."""
    if makespan_us >= 10_000_000:
        return 1e-6, "s"
    if makespan_us >= 10_000:
        return 1e-3, "ms"
    return 1.0, "us"


def _png(fig: Any) -> bytes:
    fig.canvas.draw()
    return _canvas_png(fig.canvas)


def _canvas_png(canvas: Any) -> bytes:
    """What the Agg `canvas` has drawn (``savefig`` draws the whole figure first), as a PNG:
    8-bit RGB (the figures are opaque), no filter on any row, zlib level 3, the resolution _DPI.
    PIL's encoder (matplotlib's) took three times as long, choosing a filter per row, for files
    10% smaller."""
    rgba = np.asarray(canvas.buffer_rgba())
    height, width = rgba.shape[:2]
    rows = np.zeros((height, 1 + 3 * width), dtype=np.uint8)  # each row: its filter (0), its pixels
    rows[:, 1:] = rgba[..., :3].reshape(height, 3 * width)
    per_metre = round(_DPI / 0.0254)
    return b"".join((
        b"\x89PNG\r\n\x1a\n",
        _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)),
        _png_chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
        _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), 3)),
        _png_chunk(b"IEND", b""),
    ))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _us(us: float) -> str:
    if us >= 1e9:  # '.3g' wrote 2400 s as '2.4e+03 s'
        return f"{us / 1e6:,.0f} s"
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.4g} ms"
    return f"{us:.4g} us"


def _bytes_unit(n: float) -> tuple[float, str]:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return float(size), unit
    return 1.0, "B"
