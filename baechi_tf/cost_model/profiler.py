"""Profiling: run a fetch with full tracing and turn ``RunMetadata.step_stats`` into a profile.

`profile_fetch` runs a fetch some untimed warm-up steps, then some steps with
``RunOptions(trace_level=FULL_TRACE)``, and `profile_from_step_stats` combines the traces as the
original Baechi does (after TF's ``BuildCostModel``):

* Device stats are read per device. ``.../stream:all`` entries are a GPU's hardware trace: the
  kernel times of an op (named ``op:kernel``) are added up and replace the op's host-side time.
  Entries whose last part is ``device:TYPE:N`` are the executors' stats. Other entries (single
  streams, memcpy) are ignored.
* Traced nodes are mapped to the graph's ops (`baechi_tf.cost_model.executed`): a node named
  after an op is that op (a fused node too: the remapper's ``_FusedConv2D`` under the name of the
  Relu it ends with, oneDNN's ``_MklNative*`` kernels); a node Grappler made of an op
  (``ConstantFolding/<op>-...``, ``<op>-0-Transpose...-LayoutOptimizer``) adds its time to that
  op. Runtime nodes (copies between devices, ``_Arg``, ``_Retval``, ``_SOURCE``), ops of function
  bodies traced inside their call, and nodes nothing names are unmatched: their time counts in
  the step's traced time and, by node type, in ``unmatched_compute_us``, so that the coverage says
  what share of each step the graph's ops account for.
* Given the steps' partition graphs, the ops a fused node replaced (`executed.fused_ops`) are in
  the profile with no time of their own and ``fused_into`` the op the fused node ran as: its time
  is theirs, and the placement keeps them on its device.
* Per op and step: the op's time (summed when it runs several times, as inside a loop), each
  output's bytes (the larger of the allocated bytes and the bytes its shape and type describe; a
  tensor that aliases a variable allocates nothing but still costs its size to send), temporary and
  persistent memory, and each output's buffer (`output_buffers`). Over steps: the median time, the
  max of every memory figure, and the buffer an output had in every step (else its own).

Profile with the optimizer settings the placed graph runs with (`BaechiSession` does: Grappler on
but for what would move ops, `baechi_tf.rewriter.devices.placed_graph_config`), so that the fused
and rewritten nodes are those the placed graph runs; `profiling_config` runs the graph as written
(Grappler off). Profiling runs the fetch, so it changes variables when the fetch trains: use a
session you can spare.

Time: O(traced nodes x name length) per step, plus O(nodes + inputs) for the fused ops; memory
O(ops).
"""

from __future__ import annotations

import dataclasses

import logging
import re
from typing import Any, Collection, Mapping, Optional, Sequence

from baechi_tf import interrupts
from baechi_tf.progress import Progress
from baechi_tf.cost_model.machine_load import LoadMeter, busy_warning
from baechi_tf.cost_model.profile import (
    NO_BUFFER,
    OWN_BUFFER,
    CostProfile,
    OpCost,
    conditional_ops,
    graph_fingerprint,
    graph_nodes,
    median,
)
from baechi_tf.cost_model.executed import fused_ops, node_type, source_op
from baechi_tf.errors import ConfigError, ProfileError, first_line
from baechi_tf.graph import VIEW_OP_TYPES

__all__ = [
    "ProfilingCutShort",
    "fetch_closure",
    "fit_outputs_to_graph",
    "output_buffers",
    "profile_fetch",
    "profile_from_step_stats",
    "profiling_config",
    "with_types_not_run",
]

log = logging.getLogger(__name__)

_EXECUTOR = re.compile(r"^device:[A-Za-z_]+:\d+$")


def profiling_config(config: Any = None) -> Any:
    """A copy of `config` (a ``ConfigProto``) in which TF runs the graph as written.

    Grappler's meta-optimizer is turned off and the classic graph optimizer set to L0 (no
    constant folding, no common subexpression elimination), so ops keep their names and run as
    the graph says; everything else in `config` is kept.
    """
    import tensorflow as tf

    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    out.graph_options.rewrite_options.disable_meta_optimizer = True
    out.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    return out


