"""What a traced step ran, named by the ops of the graph it was asked to run.

TensorFlow does not run a graph as written. Grappler folds constants into new ``Const`` nodes
(``ConstantFolding/<op>-matshapes-1``), rewrites ops under new names
(``<scope>/ArithmeticOptimizer/<Stage>_<op>``, ``<op>-0-TransposeNHWCToNCHW-LayoutOptimizer``,
``swap_out_<op>_0``, ``Recomputed/<op>``), and its remapper fuses chains of ops into one node
(``_FusedConv2D`` for Conv2D + BiasAdd + Relu) that takes the name of one of them, the others
vanishing. oneDNN renames kernels (``_MklNativeConv2D``) and fuses within a device too. The
executor adds runtime nodes: copies between devices (``_Send``/``_Recv``, named ``<op>/_12``),
arguments and results (``_Arg``, ``_Retval``) and constants replicated where they are read
(``<op>/replicate/_3``); Grappler's dependency optimizer gathers control edges from one device
in a NoOp there (``GroupCrossDeviceControlEdges_0/<op>``). These do no op's work: they are
"runtime" nodes here.

* `source_op` names the graph op a traced node comes from (None for a runtime node or a node
  nothing names);
* `fused_ops` reads a step's partition graphs (``RunOptions.output_partition_graphs``) and says
  which graph ops each fused node replaced;
* `where_ops_ran` says on which devices each graph op ran in a traced step, fused ops on the
  device of the node they ran in.

No TensorFlow import: graphs and step stats are read through their protobuf fields. Time
O(traced nodes x name length) for `source_op` over a step, O(nodes + inputs) for `fused_ops`.
"""

from __future__ import annotations

import re
from typing import Any, Collection, Iterable, Mapping, Optional

__all__ = [
    "RUNTIME_TYPES",
    "fused_ops",
    "is_runtime",
    "node_type",
    "source_op",
    "where_ops_ran",
]

RUNTIME_TYPES = frozenset({
    "_Send", "_Recv", "_HostSend", "_HostRecv", "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval",
})
"""Node types of the executor's own: copies between devices, a step's arguments and results."""

# Names the executor gives its nodes: '<op>/_12' (copies, control-edge helpers, replicated
# constants '<op>/replicate/_3'), '<op>_S12' (a distributed session's control-edge helpers),
# '_SOURCE', '_SINK'; and the dependency optimizer's NoOps that group control edges.
_RUNTIME_NAME = re.compile(r"(.+/_\d+|.+_S\d+|_SOURCE|_SINK|GroupCrossDeviceControlEdges_\d+/.*)\Z")
# A constant replicated onto a device that reads it, and the constant's op (`_copied_ops`).
_REPLICA = re.compile(r"(.+)/replicate/_\d+\Z")
# Path components Grappler's optimizers put in the names of the nodes they add.
_MARKERS = frozenset({
    "ArithmeticOptimizer", "ConstantFolding", "ConstantFoldingCtrl", "DependencyOptimizer",
    "LoopOptimizer", "MemoryOptimizer", "Recomputed", "ScopedAllocator", "Remapper",
})
# LayoutOptimizer's suffixes: '<op>-0-TransposeNHWCToNCHW-LayoutOptimizer', '<op>-0-0-...'.
_LAYOUT_SUFFIX = re.compile(r"(-\d+)+-[A-Za-z0-9]+-LayoutOptimizer\Z")
_SWAP_PREFIX = re.compile(r"swap_(?:in|out)_")
_SEPARATORS = "/-_:"
# Ops that never run inside a fused node: what a step is fed, and variables.
_NOT_FUSED = frozenset({
    "Placeholder", "PlaceholderV2", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "Variable",
})


def is_runtime(name: str, node_type: str = "") -> bool:
    """Whether a traced node that is not an op of the graph does no op's work: the executor's
    own (a copy, an argument) or a NoOp grouping control edges, not a node Grappler made of an
    op."""
    return node_type in RUNTIME_TYPES or bool(_RUNTIME_NAME.match(name)) or name.startswith(("_arg_", "_retval_"))


