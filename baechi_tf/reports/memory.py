"""``memory_<i>.png`` of the reports: memory in use on device i over the step
(`placer.memory_timeline`, the scheduler's memory model) with its capacity as a line, the peak and
the persistent part; one figure serves every device (`_MemoryPlot`), each PNG the same as its own
figure would give. About 15 ms a device.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from baechi_tf.placer.scheduler_state import format_bytes
from baechi_tf.placer.memory_timeline import DeviceMemory
from baechi_tf.reports.drawing import _CRITICAL, _DPI, _RC, _bytes_unit, _canvas_png, _time_unit

__all__: list[str] = []

_MAX_FRAMES = 8  # memory PNGs: frames kept for devices of other capacities (`_MemoryPlot`)


def _memory_pngs(result: Any, memory: Sequence[DeviceMemory]) -> list[bytes]:
    """``memory_<d>.png`` of each device d, from `memory` (`memory_timeline`): one figure
    (`_MemoryPlot`) drawn again for each device, only what differs from the device before."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        plot = _MemoryPlot(result)
        return [plot.png(d, mem) for d, mem in enumerate(memory)]


def _memory_figure(result: Any, d: int, mem: DeviceMemory) -> Any:
    """The figure of ``memory_<d>.png`` (a matplotlib ``Figure``)."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        plot = _MemoryPlot(result)
        plot.show(d, mem)
        return plot.fig


class _MemoryPlot:
    """The figure of the memory PNGs, made once for all devices: `show` puts a device's curve,
    lines, title and legend in it, `png` draws it.

    Drawing a whole figure takes about 40 ms, most of it the axes' ticks and their text, which
    are the same for every device of one capacity: `png` draws the figure without what differs
    between devices (a frame, kept per y-axis and zoom) and then, over a copy of that frame, only
    those artists, in the order a whole draw has them (by zorder); about 15 ms a device, a third
    of it writing the PNG.
    """

    def __init__(self, result: Any) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.result = result
        schedule = result.schedule
        self.makespan = schedule.makespan_us or 1.0  # as in the Gantt chart
        self.scale, unit = _time_unit(self.makespan)
        self.fig = Figure(figsize=(10, 3.8), dpi=_DPI)
        FigureCanvasAgg(self.fig)
        ax = self.ax = self.fig.add_axes((0.08, 0.14, 0.9, 0.70))
        self.curve = _memory_curve(ax)
        self.capacity = ax.axhline(0, color=_CRITICAL, ls="--", lw=1.2)
        self.share = self.shares = None
        if result.memory_fraction < 1:  # --placer_memory_fraction: the placer filled only this much
            self.share = ax.axhline(0, color="#e08214", ls="-.", lw=1.1)
            self.shares = result.cluster.with_memory_fraction(result.memory_fraction).devices
        (self.peak,) = ax.plot([0], [0], "o", color="black", ms=4, zorder=5)
        self.note = ax.annotate("", (0, 0), xytext=(4, 4), textcoords="offset points", fontsize=7.5)
        # pad: room for the legend's row under the title: a long device name once ran into it
        self.title = ax.set_title("", loc="left", pad=20)
        ax.set_xlim(0, self.makespan * self.scale * 1.005)
        ax.set_xlabel(f"time ({unit})")
        ax.grid(color="#e4e4e4", lw=0.5)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        self.inset: Any = None  # made for the first device whose curve it zooms
        self.inset_curve: Any = None
        self.inset_title: Any = None
        self.legend: tuple[tuple[Any, str], ...] = ()  # (handle, label) of the legend's entries
        self.frames: dict[Any, tuple[Any, Any]] = {}  # what `png` draws over, by what it shows
        self.zoomed = False

    def show(self, d: int, mem: DeviceMemory) -> None:
        """Puts device d's memory over the step (`mem`) in the figure."""
        graph, cluster, schedule = self.result.graph, self.result.cluster, self.result.schedule
        ax, scale, makespan = self.ax, self.scale, self.makespan
        device = cluster.devices[d]
        capacity = device.memory_bytes
        peak = mem.peak_bytes
        mine = schedule.placement.device_of == d
        persistent = int(graph.persistent_bytes[mine].sum())
        size, bunit = _bytes_unit(max(capacity, peak))
        times = np.append(mem.times_us, max(makespan, float(mem.times_us[-1]))) * scale
        held = np.append(mem.bytes, mem.bytes[-1])
        _set_memory_curve(self.curve, times, held / size, persistent / size)
        self.capacity.set_ydata([capacity / size] * 2)
        self.capacity.set_label(f"capacity {format_bytes(capacity)}")
        handles = [self.curve[1]] + ([self.curve[2]] if persistent > 0 else []) + [self.capacity]
        if self.share is not None:
            fraction = self.result.memory_fraction
            share = self.shares[d].memory_bytes
            self.share.set_ydata([share / size] * 2)
            self.share.set_label(f"placer's share {format_bytes(share)} ({fraction:.0%})")
            handles.append(self.share)
        i = int(np.argmax(mem.bytes))
        at = (mem.times_us[i] * scale, peak / size)
        self.peak.set_data([at[0]], [at[1]])
        right = mem.times_us[i] > 0.7 * makespan
        self.note.xy = at
        self.note.set_text(f"peak {format_bytes(peak)}")
        self.note.set_position((-4 if right else 4, 4))
        self.note.set_horizontalalignment("right" if right else "left")
        ax.set_ylim(0, max(capacity, peak) / size * 1.1)
        ax.set_ylabel(f"memory in use ({bunit})")
        self.title.set_text(
            f"{device.name}: peak {format_bytes(peak)} of {format_bytes(capacity)} "
            f"({100 * peak / capacity:.1f}%), {int(mine.sum())} ops"
        )
        entries = tuple((h, h.get_label()) for h in handles)
        if entries != self.legend:  # else the legend of the device before is this one's
            self.legend = entries
            ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=4,
                      frameon=False, fontsize=7.5, borderaxespad=0.2)
        self.zoomed = 0 < peak < 0.3 * capacity
        if self.zoomed:
            # The curve is low against the capacity: repeat it, zoomed, above it.
            # In a unit of its own: 93 KiB in GiB were ticks of 0 to 8 under a '1e-5' that ran
            # into the title.
            zsize, zunit = _bytes_unit(peak)
            inset = self._inset()
            _set_memory_curve(self.inset_curve, times, held / zsize, persistent / zsize)
            inset.set_ylim(0, peak / zsize * 1.12)
            self.inset_title.set_text(f"zoomed ({zunit})")
        if self.inset is not None:
            self.inset.set_visible(self.zoomed)

    def png(self, d: int, mem: DeviceMemory) -> bytes:
        """``memory_<d>.png``: the figure with device d's memory (`show`), as a whole draw gives it."""
        self.show(d, mem)
        legend = tuple(text.get_text() for text in self.ax.get_legend().get_texts())
        key = (self.ax.get_ylim(), self.ax.get_ylabel(), legend, self.zoomed)
        if key not in self.frames:
            if len(self.frames) == _MAX_FRAMES:  # the oldest goes: 1.5 MB each
                del self.frames[next(iter(self.frames))]
            self.frames[key] = self._draw_frame()
        frame, inset_frame = self.frames[key]
        canvas = self.fig.canvas
        renderer = canvas.get_renderer()
        canvas.restore_region(frame)
        for artist in self._changing(self.ax):
            artist.draw(renderer)
        if self.zoomed:
            canvas.restore_region(inset_frame)
            for artist in self._changing(self.inset):
                artist.draw(renderer)
        return _canvas_png(canvas)

    def _inset(self) -> Any:
        if self.inset is None:
            inset = self.inset = self.ax.inset_axes((0.5, 0.4, 0.48, 0.42))
            self.inset_curve = _memory_curve(inset)
            inset.set_xlim(0, self.makespan * self.scale * 1.005)
            inset.tick_params(labelsize=6.5)
            self.inset_title = inset.set_title("", fontsize=7, loc="left")
            inset.grid(color="#e4e4e4", lw=0.5)
            inset.set_axisbelow(True)  # as in the axes it is in: its y grid then is in no frame
        return self.inset

    def _changing(self, ax: Any) -> list[Any]:
        """The artists of `ax` that differ between devices, in the order a whole draw takes
        them (stable by zorder, as ``Axes.draw``); the spines under the curve's fill too, and the
        inset's x axis, whose labels the placer's share may cross below the inset."""
        if ax is self.ax:
            mine = [*self.curve, self.capacity, self.share, self.peak, self.note, self.title,
                    ax.spines["left"], ax.spines["bottom"]]
        else:
            mine = [*self.inset_curve, self.inset_title, ax.xaxis, ax.yaxis, *ax.spines.values()]
        keep = {id(a) for a in mine if a is not None}
        return sorted((a for a in ax.get_children() if id(a) in keep and a.get_visible()),
                      key=lambda a: a.get_zorder())

    def _draw_frame(self) -> tuple[Any, Any]:
        """Draws the figure without what `_changing` draws; (its copy, that of the inset or None)."""
        hidden = [a for ax in (self.ax, self.inset) if ax is not None and ax.get_visible()
                  for a in self._changing(ax)]
        # Titles are blanked, not hidden: the axes place a hidden title far above the figure.
        titles = {a: a.get_text() for a in (self.title, self.inset_title) if a in hidden}
        for artist in hidden:
            if artist in titles:
                artist.set_text("")
            else:
                artist.set_visible(False)
        canvas = self.fig.canvas
        try:
            canvas.draw()
        finally:
            for artist in hidden:
                if artist in titles:
                    artist.set_text(titles[artist])
                else:
                    artist.set_visible(True)
        frame = canvas.copy_from_bbox(self.fig.bbox)
        inset = canvas.copy_from_bbox(self.inset.bbox) if self.zoomed else None
        return frame, inset


def _memory_curve(ax: Any) -> tuple[Any, Any, Any]:
    """The artists of a memory curve in `ax`, empty (`_set_memory_curve` fills them): the area
    under it, its line and the line of its persistent part."""
    fill = ax.fill_between([0.0, 0.0], [0.0, 0.0], step="post", color="#9ecae1", lw=0)
    (line,) = ax.step([], [], where="post", color="#2171b5", lw=0.9, label="in use")
    persistent = ax.axhline(0, color="#6a51a3", ls=":", lw=1, label="persistent")
    return fill, line, persistent


def _set_memory_curve(curve: tuple[Any, Any, Any], times: np.ndarray, values: np.ndarray,
                      persistent: float) -> None:
    fill, line, persistent_line = curve
    fill.set_data(times, values, 0)
    line.set_data(times, values)
    persistent_line.set_ydata([persistent] * 2)
    persistent_line.set_visible(persistent > 0)
