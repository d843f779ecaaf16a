"""The colocations TF's own placer adds to a GraphDef's, read for `import_graph_def`.

A GraphDef's ``_class: loc:@x`` attributes are not all that keeps ops together: TF's placer puts
an op taking a resource handle or a reference with the op that made it (`_implicit_colocation`,
through a functional ``While``: `_handle_source`), a dataset op with the dataset it reads, the ops
of inlined functions with the graph's ops their nodes name (`_inlined_colocation`), and the ops a
placement must not split for TF's kernels to run: a v1 loop's ``Enter`` with its first reader
(`_enter_readers`), an NCHW ``MaxPoolGrad`` on CPU devices with its ``MaxPool``
(`_pool_grad_forward`), an op with the node Grappler fused it into while profiling
(`_fused_colocation`), an addition with the addition that alone reads it (`_addition_trees`).
Each returns colocation names; the importer merges them into groups.

Time O(nodes + inputs), and O(function nodes) for the inlined functions; TensorFlow only through
the ``tf.Graph`` the importer hands in.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from baechi_tf.cost_model.profile import OpCost
from baechi_tf.errors import InvalidGraphError

__all__: list[str] = []


def _parse_input(text: str) -> tuple[str, int]:
    """'^a' -> ('a', -1); 'a:2' -> ('a', 2); 'a' -> ('a', 0)."""
    if text.startswith("^"):
        return text[1:], -1
    name, sep, port = text.rpartition(":")
    if sep and port.isdigit():
        return name, int(port)
    return text, 0


_ENTERS = frozenset({"Enter", "RefEnter"})


def _enter_readers(graph_def: Any) -> dict[str, tuple[str, ...]]:
    """Each v1 loop ``Enter`` node's first data reader (in node order), which it must share a
    device with: an Enter placed apart from every op that reads it (the loop-invariant count of
    a gradient loop on a device of its own, say) made TF's step wait forever, the receiving
    device's iterations expecting copies that its device sent once. Not where both nodes name
    different devices (the user's pins hold)."""
    enters = {n.name: n for n in graph_def.node if n.op in _ENTERS}
    out: dict[str, tuple[str, ...]] = {}
    if not enters:
        return out
    for node in graph_def.node:
        for text in node.input:
            src, slot = _parse_input(text)
            enter = enters.get(src) if slot >= 0 else None
            if enter is None or src in out:
                continue
            if enter.device and node.device and enter.device != node.device:
                out[src] = ()
            else:
                out[src] = (node.name,)
    return out


# Ops whose functions a session inlines into the graph before TF's placer runs (functional
# control flow is lowered to Switch, Merge, Enter... and calls of its branches and bodies).
_INLINED_CALLS = frozenset({
    "If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
    "PartitionedCall", "StatefulPartitionedCall",
})


# Functional ops whose first input (the condition, the branch index) is not a function argument.
_SELECTING_CALLS = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})
_DT_RESOURCE = 20  # types_pb2.DT_RESOURCE


def _called_functions(node: Any, functions: Mapping[str, Any]) -> list[str]:
    """The library functions `node` calls where a session inlines them (none for other ops)."""
    if node.op in functions:
        return [node.op]
    if node.op not in _INLINED_CALLS:
        return []
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return [n for n in names if n in functions]


def _argument_inputs(node: Any) -> list[str]:
    """The inputs of a calling `node` that are its functions' arguments, in order."""
    data = [text for text in node.input if not text.startswith("^")]
    return data[1:] if node.op in _SELECTING_CALLS else data