def source_op(name: str, graph_names: Collection[str], node_type: str = "") -> Optional[str]:
    """The op of `graph_names` that the traced node `name` (of op type `node_type`) ran, or was
    made from by Grappler (see the module docstring); None when no op is named in it. A runtime
    node is not mapped (`is_runtime`). Where a name holds several ops' names, the longest one
    that the node's name starts with is taken."""
    if name in graph_names:
        return name
    if is_runtime(name, node_type):
        return None
    text = _LAYOUT_SUFFIX.sub("", _SWAP_PREFIX.sub("", name, count=1))
    parts = text.split("/")
    kept = [p for p in parts if p not in _MARKERS]
    stripped = len(kept) < len(parts)
    text = "/".join(kept)
    if text in graph_names:
        return text
    scope, _, last = text.rpartition("/")
    if stripped and "_" in last:  # '<scope>/ArithmeticOptimizer/<Stage>_<op's last part>'
        pieces = last.split("_")
        for i in range(1, len(pieces)):
            candidate = f"{scope}/{'_'.join(pieces[i:])}" if scope else "_".join(pieces[i:])
            if candidate in graph_names:
                return candidate
    for i in range(len(text) - 1, 0, -1):  # ConstantFolding's '<op>-matshapes-1', '<op>_recip'
        if text[i] in _SEPARATORS and text[:i] in graph_names:
            return text[:i]
    return None


def node_type(node_stats: Any) -> str:
    """The op type of a traced node, from its timeline label (``name = Type(inputs)``)."""
    label = node_stats.timeline_label
    _, _, call = label.partition(" = ")
    found = call.split("(", 1)[0].strip() if call else ""
    return found or "unknown"


def _input_op(text: str) -> str:
    return text[1:] if text.startswith("^") else text.split(":", 1)[0]


def fused_ops(graph_def: Any, partition_graphs: Iterable[Any]) -> dict[str, str]:
    """Graph op -> the graph op whose name the fused node that replaced it ran under.

    A fused node runs under the name of one of the ops it replaces, as another op type (the
    remapper's ``relu`` as ``_FusedConv2D``, oneDNN's ``BiasAdd`` as ``_MklNativeConv2DWithBias``);
    the ops it replaced did not run. They are the ops that fed it, up the graph, which did not
    run and whose outputs only it (or another of them) read among the nodes that ran (not
    placeholders nor variables: a fed placeholder runs as the step's argument). An op
    replaced by an ``Identity`` of another fused node (the remapper's activation after a
    ``_FusedBatchNormEx`` named after the batch norm) belongs to that node. Folded constants
    (an op that ran as ``Const``) replace no op here: the subgraph they fold does not run,
    wherever it is placed. Three more kinds of node replace ops, each only among ops of one device,
    so that the ops must stay together to be computed as profiled (in the same order of sums):
    a fused node whose readers read it in the place of a sibling that did not run (oneDNN's
    ``Conv2DBackpropFilter`` that computes the ``BiasAddGrad`` beside it, `_read_through`),
    which replaced that sibling; a node of Grappler's under a new name in the place of an op
    that did not run (the arithmetic optimizer's ``AddN`` of a tree of additions,
    `_rewritten_root`), which replaced the ops that fed only that op, under that op's name; and a
    node that ran as another type and reads what another op's node left for it (oneDNN's
    ``MaxPoolGrad`` reads its ``MaxPool``'s workspace, `_extra_input`), which goes with that op.
    An input a fused node read as another node (an equal op common-subexpression elimination kept
    instead, through a copy or not) or as a replica of a constant is not among the ops it replaced.

    `partition_graphs`: ``RunMetadata.partition_graphs`` of a step of `graph_def`. Deterministic;
    O(nodes + inputs) time, times the longest chain of removed pass-through ops.
    """
    ran: dict[str, Any] = {}
    for partition in partition_graphs:
        for node in partition.node:
            ran[node.name] = node
    nodes = {n.name: n for n in graph_def.node}
    readers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            if not text.startswith("^"):
                readers.setdefault(_input_op(text), []).append(node.name)
    read = {_tensor(t) for n in graph_def.node for t in n.input}
    copied = _copied_ops(ran)
    through = _read_through(nodes, ran, copied)
    # Not replaced by a fused reader: ops read in the place of another, and ops read as copies.
    elsewhere = {op for ops in through.values() for op in ops} | set(copied.values())
    out: dict[str, str] = {}
    for name in sorted(ran):
        node, executed = nodes.get(name), ran[name]
        if node is None:
            root = _rewritten_root(name, executed, nodes, ran)
            if root is not None:  # Grappler's node under a new name, in the place of `root`
                for op in _replaced(root, nodes, ran, readers, elsewhere):
                    out.setdefault(op, root)
            continue
        if executed.op == node.op or executed.op == "Const":
            continue
        if executed.op == "Identity" and executed.input:
            host = _input_op(executed.input[0])
            if host in nodes and host in ran and "Fused" in ran[host].op and ran[host].op != nodes[host].op:
                out.setdefault(name, host)
            continue
        for op in _replaced(name, nodes, ran, readers, elsewhere):
            out.setdefault(op, name)
        for op in through.get(name, ()):
            out.setdefault(op, name)
        extra = _extra_input(executed, read, nodes, ran)
        if extra is not None:
            out.setdefault(name, extra)
    return out


