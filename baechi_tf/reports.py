"""Reports of a placement for people: a Gantt chart, memory over time, a Chrome trace, a summary.

`write_reports(result, report_dir)` writes, from a `PlacementResult` (``placer.pipeline.place``):

* ``gantt.png``: one row per device with its ops as bars and, under it, a thin lane for its
  communication channel (sends and receives); the critical path (`Schedule.critical_chain`: the
  chain of waits that ends the step, through the copies ahead of one that waited for a busy
  channel) is marked by a red band over its ops, red transfers and red arrows where it changes
  device. Small graphs get labelled bars coloured by op type (or top-level name scope); when bars
  would be narrower than a few pixels, ops are merged at the resolution of one pixel. Rows come
  closer where the chart would be taller than _MAX_GANTT_PX; each device keeps its row, and rows
  too close for their labels are labelled 1 in a few (the title says so). Bars of a kind are one
  artist (a ``PolyCollection``).
* ``memory_<i>.png``: memory in use on device i over the step (`placer.memory_timeline`, the
  scheduler's memory model) with its capacity as a line, the peak and the persistent part; one
  figure serves every device (`_MemoryPlot`), each PNG the same as its own figure would give.
* ``trace.json``: the simulated schedule in Chrome's trace format (Perfetto, chrome://tracing):
  a process per device (pid = device index + 1) with a ``compute`` thread (tid 0) and a
  ``channel`` thread (tid 1), ops and transfers as complete events (``critical_path`` in their
  args when on that path), memory as a counter; with `tf_step_stats`, TensorFlow's own timeline
  of the real step as more processes (pid >= 1001).
* ``graph.pbtxt`` and ``events.out.tfevents.baechi``: with `graph_def`, the placed graph as text
  and as an events file for TensorBoard's graph view (``tensorboard --logdir report_dir``,
  colour by device).
* ``summary.json``: the figures of the placement (see `summary`), ``files``, the names of the
  report's files, and ``profile``, the coverage of the profile it was placed by
  (`baechi_tf.cost_model.Coverage.figures`: the traced time no op accounts for, by node type,
  among them), when given.

Written before the placed graph runs (so that a run that fails, out of memory, or is stopped
still leaves them), the trace gets TF's timeline afterwards (`add_tf_timeline`).

The reports are written all at once or not at all (`write_reports`). Figures use matplotlib's Agg
canvas directly (no pyplot, no global state) and come out the same, byte for byte, for the same
input. TensorFlow is imported only when `graph_def` or a serialized `tf_step_stats` is given.

Time O((V + E) log(V + E) + D * T) for V ops, E edges, D devices and T transfers, plus drawing:
about 3 s for 10k ops on 4 devices, most of it matplotlib; a memory PNG takes about 15 ms, so
1,024 devices take about 20 s (`bench/reports_scaling.py`); the trace takes about 0.7 KB per op.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import warnings
import zlib
from typing import Any, Optional, Sequence

import numpy as np

from baechi_tf._files import REPORT_FILE, atomic_write, keep_mode, output_error, report_files
from baechi_tf.cluster import device_task
from baechi_tf.placer.list_scheduler import format_bytes
from baechi_tf.placer.memory_timeline import DeviceMemory, memory_timeline
from baechi_tf.placer.schedule import Transfer
from baechi_tf.report import one_device_label

__all__ = ["add_tf_timeline", "chrome_trace", "summary", "write_reports"]

_DPI = 100
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
_MAX_FRAMES = 8  # memory PNGs: frames kept for devices of other capacities (`_MemoryPlot`)
_CRITICAL = "#d62728"
_MERGED = "#4c72b0"
_SEND, _RECEIVE = "#e08214", "#8073ac"
_OTHER = "#b8b8b8"
_PALETTE = (  # no red (the critical path), orange or purple (the channel)
    "#4c72b0", "#55a868", "#ccb974", "#64b5cd", "#937860",
    "#da8bc3", "#a6d854", "#e5c494", "#2f4b7c",
)
_TF_PID = 1001
# Text is drawn as given: op, type and device names may hold "$" (an even number of them made
# matplotlib parse them as mathtext, and "$$" raised ValueError).
_RC = {"font.size": 8, "axes.titlesize": 10, "text.parse_math": False}


def write_reports(
    result: Any,
    report_dir: str,
    *,
    graph_def: Any = None,
    tf_step_stats: Any = None,
    profile: Optional[dict[str, Any]] = None,
) -> dict[str, str]:
    """Writes the reports of `result` (a `PlacementResult`) into `report_dir`, creating it.

    `graph_def`: the placed GraphDef, for TensorBoard. `tf_step_stats`: a TF ``StepStats``
    message (or its serialized bytes) of a real run of the same step, shown next to the
    simulated one in the trace. `profile`: the figures of the profile's coverage, written into
    ``summary.json`` as ``profile``. Returns what was written: key -> path.

    All or nothing: the files are made in a temporary folder (in `report_dir` when it exists,
    else beside it) and moved in when every one is done, so an error or Ctrl-C while they are made
    leaves `report_dir` as it was. Files of an earlier report there that this one does not have
    (``memory_3.png`` of a placement on more devices), as its ``summary.json`` lists them, are
    removed once the new ones are in; those it replaces keep their permission bits.
    """
    graph, cluster, schedule = result.graph, result.cluster, result.schedule
    memory = memory_timeline(graph, cluster, schedule)
    critical = schedule.critical_chain(graph, cluster)
    given = report_dir
    try:
        return _write_reports(result, os.path.abspath(report_dir), memory, critical, graph_def, tf_step_stats,
                              profile)
    except OSError as e:  # a full disk: one line naming the folder, not a traceback
        raise output_error(e, given) from e


def add_tf_timeline(result: Any, report_dir: str, tf_step_stats: Any) -> str:
    """Rewrites ``trace.json`` of the reports of `result` in `report_dir` with TF's timeline of a
    real run of the step (`tf_step_stats`, as in `write_reports`) beside the simulated schedule;
    returns its path. For reports written before the run, so that a run that fails (out of
    memory) or is stopped still leaves them; the file is replaced whole or not at all."""
    path = os.path.join(report_dir, "trace.json")
    atomic_write(path, _trace_json(chrome_trace(result, tf_step_stats=tf_step_stats)))
    return path


def _write_reports(result, report_dir, memory, critical, graph_def, tf_step_stats, profile) -> dict[str, str]:
    if os.path.isdir(report_dir):  # needs only report_dir writable (its parent may not be)
        staging = tempfile.mkdtemp(prefix=".tmp-reports-", dir=report_dir)
    else:
        parent = os.path.dirname(report_dir)
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".tmp-", suffix="-" + os.path.basename(report_dir), dir=parent)
    try:
        paths = _write_into(staging, result, memory, critical, graph_def, tf_step_stats, profile)
        earlier = report_files(report_dir)
        os.makedirs(report_dir, exist_ok=True)
        for key, name in paths.items():
            keep_mode(os.path.join(report_dir, name), os.path.join(staging, name))
            os.replace(os.path.join(staging, name), os.path.join(report_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for name in sorted(earlier - set(paths.values())):
        try:
            os.remove(os.path.join(report_dir, name))
        except FileNotFoundError:
            pass
    return {key: os.path.join(report_dir, name) for key, name in paths.items()}


def _write_into(
    folder: str, result: Any, memory: Any, critical: tuple[list[int], list[Transfer]], graph_def: Any,
    tf_step_stats: Any, profile: Optional[dict[str, Any]] = None,
) -> dict[str, str]:
    """Writes the reports into `folder`; key -> file name. `critical`: `Schedule.critical_chain`."""
    paths: dict[str, str] = {}

    def put(key: str, name: str, data: bytes | str) -> None:
        assert REPORT_FILE.match(name), name  # what a report folder is checked against
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        paths[key] = name

    with warnings.catch_warnings():
        # Op names in scripts the font lacks are drawn as boxes; a warning per glyph says nothing more.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        put("gantt", "gantt.png", _gantt_png(result, *critical))
        for d, png in enumerate(_memory_pngs(result, memory)):
            put(f"memory_{d}", f"memory_{d}.png", png)
    trace = chrome_trace(result, tf_step_stats=tf_step_stats, memory=memory, critical=critical)
    put("trace", "trace.json", _trace_json(trace))
    if graph_def is not None:
        from google.protobuf import text_format

        put("graph_pbtxt", "graph.pbtxt", text_format.MessageToString(graph_def))
        put("graph_events", "events.out.tfevents.baechi", _graph_events(graph_def))
    figures = summary(result, critical[0])
    if profile is not None:
        figures["profile"] = profile
    figures["files"] = sorted([*paths.values(), "summary.json"])
    put("summary", "summary.json", json.dumps(figures, indent=1, sort_keys=True) + "\n")
    return paths


def _trace_json(trace: dict[str, Any]) -> str:
    return json.dumps(trace, separators=(",", ":"), sort_keys=True) + "\n"


# -------------------------------------------------------------------------------- summary


def summary(result: Any, critical: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """The figures of a placement as plain JSON values.

    Keys: method, num_ops, num_groups, makespan_us, lower_bound_us, makespan_over_lower_bound,
    single_device_makespan_us (None when the graph does not fit one device), placement_seconds,
    step_seconds, memory_fraction (the share of each device's memory the placer could fill,
    ``--placer_memory_fraction``), devices (per device: name, ops, compute_us, peak_memory_bytes,
    capacity_bytes, placer_share_bytes: that share of capacity_bytes), num_transfers,
    transfer_bytes, critical_path (op names, first to last), critical_path_us (compute time of
    its ops), candidates (``auto``: makespan per placer it ran, null for one that failed or that
    auto stopped as too slow to be of use; else None), refinement (``auto``: initial_makespan_us,
    the makespan of the placement it started from, the winner in method, and seconds; None when
    it did not refine).
    """
    graph, cluster, schedule = result.graph, result.cluster, result.schedule
    if critical is None:
        critical = schedule.critical_chain(graph, cluster)[0]
    device_of = result.placement.device_of
    fraction = float(result.memory_fraction)
    shares = cluster.with_memory_fraction(fraction).devices
    devices = []
    for d, dev in enumerate(cluster.devices):
        mask = device_of == d
        devices.append(
            {
                "name": dev.name,
                "ops": int(mask.sum()),
                "compute_us": float(graph.compute_us[mask].sum()),
                "peak_memory_bytes": int(schedule.peak_memory_bytes[d]),
                "capacity_bytes": int(dev.memory_bytes),
                "placer_share_bytes": int(shares[d].memory_bytes),
            }
        )
    makespan, bound = float(result.makespan_us), float(result.lower_bound_us)
    single = result.single_device_makespan_us
    return {
        "method": result.placement.method,
        "num_ops": graph.num_ops,
        "num_groups": int(result.groups.num_groups),
        "makespan_us": makespan,
        "lower_bound_us": bound,
        "makespan_over_lower_bound": makespan / bound if bound > 0 else None,
        "single_device_makespan_us": None if single is None else float(single),
        "placement_seconds": float(result.placement_seconds),
        "step_seconds": {k: float(v) for k, v in result.step_seconds.items()},
        "memory_fraction": fraction,
        "devices": devices,
        "num_transfers": len(schedule.transfers),
        "transfer_bytes": int(sum(int(graph.tensor_bytes[t.tensor]) for t in schedule.transfers)),
        "critical_path": [graph.names[op] for op in critical],
        "critical_path_us": float(sum(float(graph.compute_us[op]) for op in critical)),
        "candidates": _candidates(result),
        "refinement": _refinement(result),
    }


def _refinement(result: Any) -> Optional[dict[str, float]]:
    stats = getattr(result, "refine_stats", None)
    if stats is None:
        return None
    return {"initial_makespan_us": float(stats.initial_makespan_us), "seconds": float(stats.seconds)}


def _candidates(result: Any) -> Optional[dict[str, Optional[float]]]:
    """``auto``: the simulated makespan of each placer it ran (None where one failed)."""
    found = getattr(result, "candidates", None)
    if not found:
        return None
    return {k: None if v is None else float(v) for k, v in sorted(found.items())}


# -------------------------------------------------------------------------------- trace


def chrome_trace(
    result: Any,
    *,
    tf_step_stats: Any = None,
    memory: Optional[Sequence[DeviceMemory]] = None,
    critical: Optional[tuple[list[int], list[Transfer]]] = None,
) -> dict[str, Any]:
    """The schedule as a Chrome trace (a JSON object with ``traceEvents``); `critical`: the
    critical path (`Schedule.critical_chain`, made when not given), marked in the events' args.

    Device i is process i + 1 with threads ``compute`` (tid 0) and ``channel`` (tid 1). Each op
    is one complete event (ts = start, dur = compute time); each transfer is two, a ``send`` on
    the source's channel and a ``receive`` on the destination's, with the same args (instant
    events, ``ph: i``, for a copy that takes no time); memory in use is the counter ``memory``.
    `tf_step_stats` adds TF's timeline as processes from 1001 on.
    """
    graph, cluster, schedule = result.graph, result.cluster, result.schedule
    if memory is None:
        memory = memory_timeline(graph, cluster, schedule)
    if critical is None:
        critical = schedule.critical_chain(graph, cluster)
    critical_ops, critical_copies = critical
    on_copies = {(t.tensor, t.dst_device) for t in critical_copies}
    on_path = np.zeros(graph.num_ops, dtype=bool)
    on_path[critical_ops] = True
    events: list[dict[str, Any]] = []
    for d, dev in enumerate(cluster.devices):
        pid = d + 1
        events += _process_metadata(pid, f"simulated {dev.name}", d)
        events += _thread_metadata(pid, 0, "compute") + _thread_metadata(pid, 1, "channel")
    types = graph.op_types or ("",) * graph.num_ops
    device_of = schedule.placement.device_of.tolist()
    start, end = schedule.start_us.tolist(), schedule.end_us.tolist()
    for op in schedule.order.tolist():
        events.append(
            {
                "name": graph.names[op],
                "cat": "op",
                "ph": "X",
                "ts": start[op],
                "dur": end[op] - start[op],
                "pid": device_of[op] + 1,
                "tid": 0,
                "args": {
                    "op": graph.names[op],
                    "type": types[op],
                    "output_bytes": list(graph.output_bytes[op]),
                    "temp_bytes": int(graph.temp_bytes[op]),
                    "persistent_bytes": int(graph.persistent_bytes[op]),
                    "critical_path": bool(on_path[op]),
                },
            }
        )
    for tr in sorted(schedule.transfers, key=lambda t: (t.start_us, t.src_device, t.dst_device, t.tensor)):
        src = int(graph.tensor_src[tr.tensor])
        slot = int(graph.tensor_src_output[tr.tensor])
        tensor = f"{graph.names[src]}:{slot}" if slot >= 0 else f"^{graph.names[src]}"
        args = {
            "tensor": tensor,
            "bytes": int(graph.tensor_bytes[tr.tensor]),
            "from": cluster.names[tr.src_device],
            "to": cluster.names[tr.dst_device],
            "critical_path": (tr.tensor, tr.dst_device) in on_copies,
        }
        # A copy that takes no time holds no channel (the simulator books nothing for it), so it
        # may fall inside another copy: it is an instant, which viewers do not nest in a slice.
        if tr.end_us > tr.start_us:
            timed = {"ph": "X", "dur": tr.end_us - tr.start_us}
        else:
            timed = {"ph": "i", "s": "t"}
        for pid, what in ((tr.src_device + 1, "send"), (tr.dst_device + 1, "receive")):
            events.append(
                {"name": f"{what} {tensor}", "cat": what, "ts": tr.start_us, **timed, "pid": pid, "tid": 1,
                 "args": args}
            )
    for d, mem in enumerate(memory):
        for t, b in zip(mem.times_us.tolist(), mem.bytes.tolist()):
            events.append({"name": "memory", "ph": "C", "ts": t, "pid": d + 1, "args": {"bytes": b}})
    if tf_step_stats is not None:
        events += _tf_events(tf_step_stats)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "method": result.placement.method,
            "makespan_us": float(result.makespan_us),
            "lower_bound_us": float(result.lower_bound_us),
        },
    }


def _process_metadata(pid: int, name: str, sort_index: int) -> list[dict[str, Any]]:
    return [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}},
    ]


def _thread_metadata(pid: int, tid: int, name: str) -> list[dict[str, Any]]:
    return [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}]


def _tf_events(step_stats: Any) -> list[dict[str, Any]]:
    """TF's ``StepStats`` as complete events, time 0 at the first op TF started.

    TF runs a device's independent ops side by side on its threads, yet its step stats give them
    all one ``thread_id`` (0 on CPU devices): events of one thread would overlap, which trace
    viewers take for nesting (or drop). Each TF thread is split into as many lanes (threads of
    the trace) as it runs ops at once; its first lane keeps its name, ``thread <id>``.
    """
    if isinstance(step_stats, (bytes, bytearray)):
        from tensorflow.core.framework import step_stats_pb2

        step_stats = step_stats_pb2.StepStats.FromString(bytes(step_stats))
    devices = sorted(step_stats.dev_stats, key=lambda s: s.device)
    starts = [_tf_start_us(ns) for dev in devices for ns in dev.node_stats]
    t0 = min(starts, default=0.0)
    events: list[dict[str, Any]] = []
    for k, dev in enumerate(devices):
        pid = _TF_PID + k
        events += _process_metadata(pid, f"TensorFlow {dev.device}", 1000 + k)
        by_thread: dict[int, list[Any]] = {}
        for ns in dev.node_stats:
            by_thread.setdefault(int(ns.thread_id), []).append(ns)
        next_tid = 0
        for thread in sorted(by_thread):
            nodes = sorted(by_thread[thread], key=lambda ns: (_tf_start_us(ns), -_tf_duration_us(ns)))
            lane_ends: list[float] = []  # end of the last event of each lane of this thread
            for ns in nodes:
                start = _tf_start_us(ns) - t0
                duration = _tf_duration_us(ns)
                lane = next((j for j, end in enumerate(lane_ends) if end <= start), len(lane_ends))
                if lane == len(lane_ends):
                    lane_ends.append(start + duration)
                    name = f"thread {thread}" if lane == 0 else f"thread {thread} ({lane + 1})"
                    events += _thread_metadata(pid, next_tid + lane, name)
                else:
                    lane_ends[lane] = start + duration
                events.append(
                    {
                        "name": ns.node_name,
                        "cat": "tensorflow",
                        "ph": "X",
                        "ts": start,
                        "dur": duration,
                        "pid": pid,
                        "tid": next_tid + lane,
                        "args": {"op": ns.node_name, "label": ns.timeline_label,
                                 "thread_id": thread},
                    }
                )
            next_tid += len(lane_ends)
    return events


def _tf_start_us(ns: Any) -> float:
    if ns.all_start_micros:
        return float(ns.all_start_micros)
    return ns.all_start_nanos / 1e3


def _tf_duration_us(ns: Any) -> float:
    if ns.op_end_rel_micros or not ns.op_end_rel_nanos:
        return float(ns.op_end_rel_micros)
    return ns.op_end_rel_nanos / 1e3


def _graph_events(graph_def: Any) -> bytes:
    """An events file holding `graph_def`, as ``FileWriter.add_graph`` writes it (wall time 0,
    so that the bytes depend on the graph only)."""
    import tempfile

    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    records = [
        event_pb2.Event(wall_time=0.0, file_version="brain.Event:2"),
        event_pb2.Event(wall_time=0.0, step=0, graph_def=graph_def.SerializeToString()),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "events")
        with tf.io.TFRecordWriter(path) as writer:
            for event in records:
                writer.write(event.SerializeToString())
        with open(path, "rb") as f:
            return f.read()


# -------------------------------------------------------------------------------- figures


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
