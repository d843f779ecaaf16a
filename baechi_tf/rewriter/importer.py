"""GraphDef + CostProfile + Cluster -> `OpGraph`: the TensorFlow end that feeds the placers.

One op per node, in node order, with:

* **Costs** from the profile: compute time, bytes of each output slot, temporary and persistent
  memory. Variables always hold at least their own size as persistent memory (a resource
  variable's buffer is allocated by the op that assigns it, so the handle op's trace shows none).
  Ops that no step of the profiled fetches runs (`baechi_tf.cost_model.profile.unrun_ops`: the
  initializers, a Keras model's construction graph...) cost nothing: no time, no bytes but a
  variable's own size; TF allocates nothing for them in those steps. Other ops the profile lacks
  get estimates and are listed in the coverage: output bytes from static shapes and types
  (unknown dimensions count as 1), variables their size as persistent memory, compute time the
  median of the profiled ops of the same type or, when no op of that type was profiled (those
  ops are listed apart), an estimate from the bytes it reads and writes and the operations it
  computes, by coefficients fitted to the profiled ops (`baechi_tf.cost_model.estimate`).
* **Edges**: one data edge per (producer output, consumer), carrying the producer's output bytes;
  one control edge per control input, unless a data edge already links the two ops.
  ``NextIteration -> Merge`` back edges of loops are left out, so the graph is a DAG, and so are
  the edges of ops that no profiled step runs: no tensor or message goes to them in a step.
* **Colocation**: the TF colocation names of ``_class: loc:@x``, plus the colocations TF's own
  placer adds (`baechi_tf.rewriter.colocation`): an op taking a resource handle or a reference from
  another op (as its input is declared: not one reading the value through a reference) runs on that
  op's device (a handle that a functional ``While`` takes and hands out again comes from where it
  went in: `_handle_source`), and so does a dataset op reading another dataset. TF moves it there
  whatever the GraphDef says: where the two are pinned to different devices, the reader's pin gives
  way (`_implicit_colocation`). Iterators go with the graph's ``Iterator.from_string_handle`` ops:
  any of them may be fed in by its string handle, and TF makes an iterator from a handle only on
  the device where the iterator lives. An op calling functions that a session inlines (functional
  control flow) goes with the ops of the graph that the functions' nodes name in their ``_class``;
  such an op named by a node with a device is pinned there, and one named by a node taking a
  resource handle argument goes with the handle's maker (`_inlined_colocation`). A v1 loop's
  ``Enter`` goes with its first reader (`_enter_readers`), and on CPU devices an NCHW
  ``MaxPoolGrad`` with its ``MaxPool`` (`_pool_grad_forward`). An op that a fused node replaced
  while profiling goes with the op the node ran as (``OpCost.fused_into``: Grappler's remapper
  fuses ops of different devices into one node on one of them), unless the user pinned the two to
  different devices. An addition whose only reader is an addition goes with it, so that Grappler
  sums a tree of additions as it does on one device (`_addition_trees`).
* **Pinned devices** (`baechi_tf.rewriter.pins`): a node whose ``device`` names one device
  (``/device:GPU:1``, ``/cpu:0``, ...) stays there. `device_aliases` map a name to another (virtual
  CPU devices stand in for GPUs). A node naming the host CPU that is not a cluster device is pinned
  to `host_device`. A device that is neither is an error, unless `ignore_user_devices`, which lets
  the placer move it. Partial names (``/job:worker``) pin nothing.
* **Kernels**: an op without a kernel for the cluster's device type, but with a CPU kernel, is
  pinned to the host CPU (TF's registry,
  ``tensorflow.python.framework.kernels.get_registered_kernels_for_op``). A registry that knows
  no kernel at all of a device type (``tensorflow-cpu`` and GPUs) cannot tell, and the check is
  skipped for that type, with a note saying so. Ops that call a function of the graph's library
  are not checked.

Time: O(nodes + inputs) plus TensorFlow's own import of the GraphDef (for output types and static
shapes); memory O(nodes + inputs).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import statistics
from typing import Any, Callable, Mapping, Optional

from baechi_tf.cluster import Cluster, Device
from baechi_tf.control_edges import drop_implied_control_edges
from baechi_tf.cost_model.estimate import ShapeCost, fit_shape_cost, op_flops
from baechi_tf.cost_model.profile import (
    NO_BUFFER,
    OWN_BUFFER,
    CostProfile,
    Coverage,
    OpCost,
    ProfileMismatch,
    compare_to_graph,
    unrun_ops,
)
from baechi_tf.errors import InvalidGraphError, ProfileError
from baechi_tf.graph import HELD, VARIABLE_OP_TYPES, OpGraph
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.rewriter.colocation import (
    _FROM_STRING_HANDLE,
    _ITERATORS,
    _addition_trees,
    _enter_readers,
    _fused_colocation,
    _implicit_colocation,
    _inlined_colocation,
    _parse_input,
    _pool_grad_forward,
)
from baechi_tf.rewriter.pins import _DeviceResolver, _resolve_function_devices

__all__ = [
    "ImportResult",
    "has_registered_kernel",
    "import_graph_def",
]

log = logging.getLogger(__name__)

_BACK_EDGE_SRC = frozenset({"NextIteration", "RefNextIteration"})
_BACK_EDGE_DST = frozenset({"Merge", "RefMerge"})

KernelLookup = Callable[[str, str], bool]


@dataclasses.dataclass(frozen=True, eq=False)
class ImportResult:
    """The op graph of a GraphDef and what the import had to decide."""

    graph: OpGraph
    coverage: Coverage
    default_compute_ops: tuple[str, ...]  # unprofiled ops of unprofiled types: estimated from shapes
    host_ops: tuple[str, ...]  # ops pinned to the host CPU: no kernel for the cluster's type
    host_device: Optional[str]  # name of the host CPU when some op is pinned there
    mismatch: Optional[ProfileMismatch]  # set when the profile was of another graph (allowed)
    notes: tuple[str, ...]  # decisions worth telling the user


@functools.lru_cache(maxsize=None)
def _kernel_device_types(op_type: str) -> frozenset[str]:
    from tensorflow.python.framework import kernels

    try:
        registered = kernels.get_registered_kernels_for_op(op_type).kernel
    except Exception:  # an unknown op type: no kernel anywhere
        return frozenset()
    return frozenset(k.device_type for k in registered)


def has_registered_kernel(op_type: str, device_type: str) -> bool:
    """Whether TF's kernel registry has a kernel of `op_type` for `device_type`."""
    types = _kernel_device_types(op_type)
    return device_type.upper() in types or "DEFAULT" in types