# A resource handle (a variable's, a table's) is host memory: its kernels keep it there on every
# device type, and VarHandleOp makes its one handle when the kernel is built, outside the step's
# allocations. As an output it holds no device memory.
_DT_RESOURCE = 20  # types_pb2.DT_RESOURCE


def _element_bytes(dtype_enum: int) -> int:
    import tensorflow as tf

    try:
        size = tf.as_dtype(dtype_enum).base_dtype.size
    except (TypeError, ValueError):
        return 0
    return size or 8  # string, resource and variant elements: count a pointer


def _described_bytes(description) -> int:
    dims = [d.size for d in description.shape.dim]
    if description.shape.unknown_rank or any(d < 0 for d in dims):
        return 0
    count = 1
    for d in dims:
        count *= d
    return count * _element_bytes(description.dtype)


class _Acc:
    """One op's figures over the traced steps."""

    __slots__ = ("times", "outputs", "temp", "persistent", "device", "buffers", "held", "held_until")

    def __init__(self, device: str) -> None:
        self.times: list[float] = []
        self.outputs: dict[int, int] = {}
        self.temp = 0
        self.persistent = 0
        self.device = device
        self.buffers: Optional[dict[int, int]] = None  # slot -> buffer in every step so far
        self.held = 0  # `OpCost.held_bytes`
        self.held_until = ""


# Op types whose outputs reuse their inputs' buffers (`output_buffers` when a trace has no
# addresses): output slot i is input i's buffer (input 0's for the one-output views). The views
# whose output is the whole input, and Snapshot, which forwards its input when it alone holds it.
_FORWARDING_TYPES = VIEW_OP_TYPES - {"Slice", "Split", "SplitV", "Unpack"} | {"Snapshot"}
# Op types whose value is a variable's buffer, which persistent bytes count.
_VARIABLE_VIEW_TYPES = frozenset({"ReadVariableOp", "VariableV2", "Variable"})


def output_buffers(
    op_type: str, outputs: dict[int, tuple[int, int]], inputs: Sequence[Optional[tuple[int, int]]],
    allocated: int, persistent: int,
) -> dict[int, int]:
    """Per output slot of one traced run of an op, the buffer it was in (`OpCost.output_alias`).

    `outputs`: slot -> (address, bytes) from ``allocation_description.ptr`` (0: not recorded);
    `inputs`: per data input, the (address, bytes) of the buffer it read (None: not traced);
    `allocated`: the bytes the op's allocation records allocated; `persistent`: its persistent
    memory. An output at the address of an input's buffer is that input's (TF 2.21 records the
    buffer's base address, also for a slice, Unpack or Split of it, and an input forwarded in
    place); one no input has, from an op that allocated nothing, is NO_BUFFER when the op reads a
    variable (`_VARIABLE_VIEW_TYPES`) or its persistent memory holds it (a constant); else its
    own. Without an address, `_FORWARDING_TYPES` says."""
    out = {}
    for slot, (ptr, nbytes) in outputs.items():
        if ptr:
            k = next((k for k, i in enumerate(inputs) if i is not None and i[0] == ptr), None)
            if k is not None:
                out[slot] = k
            elif allocated == 0 and (op_type in _VARIABLE_VIEW_TYPES or 0 < nbytes <= persistent):
                out[slot] = NO_BUFFER
            else:
                out[slot] = OWN_BUFFER
        elif op_type in _FORWARDING_TYPES and len(inputs) > (slot if op_type == "IdentityN" else 0):
            out[slot] = slot if op_type == "IdentityN" else 0
        elif op_type in _VARIABLE_VIEW_TYPES:
            out[slot] = NO_BUFFER
        else:
            out[slot] = OWN_BUFFER
    return out


