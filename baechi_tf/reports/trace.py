"""``trace.json`` of the reports, and the placed graph for TensorBoard.

The trace is the simulated schedule in Chrome's trace format (Perfetto, chrome://tracing): a
process per device (pid = device index + 1) with a ``compute`` thread (tid 0) and a ``channel``
thread (tid 1), ops and transfers as complete events (``critical_path`` in their args when on
that path), memory as a counter; with `tf_step_stats`, TensorFlow's own timeline of the real step
as more processes (pid >= 1001). About 0.7 KB per op.

``events.out.tfevents.baechi`` (`_graph_events`) holds the placed GraphDef for TensorBoard's
graph view. TensorFlow is imported only for it and for a serialized `tf_step_stats`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import numpy as np

from baechi_tf.placer.memory_timeline import DeviceMemory, memory_timeline
from baechi_tf.placer.schedule import Transfer

__all__ = ["chrome_trace"]

_TF_PID = 1001


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


def _trace_json(trace: dict[str, Any]) -> str:
    return json.dumps(trace, separators=(",", ":"), sort_keys=True) + "\n"