def _registry_knows(lookup: KernelLookup, device_type: str) -> bool:
    # Every real device type has a MatMul kernel; a registry without one was built without it.
    return lookup("MatMul", device_type)


def _static_bytes(tensor) -> int:
    dtype = tensor.dtype.base_dtype
    if dtype.name == "resource":  # a handle, in host memory (the profiler's `_DT_RESOURCE`)
        return 0
    size = dtype.size or 8  # string and variant elements: count a pointer
    shape = tensor.shape
    if shape.rank is None:
        return size
    count = 1
    for d in shape.as_list():
        count *= d if d is not None and d >= 0 else 1
    return count * size


def _variable_bytes(op) -> int:
    import tensorflow as tf

    try:
        dtype = tf.as_dtype(op.get_attr("dtype")).base_dtype
        shape = tf.TensorShape(op.get_attr("shape"))
    except (ValueError, TypeError):
        return 0
    if shape.rank is None:
        return dtype.size
    count = 1
    for d in shape.as_list():
        count *= d if d is not None and d >= 0 else 1
    return count * (dtype.size or 8)


def _tf_graph(graph_def):
    import tensorflow as tf

    g = tf.Graph()
    given = graph_def
    graph_def = type(given)()
    graph_def.CopyFrom(given)  # TF's import adds the ops' default attrs to the message it is given
    try:
        with g.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "cycle" in msg:
            _structure(graph_def).validate()  # names the ops on a cycle
        raise InvalidGraphError(f"the GraphDef does not import into TensorFlow: {msg}") from None
    return g