def _data_inputs(graph_def: Any) -> dict[str, list[tuple[str, int]]]:
    """Node name -> its data inputs as (producer, output slot), in input order."""
    out = {}
    for node in graph_def.node:
        ins = []
        for text in node.input:
            if text.startswith("^"):
                continue
            name, _, port = text.rpartition(":")
            ins.append((name, int(port)) if name and port.isdigit() else (text, 0))
        out[node.name] = ins
    return out


def _held(records: Sequence[tuple[int, int]], span: Optional[tuple[int, int]], own: Sequence[int],
          readers: set[str], spans: Mapping[str, tuple[int, int]]) -> tuple[int, str]:
    """(bytes, reader): what an op's allocation `records` ((time, bytes), negative bytes for a
    free) kept past its `span`'s end beyond its `own` output buffers (those the graph's ops
    read), and freed while `reader`, one of its `readers`, ran (a oneDNN max pool's workspace,
    freed by its gradient); (0, '') when nothing was, or no reader was running when it was
    freed. Each allocation is matched with the first later free of as many bytes; an output's
    buffer is an allocation of its size. Time O(R^2 + R H) for R records (a few per op) and H
    readers."""
    if span is None or not readers:
        return 0, ""
    allocs = sorted((t, b) for t, b in records if b > 0)
    frees = sorted((t, -b) for t, b in records if b < 0)
    used = [False] * len(frees)
    outlived: list[tuple[int, int]] = []  # (bytes, time freed) of allocations freed after the end
    for t, b in allocs:
        k = next((i for i, (tf, bf) in enumerate(frees) if not used[i] and bf == b and tf >= t), None)
        if k is None:
            continue  # never freed in the step: a variable's new buffer, or an output kept
        used[k] = True
        if frees[k][0] > span[1]:
            outlived.append((b, frees[k][0]))
    for nbytes in own:  # the outputs' buffers, freed by their last readers
        k = next((i for i, (b, _) in enumerate(outlived) if b == nbytes), None)
        if k is not None:
            del outlived[k]
    held, last, until = 0, -1, ""
    for b, t in outlived:
        reader = max((r for r in readers if r in spans and spans[r][0] <= t <= spans[r][1] + 1),
                     key=lambda r: spans[r][1], default=None)
        if reader is None:
            continue
        held += b
        if t > last:
            last, until = t, reader
    return held, until