def _extra_input(executed: Any, read: Collection[str], nodes: Mapping[str, Any], ran: Mapping[str, Any]) -> Optional[str]:
    """The first graph op that ran and whose output the node `executed` reads though no op of
    the graph reads it (`read`: the tensors the graph's ops read): a kernel that takes what
    another kernel left for it on the same device (oneDNN's ``MaxPoolGrad`` reads the workspace
    of its ``MaxPool``, output 1, which the graph's op has not). None when there is none."""
    for text in executed.input:
        op = _input_op(text)
        if _tensor(text) not in read and op in ran and op in nodes and op != executed.name:
            return op
    return None


def _tensor(text: str) -> str:
    """An input's tensor as ``op:k`` (``op`` alone is output 0), or ``^op``."""
    return text if text.startswith("^") or ":" in text else f"{text}:0"


def _rewritten_root(name: str, executed: Any, nodes: Mapping[str, Any], ran: Mapping[str, Any]) -> Optional[str]:
    """The graph op that a node of Grappler's, `name`, took the place of: the op its name holds
    (`source_op`), when that op did not run and the node does its work (the arithmetic
    optimizer's ``<scope>/ArithmeticOptimizer/AddOpsRewrite_<op>``, an ``AddN`` of a tree of
    additions). None for a node that does no op's work or sits beside its op."""
    if is_runtime(name, executed.op) or executed.op == "Const":
        return None
    root = source_op(name, nodes, executed.op)
    return root if root is not None and root not in ran and nodes[root].op not in _NOT_FUSED else None


# Ops whose output k is their input k (IdentityN) or 0 (the others) that Grappler removes,
# readers reading that input instead.
_PASS_THROUGH = frozenset({"Identity", "IdentityN", "Snapshot", "Reshape", "Squeeze", "ExpandDims", "StopGradient"})


def _read_through(nodes: Mapping[str, Any], ran: Mapping[str, Any], copied: Mapping[str, str]) -> dict[str, list[str]]:
    """Node that ran -> the graph ops that did not run and whose readers read it in their
    place: an op fused with a sibling (oneDNN's ``Conv2DBackpropFilter`` with the
    ``BiasAddGrad`` of the same layer, one node with both outputs under the filter gradient's
    name). Found by comparing, input by input, each reader as written and as it ran, through the
    pass-through ops (`_PASS_THROUGH`) that did not run either, and through the copies between
    devices and the replicas of constants (`copied`, from `_copied_ops`)."""
    out: dict[str, list[str]] = {}
    for name, executed in ran.items():
        node = nodes.get(name)
        if node is None:
            continue
        written = [t for t in node.input if not t.startswith("^")]
        done = [_input_op(t) for t in executed.input if not t.startswith("^")]
        if len(written) != len(done):
            continue
        for text, node_read in zip(written, done):
            op, host = _replaced_output(text, nodes, ran), copied.get(node_read, node_read)
            # A host copied to the reader ran, as the copy, where no reader of its own device is.
            if op is not None and host != op and host in nodes and (host in ran or node_read in copied):
                out.setdefault(host, []).append(op)
    return {k: sorted(set(v)) for k, v in out.items()}