def _structure(graph_def) -> OpGraph:
    """Nodes and inputs only (every input as a control edge), loops' back edges left out."""
    builder = OpGraphBuilder()
    types = {}
    for node in graph_def.node:
        builder.add_op(node.name, op_type=node.op)
        types[node.name] = node.op
    for node in graph_def.node:
        for text in node.input:
            src, _ = _parse_input(text)
            if src in types and not (types[src] in _BACK_EDGE_SRC and node.op in _BACK_EDGE_DST):
                builder.add_control_edge(src, node.name)
    return builder.build()


def import_graph_def(
    graph_def: Any,
    profile: CostProfile,
    cluster: Cluster,
    *,
    host_device: Optional[Device] = None,
    device_aliases: Optional[Mapping[str, str]] = None,
    allow_profile_mismatch: bool = False,
    ignore_user_devices: bool = False,
    kernel_lookup: Optional[KernelLookup] = None,
    keep_implied_control_edges: bool = False,
) -> ImportResult:
    """The `OpGraph` of `graph_def` with the costs of `profile`, for placement on `cluster`.

    Control edges that other paths imply are left out (`control_edges`), as Grappler leaves
    them out of the step it runs, unless `keep_implied_control_edges` (for comparisons).

    `host_device` is the host CPU: ops the user pinned to it, and ops without a kernel for the
    cluster's device type, are pinned to it. When it is not a device of `cluster`, the caller
    places on `cluster` plus the host (see `baechi_tf.rewriter.graph_pass`). A profile of another
    graph raises `ProfileError` unless `allow_profile_mismatch`: then only the ops of the same
    name, type and inputs take measured costs, and the result says what did not match.
    """
    mismatch = compare_to_graph(profile, graph_def)
    if mismatch is not None and not allow_profile_mismatch:
        raise ProfileError(
            f"the cost profile was taken on another graph: {mismatch.describe()}; profile this "
            "graph again, or allow the mismatch (--allow_profile_mismatch) to use the costs of "
            "the ops that match"
        )
    usable: Mapping[str, OpCost] = profile.ops
    if mismatch is not None:
        bad = set(mismatch.changed)
        usable = {n: c for n, c in profile.ops.items() if n not in bad}

    tfg = _tf_graph(graph_def)
    import tensorflow as tf

    notes: list[str] = []
    if profile.tf_version and profile.tf_version != tf.__version__:
        notes.append(
            f"the profile was taken with TensorFlow {profile.tf_version}, this is "
            f"{tf.__version__}: op costs may have changed"
        )
    lookup = kernel_lookup or has_registered_kernel
    # On CPU stand-ins of one process (every device of shared memory, one task) the value a step
    # is fed stays the caller's array, which TF hands the step without a copy (the Placeholder's
    # kernel never runs): a Placeholder of a traced step holds no device memory there. A GPU, or
    # another task, receives a copy of its own.
    caller_feeds = profile.num_traced_steps >= 1 and bool(cluster.devices) and all(
        d.shared_memory for d in cluster.devices) and len({d.task for d in cluster.devices}) == 1
    resolver = _DeviceResolver(cluster, host_device, device_aliases or {}, ignore_user_devices)
    _resolve_function_devices(graph_def, resolver, write=False)

    # Kernel check: the device types of the cluster the registry knows about.
    target_types = sorted({d.type.upper() for d in cluster.devices})
    checked_types = [t for t in target_types if _registry_knows(lookup, t)]
    for t in target_types:
        if t not in checked_types:
            notes.append(
                f"kernel check skipped for {t}: this TensorFlow registers no {t} kernels, so "
                f"ops without a {t} kernel cannot be told apart"
            )
    library_ops = {f.signature.name for f in graph_def.library.function}

    by_type: dict[str, list[float]] = {}
    for c in usable.values():
        by_type.setdefault(c.op_type, []).append(c.compute_us)
    type_median = {t: statistics.median(v) for t, v in by_type.items()}
    unrun = unrun_ops(profile, graph_def)
    shape_cost = _shape_cost(graph_def, tfg, usable, type_median, unrun)

    builder = OpGraphBuilder()
    default_ops: list[str] = []
    host_ops: list[str] = []
    used_host = False
    estimated: list[str] = []
    profiled_us = 0.0
    names = [n.name for n in graph_def.node]
    node_types = {n.name: n.op for n in graph_def.node}
    from_handle = [n.name for n in graph_def.node if n.op in _FROM_STRING_HANDLE]
    enter_readers = _enter_readers(graph_def)
    inlined, inlined_pins = _inlined_colocation(graph_def, tfg)
    user_pins = {
        node.name: resolver.resolve(node.name, node.device or inlined_pins.get(node.name, ""))
        for node in graph_def.node
    }
    implicit, overridden = _implicit_colocation(tfg, {n: d for n, (d, _) in user_pins.items()})
    additions = _addition_trees(graph_def, user_pins)
    if overridden:
        name, device = next(iter(overridden.items()))
        one = len(overridden) == 1
        notes.append(
            f"{len(overridden)} {'op' if one else 'ops'} pinned to one device read a resource or "
            f"reference that TF puts on another; TF runs {'it' if one else 'them'} there, and so "
            f"does the placement (first: {name!r}, pinned to {user_pins[name][0]!r}, runs on "
            f"{device!r})"
        )

    held_edges: list[tuple[str, int, str]] = []  # (op, its held slot, the reader that frees it)
    by_name = {n.name: n for n in graph_def.node}
    for node in graph_def.node:
        op = tfg.get_operation_by_name(node.name)
        cost = usable.get(node.name)
        if cost is not None and cost.op_type and cost.op_type != node.op:
            cost = None  # same name, another op: only possible with an allowed mismatch
        out_bytes, compute, temp, persistent = _op_costs(
            node.name, node.op, op, cost, type_median, shape_cost if node.name not in unrun else None,
            allow_profile_mismatch,
        )
        if node.name in unrun:
            out_bytes, compute, temp = [0] * len(out_bytes), 0.0, 0
        elif cost is not None:
            profiled_us += compute
        else:
            estimated.append(node.name)
            if node.op not in type_median:
                default_ops.append(node.name)

        device, on_host = user_pins[node.name] if node.name not in overridden else (None, False)
        if (
            device is None
            and host_device is not None
            and _needs_host(node.op, checked_types, lookup, library_ops)
        ):
            device, on_host = host_device.name, True
            host_ops.append(node.name)
        used_host = used_host or on_host

        if caller_feeds and node.op == "Placeholder" and node.name not in unrun:
            alias = [HELD] * len(out_bytes)  # the step's fed value: the caller's array
        else:
            alias = _output_alias(node, cost, len(out_bytes), node_types, unrun)
        until = _held_until(node, cost, unrun, by_name)
        if until is not None:  # one more output, read by the op that frees it (`_held_until`)
            held_edges.append((node.name, len(out_bytes), until))
            out_bytes = list(out_bytes) + [cost.held_bytes]
            alias = alias + [None] if alias else alias
        elif cost is not None and node.name not in unrun:
            temp += cost.held_bytes  # held for a reader the graph does not show: scratch
        colocation = [
            v.decode() if isinstance(v, bytes) else v
            for v in (node.attr["_class"].list.s if "_class" in node.attr else ())
        ]
        colocation = [c[len("loc:@") :] for c in colocation if c.startswith("loc:@")]
        fused = _fused_colocation(node.name, cost, user_pins)
        builder.add_op(
            node.name,
            compute_us=float(compute),
            output_bytes=[int(b) for b in out_bytes],
            temp_bytes=int(temp),
            persistent_bytes=int(persistent),
            device=device,
            colocation=tuple(colocation)
            + tuple(implicit.get(node.name, ()))
            + (tuple(from_handle[:1]) if node.op in _ITERATORS else ())
            + enter_readers.get(node.name, ())
            + tuple(inlined.get(node.name, ()))
            + _pool_grad_forward(node, target_types)
            + additions.get(node.name, ())
            + fused,
            op_type=node.op,
            output_alias=alias,
        )

    _add_edges(builder, graph_def, node_types, unrun)
    for src, slot, dst in held_edges:
        builder.add_edge(src, dst, slot)
    graph, implied = builder.build(), 0
    if not keep_implied_control_edges:
        graph, implied = drop_implied_control_edges(graph)
    if implied:
        notes.append(
            f"{implied} control edges that other paths imply were left out, as Grappler's "
            "dependency optimizer removes them"
        )
    if resolver.ignored:
        notes.append(
            f"{len(resolver.ignored)} ops named devices outside the cluster and were placed "
            f"freely (first: {resolver.ignored[0]!r})"
        )
    if unrun:
        first = next(n for n in names if n in unrun)
        notes.append(
            f"{len(unrun)} ops ran in no traced step (first: {first!r}): no step of the profiled "
            "fetches runs them, so they are placed at no cost"
        )
    if host_ops:
        notes.append(
            f"{len(host_ops)} ops have no kernel for {', '.join(checked_types)} and stay on the "
            f"host CPU (first: {host_ops[0]!r})"
        )
    coverage = Coverage(
        num_graph_ops=len(names),
        num_profiled_ops=len(names) - len(estimated) - len(unrun),
        estimated_ops=tuple(estimated),
        profiled_compute_us=profiled_us,
        traced_compute_us=profile.traced_compute_us,
        unmatched_compute_us=profile.unmatched_compute_us,
        unrun_ops=tuple(n for n in names if n in unrun),
        machine_load=profile.machine_load,
    )
    log.info("%s", coverage.describe())
    return ImportResult(
        graph=graph,
        coverage=coverage,
        default_compute_ops=tuple(default_ops),
        host_ops=tuple(host_ops),
        host_device=host_device.name if used_host and host_device is not None else None,
        mismatch=mismatch,
        notes=tuple(notes),
    )