def profile_from_step_stats(
    step_stats_list: Sequence[Any], graph_def: Any, *, tf_version: str = "", partition_graphs: Sequence[Any] = ()
) -> CostProfile:
    """Combines the ``StepStats`` of several traced steps of `graph_def` into a profile.

    `partition_graphs`: the ``RunMetadata.partition_graphs`` of one of the steps, from which the
    ops fused nodes replaced are found (none without them)."""
    if not step_stats_list:
        raise ProfileError("no traced step to build a profile from; trace at least one step")
    names = {n.name: n.op for n in graph_def.node}
    # The ops of a function's body run in an executor of their own and are traced under their
    # names in the body: a body's 'MatMul' added its time and sizes to the graph's 'MatMul'.
    # A traced op of such a name that ran within a call op of the same device is the body's.
    calls = {n.name for n in graph_def.node if _calls_function(n)}
    shadowed = _function_body_names(graph_def) & names.keys() if calls else set()
    acc: dict[str, _Acc] = {}
    data_inputs = _data_inputs(graph_def)
    readers: dict[tuple[str, int], list[str]] = {}  # the ops whose data inputs read each tensor
    for reader, ins in data_inputs.items():
        for t in set(ins):
            readers.setdefault(t, []).append(reader)
    op_readers: dict[str, set[str]] = {}  # the ops whose data inputs read any output of each op
    for (src, _), rs in readers.items():
        op_readers.setdefault(src, set()).update(rs)
    fused = fused_ops(graph_def, partition_graphs) if partition_graphs else {}
    step_totals: list[float] = []
    step_unmatched: list[dict[str, float]] = []
    sources = _SourceCache(names)
    for step_stats in step_stats_list:
        kernel_us: dict[str, float] = {}
        executors = []
        for dev in sorted(step_stats.dev_stats, key=lambda d: d.device.split("/")[-1]):
            last = dev.device.split("/")[-1]
            if last == "stream:all":
                for ns in dev.node_stats:
                    op = ns.node_name.split(":")[0]
                    kernel_us[op] = kernel_us.get(op, 0.0) + _op_us(ns)
            elif _EXECUTOR.match(last):
                executors.append(dev)
        step_time: dict[str, float] = {}
        traced: dict[str, tuple[dict[int, tuple[int, int]], int, int]] = {}  # for `output_buffers`
        # op -> slot -> (most bytes of its buffer, most bytes by its shape) in the step
        sizes: dict[str, dict[int, tuple[int, int]]] = {}
        records: dict[str, list[tuple[int, int]]] = {}  # op -> its allocation records, for `_held`
        spans: dict[str, tuple[int, int]] = {}  # node -> (start, end) in trace microseconds
        unmatched: dict[str, float] = {}
        total = 0.0
        for dev in executors:
            call_spans = [_span_us(ns) for ns in dev.node_stats if ns.node_name in calls] if shadowed else []
            for ns in dev.node_stats:
                name = ns.node_name
                us = kernel_us.get(name, _op_us(ns))
                total += us
                spans[name] = (int(ns.all_start_micros), int(ns.all_start_micros + ns.all_end_rel_micros))
                op = sources.op_of(ns)
                if op is None or (name in shadowed and _within(_span_us(ns), call_spans)):
                    kind = node_type(ns)
                    unmatched[kind] = unmatched.get(kind, 0.0) + us
                    continue
                a = acc.get(op)
                if a is None:
                    a = acc[op] = _Acc(dev.device)
                step_time[op] = step_time.get(op, 0.0) + us
                if op != name:  # a node Grappler made of the op: its time, not its outputs
                    continue
                buffers = {}
                slot_sizes = sizes.setdefault(op, {})
                for out in ns.output:
                    desc = out.tensor_description
                    described = _described_bytes(desc)
                    nbytes = 0 if desc.dtype == _DT_RESOURCE else max(
                        int(desc.allocation_description.allocated_bytes),
                        int(desc.allocation_description.requested_bytes),
                        described,
                    )
                    buffers[out.slot] = (int(desc.allocation_description.ptr), nbytes)
                    most, by_shape = slot_sizes.get(out.slot, (0, 0))
                    slot_sizes[out.slot] = (max(most, nbytes), max(by_shape, described))
                a.temp = max(a.temp, int(ns.memory_stats.temp_memory_size))
                a.persistent = max(a.persistent, int(ns.memory_stats.persistent_memory_size))
                records[op] = [(int(r.alloc_micros), int(r.alloc_bytes)) for m in ns.memory for r in m.allocation_records]
                allocated = sum(b for _, b in records[op] if b > 0)
                traced[op] = (buffers, allocated, int(ns.memory_stats.persistent_memory_size))
        for name, us in step_time.items():
            acc[name].times.append(us)
        ran = step_time.keys() | {op for op, host in fused.items() if host in step_time}
        for name, (outputs, allocated, persistent) in traced.items():
            ins = data_inputs.get(name, ())
            inputs = [traced[s][0].get(o) if s in traced else None for s, o in ins]
            step = output_buffers(names[name], outputs, inputs, allocated, persistent)
            a = acc[name]
            # An op not of `VIEW_OP_TYPES` seen writing in place (TF's forward_input) did so only
            # as the input's only holder, taken as settled only for an input it alone reads of the
            # ops the step runs.
            if names[name] not in VIEW_OP_TYPES:
                step = {k: v if v < 0 or _sole_reader(name, readers.get(ins[v], ()), ran) else OWN_BUFFER
                        for k, v in step.items()}
            for k, (nbytes, by_shape) in sizes.get(name, {}).items():
                # An output in an input's buffer is the part its shape says: TF describes a view
                # (a part of a Split, a Slice) by the whole buffer it is in.
                if step.get(k, OWN_BUFFER) >= 0 and by_shape:
                    nbytes = by_shape
                if nbytes > a.outputs.get(k, -1):
                    a.outputs[k] = nbytes
            # What its records allocated beyond its own outputs (a variable's copy on write, an
            # assignment's copy of a shared value) is scratch to the model, but for what a
            # reader of its outputs freed after its end (`_held`).
            # An output no op of the graph reads (oneDNN's hidden workspace slot of a max pool) may
            # be held so too; it is not scratch here, and `fit_outputs_to_graph` folds what of an
            # undeclared slot is not held into the scratch.
            own = {k: nbytes for k, (_, nbytes) in outputs.items() if step.get(k, OWN_BUFFER) == OWN_BUFFER}
            read = [nbytes for k, nbytes in own.items() if readers.get((name, k))]
            held, until = _held(records.get(name, ()), spans.get(name), read, op_readers.get(name, set()), spans)
            unread = sum(own.values()) - sum(read)
            a.temp = max(a.temp, allocated - sum(own.values()) - max(0, held - unread))
            if held > a.held:
                a.held, a.held_until = held, until
            if a.buffers is None:
                a.buffers = step
            else:  # a buffer it was not in every step is its own
                a.buffers = {k: v if step.get(k, v) == v else OWN_BUFFER for k, v in a.buffers.items()}
        step_totals.append(total)
        step_unmatched.append(unmatched)
    ops = {}
    for name, a in acc.items():
        width = max(a.outputs) + 1 if a.outputs else 0
        ops[name] = OpCost(
            name=name,
            op_type=names[name],
            compute_us=median(a.times),
            output_bytes=tuple(max(a.outputs.get(s, 0), 0) for s in range(width)),
            temp_bytes=a.temp,
            persistent_bytes=a.persistent,
            device=a.device,
            num_steps=len(a.times),
            output_alias=_alias_slots(a.buffers, width),
            held_bytes=a.held,
            held_until=a.held_until,
        )
    return CostProfile(
        ops=_with_fused_ops(ops, names, fused),
        graph_fingerprint=graph_fingerprint(graph_def),
        graph_nodes=graph_nodes(graph_def),
        tf_version=tf_version,
        num_traced_steps=len(step_stats_list),
        traced_compute_us=median(step_totals),
        unmatched_compute_us=_median_by_type(step_unmatched),
    )


