"""A traced ``tf.function`` as a GraphDef the pipeline places, and its profile.

`function_graph` turns one ``ConcreteFunction`` into a `FunctionGraph`: the function's graph
(``concrete_fn.graph.as_graph_def()``) in which

* each captured ``tf.Variable`` (a resource placeholder) becomes a ``VarHandleOp`` of the
  variable's dtype and shape, pinned to the device the variable lives on. The importer then gives
  it the variable's bytes as persistent memory on that device, and TF's colocation of resource
  readers and writers with their resource (`baechi_tf.rewriter.colocation`) keeps every op that
  reads or updates it there;
* each argument and each other captured tensor stays a placeholder, pinned to the device its
  value is on (the host CPU for an eager tensor made there), where the function receives it.

`profile_function` runs that graph in a ``tf.compat.v1.Session`` on scratch copies of the
variables (their values now) and of the arguments, `warmup_steps` untraced runs then
`traced_steps` with ``FULL_TRACE``, through `baechi_tf.cost_model.profiler.profile_fetch`: the
same step stats, fused-node mapping and allocation records as a `BaechiSession`'s profile, and
the user's variables do not move. Why this route and not the profiler's trace
(``tf.profiler.experimental``, an ``xplane.pb``): docs/tf2.md, "Profiling".

Time: O(nodes) to convert, plus the profiling runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from baechi_tf.cost_model.profile import CostProfile
from baechi_tf.errors import ConfigError

__all__ = ["FunctionGraph", "function_graph", "profile_function", "trace_signature"]


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionGraph:
    """One trace of a function, ready to profile and to place."""

    graph_def: Any  # the function's GraphDef, its variables as pinned VarHandleOps
    feeds: Mapping[str, Any]  # placeholder tensor name -> the value a call gives it
    fetches: tuple[str, ...]  # output tensors, then the ops that must run (control outputs)
    variables: Mapping[str, Any]  # VarHandleOp name -> the tf.Variable it stands for
    pinned_inputs: Mapping[str, str]  # placeholder name -> the device its value is on


def _flat_inputs(concrete_fn: Any, args: tuple, kwargs: dict) -> list:
    """The values of a call's arguments, one per placeholder the trace made for them, in the
    order of ``concrete_fn.graph.inputs`` (as ``ConcreteFunction.__call__`` flattens them)."""
    from tensorflow.python.eager.polymorphic_function import function_type_utils

    bound = function_type_utils.canonicalize_function_inputs(args, kwargs, concrete_fn.function_type)
    return list(concrete_fn.function_type.unpack_inputs(bound))


def _variable_node(name: str, variable: Any) -> Any:
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=name, op="VarHandleOp", device=variable.device)
    node.attr["dtype"].type = variable.dtype.as_datatype_enum
    node.attr["shape"].shape.CopyFrom(variable.shape.as_proto())
    node.attr["shared_name"].s = name.encode()
    node.attr["container"].s = b""
    return node


def function_graph(concrete_fn: Any, args: tuple, kwargs: dict) -> FunctionGraph:
    """The `FunctionGraph` of `concrete_fn` called with `args` and `kwargs`.

    Raises `ConfigError` for a captured resource that is not a ``tf.Variable`` (a lookup table,
    an iterator): its state cannot be copied into the profiling session.
    """
    import tensorflow as tf

    graph = concrete_fn.graph
    flat = _flat_inputs(concrete_fn, args, kwargs)
    captured = list(concrete_fn.captured_inputs)
    placeholders = list(graph.inputs)
    if len(flat) + len(captured) != len(placeholders):
        raise ConfigError(
            f"the trace of {concrete_fn.name} has {len(placeholders)} inputs but the call gives "
            f"{len(flat)} arguments and the function captures {len(captured)} tensors: "
            "baechi_tf.function cannot tell which value feeds which input; pass tensors, not "
            "nested structures of other types"
        )
    known = {id(v.handle): v for v in graph.variables}
    known.update({id(v.handle): v for v in flat if isinstance(v, tf.Variable)})
    variables: dict[str, Any] = {}
    feeds: dict[str, Any] = {}
    pinned: dict[str, str] = {}
    for tensor, value in zip(placeholders, flat + captured):
        name = tensor.op.name
        if tensor.dtype == tf.resource:
            variable = value if isinstance(value, tf.Variable) else known.get(id(value))
            if variable is None:
                raise ConfigError(
                    f"the function reads the resource {name!r}, which is not a tf.Variable (a "
                    "lookup table, a dataset iterator?): baechi_tf.function places functions "
                    "whose state is tf.Variables; make the resource outside the function and "
                    "pass its values in as tensors"
                )
            variables[name] = variable
        else:
            feeds[tensor.name] = value
            pinned[name] = getattr(value, "device", "") or ""
    graph_def = graph.as_graph_def()
    for i, node in enumerate(graph_def.node):
        if node.name in variables:
            graph_def.node[i].CopyFrom(_variable_node(node.name, variables[node.name]))
        elif pinned.get(node.name):
            node.device = pinned[node.name]
    fetches = tuple(t.name for t in graph.outputs) + tuple(sorted({op.name for op in graph.control_outputs}))
    return FunctionGraph(graph_def, feeds, fetches, variables, pinned)


def profile_function(
    function: FunctionGraph, config: Any, *, warmup_steps: int, traced_steps: int
) -> CostProfile:
    """The profile of `function`, run in a session of `config` on copies of its variables."""
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profile_fetch

    scratch = tf.Graph()
    with scratch.as_default():
        tf.graph_util.import_graph_def(function.graph_def, name="")
        loads = []
        with tf.name_scope("baechi_tf_load"):
            for name, variable in sorted(function.variables.items()):
                value = tf.compat.v1.placeholder(variable.dtype, variable.shape)
                handle = scratch.get_tensor_by_name(name + ":0")
                with scratch.colocate_with(handle.op):
                    loads.append((tf.raw_ops.AssignVariableOp(resource=handle, value=value), value, variable))
    # Read in eager mode, before the session makes its graph the default.
    values = {value: variable.numpy() for _, value, variable in loads}
    feeds = {name: value.numpy() if hasattr(value, "numpy") else value for name, value in function.feeds.items()}
    with tf.compat.v1.Session(graph=scratch, config=config) as session:
        if loads:
            session.run([op for op, _, _ in loads], values)
        return profile_fetch(
            session,
            list(function.fetches),
            feeds,
            warmup_steps=warmup_steps,
            traced_steps=traced_steps,
            graph_def=function.graph_def,
        )


def trace_signature(graph_def: Any) -> tuple:
    """What two traces of one function must share for a placement of the first to apply to the
    second: every node's name, type, inputs and attributes, but for the names of the library
    functions it calls (a new trace names its branches anew) and devices. Python code that
    changes what it traces (a counter, a random number read at trace time) changes it."""
    out = []
    for node in graph_def.node:
        attrs = []
        for key in sorted(node.attr):
            value = node.attr[key]
            if key.startswith("_") or value.HasField("func") or len(value.list.func):
                continue
            attrs.append((key, value.SerializeToString(deterministic=True)))
        out.append((node.name, node.op, tuple(node.input), tuple(attrs)))
    return tuple(sorted(out))
