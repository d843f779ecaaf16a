"""``gantt.png`` of the reports: one row per device with its ops as bars and, under it, a thin
lane for its communication channel (sends and receives).

The critical path (`Schedule.critical_chain`: the chain of waits that ends the step, through the
copies ahead of one that waited for a busy channel) is marked by a red band over its ops, red
transfers and red arrows where it changes device. Small graphs get labelled bars coloured by op
type (or top-level name scope); when bars would be narrower than a few pixels, ops are merged at
the resolution of one pixel. Rows come closer where the chart would be taller than
_MAX_GANTT_PX; each device keeps its row, and rows too close for their labels are labelled 1 in a
few (the title says so). Bars of a kind are one artist (a ``PolyCollection``).

Time O((V + E) log(V + E) + D * T) for V ops, E edges, D devices and T transfers, plus drawing:
about 3 s for 10k ops on 4 devices, most of it matplotlib.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from baechi_tf.cluster import device_task
from baechi_tf.placer.schedule import Transfer
from baechi_tf.report import one_device_label
from baechi_tf.reports.drawing import _CRITICAL, _DPI, _RC, _png, _time_unit, _us

__all__: list[str] = []

_WIDTH_IN = 14.0
_AX_LEFT, _AX_RIGHT = 0.085, 0.985  # axes edges as fractions of the figure width
_CHAR_PX = 5.6  # mean width of a character of the 7 pt label font at _DPI
_MIN_BAR_PX = 2.5  # below this median op width, ops are merged at one pixel
_MAX_SINGLE_BARS = 1500  # above this many ops, too
_MAX_ARROWS = 60  # critical-path device changes drawn as arrows, at most
_ROW_IN = 0.62  # Gantt chart: inches from a device's row to the next one's, at most
_MAX_GANTT_PX = 4000  # its height at most: more devices get closer rows
_LABEL_PX = 12  # closer rows than this are labelled 1 in a few
_MAX_LABEL_FRACTION = 0.3  # of the Gantt chart's width, for the rows' labels at most
_MERGED = "#4c72b0"
_SEND, _RECEIVE = "#e08214", "#8073ac"
_OTHER = "#b8b8b8"
_PALETTE = (  # no red (the critical path), orange or purple (the channel)
    "#4c72b0", "#55a868", "#ccb974", "#64b5cd", "#937860",
    "#da8bc3", "#a6d854", "#e5c494", "#2f4b7c",
)


def _short_name(name: str, room_px: float) -> str:
    """The longest of the name, its last two or its last path part that fits `room_px`."""
    parts = name.split("/")
    for k in (len(parts), 2, 1):
        label = "/".join(parts[-k:])
        if len(label) * _CHAR_PX + 4 <= room_px:
            return label
    return ""


def _merge(starts: np.ndarray, ends: np.ndarray, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Intervals (sorted by start) joined where they are less than `gap` apart."""
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    cut = np.flatnonzero(s[1:] > e[:-1] + gap) + 1
    first = np.concatenate(([0], cut))
    last = np.concatenate((cut - 1, [s.size - 1]))
    return s[first], np.maximum(e[last], s[first] + gap)


def _by_device(items: np.ndarray, devices: np.ndarray, num_devices: int) -> list[np.ndarray]:
    """`items` split by their device (`devices`, one per item), each part in the items' order."""
    order = np.argsort(devices, kind="stable")
    return np.split(items[order], np.searchsorted(devices[order], np.arange(1, num_devices)))


def _rects(x0: Any, x1: Any, y0: Any, height: float) -> np.ndarray:
    """Vertices [n, 4, 2] of the rectangles from x0 to x1 and y0 to y0 + height (arrays, or
    numbers for all), for one ``PolyCollection``: one artist for many bars."""
    x0, x1 = np.asarray(x0, dtype=float), np.asarray(x1, dtype=float)
    y0 = np.broadcast_to(np.asarray(y0, dtype=float), x0.shape)
    y1 = y0 + height
    return np.stack([np.stack(corner, axis=-1) for corner in ((x0, y0), (x0, y1), (x1, y1), (x1, y0))], axis=1)