def _sole_reader(op: str, readers: Collection[str], ran: Collection[str]) -> bool:
    """Whether `op` is the only one of a tensor's `readers` that ran in the traced step (`ran`:
    the ops whose nodes ran, or that a fused node that ran replaced). A reader the step never
    runs (a gradient's ``ZerosLike`` of an output nothing differentiates) holds no reference to
    the buffer, so an op seen writing into it in place did so as its only holder."""
    return all(r == op or r not in ran for r in readers)


def _alias_slots(buffers: Optional[dict[int, int]], width: int) -> tuple[int, ...]:
    """`OpCost.output_alias` of width slots; () when every output had its own buffer."""
    slots = tuple((buffers or {}).get(s, OWN_BUFFER) for s in range(width))
    return slots if any(a != OWN_BUFFER for a in slots) else ()


class _SourceCache:
    """The graph op each traced node name maps to (`executed.source_op`), looked up once."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.found: dict[str, Optional[str]] = {}

    def op_of(self, ns: Any) -> Optional[str]:
        name = ns.node_name
        if name in self.names:
            return name
        if name not in self.found:
            self.found[name] = source_op(name, self.names, node_type(ns))
        return self.found[name]


def _median_by_type(steps: Sequence[dict[str, float]]) -> dict[str, float]:
    """Node type -> the median over `steps` of its unmatched time (0 in a step without it)."""
    kinds = sorted({k for step in steps for k in step})
    return {k: median([step.get(k, 0.0) for step in steps]) for k in kinds}


def _with_fused_ops(ops: dict[str, OpCost], names: dict[str, str], fused: dict[str, str]) -> dict[str, OpCost]:
    """`ops` with the ops fused nodes replaced: each in the profile with ``fused_into`` the op
    whose node ran (its own time, 0 unless Grappler's nodes made of it ran, and its outputs
    none: the fused node never wrote them), on that op's device and steps."""
    out = dict(ops)
    for name, host in sorted(fused.items()):
        into = ops.get(host)
        if into is None or name not in names:
            continue
        own = ops.get(name)
        if own is not None:
            out[name] = dataclasses.replace(own, fused_into=host)
        else:
            out[name] = OpCost(name=name, op_type=names[name], compute_us=0.0, output_bytes=(),
                               device=into.device, num_steps=into.num_steps, fused_into=host)
    return out