def _inlined_colocation(graph_def: Any, tfg: Any) -> tuple[dict[str, list[str]], dict[str, str]]:
    """What the functions that ops call put ops of the graph with, once a session inlines them:
    a node of a body or branch (or of a function that one calls, inlined in turn) runs on its own
    device, else on its caller's, and its ``_class: loc:@x`` names `x` of the graph when the
    function itself has no node `x` (TF prefixes only the names of the function's own nodes).
    While v2 makes such names: a loop's gradient body colocated with a shape it hoisted out of
    the loop, 'gradients/Mean_grad/Shape', is put with the graph's op of that name. A node taking
    a resource handle argument runs with the handle's maker, and so does what it names then (a
    gradient branch's VariableShape colocated with the forward Case).

    Returns the ops of the graph each op shares a device with (a caller, those named by nodes
    that run on its device; an op named by a node taking a handle, the handle's maker) and the
    device that nodes naming a device put an op of the graph on (the first one, in the order of
    the graph's nodes and the functions' nodes). Time: O(nodes of the functions each caller
    reaches)."""
    import tensorflow as tf

    functions = {f.signature.name: f for f in graph_def.library.function}
    if not functions:
        return {}, {}
    top = {node.name for node in graph_def.node}
    # function -> (node's device, op of the graph it names, the handle arguments it takes)
    named_in: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {}
    # function -> (calling node's device, function, its arguments' indices among the caller's)
    calls: dict[str, list[tuple[str, str, tuple[Optional[int], ...]]]] = {}
    for name, fdef in functions.items():
        own = {node.name for node in fdef.node_def}
        args = {a.name: k for k, a in enumerate(fdef.signature.input_arg)}
        handles = {a.name for a in fdef.signature.input_arg if a.type == _DT_RESOURCE}
        named_in[name], calls[name] = [], []
        for node in fdef.node_def:
            passed = tuple(args.get(text) for text in _argument_inputs(node))
            calls[name].extend((node.device, f, passed) for f in _called_functions(node, functions))
            taken = tuple(args[text] for text in node.input if text in handles)
            for value in node.attr["_class"].list.s if "_class" in node.attr else ():
                text = value.decode() if isinstance(value, bytes) else value
                target = text[len("loc:@"):]
                if text.startswith("loc:@") and target not in own and target in top:
                    named_in[name].append((node.device, target, taken))
    out: dict[str, list[str]] = {}
    pins: dict[str, str] = {}
    for node in graph_def.node:
        called = _called_functions(node, functions)
        if not called:
            continue
        op = tfg.get_operation_by_name(node.name)
        inputs = list(op.inputs)[1:] if node.op in _SELECTING_CALLS else list(op.inputs)
        makers = tuple(_handle_source(t).op.name if t.dtype == tf.resource else None for t in inputs)
        todo = [("", f, makers) for f in reversed(called)]
        seen: set[tuple[str, str, tuple[Optional[str], ...]]] = set()
        while todo:
            device, name, sources = todo.pop()
            if (device, name, sources) in seen:
                continue
            seen.add((device, name, sources))
            for own_device, target, taken in named_in[name]:
                with_handles = sorted({sources[k] for k in taken if k < len(sources) and sources[k]})
                if with_handles:  # TF puts a handle's reader with its maker, whatever its pin
                    out.setdefault(target, []).extend(with_handles)
                elif own_device or device:
                    pins.setdefault(target, own_device or device)
                elif target != node.name:
                    out.setdefault(node.name, []).append(target)
            for own_device, f, passed in reversed(calls[name]):
                inner = tuple(sources[k] if k is not None and k < len(sources) else None for k in passed)
                todo.append((own_device or device, f, inner))
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}, pins


_NCHW_POOL_GRADS = frozenset({"MaxPoolGrad", "MaxPoolGradV2"})


def _pool_grad_forward(node: Any, device_types: Any) -> tuple[str, ...]:
    """The pooling op an NCHW ``MaxPoolGrad`` on CPU devices shares a device with. Apart from it,
    Inception-v3 in NCHW failed its first step under HEFT, m-SCT and m-TOPO placements: TF ran
    its own CPU kernel, which takes NHWC only ('Default MaxPoolingGradOp only supports NHWC on
    device type CPU'), not oneDNN's; kept together, each of them ran. (A small conv and pool
    split the same way ran: what else makes TF pick its own kernel is not known.)"""
    if node.op not in _NCHW_POOL_GRADS or "CPU" not in device_types or len(node.input) < 2:
        return ()
    # `in` first: reading a missing key of a NodeDef's attr map adds it to the user's graph.
    if "data_format" not in node.attr or node.attr["data_format"].s != b"NCHW":
        return ()
    return (_parse_input(node.input[1])[0],)


