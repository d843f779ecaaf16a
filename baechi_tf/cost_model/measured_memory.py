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

* **tensors that came without a record**, on devices of other tasks (each task its own process,
  as each GPU has its own memory). A tensor received from another task (a ``RecvTensor`` entry
  of the step, its ``timeline_label`` naming ``edge_<n>_<op> from <device> to <device>``) is
  allocated on the receiving device by gRPC, outside any kernel's tracking allocator: it is
  counted there from the end of its ``RecvTensor`` (or the start of its first reader there, where
  that is earlier: the trace may log the call's end late) until the last node on that device that reads
  an output of the op is done, or reads the buffer where a reader there passed it on as an output
  of its own (an element-wise op written in place, an Identity: an output that allocated nothing,
  of the tensor's bytes, at no other input's address), and so on. A value fed to the step
  (`fed`, by the caller: worker tasks receive a copy of it; on CPU stand-ins of one process it
  stays the caller's array and is not to be given) is counted where TF put it, which on worker
  tasks is the master's device whatever the op's: the device that sent it on to others (as
  ``_recv_<op>_<k>``), else the one device whose nodes read it, else the op's ``device`` field;
  from that device's first node of the step until the last node there that reads it, or that
  sends it on, is done (or reads it passed on, as above). Another task's copy of it is a
  received tensor, as above.

Records of one microsecond keep the order of their nodes' starts and, within a node, their own:
an op's scratch allocated and freed within a microsecond still counts. A tensor that another CPU
device reads is not copied (it stays the producer's buffer, held until its last reader anywhere
is done), where a GPU would receive a copy of its own: on stand-ins the producer's device holds
it longer and the reader's device never holds it.

Time O(R log R + N + I) for R records (received and fed tensors among them), N nodes and I
inputs; memory O(R + N + I).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional

import numpy as np

from baechi_tf.graph import VARIABLE_OP_TYPES

__all__ = ["MeasuredDevice", "measured_memory", "variable_bytes"]

_EXECUTOR = re.compile(r"^device:[A-Za-z_]+:\d+$")
_RECEIVED = re.compile(r"\bedge_\d+_(?P<op>\S+) from (?P<sender>\S+) to (?P<receiver>\S+)$")
_FED = re.compile(r"^_recv_(.+)_\d+$")


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


def _resolver(names: Any) -> Callable[[str], Optional[str]]:
    """A function from any spelling of a device name to the one of `names` (full device names of
    a step) it names, None when it names none or several: '/device:CPU:1' finds
    '/job:localhost/replica:0/task:0/device:CPU:1' in one process, and a task's device needs its
    task."""
    import tensorflow as tf

    specs = [(n, tf.DeviceSpec.from_string(n)) for n in dict.fromkeys(names)]
    fields = ("job", "replica", "task", "device_type", "device_index")

    def resolve(device: str) -> Optional[str]:
        if not device:
            return None
        want = tf.DeviceSpec.from_string(device)
        found = [n for n, spec in specs if all(
            getattr(want, f) is None or str(getattr(want, f)).upper() == str(getattr(spec, f)).upper()
            for f in fields)]
        return found[0] if len(found) == 1 else None

    return resolve


def _arrivals(executors: Any, nodes: Mapping[str, Any], readers: Mapping[str, list[str]],
              op_starts: Mapping[str, int], ends: Mapping[str, int], ran_on: Mapping[str, str],
              fed: Mapping[str, int], resolve: Callable[[str], Optional[str]]) -> list[tuple[str, int, int, str]]:
    """Two (device, time, bytes, op) events for each tensor that came to a device without an
    allocation record, a tensor of `op` received from another task or a value fed to `op`
    (module docstring): its bytes at its arrival (the end of its ``RecvTensor``, or the start of
    its first reader there where that is earlier), and their negation when its last reader there
    is done."""
    out: list[tuple[str, int, int, str]] = []
    sent: dict[tuple[str, str], int] = {}  # (op, sending device) -> end of its last RecvTensor
    # Per node that ran, each output's (address, bytes it allocated, bytes asked for).
    outputs = {ns.node_name: [(int(o.tensor_description.allocation_description.ptr),
                               int(o.tensor_description.allocation_description.allocated_bytes),
                               int(o.tensor_description.allocation_description.requested_bytes)) for o in ns.output]
               for d in executors for ns in d.node_stats if ns.node_name != "RecvTensor"}

    def passed_on(reader: str, source: str, device: str, buffer: int, nbytes: int) -> int:
        """The address of `reader`'s output that is the buffer of `source`'s tensor it read (written
        in place or passed on: it allocated nothing there), or 0. `buffer` is that address, 0 for a
        tensor that came without a record, whose address the trace does not give: then an output
        of its `nbytes` that allocated nothing and is no buffer of the reader's other inputs on
        `device`, where no other input came without a record too (which of the two it passed on
        would not be known)."""
        found = outputs.get(reader, ())
        if buffer:
            return next((ptr for ptr, allocated, _ in found if ptr == buffer and not allocated), 0)
        others: set[int] = set()
        for text in nodes[reader].input if reader in nodes else ():
            src, _, slot = text.partition(":")
            if text.startswith("^") or src == source:
                continue
            if ran_on.get(src) != device:
                return 0
            if int(slot or 0) < len(outputs.get(src, ())):
                others.add(outputs[src][int(slot or 0)][0])
        return next((ptr for ptr, allocated, requested in found
                     if ptr and not allocated and requested == nbytes and ptr not in others), 0)

    def last_read(op: str, device: str, since: int, nbytes: int) -> int:
        """The end of the last node on `device` that reads `op`'s tensor, or an output of a
        reader there that is that tensor's buffer passed on (an element-wise op written in place,
        an Identity), and so on; `since` at the earliest."""
        until, todo, seen = since, [(op, 0)], set()
        while todo:
            node, buffer = todo.pop()
            for r in readers.get(node, ()):
                if ran_on.get(r) != device or (r, buffer) in seen:
                    continue
                seen.add((r, buffer))
                until = max(until, ends[r])
                ptr = passed_on(r, node, device, buffer, nbytes)
                if ptr:
                    todo.append((r, ptr))
        return until

    for dev in executors:
        for ns in dev.node_stats:
            if ns.node_name != "RecvTensor":
                continue
            label = _RECEIVED.search(ns.timeline_label)
            if label is None or not ns.output:
                continue
            op = label["op"]
            fed_op = _FED.match(op)
            if op not in nodes and fed_op is not None and fed_op[1] in nodes:
                op = fed_op[1]  # a fed value sent on: TF's node that brings it in is '_recv_<op>_<k>'
            receiver = resolve(label["receiver"]) or dev.device
            sender = resolve(label["sender"])
            arrived = int(ns.all_start_micros + ns.all_end_rel_micros)
            # It was there by the time a reader on the receiver started, whenever the RPC's own
            # end was traced (the trace may log it later, on a busy machine).
            arrived = min([arrived] + [op_starts[r] for r in readers.get(op, ())
                                       if ran_on.get(r) == receiver and r in op_starts])
            if sender is not None:
                sent[(op, sender)] = max(sent.get((op, sender), arrived), arrived)
            described = ns.output[0].tensor_description.allocation_description
            nbytes = max(int(described.allocated_bytes), int(described.requested_bytes))
            if nbytes > 0:
                until = last_read(op, receiver, arrived, nbytes)
                out += [(receiver, arrived, nbytes, op), (receiver, until, -nbytes, op)]
    if fed:
        starts: dict[str, int] = {}  # device -> its first node's start in the step
        for d in executors:
            for ns in d.node_stats:
                starts[d.device] = min(starts.get(d.device, int(ns.all_start_micros)), int(ns.all_start_micros))
        for tensor, nbytes in fed.items():
            op = tensor.split(":")[0]
            node = nodes.get(op)
            # Where TF put it, which need not be the op's device: the task that sent it on, else
            # the one its readers ran on, else the op's device.
            where = {d for o, d in sent if o == op} or {ran_on[r] for r in readers.get(op, ()) if r in ran_on}
            device = where.pop() if len(where) == 1 else resolve(node.device) if node is not None else None
            if device is None or nbytes <= 0:
                continue
            since = starts.get(device, 0)
            until = max(last_read(op, device, since, int(nbytes)), sent.get((op, device), since))
            out += [(device, since, int(nbytes), op), (device, until, -int(nbytes), op)]
    return out


def measured_memory(
    step_stats: Any, graph_def: Any, fed: Optional[Mapping[str, int]] = None
) -> dict[str, MeasuredDevice]:
    """Per device of the step (keyed by its name in `step_stats`), the memory it held during the
    step traced in `step_stats` (a ``StepStats`` of a ``FULL_TRACE`` run) of `graph_def`, the
    graph the session ran, by the rules of the module docstring. `fed` maps each tensor the step
    was fed that the devices hold a copy of (on worker tasks; none on CPU stand-ins of one
    process) to its bytes."""
    fed = fed or {}
    nodes = {n.name: n for n in graph_def.node}
    executors = [d for d in step_stats.dev_stats if _EXECUTOR.match(d.device.split("/")[-1])]
    ran = [(d.device, ns) for d in executors for ns in d.node_stats if ns.node_name != "RecvTensor"]
    ends = {ns.node_name: int(ns.all_start_micros + ns.all_end_rel_micros) for _, ns in ran}
    starts = {ns.node_name: int(ns.all_start_micros) for _, ns in ran}
    ran_on = {ns.node_name: device for device, ns in ran}
    readers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            if not text.startswith("^"):
                readers.setdefault(text.split(":")[0], []).append(node.name)
    resolve = _resolver(d.device for d in executors)
    persistent: dict[str, int] = {d.device: 0 for d in executors}
    variables: dict[str, int] = {d.device: 0 for d in executors}
    ran_variables: set[str] = set()
    events: dict[str, list[tuple[int, int, str]]] = {d.device: [] for d in executors}
    replaced: dict[str, int] = {d.device: 0 for d in executors}
    for dev in executors:
        name = dev.device
        stats = sorted(dev.node_stats, key=lambda ns: ns.all_start_micros)  # stable
        for ns in stats:
            if ns.node_name == "RecvTensor":  # gRPC's, no kernel: `_arrivals`
                continue
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
            device = resolve(node.device)
            if device is not None:
                variables[device] += variable_bytes(node)
    for device, t, nbytes, op in _arrivals(executors, nodes, readers, starts, ends, ran_on, fed, resolve):
        events[device].append((t, nbytes, op))
    out = {}
    for name in events:
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
