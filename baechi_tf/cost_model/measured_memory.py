"""Memory each device held during a traced step, rebuilt from the step's allocation records.

On a GPU the per-device allocator's ``peak_bytes`` is the answer. CPU devices that stand in for
GPUs share one allocator, so there it is the peak of all of them together. What stays per device
is each node's ``memory[].allocation_records``: ``(alloc_micros, alloc_bytes)``, negative bytes
for a free, kept by the tracking allocator of the node's kernel from the allocation until the
buffer is freed, whichever op drops the last reference. `measured_memory` sums the records of
the nodes that ran on each device (the executor's entries of ``step_stats.dev_stats``, the
runtime's nodes included), in time order, and adds what the records cannot see:

* **persistent bytes**: each variable's bytes (``VarHandleOp``, ``VariableV2``: shape times
  element size, weights and optimizer slots alike), on the device its op ran on in the step (its
  ``device`` field in `graph_def` when it did not run); plus each other node's
  ``memory_stats.persistent_memory_size`` (a ``Const``'s tensor). These were allocated before the
  step and are held through it.
* **replaced buffers**: records a node leaves allocated at the end of the step. In a training
  step they are new buffers of variables (a variable updated in copy-on-write mode, as Adam's
  slots of an embedding read by a gather are, gets a new buffer each step; an output forwarded
  into a variable, as by ``v.assign(v * b)``, becomes its buffer), and the old buffer, allocated
  before the step, is freed when the variable lets it go, which no record shows. Each such
  remainder is taken as freed when the last node that reads its node's outputs in the step is
  done (the assignment), or at its node's end when none does: counted until then, the old buffer
  being among the persistent bytes (`MeasuredDevice.replaced_bytes` says how much was).

Records of one microsecond keep the order of their nodes' starts and, within a node, their own:
an op's scratch allocated and freed within a microsecond still counts. A tensor that another CPU
device reads is not copied (it stays the producer's buffer, held until its last reader anywhere
is done), where a GPU would receive a copy of its own: on stand-ins the producer's device holds
it longer and the reader's device never holds it.

Time O(R log R + N + I) for R records, N nodes and I inputs; memory O(R + N + I).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np

from baechi_tf.graph import VARIABLE_OP_TYPES

__all__ = ["MeasuredDevice", "measured_memory", "variable_bytes"]

_EXECUTOR = re.compile(r"^device:[A-Za-z_]+:\d+$")


@dataclasses.dataclass(frozen=True, eq=False)
class MeasuredDevice:
    """What one device held during a traced step."""

    device: str  # as the step stats name it
    peak_bytes: int  # persistent_bytes + step_peak_bytes
    persistent_bytes: int  # variables' bytes plus the kernels' persistent memory
    variable_bytes: int  # the variables' share of persistent_bytes
    step_peak_bytes: int  # peak over the step of the allocation records' running sum
    peak_us: int  # trace time of that peak (the first time it is reached); 0 with no record
    replaced_bytes: int  # records left allocated at the step's end, taken as freed when read (see above)
    live_at_peak: Mapping[str, int]  # node -> bytes of its records held at the peak (> 0 only)
    times_us: np.ndarray  # int64 [k], the records' times in order
    level_bytes: np.ndarray  # int64 [k], the running sum after each record (persistent excluded)


def variable_bytes(node: Any) -> int:
    """Bytes of the variable a NodeDef of `VARIABLE_OP_TYPES` makes (0 for another op, or a shape
    with unknown dimensions)."""
    from baechi_tf.cost_model.profiler import _element_bytes

    if node.op not in VARIABLE_OP_TYPES or "shape" not in node.attr or "dtype" not in node.attr:
        return 0
    shape = node.attr["shape"].shape
    if shape.unknown_rank or any(d.size < 0 for d in shape.dim):
        return 0
    count = 1
    for d in shape.dim:
        count *= d.size
    return count * _element_bytes(node.attr["dtype"].type)


def _local(device: str) -> str:
    """'device:CPU:1' of any spelling of a device name ('' when it names no single device)."""
    import tensorflow as tf

    if not device:
        return ""
    spec = tf.DeviceSpec.from_string(device)
    if spec.device_type is None or spec.device_index is None:
        return ""
    return f"device:{spec.device_type.upper()}:{spec.device_index}"


def measured_memory(step_stats: Any, graph_def: Any) -> dict[str, MeasuredDevice]:
    """Per device of the step (keyed by its name in `step_stats`), the memory it held during the
    step traced in `step_stats` (a ``StepStats`` of a ``FULL_TRACE`` run) of `graph_def`, the
    graph the session ran, by the rules of the module docstring."""
    nodes = {n.name: n for n in graph_def.node}
    executors = [d for d in step_stats.dev_stats if _EXECUTOR.match(d.device.split("/")[-1])]
    ends = {ns.node_name: int(ns.all_start_micros + ns.all_end_rel_micros) for d in executors for ns in d.node_stats}
    readers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            if not text.startswith("^"):
                readers.setdefault(text.split(":")[0], []).append(node.name)
    by_local = {_local(d.device): d.device for d in executors}
    persistent: dict[str, int] = {d.device: 0 for d in executors}
    variables: dict[str, int] = {d.device: 0 for d in executors}
    ran_variables: set[str] = set()
    events: dict[str, list[tuple[int, int, str]]] = {d.device: [] for d in executors}
    replaced: dict[str, int] = {d.device: 0 for d in executors}
    for dev in executors:
        name = dev.device
        stats = sorted(dev.node_stats, key=lambda ns: ns.all_start_micros)  # stable
        for ns in stats:
            node = nodes.get(ns.node_name)
            if node is not None and node.op in VARIABLE_OP_TYPES:
                if ns.node_name not in ran_variables:
                    ran_variables.add(ns.node_name)
                    variables[name] += variable_bytes(node)
            else:
                persistent[name] += int(ns.memory_stats.persistent_memory_size)
            net, end = 0, ends[ns.node_name]
            for used in ns.memory:
                for record in used.allocation_records:
                    events[name].append((int(record.alloc_micros), int(record.alloc_bytes), ns.node_name))
                    net += int(record.alloc_bytes)
                    end = max(end, int(record.alloc_micros))
            if net > 0:
                end = max([end] + [ends[r] for r in readers.get(ns.node_name, ()) if r in ends])
                events[name].append((end, -net, ns.node_name))
                replaced[name] += net
    for node in graph_def.node:
        if node.op in VARIABLE_OP_TYPES and node.name not in ran_variables:
            device = by_local.get(_local(node.device))
            if device is not None:
                variables[device] += variable_bytes(node)
    out = {}
    for dev in executors:
        name = dev.device
        evs = events[name]
        times = np.fromiter((t for t, _, _ in evs), np.int64, len(evs))
        deltas = np.fromiter((b for _, b, _ in evs), np.int64, len(evs))
        order = np.argsort(times, kind="stable")
        level = np.cumsum(deltas[order])
        top = int(np.argmax(level)) if level.size else -1
        step_peak = max(int(level[top]), 0) if level.size else 0
        live: dict[str, int] = {}
        if step_peak > 0:
            for i in order[: top + 1].tolist():
                live[evs[i][2]] = live.get(evs[i][2], 0) + evs[i][1]
        held = persistent[name] + variables[name]
        times_sorted, level_ro = times[order], level
        times_sorted.setflags(write=False)
        level_ro.setflags(write=False)
        out[name] = MeasuredDevice(
            device=name,
            peak_bytes=held + step_peak,
            persistent_bytes=held,
            variable_bytes=variables[name],
            step_peak_bytes=step_peak,
            peak_us=int(times_sorted[top]) if step_peak > 0 else 0,
            replaced_bytes=replaced[name],
            live_at_peak={k: v for k, v in live.items() if v > 0},
            times_us=times_sorted,
            level_bytes=level_ro,
        )
    return out