def _fused_colocation(name: str, cost: Optional[OpCost], user_pins: Mapping[str, tuple]) -> tuple[str, ...]:
    """The op whose fused node replaced op `name` while profiling (``cost.fused_into``), as a
    colocation name; none when the user pinned the two ops to different devices (the session
    then runs without the fusion) or the op is not in the graph."""
    into = cost.fused_into if cost is not None else ""
    if not into or into not in user_pins:
        return ()
    mine, theirs = user_pins[name][0], user_pins[into][0]
    return () if mine is not None and theirs is not None and mine != theirs else (into,)


_ADDITIONS = frozenset({"Add", "AddV2", "AddN"})


def _addition_trees(graph_def: Any, user_pins: Mapping[str, tuple]) -> dict[str, tuple[str, ...]]:
    """Each addition (``Add``, ``AddV2``, ``AddN``) whose output only one op reads, an addition
    too, -> that reader, as a colocation name. Grappler's arithmetic optimizer gathers such a
    tree of additions into one ``AddN`` (``AddOpsRewrite``, grouping the leaves by shape) only
    when its ops share a device (``arithmetic_optimizer.cc``: ``CanAbsorbInputByOptimizer``), so
    a tree the placement splits is summed in another order than on one device. Seen in Keras 3's
    ResNet50: a residual ``Add`` of two batch norms' ``add_1`` ran unplaced as ``(a*x + c*y) +
    (b + d)``; split, as ``a*x + b`` on one device. A profile does not always show the rewrite (a
    session's Grappler did not make this one, the function runtime's did), so the rule is read
    from the graph. Pairs the user pinned to different devices are left apart. O(nodes +
    inputs)."""
    readers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            if not text.startswith("^"):
                readers.setdefault(_parse_input(text)[0], []).append(node.name)
    kinds = {n.name: n.op for n in graph_def.node}
    out: dict[str, tuple[str, ...]] = {}
    for name, kind in kinds.items():
        read = set(readers.get(name, ()))
        if kind not in _ADDITIONS or len(read) != 1:
            continue
        (reader,) = read
        mine, theirs = user_pins.get(name, (None,))[0], user_pins.get(reader, (None,))[0]
        if kinds.get(reader) in _ADDITIONS and (mine is None or theirs is None or mine == theirs):
            out[name] = (reader,)
    return out


# Ops TF's placer does not put with their resource inputs: those of its
# InputColocationExemptionRegistry, function calls (and datasets with a function, `_exempt`) that
# hand the resources to the ops of a function, which go with them; and functional control flow,
# which a session lowers to Switch, Merge and Enter nodes before placing (those go with the
# resource, the op is gone).
_RESOURCE_COLOCATION_EXEMPT = frozenset({
    "PartitionedCall", "StatefulPartitionedCall",
    "If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
})


def _exempt(op: Any) -> bool:
    """Whether TF leaves `op` where it is rather than put it with the resources it takes: a
    dataset with a function takes them for it, as TF registers every such dataset (``map`` with
    or without ``num_parallel_calls``, ``filter``, ``take_while``, ``interleave``, ``scan``...)."""
    if op.type in _RESOURCE_COLOCATION_EXEMPT:
        return True
    return _is_dataset(op.type) and any(a.HasField("func") or a.list.func for a in op.node_def.attr.values())