def _op_costs(
    name: str,
    op_type: str,
    op: Any,
    cost: Optional[OpCost],
    type_median: Mapping[str, float],
    shape_cost: Optional[ShapeCost],
    allow_profile_mismatch: bool,
) -> tuple[list[int], float, int, int]:
    """(output bytes, compute us, temporary bytes, persistent bytes) of one op."""
    outputs = op.outputs
    static = [_static_bytes(t) for t in outputs]
    var_bytes = _variable_bytes(op) if op_type in VARIABLE_OP_TYPES else 0
    if cost is None:
        if op_type in type_median:
            return static, type_median[op_type], 0, var_bytes
        if shape_cost is None:  # an op no profiled step runs (`_shape_cost`): it costs nothing
            return static, 0.0, 0, var_bytes
        return static, shape_cost.estimate_us(*_bytes_and_flops(op)), 0, var_bytes
    if len(cost.output_bytes) > len(outputs) and not allow_profile_mismatch:
        raise ProfileError(
            f"the profile gives op {name!r} {len(cost.output_bytes)} outputs but the graph's op "
            f"has {len(outputs)}; profile this graph again"
        )
    out_bytes = [
        cost.output_bytes[i] if i < len(cost.output_bytes) else static[i]
        for i in range(len(outputs))
    ]
    return out_bytes, cost.compute_us, cost.temp_bytes, max(cost.persistent_bytes, var_bytes)


