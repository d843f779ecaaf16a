"""`OpGraph`: the operators of a dataflow graph with their costs, as plain arrays.

An `OpGraph` is what every placer, the simulator and the LP read. It knows nothing of TensorFlow:
the TF importer (`baechi_tf.rewriter`) and the JSON reader (`baechi_tf.json_io`) both build one.

Ops have integer ids ``0..num_ops-1``. Per op: ``compute_us``, ``output_bytes`` (one entry per
output slot), ``temp_bytes`` (scratch memory while the op runs), ``persistent_bytes`` (memory held
for the whole step, such as variables), an optional pinned device name and the TF colocation names
of the op (``loc:@x`` without the prefix; empty when it has none).

Edges are data edges, which carry the tensor ``(src, src_output)``, and control edges
(``src_output == -1``), which carry no bytes but still cost a message between devices. Several
consumers of one tensor share it: a tensor is sent to a device at most once. Tensors are numbered
``0..num_tensors-1`` in the order of their first edge.

An output slot may reuse a buffer instead of allocating one (``output_alias``, per op and slot;
empty when no output does): ``None`` for a buffer of its own; ``(src, slot)``, a data input of the
op, for an output that is that input's buffer (TF's ``Identity``, ``Reshape``, an element-wise op
done in place); `HELD` for a view of memory that persistent bytes already count (a variable's
value as ``ReadVariableOp`` returns it). The scheduler's memory model reads it
(`baechi_tf.placer.buffers.buffer_tables`).

The graph is immutable; derived arrays (adjacency in CSR form, topological order) are computed on
first use and cached. Every traversal is iterative and linear in ops plus edges.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import types
from typing import Optional, Sequence

import numpy as np

from baechi_tf.errors import InvalidGraphError

__all__ = ["CONTROL", "HELD", "OpGraph", "VARIABLE_OP_TYPES", "VIEW_OP_TYPES", "csr"]

CONTROL = -1
"""`src_output` of a control edge."""

HELD = (-1, -1)
"""`OpGraph.output_alias` of an output that allocates nothing: a view of memory that some op's
persistent bytes count (a variable's value)."""

VIEW_OP_TYPES = frozenset({
    "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "PreventGradient",
    "EnsureShape", "Bitcast", "Slice", "Split", "SplitV", "Unpack",
})
"""TF op types (`OpGraph.op_types`) whose outputs that reuse an input's buffer (`output_alias`)
are views of it: TF shares the buffer with them whatever else holds it, where an element-wise op
writes in place only into a buffer nothing else holds."""

VARIABLE_OP_TYPES = frozenset({"VariableV2", "Variable", "VarHandleOp", "AutoReloadVariable"})
"""TF op types that make a variable: its buffer is persistent memory of the op's device, held
whether or not a step runs the op (the importer's estimate, the measured memory and the bench
count it so). TF 2.21 registers no ``AutoReloadVariable``; a GraphDef of older contrib code may
name it."""

MAX_TOTAL_BYTES = 1 << 62
"""Most bytes a graph may hold in all (outputs, scratch and persistent memory of every op), 4 EiB.

Byte counts are int64; with every op's bytes adding up to less than this, each sum the placers
form (a group's, a device's, a capacity minus a use) fits with room to spare."""

MAX_TOTAL_COMPUTE_US = 1e15
"""Most microseconds of compute a graph may hold in all (31 years): sums of it, and times in its
schedules, stay exact to a fraction of a microsecond."""


def _above(value: float, limit: float) -> str:
    """`value`, which is above `limit`, in few digits that still read as above it."""
    for digits in (3, 6, 9, 12, 15):
        text = f"{value:.{digits}g}"
        if float(text) > limit:
            return text
    return repr(value)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class OpGraph:
    """Ops and edges as arrays; build one with `graph_builder.OpGraphBuilder` or
    `OpGraph.from_arrays`."""

    names: tuple[str, ...]
    compute_us: np.ndarray  # float64 [num_ops], microseconds per step
    output_bytes: tuple[tuple[int, ...], ...]  # per op, bytes of each output slot
    temp_bytes: np.ndarray  # int64 [num_ops], scratch memory while the op runs
    persistent_bytes: np.ndarray  # int64 [num_ops], memory held for the whole step
    pinned_device: tuple[Optional[str], ...]  # device the user fixed, or None
    colocation: tuple[tuple[str, ...], ...]  # TF colocation names of each op (may be empty)
    edge_src: np.ndarray  # int32 [num_edges]
    edge_dst: np.ndarray  # int32 [num_edges]
    edge_src_output: np.ndarray  # int32 [num_edges], output slot of src, CONTROL for control
    op_types: tuple[str, ...] = ()  # optional TF op type per op, for reports
    # per op, per output slot: None (own buffer), (src, slot) of a data input whose buffer it is,
    # or HELD; () when no output reuses a buffer
    output_alias: tuple[tuple[Optional[tuple[int, int]], ...], ...] = ()

    @classmethod
    def from_arrays(
        cls,
        names: Sequence[str],
        compute_us: Sequence[float],
        output_bytes: Sequence[Sequence[int]],
        temp_bytes: Sequence[int] | None = None,
        persistent_bytes: Sequence[int] | None = None,
        pinned_device: Sequence[Optional[str]] | None = None,
        colocation: Sequence[Sequence[str]] | None = None,
        edge_src: Sequence[int] = (),
        edge_dst: Sequence[int] = (),
        edge_src_output: Sequence[int] = (),
        op_types: Sequence[str] = (),
        output_alias: Sequence[Sequence[Optional[tuple[int, int]]]] = (),
        *,
        validate: bool = True,
    ) -> "OpGraph":
        """Builds a graph from per-op sequences and edge index arrays; validates it by default.

        A repeated edge (same source, output and destination) is kept once, as
        `OpGraphBuilder.add_edge` does: an op that reads a tensor twice receives it once.
        """
        n = len(names)
        names = tuple(names)
        output_bytes = tuple(
            tuple(
                b if type(b) is int and -MAX_TOTAL_BYTES < b < MAX_TOTAL_BYTES  # the usual case, fast
                else _whole_bytes(b, names, i, "output_bytes")
                for b in outs
            )
            for i, outs in enumerate(output_bytes)
        )
        # Edge ids are checked while still exact (int64) and only then narrowed to int32: an
        # output slot of 2**32 must be an error, not wrap around to slot 0.
        edges = tuple(_edge_ids(a, what) for a, what in (
            (edge_src, "edge_src"), (edge_dst, "edge_dst"), (edge_src_output, "edge_src_output")
        ))
        _check_edge_ids(*edges, names, output_bytes)
        edge_src, edge_dst, edge_src_output = _unique_edges(*edges)
        graph = cls(
            names=names,
            compute_us=_frozen(np.asarray(compute_us, dtype=np.float64).reshape(-1)),
            output_bytes=output_bytes,
            temp_bytes=_frozen(_int_array(temp_bytes, n, names, "temp_bytes")),
            persistent_bytes=_frozen(_int_array(persistent_bytes, n, names, "persistent_bytes")),
            pinned_device=tuple(pinned_device) if pinned_device is not None else (None,) * n,
            colocation=(
                tuple(tuple(c) for c in colocation) if colocation is not None else ((),) * n
            ),
            edge_src=_frozen(edge_src.astype(np.int32)),
            edge_dst=_frozen(edge_dst.astype(np.int32)),
            edge_src_output=_frozen(edge_src_output.astype(np.int32)),
            op_types=tuple(op_types),
            output_alias=_alias_tuple(output_alias),
        )
        if validate:
            graph.validate()
        return graph

    # ---------------------------------------------------------------- sizes and lookups

    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return int(self.edge_src.shape[0])

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Op name -> op id."""
        return {name: i for i, name in enumerate(self.names)}

    def op_id(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise InvalidGraphError(f"no op named {name!r} in the graph") from None

    @functools.cached_property
    def output_total_bytes(self) -> np.ndarray:
        """int64 [num_ops]: sum of an op's output slots."""
        return _frozen(np.fromiter((sum(o) for o in self.output_bytes), np.int64, self.num_ops))

    @functools.cached_property
    def total_bytes(self) -> int:
        """The ops' output, scratch and persistent bytes, all summed (Python ints: exact). No
        device of any placement holds more than this."""
        return (
            sum(sum(outs) for outs in self.output_bytes)
            + sum(self.temp_bytes.tolist())
            + sum(self.persistent_bytes.tolist())
        )

    @functools.cached_property
    def is_control(self) -> np.ndarray:
        return _frozen(self.edge_src_output == CONTROL)

    @functools.cached_property
    def edge_bytes(self) -> np.ndarray:
        """int64 [num_edges]: bytes of the tensor an edge carries (0 for control edges)."""
        out = np.zeros(self.num_edges, dtype=np.int64)
        for e in np.flatnonzero(~self.is_control):
            out[e] = self.output_bytes[self.edge_src[e]][self.edge_src_output[e]]
        return _frozen(out)

    # ---------------------------------------------------------------- tensors

    @functools.cached_property
    def _tensors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(edge -> tensor, tensor -> src, tensor -> output slot): a tensor per distinct (src,
        output slot), numbered in the order of their first edges."""
        src = self.edge_src.astype(np.int64)
        out = self.edge_src_output.astype(np.int64)
        if src.size == 0:
            empty = np.zeros(0, dtype=np.int32)
            return _frozen(empty), _frozen(empty.copy()), _frozen(empty.copy())
        low = int(out.min())
        key = src * (int(out.max()) - low + 1) + (out - low)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        by_first = np.argsort(first, kind="stable")  # tensor ids in order of first appearance
        rank = np.empty_like(by_first)
        rank[by_first] = np.arange(by_first.size)
        firsts = first[by_first]
        return (
            _frozen(rank[inverse.reshape(-1)].astype(np.int32)),
            _frozen(self.edge_src[firsts].astype(np.int32)),
            _frozen(self.edge_src_output[firsts].astype(np.int32)),
        )

    @property
    def edge_tensor(self) -> np.ndarray:
        """int32 [num_edges]: the tensor id an edge carries."""
        return self._tensors[0]

    @property
    def tensor_src(self) -> np.ndarray:
        """int32 [num_tensors]: the op producing each tensor."""
        return self._tensors[1]

    @property
    def tensor_src_output(self) -> np.ndarray:
        """int32 [num_tensors]: output slot of each tensor, CONTROL for control messages."""
        return self._tensors[2]

    @property
    def num_tensors(self) -> int:
        return int(self.tensor_src.shape[0])

    @functools.cached_property
    def tensor_bytes(self) -> np.ndarray:
        """int64 [num_tensors]."""
        out = np.zeros(self.num_tensors, dtype=np.int64)
        out[self.edge_tensor] = self.edge_bytes
        return _frozen(out)

    @functools.cached_property
    def tensor_consumers(self) -> tuple[tuple[int, ...], ...]:
        """Distinct ops reading each tensor, ascending."""
        return _neighbours(self.edge_tensor, self.edge_dst, self.num_tensors)

    @functools.cached_property
    def input_tensors(self) -> tuple[tuple[int, ...], ...]:
        """Distinct tensors each op reads, ascending."""
        return _neighbours(self.edge_dst, self.edge_tensor, self.num_ops)

    @functools.cached_property
    def output_tensors(self) -> tuple[tuple[int, ...], ...]:
        """Tensors (control messages included) each op sends, ascending."""
        return _neighbours(self.tensor_src, np.arange(self.num_tensors), self.num_ops)

    # ---------------------------------------------------------------- adjacency (CSR)

    @functools.cached_property
    def _out_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return csr(self.edge_src, self.num_ops)

    @functools.cached_property
    def _in_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return csr(self.edge_dst, self.num_ops)

    def out_edges(self, op: int) -> np.ndarray:
        """Edge ids leaving `op`, in edge-id order."""
        ptr, idx = self._out_csr
        return idx[ptr[op] : ptr[op + 1]]

    def in_edges(self, op: int) -> np.ndarray:
        """Edge ids entering `op`, in edge-id order."""
        ptr, idx = self._in_csr
        return idx[ptr[op] : ptr[op + 1]]

    @functools.cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """Distinct successor ops of each op, ascending."""
        return _neighbours(self.edge_src, self.edge_dst, self.num_ops)

    @functools.cached_property
    def successor_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """`successors` as int64 rows, read-only: op v's are ids[ptr[v]:ptr[v + 1]]."""
        ptr = np.zeros(self.num_ops + 1, dtype=np.int64)
        np.cumsum([len(s) for s in self.successors], out=ptr[1:])
        ids = np.fromiter((w for s in self.successors for w in s), dtype=np.int64, count=int(ptr[-1]))
        return _frozen(ptr), _frozen(ids)

    @functools.cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """Distinct predecessor ops of each op, ascending."""
        return _neighbours(self.edge_dst, self.edge_src, self.num_ops)

    # ---------------------------------------------------------------- order

    @functools.cached_property
    def topo_order(self) -> np.ndarray:
        """int32 [num_ops]: Kahn's order. Of the ops that are ready together, those with control
        inputs alone (no tensor read: a constant or a NoOp after other ops) come first, then the
        lower op id: TF's executor runs such an inexpensive op as soon as its control inputs are
        done, not behind the work its device has queued (an optimizer's learning-rate constant
        with a control input from every batch-norm update would otherwise come after the whole
        backward pass, and every update reading it with it). Raises on a cycle.
        O((V + E) log V)."""
        later = np.ones(self.num_ops, dtype=bool)  # all but the ops with control inputs alone
        later[self.edge_dst[self.edge_src_output == CONTROL]] = False
        later[self.edge_dst[self.edge_src_output != CONTROL]] = True
        order = _kahn(self.successors, self.predecessors, self.num_ops, later.tolist())
        if len(order) < self.num_ops:
            raise InvalidGraphError(self._cycle_message(set(range(self.num_ops)) - set(order)))
        return _frozen(np.asarray(order, dtype=np.int32))

    @functools.cached_property
    def topo_index(self) -> np.ndarray:
        """int32 [num_ops]: position of each op in `topo_order`."""
        index = np.empty(self.num_ops, dtype=np.int32)
        index[self.topo_order] = np.arange(self.num_ops, dtype=np.int32)
        return _frozen(index)

    def _cycle_message(self, stuck: set[int]) -> str:
        # Every op left over by Kahn's algorithm has a predecessor that is left over too; walk
        # predecessors until an op repeats, which closes a cycle.
        start = min(stuck)
        seen: dict[int, int] = {}
        path: list[int] = []
        op = start
        while op not in seen:
            seen[op] = len(path)
            path.append(op)
            op = next(p for p in self.predecessors[op] if p in stuck)
        cycle = path[seen[op] :][::-1]
        k = cycle.index(min(cycle))
        cycle = cycle[k:] + cycle[:k]
        names = " -> ".join(repr(self.names[i]) for i in cycle + [cycle[0]])
        return (
            f"the graph has a cycle: {names}; remove one of its edges (loops must go through "
            "NextIteration -> Merge, which is left out of the DAG)"
        )

    # ---------------------------------------------------------------- checks

    def validate(self) -> None:
        """Raises `InvalidGraphError` on a malformed graph.

        Checks array lengths, unique op names, edges that point at missing ops or output slots,
        self-loops, negative or non-finite costs and cycles (naming the ops on one).
        """
        n = self.num_ops
        for field, value in (
            ("compute_us", self.compute_us),
            ("temp_bytes", self.temp_bytes),
            ("persistent_bytes", self.persistent_bytes),
        ):
            if value.shape != (n,):
                raise InvalidGraphError(f"{field} has {value.shape[0]} entries for {n} ops")
        for field, value in (
            ("output_bytes", self.output_bytes),
            ("pinned_device", self.pinned_device),
            ("colocation", self.colocation),
        ):
            if len(value) != n:
                raise InvalidGraphError(f"{field} has {len(value)} entries for {n} ops")
        if self.op_types and len(self.op_types) != n:
            raise InvalidGraphError(f"op_types has {len(self.op_types)} entries for {n} ops")
        if not (self.edge_src.shape == self.edge_dst.shape == self.edge_src_output.shape):
            raise InvalidGraphError("edge_src, edge_dst and edge_src_output differ in length")
        if len(self.index) != n:
            seen: set[str] = set()
            dup = next(x for x in self.names if x in seen or seen.add(x))  # type: ignore[func-returns-value]
            raise InvalidGraphError(f"op name {dup!r} is used by two ops; op names must be unique")
        for i, name in enumerate(self.names):
            if not isinstance(name, str) or not name:
                raise InvalidGraphError(f"op {i} has no name; every op needs a non-empty name")
        self._check_costs()
        self._check_edges()
        self._check_aliases()
        _ = self.topo_order  # raises on a cycle

    def _check_costs(self) -> None:
        bad = np.flatnonzero(~np.isfinite(self.compute_us) | (self.compute_us < 0))
        if bad.size:
            i = int(bad[0])
            raise InvalidGraphError(
                f"op {self.names[i]!r} has compute_us={self.compute_us[i]!r}; "
                "compute times must be finite and >= 0 microseconds"
            )
        for field, value in (("temp_bytes", self.temp_bytes), ("persistent_bytes", self.persistent_bytes)):
            bad = np.flatnonzero(value < 0)
            if bad.size:
                i = int(bad[0])
                raise InvalidGraphError(
                    f"op {self.names[i]!r} has {field}={int(value[i])}; memory sizes must be >= 0"
                )
        for i, outs in enumerate(self.output_bytes):
            if any(b < 0 for b in outs):
                raise InvalidGraphError(
                    f"op {self.names[i]!r} has output_bytes={list(outs)}; sizes must be >= 0"
                )
        # Sums of many costs must stay exact integers and finite floats (module MAX_TOTAL_BYTES).
        total_bytes = self.total_bytes
        if total_bytes >= MAX_TOTAL_BYTES:
            raise InvalidGraphError(
                f"the ops' outputs, scratch and persistent memory add up to {total_bytes} bytes, "
                f"more than the 2**62 ({MAX_TOTAL_BYTES}) a graph may hold: check that sizes are "
                "in bytes"
            )
        total_us = sum(self.compute_us.tolist())  # Python floats: no numpy overflow warning
        if not total_us <= MAX_TOTAL_COMPUTE_US:
            raise InvalidGraphError(
                f"the ops' compute times add up to {_above(total_us, MAX_TOTAL_COMPUTE_US)} us, more "
                "than the 1e15 us (31 years) a step may take: check that they are in microseconds"
            )

    def _check_edges(self) -> None:
        _check_edge_ids(self.edge_src, self.edge_dst, self.edge_src_output, self.names, self.output_bytes)
        loops = np.flatnonzero(self.edge_src == self.edge_dst)
        if loops.size:
            name = self.names[int(self.edge_src[loops[0]])]
            raise InvalidGraphError(f"op {name!r} has an edge to itself; remove it")


    def _check_aliases(self) -> None:
        if not self.output_alias:
            return
        if len(self.output_alias) != self.num_ops:
            raise InvalidGraphError(f"output_alias has {len(self.output_alias)} entries for {self.num_ops} ops")
        data = set(zip(self.edge_src.tolist(), self.edge_src_output.tolist(), self.edge_dst.tolist()))
        for op, (outs, aliases) in enumerate(zip(self.output_bytes, self.output_alias)):
            if len(aliases) != len(outs):
                raise InvalidGraphError(
                    f"op {self.names[op]!r} has {len(outs)} outputs but {len(aliases)} entries in "
                    "output_alias; give one per output slot (None for a buffer of its own)"
                )
            for slot, a in enumerate(aliases):
                if a is not None and a != HELD and (*a, op) not in data:
                    raise InvalidGraphError(
                        f"output {slot} of op {self.names[op]!r} reuses the buffer of output {a[1]} "
                        f"of op {a[0]}, which it does not read; an output can reuse only a data "
                        "input's buffer (or be HELD, or None)"
                    )


def _alias_tuple(aliases: Sequence[Sequence[Optional[tuple[int, int]]]]) -> tuple:
    """`output_alias` as tuples of None, HELD or (src, slot) pairs of ints; () when none aliases."""
    out = tuple(tuple(None if a is None else (int(a[0]), int(a[1])) for a in outs) for outs in aliases)
    return out if any(a is not None for outs in out for a in outs) else ()


def _check_edge_ids(src, dst, out, names: Sequence[str], output_bytes: Sequence[Sequence[int]]) -> None:
    """Raises unless every edge joins two ops of the graph and reads an output its source has."""
    n = len(names)
    if not (src.shape == dst.shape == out.shape) or len(output_bytes) != n:
        return  # reported by validate
    for arr, end in ((src, "source"), (dst, "destination")):
        bad = np.flatnonzero((arr < 0) | (arr >= n))
        if bad.size:
            e = int(bad[0])
            raise InvalidGraphError(
                f"edge {e} has {end} op id {int(arr[e])}, but the graph has ops 0..{n - 1}: "
                "a dangling edge; drop it or add the op"
            )
    num_outputs = np.fromiter((len(outs) for outs in output_bytes), dtype=np.int64, count=n)
    bad = np.flatnonzero((out != CONTROL) & ((out < 0) | (out >= num_outputs[src])))
    if bad.size:
        e = int(bad[0])
        s, o = int(src[e]), int(out[e])
        k = len(output_bytes[s])
        raise InvalidGraphError(
            f"edge {names[s]!r} -> {names[int(dst[e])]!r} reads output "
            f"{o} of {names[s]!r}, which has {k} output{'' if k == 1 else 's'}; give {names[s]!r} "
            f"a size for output {o} (output_bytes), or make the edge a control edge"
        )


def _unique_edges(src, dst, out) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edges with repeats dropped, first occurrences in their order."""
    src, dst, out = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (src, dst, out))
    if src.shape != dst.shape or src.shape != out.shape or src.size < 2:
        return src, dst, out  # mismatched lengths are reported by validate
    # One integer per edge: output slots from CONTROL (-1) up, op ids as given (validate checks them).
    span_out = int(out.max() - out.min()) + 1
    span_op = int(max(src.max(), dst.max()) - min(src.min(), dst.min())) + 1
    low = int(min(src.min(), dst.min()))
    key = ((src - low) * span_op + (dst - low)) * span_out + (out - out.min())
    _, first = np.unique(key, return_index=True)
    if first.size == src.size:
        return src, dst, out
    keep = np.sort(first)
    return src[keep], dst[keep], out[keep]


def _whole_bytes(value, names: Sequence[str], op: int, field: str) -> int:
    """`value` as an int, or `InvalidGraphError` naming the op when it is not a whole number of
    bytes or exceeds `MAX_TOTAL_BYTES` (numpy would raise OverflowError or truncate 1.5 to 1)."""
    if isinstance(value, (int, np.integer)):
        whole = int(value)
    elif isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        whole = int(value)
    else:
        whole = None
    if whole is None or abs(whole) >= MAX_TOTAL_BYTES:
        name = names[op] if op < len(names) else f"#{op}"
        raise InvalidGraphError(
            f"op {name!r} has {field}={value!r}; sizes must be whole numbers of bytes below "
            f"2**62 ({MAX_TOTAL_BYTES})"
        )
    return whole


def _int_array(values: Optional[Sequence[int]], n: int, names: Sequence[str], field: str) -> np.ndarray:
    if values is None:
        return np.zeros(n, dtype=np.int64)
    array = np.asarray(values).reshape(-1)
    if array.dtype.kind == "i" and (np.abs(array) < MAX_TOTAL_BYTES).all():
        return array.astype(np.int64)
    # Floats, ints beyond int64 (numpy keeps them as objects), anything else: one by one.
    return np.array(
        [_whole_bytes(v, names, i, field) for i, v in enumerate(array.tolist())], dtype=np.int64
    )


def _edge_ids(values: Sequence[int], field: str) -> np.ndarray:
    """The edge op ids or output slots as int64 (exact, unlike the int32 they are kept in)."""
    try:
        return np.asarray(values, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError):
        raise InvalidGraphError(
            f"{field} holds a value that is not an op id or output slot (an integer below 2**63)"
        ) from None


def csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, order), read-only: order sorts the entries by `keys` (0..n-1, stable), and those of
    key k are order[ptr[k]:ptr[k + 1]]."""
    order = np.argsort(keys, kind="stable").astype(np.int32)
    counts = np.bincount(keys, minlength=n) if keys.size else np.zeros(n, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return _frozen(ptr), _frozen(order)


def _neighbours(frm: np.ndarray, to: np.ndarray, n: int) -> tuple[tuple[int, ...], ...]:
    out: list[set[int]] = [set() for _ in range(n)]
    for a, b in zip(frm.tolist(), to.tolist()):
        out[a].add(b)
    return tuple(tuple(sorted(s)) for s in out)


def _kahn(
    succ: Sequence[Sequence[int]], pred: Sequence[Sequence[int]], n: int, later: Sequence[bool]
) -> list[int]:
    """Kahn's order; of the ready ops, those not `later` first, then the lower id."""
    indeg = [len(p) for p in pred]
    key = [i + n * int(x) for i, x in enumerate(later)]  # sorts as (later, id)
    heap = [key[i] for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        op = heapq.heappop(heap) % n
        order.append(op)
        for s in succ[op]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, key[s])
    return order