def _implicit_colocation(tfg: Any, pins: Mapping[str, Optional[str]]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The producers TF's placer puts each op with, and the pins of `pins` it drops to do so.

    TF colocates an op with the producers of its inputs of resource or reference type (the input
    the op declares: a `MatMul` reading a reference variable's output directly reads its value,
    and may run elsewhere; function calls take resources where they are), and a dataset op with
    the dataset it reads. It walks those edges in
    the order it made them (its ops in order, each one's inputs in order), and where the two sides
    are pinned to different devices the consumer's side takes the producer's (its placer:
    "Ignoring device specification ... because the input edge ... is a reference connection").
    So a variable's readers pinned to two devices run where the variable's own pin, else its
    first pinned reader, puts it. The second result maps each op whose pin TF overrides to the
    device it runs on. The pin of an op that makes a resource (no inputs, one resource or
    reference output: a variable, a table) is never overridden by another such pin: an op taking
    resources that two of them are pinned to different devices is an `InvalidGraphError`, as TF
    refuses it ("a reference or resource edge connects colocation groups with incompatible
    resource devices").
    """
    import tensorflow as tf

    parent: dict[str, str] = {}
    pin_of: dict[str, Optional[str]] = {}  # a root -> its set's pin
    made_on: dict[str, tuple[str, str]] = {}  # a root -> (an op making a resource, its pin)
    for op in tfg.get_operations():
        if not op.inputs and len(op.outputs) == 1 and pins.get(op.name) is not None:
            dtype = op.outputs[0].dtype
            if dtype == tf.resource or dtype._is_ref_dtype:
                made_on[op.name] = (op.name, pins[op.name])

    def find(name: str) -> str:
        root = name
        while parent.get(root, root) != root:
            root = parent[root]
        while name != root:
            parent[name], name = root, parent.get(name, root)
        return root

    out: dict[str, list[str]] = {}
    for op in tfg.get_operations():
        producers: list[str] = []
        for t, dtype in zip(op.inputs, op._input_types):
            src = _handle_source(t).op if dtype == tf.resource else t.op
            if dtype == tf.variant:
                if not (_is_dataset(src.type) and _is_dataset(op.type)):
                    continue
            elif not (dtype == tf.resource or dtype._is_ref_dtype) or _exempt(op):
                continue
            producers.append(src.name)
            a, b = find(src.name), find(op.name)
            if a == b:
                continue
            pa, pb = pin_of.get(a, pins.get(a)), pin_of.get(b, pins.get(b))
            ma, mb = made_on.get(a), made_on.get(b)
            if ma is not None and mb is not None and ma[1] != mb[1]:
                raise InvalidGraphError(
                    f"op {op.name!r} takes {src.name!r}, which puts {mb[0]!r} (pinned to "
                    f"{mb[1]!r}) and {ma[0]!r} (pinned to {ma[1]!r}) on one device: TF refuses such "
                    "a graph ('a reference or resource edge connects colocation groups with "
                    "incompatible resource devices'); pin them to one device"
                )
            parent[b] = a
            pin_of[a] = pa if pa is not None else pb  # the producer's side wins a conflict
            if mb is not None:
                made_on[a] = mb
        if producers:
            out[op.name] = list(dict.fromkeys(producers))
    overridden = {}
    for name, pin in pins.items():
        if pin is not None:
            root = find(name)
            runs_on = pin_of.get(root, pins.get(root))
            if runs_on is not None and runs_on != pin:
                overridden[name] = runs_on
    return out, overridden


_WHILES = frozenset({"While", "StatelessWhile"})


def _handle_source(t: Any) -> Any:
    """The tensor a functional loop's output `t` passes through: a ``While`` hands out each loop
    variable it takes, and a resource handle it takes comes out as it went in (a session lowers
    the loop to Enter -> Merge -> Switch -> Exit nodes, each taking the handle from the one
    before, so TF runs a reader of the output with the handle's maker). Other tensors are
    their own source."""
    while t.op.type in _WHILES and t.value_index < len(t.op.inputs):
        t = t.op.inputs[t.value_index]
    return t


# Ops that make an iterator resource, and those that make one from a string handle.
_FROM_STRING_HANDLE = frozenset({"IteratorFromStringHandle", "IteratorFromStringHandleV2"})
_ITERATORS = _FROM_STRING_HANDLE | {
    "Iterator", "IteratorV2", "OneShotIterator", "AnonymousIterator", "AnonymousIteratorV2", "AnonymousIteratorV3",
}


def _is_dataset(op_type: str) -> bool:
    return "Dataset" in op_type