def _calls_function(node: Any) -> bool:
    """Whether `node` runs a function of the graph's library (PartitionedCall, While, If, ...)."""
    return any(v.func.name or len(v.list.func) for v in node.attr.values())


def _function_body_names(graph_def: Any) -> set[str]:
    """The names the library's functions give their ops and arguments in a trace."""
    out: set[str] = set()
    for function in graph_def.library.function:
        out.update(n.name for n in function.node_def)
        out.update(a.name for a in function.signature.input_arg)
    return out


def _span_us(ns: Any) -> tuple[float, float]:
    """(start, end) of a traced op, in microseconds of the trace's clock."""
    start = ns.all_start_nanos / 1e3 if ns.all_start_nanos else float(ns.all_start_micros)
    length = ns.all_end_rel_nanos / 1e3 if ns.all_end_rel_nanos else float(ns.all_end_rel_micros)
    return start, start + length


def _within(span: tuple[float, float], outer: Sequence[tuple[float, float]]) -> bool:
    return any(a <= span[0] and span[1] <= b for a, b in outer)


def _op_us(ns) -> float:
    """An op's own time in microseconds: nanoseconds when TF recorded them."""
    if ns.op_end_rel_nanos > 0:
        return ns.op_end_rel_nanos / 1000.0
    return float(max(ns.op_end_rel_micros, 0))


class ProfilingCutShort(Exception):
    """`profile_fetch(stop_on_error=True)`: a run after the first failed before any step was
    traced (`runs` runs had succeeded; `error` is TF's)."""

    def __init__(self, runs: int, error: Exception) -> None:
        super().__init__(f"profiling run {runs + 1} failed before any step was traced: {first_line(error)}")
        self.runs = runs
        self.error = error