def _copied_ops(ran: Mapping[str, Any]) -> dict[str, str]:
    """Node of the runtime's that holds another node's output on a reader's device -> that node:
    a ``_Recv`` -> the input of the ``_Send`` of the same ``tensor_name`` (one per copy between
    two devices, over all the step's partitions); a constant replicated where it is read,
    ``<op>/replicate/_3``, -> ``<op>``."""
    sends = {n.attr["tensor_name"].s: _input_op(n.input[0])
             for n in ran.values() if n.op in ("_Send", "_HostSend") and n.input}
    out = {name: sends[n.attr["tensor_name"].s] for name, n in ran.items()
           if n.op in ("_Recv", "_HostRecv") and n.attr["tensor_name"].s in sends}
    for name, n in ran.items():
        match = _REPLICA.match(name)
        if match and n.op == "Const":
            out[name] = match.group(1)
    return out


def _replaced_output(text: str, nodes: Mapping[str, Any], ran: Mapping[str, Any]) -> Optional[str]:
    """The op that made the tensor `text` (``op:k``) as written, following pass-through ops that
    did not run up to one that is not a pass-through; None when that op ran or is not known."""
    for _ in range(len(nodes)):
        op, _, index = text.partition(":")
        node = nodes.get(op)  # `index`: a graph's input names an output by number, or by none
        if node is None or op in ran:
            return None
        if node.op not in _PASS_THROUGH:
            return op
        inputs = [t for t in node.input if not t.startswith("^")]
        k = int(index) if node.op == "IdentityN" and index.isdigit() else 0
        if k >= len(inputs):
            return None
        text = inputs[k]
    return None


def _replaced(root: str, nodes: Mapping[str, Any], ran: Mapping[str, Any], readers: Mapping[str, list[str]],
              elsewhere: Collection[str]) -> list[str]:
    """The ops the fused node `root` replaced (`fused_ops`), in graph order; not those in
    `elsewhere`, whose readers read another node in their place (`_read_through`)."""
    found: set[str] = set()
    stack = [_input_op(t) for t in nodes[root].input if not t.startswith("^")]
    while stack:
        op = stack.pop()
        if op in found or op in ran or op in elsewhere or op not in nodes or nodes[op].op in _NOT_FUSED:
            continue
        found.add(op)
        stack.extend(_input_op(t) for t in nodes[op].input if not t.startswith("^"))
    # An op read by a node that ran (but the root) was not replaced by the root.
    found = {op for op in found if not any(r != root and r in ran for r in readers.get(op, ()))}
    reached: set[str] = set()
    stack = [_input_op(t) for t in nodes[root].input if not t.startswith("^")]
    while stack:  # those still joined to the root through replaced ops
        op = stack.pop()
        if op in found and op not in reached:
            reached.add(op)
            stack.extend(_input_op(t) for t in nodes[op].input if not t.startswith("^"))
    return [n for n in nodes if n in reached]


def where_ops_ran(step_stats: Any, graph_def: Any, partition_graphs: Iterable[Any] = ()) -> dict[str, set[str]]:
    """Graph op -> the devices of the executors that ran it in a traced step.

    An op runs where a node mapped to it by `source_op` ran (Grappler's nodes made from it
    too); an op a fused node replaced (`fused_ops`, from `partition_graphs` of the same step)
    where that node ran. An op whose readers read another node in its place ran nowhere
    (`_read_through`: Grappler's common-subexpression elimination keeps one of equal ops of a
    device, and TF replicates a constant where it is read), nor does one folded. Runtime nodes
    (`is_runtime`) are no op's. Only executor entries are read (a GPU's ``stream:*`` and
    ``memcpy`` entries repeat them).
    """
    names = {n.name for n in graph_def.node}
    out: dict[str, set[str]] = {}
    cache: dict[str, Optional[str]] = {}
    for dev in step_stats.dev_stats:
        last = dev.device.rsplit("/", 1)[-1]
        if not last.startswith("device:") or last.count(":") != 2:
            continue
        for ns in dev.node_stats:
            if ns.node_name not in cache:
                cache[ns.node_name] = source_op(ns.node_name, names, node_type(ns))
            op = cache[ns.node_name]
            if op is not None:
                out.setdefault(op, set()).add(dev.device)
    for op, host in fused_ops(graph_def, partition_graphs).items():
        if host in out:
            out.setdefault(op, set()).update(out[host])
    return out