_MAX_FIT_SAMPLES = 2000


def _shape_cost(
    graph_def: Any, tfg: Any, usable: Mapping[str, OpCost], type_median: Mapping[str, float],
    unrun: frozenset[str],
) -> Optional[ShapeCost]:
    """The `ShapeCost` fitted to the profiled ops (at most `_MAX_FIT_SAMPLES`, evenly by name),
    when some op of the graph that runs (not in `unrun`) is of a type none of them is; else None
    (not needed)."""
    if all(n.name in usable or n.op in type_median or n.name in unrun for n in graph_def.node):
        return None
    names = sorted(n for n, c in usable.items() if c.compute_us > 0 and not c.fused_into)
    step = max(1, len(names) // _MAX_FIT_SAMPLES)
    samples = []
    for name in names[::step]:
        try:
            op = tfg.get_operation_by_name(name)
        except KeyError:
            continue
        samples.append((*_bytes_and_flops(op), usable[name].compute_us))
    columns = list(zip(*samples)) if samples else ([], [], [])
    return fit_shape_cost(*columns)


def _shape(tensor: Any) -> Optional[list]:
    return tensor.shape.as_list() if tensor.shape.rank is not None else None


def _bytes_and_flops(op: Any) -> tuple[float, float]:
    """Bytes an op reads and writes (static shapes) and its floating-point operations."""
    nbytes = sum(_static_bytes(t) for t in op.inputs) + sum(_static_bytes(t) for t in op.outputs)
    flops = op_flops(op.type, [_shape(t) for t in op.inputs], [_shape(t) for t in op.outputs])
    return float(nbytes), flops


def _add_edges(
    builder: OpGraphBuilder, graph_def: Any, node_types: Mapping[str, str], unrun: frozenset[str]
) -> None:
    """Data edges, then control edges not parallel to a data edge; loops' back edges and the
    edges of `unrun` ops left out. One pass over the inputs, the edges handed to the builder at
    once (a graph may have hundreds of thousands of control inputs)."""
    ids = builder.ids
    src_ids: list[int] = []
    dst_ids: list[int] = []
    slots: list[int] = []
    for node in graph_def.node:
        dst = ids[node.name]
        merge = node.op in _BACK_EDGE_DST
        data_srcs: set[int] = set()
        for text in node.input:
            name, port = _parse_input(text)
            src = ids.get(name)
            if src is None:
                raise InvalidGraphError(
                    f"op {node.name!r} reads {text!r}, but the graph has no op {name!r}: the "
                    "GraphDef is incomplete"
                )
            if merge and node_types[name] in _BACK_EDGE_SRC:
                continue  # a loop's back edge: left out of the DAG
            if node.name in unrun or name in unrun:
                continue  # no step sends it anything
            if port >= 0:
                data_srcs.add(src)
            elif src in data_srcs:
                continue
            src_ids.append(src)
            dst_ids.append(dst)
            slots.append(port)
    builder.add_edges_by_id(src_ids, dst_ids, slots)


def _held_until(node: Any, cost: Optional[OpCost], unrun: frozenset[str], names: Mapping[str, Any]) -> Optional[str]:
    """The op that frees what `node`'s op held past its end (`OpCost.held_bytes`), when the
    model can hold it so: that op is in the graph, runs, and reads an output of `node`'s. The
    importer then gives the op one more output of those bytes, read by that op alone, so that
    they are allocated when the op starts and freed when their reader is done (a oneDNN max
    pool's workspace, which its gradient reads in the partitioned graph). None otherwise: the
    bytes are then the op's scratch, as before the profile told them apart."""
    if cost is None or cost.held_bytes <= 0 or node.name in unrun:
        return None
    until = cost.held_until
    if until not in names or until in unrun:
        return None
    reader = names[until]
    if not any(not t.startswith("^") and _parse_input(t)[0] == node.name for t in reader.input):
        return None
    return until


def _output_alias(node: Any, cost: Optional[OpCost], width: int, node_types: Mapping[str, str],
                  unrun: frozenset[str]) -> list:
    """`OpGraphBuilder.add_op`'s output_alias from the profile's `OpCost.output_alias`: an input's
    position becomes the (producer, slot) of that data input, kept only when `_add_edges` makes
    its edge (not a loop's back edge, no op that never runs)."""
    if cost is None or not cost.output_alias or node.name in unrun:
        return []
    inputs = [_parse_input(t) for t in node.input if not t.startswith("^")]
    out: list = []
    for slot in range(width):
        a = cost.output_alias[slot] if slot < len(cost.output_alias) else OWN_BUFFER
        if a == NO_BUFFER:
            out.append(HELD)
        elif 0 <= a < len(inputs) and inputs[a][0] not in unrun and not (
            node.op in _BACK_EDGE_DST and node_types.get(inputs[a][0]) in _BACK_EDGE_SRC
        ):
            out.append(inputs[a])
        else:
            out.append(None)
    return out


def _needs_host(
    op_type: str, checked_types: list[str], lookup: KernelLookup, library_ops: set[str]
) -> bool:
    """True when `op_type` has no kernel for any checked cluster type but one for the CPU."""
    if not checked_types or op_type in library_ops:
        return False
    if any(lookup(op_type, t) for t in checked_types):
        return False
    return "CPU" not in checked_types and lookup(op_type, "CPU")