def profile_fetch(
    session: Any,
    fetches: Any,
    feed_dict: Optional[dict] = None,
    *,
    warmup_steps: int = 2,
    traced_steps: int = 5,
    graph_def: Any = None,
    timeout_ms: int = 0,
    stop_on_error: bool = False,
) -> CostProfile:
    """Runs `fetches` in `session` and profiles it.

    `warmup_steps` untraced steps, then `traced_steps` with full tracing. The profile describes
    `graph_def` (default: the session's graph now). Every run executes the fetch, with all its
    side effects (a training fetch trains). `timeout_ms` > 0 limits each run, as
    ``RunOptions.timeout_in_ms`` does (TF's DeadlineExceededError past it). When the fetch's
    input runs out (TF's OutOfRangeError: a dataset shorter than the steps) after at least one
    traced step, the profile is made of the steps traced so far; before that, the error is raised.

    With `stop_on_error`, any TF error of a run after the first ends the profiling so (a step
    valid only so many times, such as one asserting on the step count, fails when run again and
    again); when no step was traced yet, `ProfilingCutShort` is raised instead of the error. The
    first run's error is raised as it is: the fetch fails from the state it started in.

    The profile keeps the CPU time other work took on this machine over the runs
    (`CostProfile.machine_load`); where it was `machine_load.BUSY_SHARE` of the machine or more,
    a warning says so.
    """
    import tensorflow as tf

    if traced_steps < 1 or warmup_steps < 0:
        raise ConfigError(
            f"traced_steps={traced_steps}, warmup_steps={warmup_steps}: trace at least one step "
            "and warm up zero or more"
        )
    if graph_def is None:
        graph_def = session.graph.as_graph_def()
    warmup = tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE, timeout_in_ms=timeout_ms)
    first_traced = tf.compat.v1.RunOptions()
    first_traced.CopyFrom(options)
    first_traced.output_partition_graphs = True  # what ran, for the ops fused nodes replaced
    traces = []
    partitions: list[Any] = []
    meter = LoadMeter().start()  # over the warm-up too: a longer span, in the same conditions
    with Progress("profiling", warmup_steps + traced_steps, unit="steps", tick=True) as bar:
        for step in range(warmup_steps + traced_steps):
            traced = step >= warmup_steps
            metadata = tf.compat.v1.RunMetadata() if traced else None
            try:
                session.run(fetches, feed_dict=feed_dict,
                            options=(first_traced if not traces else options) if traced else warmup,
                            run_metadata=metadata)
            except tf.errors.OpError as e:
                ran_out = isinstance(e, tf.errors.OutOfRangeError)
                if not step or not (stop_on_error or (ran_out and traces)):
                    raise  # the first run's error, or one profile_fetch does not stop at
                if not traces:
                    raise ProfilingCutShort(step, e) from e
                if ran_out:
                    log.info("the input ran out after %d of %d traced steps; profiling those",
                             len(traces), traced_steps)
                else:
                    log.warning(
                        "profiling run %d of %d failed (%s: %s); placing by the %d step(s) traced "
                        "before it", step + 1, warmup_steps + traced_steps, type(e).__name__,
                        first_line(e), len(traces),
                    )
                break
            interrupts.check()
            if traced:
                traces.append(metadata.step_stats)
                partitions = partitions or list(metadata.partition_graphs)
            bar.update(advance=1, note="traced" if traced else "warm-up")
    load = meter.stop()
    runs = warmup_steps + len(traces)
    busy = busy_warning(load, f"the {runs} profiling run{'s' if runs != 1 else ''}")
    if busy:
        log.warning("%s", busy)
    profile = fit_outputs_to_graph(
        profile_from_step_stats(traces, graph_def, tf_version=tf.__version__, partition_graphs=partitions),
        session.graph,
    )
    profile = with_types_not_run(profile, graph_def, _fetch_closure(session.graph, fetches, feed_dict))
    profile = dataclasses.replace(profile, machine_load=load)
    log.info(
        "profiled %d ops over %d traced steps (%.0f us traced per step)",
        len(profile.ops),
        len(traces),
        profile.traced_compute_us,
    )
    return profile


def with_types_not_run(profile: CostProfile, graph_def: Any, closure: Optional[set[str]]) -> CostProfile:
    """`profile` plus an entry of no time, run in no traced step (``num_steps=0``), for each op
    of `closure` (the ops the profiled fetch runs; None: unknown, nothing added) that did not run
    and whose type no profiled op has: Grappler removed every op of that type from the fetch
    (the dependency optimizer's ``Identity`` and ``NoOp`` nodes, on one device). Those types
    then have a measurement, zero, rather than a guess from shapes. Ops of a measured type that
    did not run are left out: the importer gives them their type's time, as a placement across
    devices may run them (a duplicate merged on one device runs on each of two); so are the ops
    that another step may run (`conditional_ops`: a branch not taken)."""
    if not closure:
        return profile
    measured = {c.op_type for c in profile.ops.values() if c.num_steps}
    conditional = conditional_ops(graph_def)
    ops = dict(profile.ops)
    for node in graph_def.node:
        if node.name in closure and node.name not in ops and node.op not in measured and node.name not in conditional:
            ops[node.name] = OpCost(name=node.name, op_type=node.op, compute_us=0.0, output_bytes=(), num_steps=0)
    return dataclasses.replace(profile, ops=ops)