def _colour_keys(graph: Any) -> tuple[list[str], dict[str, str]]:
    """Per op, a colour key (op type, else top-level name scope); the 9 keys with the most
    compute get colours, the rest share grey."""
    if graph.op_types and any(graph.op_types):
        keys = [t or "(no type)" for t in graph.op_types]  # the legend said '?' of untyped ops
    else:
        keys = [n.split("/")[0] if "/" in n else "(top level)" for n in graph.names]
    weight: dict[str, float] = {}
    for k, us in zip(keys, graph.compute_us.tolist()):
        weight[k] = weight.get(k, 0.0) + us
    top = sorted(weight, key=lambda k: (-weight[k], k))
    colours = {k: _PALETTE[i] for i, k in enumerate(top[: len(_PALETTE)])}
    return keys, colours


def _gantt_png(result: Any, critical: Sequence[int], copies: Sequence[Transfer] = ()) -> bytes:
    import matplotlib

    with matplotlib.rc_context(_RC):
        return _png(_gantt_figure(result, critical, copies))


def _gantt_figure(result: Any, critical: Sequence[int], copies: Sequence[Transfer] = ()) -> Any:
    """The figure of ``gantt.png`` (a matplotlib ``Figure``): `critical` and `copies` are the ops
    and copies of the critical path (`Schedule.critical_chain`), drawn in red."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    graph, cluster, schedule = result.graph, result.cluster, result.schedule
    nd = cluster.num_devices
    makespan = schedule.makespan_us or 1.0  # a step of 0 us: an axis of 1 us, not of 1e-9
    scale, unit = _time_unit(makespan)
    start, end = schedule.start_us, schedule.end_us
    one_task = len({device_task(n) for n in cluster.names}) == 1  # then the task tells nothing
    device_labels = [_device_label(name, one_task) for name in cluster.names]
    # Rows from the top: device d has its compute row at y = -d and its channel lane below, rows
    # _ROW_IN apart, closer where the chart would be taller than _MAX_GANTT_PX: every device keeps
    # its row; where rows are too close for their labels, 1 in `every` is labelled, and the lanes
    # are not.
    row_h, lane_h = 0.62, 0.2
    pitch_in = min(_ROW_IN, (_MAX_GANTT_PX / _DPI - 2.1) / nd)  # 2.1 in: title, axes, legend
    pitch_px = pitch_in * _DPI
    lanes_labelled = pitch_px >= 2 * _LABEL_PX
    every = int(np.ceil(_LABEL_PX / pitch_px))
    device_labels[::every], ax_left = _fit_labels(device_labels[::every])
    ax_px = (_AX_RIGHT - ax_left) * _WIDTH_IN * _DPI
    px_us = makespan / ax_px  # microseconds per pixel
    widths_px = (end - start) / px_us
    merged = graph.num_ops > _MAX_SINGLE_BARS or (
        graph.num_ops > 0 and float(np.median(widths_px)) < _MIN_BAR_PX
    )
    fixed_in = 1.55 + (0.35 if not merged else 0.0)
    top = max(0.32, 0.2 / pitch_in)  # over the first row: room for the lower bound's label
    height_in = fixed_in + pitch_in * (nd + top - 0.32)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(_WIDTH_IN, height_in), dpi=_DPI)
        FigureCanvasAgg(fig)
        bottom_in = 0.95 if not merged else 0.6
        ax = fig.add_axes(
            (ax_left, bottom_in / height_in, _AX_RIGHT - ax_left, 1 - (bottom_in + 0.5) / height_in)
        )
        on_path = np.zeros(graph.num_ops, dtype=bool)
        on_path[list(critical)] = True
        keys, colours = _colour_keys(graph)
        rows = -np.arange(nd, dtype=float)
        ax.add_collection(PolyCollection(  # the rows' grey, across the axes
            _rects(np.zeros(nd), np.ones(nd), rows - row_h / 2, row_h), facecolors="#f4f4f4", lw=0,
            zorder=0, transform=ax.get_yaxis_transform()), autolim=False)
        by_device = _by_device(schedule.order, schedule.placement.device_of[schedule.order], nd)
        bars, critical_bars = [], []
        for d, ops in enumerate(by_device):
            if merged:
                s, e = _merge(start[ops], end[ops], px_us)
                bars.append(_rects(s * scale, e * scale, rows[d] - row_h / 2, row_h))
            else:
                bars.append(_rects(start[ops] * scale, end[ops] * scale, rows[d] - row_h / 2, row_h))
                for op in ops.tolist():
                    label = _short_name(graph.names[op], widths_px[op])
                    if label:
                        ax.text((start[op] + end[op]) / 2 * scale, rows[d], label, ha="center",
                                va="center", fontsize=7, clip_on=True, zorder=4)
            # The critical path: a red band over the top of the row.
            crit = ops[on_path[ops]]
            s, e = _merge(start[crit], end[crit], px_us)
            critical_bars.append(_rects(s * scale, e * scale, rows[d] + row_h / 2 - 0.1, 0.13))
        if merged:
            ax.add_collection(PolyCollection(np.concatenate(bars), facecolors=_MERGED, lw=0, zorder=2),
                              autolim=False)
        else:
            order = np.concatenate(by_device).tolist()
            ax.add_collection(PolyCollection(
                np.concatenate(bars), facecolors=[colours.get(keys[op], _OTHER) for op in order],
                edgecolors="white", linewidths=0.6, zorder=2), autolim=False)
        ax.add_collection(PolyCollection(np.concatenate(critical_bars), facecolors=_CRITICAL, lw=0, zorder=3),
                          autolim=False)
        _draw_transfers(ax, graph, cluster, schedule, critical, copies, scale, px_us, row_h, lane_h)
        bound = result.lower_bound_us * scale
        ax.axvline(bound, color="#555555", ls=":", lw=1, zorder=5)
        ax.text(bound, row_h / 2 + 0.08, " lower bound", color="#555555", fontsize=7, va="bottom",
                ha="left" if result.lower_bound_us < 0.85 * makespan else "right")
        labelled = range(0, nd, every)
        yticks = [y for d in labelled for y in (rows[d], rows[d] - row_h / 2 - 0.03 - lane_h / 2)]
        ylabels = [label for d in labelled for label in (device_labels[d], "channel")]
        if not lanes_labelled:
            yticks, ylabels = yticks[::2], ylabels[::2]
        ax.set_yticks(yticks, ylabels)
        if lanes_labelled:
            for label in ax.get_yticklabels()[1::2]:
                label.set_fontsize(6.5)
                label.set_color("#666666")
        ax.set_ylim(-(nd - 1) - row_h / 2 - lane_h - 0.12, row_h / 2 + top)
        ax.set_xlim(0, makespan * scale * 1.005)
        ax.set_xlabel(f"time ({unit})")
        ax.tick_params(axis="y", length=0)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.grid(axis="x", color="#dddddd", lw=0.5, zorder=1)
        ax.set_axisbelow(True)
        single = result.single_device_makespan_us
        title = (
            f"{result.placement.method}: makespan {_us(result.makespan_us)}, lower bound "
            f"{_us(result.lower_bound_us)}"
            + (f", {one_device_label(result)} {_us(single)}" if single is not None else ", does not fit one device")
            + f"; {graph.num_ops} ops, {len(schedule.transfers)} transfers"
        )
        if merged:
            title += " (ops merged at 1 pixel)"
        if every > 1:
            title += f"; a row per device, 1 in {every} labelled"
        ax.set_title(title, loc="left")
        handles = [Patch(color=_CRITICAL, label="critical path"), Patch(color=_SEND, label="send"),
                   Patch(color=_RECEIVE, label="receive")]
        if not merged:
            shown = [k for k in colours if any(keys[op] == k for op in range(graph.num_ops))]
            handles += [Patch(color=colours[k], label=k) for k in shown]
            if len(colours) < len(set(keys)):
                handles.append(Patch(color=_OTHER, label="other"))
        fig.legend(handles=handles, loc="lower left", ncol=min(len(handles), 7), frameon=False,
                   bbox_to_anchor=(ax_left, 0.0), fontsize=7.5)
        return fig


def _fit_labels(labels: Sequence[str]) -> tuple[list[str], float]:
    """(labels, the Gantt axes' left edge as a fraction of the figure's width): _AX_LEFT, or more
    where a row's label needs it ('parameter_server/r0/t0 CPU:0' lost its first 9 characters), up
    to _MAX_LABEL_FRACTION; a label wider than that keeps its end, after '…' (a job name of 200
    characters made a margin wider than the figure, and the axes' negative width raised)."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    renderer = RendererAgg(1, 1, _DPI)
    prop = FontProperties(size=_RC["font.size"])
    room_px = _MAX_LABEL_FRACTION * _WIDTH_IN * _DPI - 12

    def width(label: str) -> float:
        return renderer.get_text_width_height_descent(label, prop, ismath=False)[0]

    fitted, widest = [], 0.0
    for label in labels:
        w = width(label)
        if w > room_px:
            keep = int(len(label) * room_px / w)  # then fewer while it is still too wide
            while keep > 1 and width("…" + label[-keep:]) > room_px:
                keep -= 1
            label = "…" + label[-keep:]
            w = width(label)
        fitted.append(label)
        widest = max(widest, w)
    return fitted, max(_AX_LEFT, (widest + 12) / (_WIDTH_IN * _DPI))


def _draw_transfers(ax, graph, cluster, schedule, critical, copies, scale, px_us, row_h, lane_h) -> None:
    """Sends and receives on each device's channel lane; the critical path's `copies` in red, with
    an arrow from an op's end to the next op's start where the path changes device."""
    from matplotlib.collections import PolyCollection

    device_of = schedule.placement.device_of
    nd = cluster.num_devices
    crit_transfers = {(t.tensor, t.dst_device) for t in copies}
    hops = [(p, q) for p, q in zip(critical[:-1], critical[1:]) if device_of[p] != device_of[q]]
    transfers = schedule.transfers
    src = np.array([t.src_device for t in transfers], dtype=np.int64)
    dst = np.array([t.dst_device for t in transfers], dtype=np.int64)
    starts = np.array([t.start_us for t in transfers], dtype=float)
    ends = np.array([t.end_us for t in transfers], dtype=float)
    red = np.flatnonzero([(t.tensor, t.dst_device) in crit_transfers for t in transfers])
    both = np.concatenate((red, red))  # on the lanes of both ends
    for devices, which, colour, zorder in ((src, np.arange(len(transfers)), _SEND, 2),
                                           (dst, np.arange(len(transfers)), _RECEIVE, 2),
                                           (np.concatenate((src[red], dst[red])), both, _CRITICAL, 3)):
        lanes = []
        for d, mine in enumerate(_by_device(which, devices, nd)):
            s, e = _merge(starts[mine], ends[mine], px_us * 0.5)
            lanes.append(_rects(s * scale, e * scale, -d - row_h / 2 - 0.03 - lane_h, lane_h))
        ax.add_collection(PolyCollection(np.concatenate(lanes), facecolors=colour, lw=0, zorder=zorder),
                          autolim=False)
    if len(hops) <= _MAX_ARROWS:
        for p, q in hops:
            y0, y1 = -int(device_of[p]), -int(device_of[q])
            y0, y1 = y0 + (-row_h / 2 if y1 < y0 else row_h / 2), y1 + (row_h / 2 if y1 < y0 else -row_h / 2)
            ax.annotate("", xy=(schedule.start_us[q] * scale, y1),
                        xytext=(schedule.end_us[p] * scale, y0), zorder=6,
                        arrowprops={"arrowstyle": "-|>", "color": _CRITICAL, "lw": 0.9,
                                    "shrinkA": 0, "shrinkB": 0, "mutation_scale": 8})


def _device_label(name: str, one_task: bool = False) -> str:
    """'GPU:0' from '/device:GPU:0'; the task too when there is one and the cluster has others
    (a label as long as 'localhost/r0/t0 CPU:1' does not fit the margin)."""
    head, _, local = name.rpartition("/device:")
    if not local:
        return name
    task = head.replace("/job:", "").replace("/replica:", "/r").replace("/task:", "/t")
    return f"{task} {local}" if task and not one_task else local