def fetch_closure(graph: Any, fetches: Any, fed: Collection[str] = ()) -> set[str]:
    """Names of the ops of `graph` that a run of `fetches` (names, tensors or operations, nested
    as ``Session.run`` takes them) executes: their inputs and control inputs, the graph cut at
    the tensors named in `fed`. ``KeyError`` or ``ValueError`` for a fetch not in `graph`."""
    import tensorflow as tf

    stack = []
    for fetch in tf.nest.flatten(fetches):
        element = graph.as_graph_element(fetch)
        stack.append(element if isinstance(element, tf.Operation) else element.op)
    seen: set[str] = set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs if t.name not in fed)
        stack.extend(op.control_inputs)
    return seen


def _fetch_closure(graph: Any, fetches: Any, feed_dict: Optional[dict]) -> Optional[set[str]]:
    """`fetch_closure` of a `profile_fetch` run; None when a fetch or feed is not of `graph`."""
    try:
        fed = {graph.as_graph_element(k).name for k in (feed_dict or {})}
        return fetch_closure(graph, fetches, fed)
    except (TypeError, ValueError, KeyError):
        return None


def fit_outputs_to_graph(profile: Any, graph: Any) -> Any:
    """`profile` without the output slots that the ops of `graph` (a ``tf.Graph``, or a
    ``GraphDef``: outputs counted from the ops' definitions) do not have; their bytes are
    counted as the op's temporary memory, but for those it held past its end (`held_bytes`,
    counted first from these slots).

    oneDNN's CPU kernels give some ops more outputs at run time than the graph declares (a
    training MaxPool keeps a workspace for its gradient, which frees it), and the step stats
    report them under the op's name; the importer would take them for a profile of another graph.
    """
    if hasattr(graph, "get_operations"):
        counts = {op.name: len(op.outputs) for op in graph.get_operations()}
    else:
        counts = _declared_outputs(graph)
    ops = {}
    for name, cost in profile.ops.items():
        n = counts.get(name, len(cost.output_bytes))
        if len(cost.output_bytes) > n:
            alias = cost.output_alias[:n]
            hidden = sum(cost.output_bytes[n:])
            cost = dataclasses.replace(cost, output_bytes=cost.output_bytes[:n],
                                       temp_bytes=cost.temp_bytes + max(0, hidden - cost.held_bytes),
                                       output_alias=alias if any(a != OWN_BUFFER for a in alias) else ())
        ops[name] = cost
    return dataclasses.replace(profile, ops=ops)


def _declared_outputs(graph_def: Any) -> dict[str, int]:
    """Output count of each node of `graph_def` whose op TF or the graph's library defines."""
    from tensorflow.python.framework import op_def_registry

    signatures = {f.signature.name: f.signature for f in graph_def.library.function}
    out = {}
    for node in graph_def.node:
        op_def = signatures.get(node.op) or op_def_registry.get(node.op)
        if op_def is None:
            continue  # the import says what is wrong with it
        defaults = {a.name: a.default_value for a in getattr(op_def, "attr", ())}

        def attr(name: str) -> Any:
            return node.attr[name] if name in node.attr else defaults.get(name)

        count = 0
        for arg in op_def.output_arg:
            if arg.number_attr:
                value = attr(arg.number_attr)
                count += value.i if value is not None else 0
            elif arg.type_list_attr:
                value = attr(arg.type_list_attr)
                count += len(value.list.type) if value is not None else 0
            else:
                count += 1
        out[node.name] = count
    return out
