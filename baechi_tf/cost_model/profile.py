"""`CostProfile`: measured per-op costs of one graph, and its protobuf file.

A profile holds, per op, the median compute time over the traced steps and the maxima of each
output's bytes, of temporary and of persistent memory (Baechi, SoCC 2020; `profiler`); for
an op that a fused node replaced, the op it ran as (``fused_into``); per output, whether it reused
a buffer (``output_alias``: an input's, or one its op did not allocate); memory its kernel kept
past its end until a reader of its outputs ended (``held_bytes``, ``held_until``: a oneDNN max
pool's workspace); the traced time that no op of the graph accounts for, by node type
(``unmatched_compute_us``); and the CPU time other work took on the machine while the steps ran
(``machine_load``, `machine_load.MachineLoad`). It
remembers which graph it was taken on (a fingerprint over every node's name, type, inputs and
attributes, so that the same model at another size does not match; device fields and TF's
internal ``_`` attributes are left out, so that a placed copy of a graph matches its unplaced
original) and the TensorFlow version.

The file is a ``baechi_tf.CostProfile`` protobuf message (``baechi_tf/proto/cost_profile.proto``),
written atomically. Reading it parses bytes and nothing else: a pickle, a text file, a truncated
or an empty file is refused with a `ProfileError`, and no code from the file is ever run.

This module does not import TensorFlow: graphs are read through their ``node`` field (any
``GraphDef``-like value whose nodes have ``name``, ``op``, ``input`` and maybe ``attr``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import statistics
from typing import Any, Iterable, Mapping, Optional, Sequence

from baechi_tf._files import atomic_write
from baechi_tf.cost_model.machine_load import MachineLoad
from baechi_tf.errors import ProfileError

__all__ = [
    "READ_TABLES_SCOPE",
    "Coverage",
    "CostProfile",
    "GraphNode",
    "NO_BUFFER",
    "OWN_BUFFER",
    "OpCost",
    "ProfileMismatch",
    "compare_to_graph",
    "conditional_ops",
    "graph_fingerprint",
    "graph_nodes",
    "load_profile",
    "merge_profiles",
    "not_a_profile_to_replace",
    "profile_coverage",
    "profile_from_bytes",
    "profile_to_bytes",
    "read_bytes",
    "save_profile",
    "unrun_ops",
]

_MAGIC = "baechi_tf.CostProfile"
_END = "end"
# 2: node digests cover attributes (shapes, values, dtypes), not only types and inputs.
# 3: ops carry fused_into, and the profile the traced time no op accounts for (format 2 is read:
#    nothing fused, unmatched time unknown).
# 4: ops carry output_alias, the outputs that reused a buffer (formats 2 and 3 are read: none did).
# 5: ops carry held_bytes and held_until, memory kept past their end (formats 2-4 are read: none).
# 6: the profile carries machine_load, the CPU time other work took while its steps ran (formats
#    2-5 are read: unknown).
_FORMAT_VERSION = 6
_READ_VERSIONS = (2, 3, 4, 5, 6)


@dataclasses.dataclass(frozen=True)
class OpCost:
    """Costs of one op over the traced steps."""

    name: str
    op_type: str
    compute_us: float  # median over traced steps of the op's time in one step
    output_bytes: tuple[int, ...]  # per output slot, max over steps (0 for a slot never seen)
    temp_bytes: int = 0  # max over steps of the op's scratch memory
    persistent_bytes: int = 0  # max over steps of memory the op holds across steps
    device: str = ""  # device the op ran on while profiled
    num_steps: int = 1  # traced steps in which the op ran
    # the op whose fused node replaced this one, and whose time includes its work ('' when the op
    # ran as itself); such ops must share that op's device for the fusion to happen as profiled
    fused_into: str = ""
    # per output slot, the buffer it was in every traced step: OWN_BUFFER, INPUT k >= 0 (its k-th
    # data input's), or NO_BUFFER (one it did not allocate, a variable's); () when all were own
    output_alias: tuple[int, ...] = ()
    # bytes its kernel allocated beyond its outputs that stayed allocated past its end until
    # `held_until`, an op that reads one of its outputs, ended (a oneDNN max pool's workspace,
    # freed once its gradient has run); max over steps, not part of temp_bytes; 0 and '' for none
    held_bytes: int = 0
    held_until: str = ""


OWN_BUFFER = -1
"""`OpCost.output_alias` of an output that allocated a buffer of its own."""
NO_BUFFER = -2
"""`OpCost.output_alias` of an output in a buffer that neither its op allocated nor an input had
(a variable's value, as ``ReadVariableOp`` returns it)."""


@dataclasses.dataclass(frozen=True)
class GraphNode:
    """What a profile remembers of each node of its graph."""

    name: str
    op_type: str
    inputs_digest: int  # first 8 bytes of SHA-256 over the op type, inputs and attributes


@dataclasses.dataclass(frozen=True, eq=False)
class CostProfile:
    """Measured costs of the ops of one graph."""

    ops: Mapping[str, OpCost]  # op name -> costs, for every op seen in the traces
    graph_fingerprint: str  # `graph_fingerprint` of the profiled graph
    graph_nodes: tuple[GraphNode, ...]  # every node of the profiled graph
    tf_version: str = ""
    # Steps traced of each fetch it describes (the fewest, once merged); 0: some fetch was placed
    # without a traced step, so that what its steps run is not known (`unrun_ops`).
    num_traced_steps: int = 0
    traced_compute_us: float = 0.0  # median per step of all traced time, runtime nodes included
    # traced time of one step that no op of the graph accounts for, by node type (median over
    # steps); None when unknown (a profile of format 2)
    unmatched_compute_us: Optional[Mapping[str, float]] = None
    # CPU time other work took on the machine while the steps ran; None when not measured
    machine_load: Optional[MachineLoad] = None

    @property
    def profiled_compute_us(self) -> float:
        """Sum of the compute times of the profiled ops (one step)."""
        return float(sum(c.compute_us for c in self.ops.values()))


@dataclasses.dataclass(frozen=True)
class Coverage:
    """How much of a graph a profile covers."""

    num_graph_ops: int  # ops in the graph
    num_profiled_ops: int  # graph ops with a measured cost
    estimated_ops: tuple[str, ...]  # graph ops without one, whose costs were estimated
    profiled_compute_us: float  # traced compute time of the graph's profiled ops, one step
    traced_compute_us: float  # all traced compute time of one step
    # the profile's `CostProfile.unmatched_compute_us` (None: unknown)
    unmatched_compute_us: Optional[Mapping[str, float]] = None
    unrun_ops: tuple[str, ...] = ()  # graph ops no profiled step runs (`unrun_ops`): no cost
    machine_load: Optional[MachineLoad] = None  # the profile's `CostProfile.machine_load`

    @property
    def op_share(self) -> float:
        return self.num_profiled_ops / self.num_graph_ops if self.num_graph_ops else 1.0

    @property
    def compute_share(self) -> float:
        """Share of the traced compute time that the graph's ops account for: all of it but the
        unmatched time when the profile knows it (measured within each step), else the profiled
        ops' time over the traced time (a median of sums against a sum of medians: on a busy
        machine it strays by several percent either way)."""
        if self.traced_compute_us <= 0:
            return 1.0 if self.num_profiled_ops else 0.0
        if self.unmatched_compute_us is not None:
            unmatched = sum(self.unmatched_compute_us.values())
            return min(1.0, max(0.0, 1.0 - unmatched / self.traced_compute_us))
        return min(1.0, self.profiled_compute_us / self.traced_compute_us)

    def describe(self, *, unrun: bool = True) -> str:
        """One line: ops profiled, share of the traced time, ops estimated and, with `unrun`, how
        many ran in no traced step (leave it out where a note names them already)."""
        return (
            f"profile covers {self.num_profiled_ops} of {self.num_graph_ops} ops "
            f"({100 * self.op_share:.1f}%) and {100 * self.compute_share:.1f}% of the traced "
            f"compute time; {len(self.estimated_ops)} ops have estimated costs"
            + (f"; {len(self.unrun_ops)} ops ran in no traced step and cost nothing"
               if unrun and self.unrun_ops else "")
        )

    def figures(self, default_compute_ops: int = 0) -> dict[str, Any]:
        """The coverage as plain JSON values: num_graph_ops, num_profiled_ops, num_estimated_ops,
        num_shape_estimated_ops (`default_compute_ops`: estimated from shapes, no op of their type
        measured), compute_share, traced_compute_us, unmatched_compute_us (node type -> us of one
        step; None when the profile does not know), machine_load (`MachineLoad`'s fields and its
        share; None when not measured)."""
        unmatched = self.unmatched_compute_us
        load = self.machine_load
        return {
            "num_graph_ops": self.num_graph_ops,
            "num_profiled_ops": self.num_profiled_ops,
            "num_estimated_ops": len(self.estimated_ops),
            "num_shape_estimated_ops": int(default_compute_ops),
            "compute_share": float(self.compute_share),
            "traced_compute_us": float(self.traced_compute_us),
            "unmatched_compute_us": None if unmatched is None else {k: float(unmatched[k]) for k in sorted(unmatched)},
            "machine_load": None if load is None else {**dataclasses.asdict(load), "share": load.share},
        }

    def unmatched_by_type(self, limit: int = 5) -> str:
        """The traced time no graph op accounts for, by node type, largest first (`limit`
        types, the rest summed): ``"0.120 ms of 255.4 ms: Const 0.100 ms, _Recv 0.020 ms"``;
        empty when unknown."""
        if self.unmatched_compute_us is None:
            return ""
        ranked = sorted(self.unmatched_compute_us.items(), key=lambda kv: (-kv[1], kv[0]))
        total = sum(us for _, us in ranked)
        parts = [f"{t} {us / 1e3:.3f} ms" for t, us in ranked[:limit]]
        if len(ranked) > limit:
            parts.append(f"{len(ranked) - limit} more types {sum(us for _, us in ranked[limit:]) / 1e3:.3f} ms")
        head = f"{total / 1e3:.3f} ms of {self.traced_compute_us / 1e3:.1f} ms"
        return f"{head}: {', '.join(parts)}" if parts else head


@dataclasses.dataclass(frozen=True)
class ProfileMismatch:
    """What differs between the graph a profile was taken on and another graph."""

    profile_fingerprint: str
    graph_fingerprint: str
    missing_from_profile: tuple[str, ...]  # nodes of the graph the profiled graph did not have
    missing_from_graph: tuple[str, ...]  # nodes of the profiled graph the graph does not have
    changed: tuple[str, ...]  # nodes of both whose op type, inputs or attributes differ

    def describe(self, limit: int = 5) -> str:
        parts = []
        for label, names in (
            ("graph ops not in the profiled graph", self.missing_from_profile),
            ("profiled ops not in the graph", self.missing_from_graph),
            ("ops whose type, inputs or attributes changed", self.changed),
        ):
            if names:
                shown = ", ".join(repr(n) for n in names[:limit])
                more = f" and {len(names) - limit} more" if len(names) > limit else ""
                parts.append(f"{len(names)} {label} ({shown}{more})")
        if not parts:
            parts.append("the same nodes, but a different fingerprint")
        return "; ".join(parts)


# ---------------------------------------------------------------------------- graph identity


def _node_digest(node: Any) -> int:
    h = hashlib.sha256(node.op.encode())
    for name in node.input:
        h.update(b"\0")
        h.update(name.encode())
    attrs = getattr(node, "attr", {})
    for key in sorted(attrs):
        if not key.startswith("_"):  # TF's own: colocation, output shapes some exporters add
            h.update(b"\1" + key.encode() + b"\0")
            h.update(attrs[key].SerializeToString(deterministic=True))
    return int.from_bytes(h.digest()[:8], "little")


READ_TABLES_SCOPE = "baechi_tf_read_tables"
"""The root name scope of the ops `BaechiSession` adds to the graph it wraps to read its lookup
tables and the resource variables no op reads (``baechi_tf_read_tables_1`` for a second
BaechiSession of a graph, before they were kept in one)."""
_READ_TABLES = re.compile(re.escape(READ_TABLES_SCOPE) + r"(_\d+)?/")


def graph_nodes(graph_def) -> tuple[GraphNode, ...]:
    """The name, type and digest (type, inputs, attributes) of every node of `graph_def`, in
    node order, but those `BaechiSession` added to read lookup tables and variables: a graph
    written after a BaechiSession ran holds them, and must match a profile taken before."""
    return tuple(
        GraphNode(n.name, n.op, _node_digest(n)) for n in graph_def.node if not _READ_TABLES.match(n.name)
    )


def _fingerprint(nodes: Iterable[GraphNode]) -> str:
    h = hashlib.sha256()
    for node in sorted(nodes, key=lambda n: n.name):
        h.update(node.name.encode())
        h.update(b"\0")
        h.update(node.inputs_digest.to_bytes(8, "little"))
    return h.hexdigest()


def graph_fingerprint(graph_def) -> str:
    """SHA-256 (hex) over every node's name, op type, inputs and attributes (not the ``_`` ones);
    device fields are left out."""
    return _fingerprint(graph_nodes(graph_def))


def compare_to_graph(profile: CostProfile, graph_def) -> Optional[ProfileMismatch]:
    """None when `profile` was taken on `graph_def` (devices aside), else what differs."""
    nodes = graph_nodes(graph_def)
    fingerprint = _fingerprint(nodes)
    if fingerprint == profile.graph_fingerprint:
        return None
    mine = {n.name: n for n in profile.graph_nodes}
    theirs = {n.name: n for n in nodes}
    return ProfileMismatch(
        profile_fingerprint=profile.graph_fingerprint,
        graph_fingerprint=fingerprint,
        missing_from_profile=tuple(n.name for n in nodes if n.name not in mine),
        missing_from_graph=tuple(n.name for n in profile.graph_nodes if n.name not in theirs),
        changed=tuple(
            n.name for n in nodes if n.name in mine and mine[n.name].inputs_digest != n.inputs_digest
        ),
    )


def profile_coverage(profile: CostProfile, graph_def) -> Coverage:
    """How many ops of `graph_def` the profile measured, and their share of the traced time."""
    names = [n.name for n in graph_def.node]
    measured = [n for n in names if n in profile.ops]
    unrun = unrun_ops(profile, graph_def)
    return Coverage(
        num_graph_ops=len(names),
        num_profiled_ops=len(measured),
        estimated_ops=tuple(n for n in names if n not in profile.ops and n not in unrun),
        profiled_compute_us=float(sum(profile.ops[n].compute_us for n in measured)),
        traced_compute_us=profile.traced_compute_us,
        unmatched_compute_us=profile.unmatched_compute_us,
        unrun_ops=tuple(n for n in names if n in unrun),
        machine_load=profile.machine_load,
    )


# Ops downstream of these v1 control-flow ops may run in another step though they did not in the
# traced ones (a branch not taken, a loop body run zero times), and leave no trace when they do
# not.
_CONDITIONAL = frozenset({"Switch", "RefSwitch", "_SwitchN", "Enter", "RefEnter"})


def unrun_ops(profile: CostProfile, graph_def) -> frozenset[str]:
    """The ops of `graph_def` that no step of the fetches `profile` traced runs.

    Outside v1 control flow, TF's executor runs every op of a fetch's pruned graph once per step
    and traces each one it runs, so an op that ran in no traced step is not part of any of the
    fetches' steps: an initializer, the construction graph of a Keras functional model, a read
    made when a variable was created and never fetched. Such an op is one that the profiled
    graph had (same name, type, inputs and attributes), that is not in ``profile.ops``, no op that
    ran reads (a tensor fed in its place is still sent to its readers), and is not reached
    (through data or control inputs) from a ``Switch`` or ``Enter``. That holds for a
    placeholder too, which no step traces: TF sends a fed value only to the ops of the step that
    read it. Empty
    when the profile has no traced step (``num_traced_steps == 0``: some fetch was placed
    without one). Time O(nodes + inputs).
    """
    if profile.num_traced_steps < 1:
        return frozenset()
    digests = {n.name: n.inputs_digest for n in profile.graph_nodes}
    readers = _readers(graph_def)
    conditional = conditional_ops(graph_def, readers)
    return frozenset(
        n.name for n in graph_def.node
        if n.name not in profile.ops and n.name not in conditional
        and not any(r in profile.ops for r in readers.get(n.name, ()))
        and digests.get(n.name) == _node_digest(n)
    )


def _readers(graph_def) -> dict[str, list[str]]:
    """Op name -> the ops that read it (data or control inputs)."""
    readers: dict[str, list[str]] = {}
    for node in graph_def.node:
        for text in node.input:
            readers.setdefault(text.lstrip("^").split(":")[0], []).append(node.name)
    return readers


def conditional_ops(graph_def, readers: Optional[Mapping[str, list[str]]] = None) -> set[str]:
    """The ops of `graph_def` reached (through data or control inputs) from a ``Switch`` or
    ``Enter``, themselves included: a step may run them though the traced ones did not (a branch
    not taken, a loop body run zero times). O(nodes + inputs)."""
    readers = _readers(graph_def) if readers is None else readers
    conditional = {n.name for n in graph_def.node if n.op in _CONDITIONAL}
    todo = list(conditional)
    while todo:
        for reader in readers.get(todo.pop(), ()):
            if reader not in conditional:
                conditional.add(reader)
                todo.append(reader)
    return conditional


def merge_profiles(old: CostProfile, new: CostProfile) -> CostProfile:
    """`new`, plus the ops only `old` measured (for a graph profiled fetch by fetch).

    Ops both measured take `new`'s costs; the graph identity is `new`'s; the traced steps the
    fewer of the two (0 when a fetch was placed without tracing: what its steps run is not
    known); the machine's load the higher of the two (`MachineLoad.share`). The unmatched time of
    each node type is the larger of the two (unknown when either is); the traced time is the
    merged ops' compute plus the unmatched time, or plus the larger of the two runtime overheads
    when it is unknown.
    """
    ops = dict(old.ops)
    ops.update(new.ops)
    steps = min(old.num_traced_steps, new.num_traced_steps)
    loads = [p.machine_load for p in (new, old) if p.machine_load is not None]
    new = dataclasses.replace(new, machine_load=max(loads, key=lambda m: m.share) if loads else None)
    if old.unmatched_compute_us is not None and new.unmatched_compute_us is not None:
        unmatched = _merged_unmatched(old.unmatched_compute_us, new.unmatched_compute_us)
        merged = dataclasses.replace(new, ops=ops, unmatched_compute_us=unmatched, num_traced_steps=steps)
        return dataclasses.replace(merged, traced_compute_us=merged.profiled_compute_us + sum(unmatched.values()))
    overhead = max(
        old.traced_compute_us - old.profiled_compute_us,
        new.traced_compute_us - new.profiled_compute_us,
        0.0,
    )
    merged = dataclasses.replace(new, ops=ops, unmatched_compute_us=None, num_traced_steps=steps)
    return dataclasses.replace(merged, traced_compute_us=merged.profiled_compute_us + overhead)


def _merged_unmatched(old: Mapping[str, float], new: Mapping[str, float]) -> dict[str, float]:
    return {t: max(old.get(t, 0.0), new.get(t, 0.0)) for t in sorted(set(old) | set(new))}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


# ---------------------------------------------------------------------------- the file


def _pb2():
    from baechi_tf.proto import cost_profile_pb2

    return cost_profile_pb2


def profile_to_bytes(profile: CostProfile) -> bytes:
    """The profile as a serialized ``baechi_tf.CostProfile`` message (deterministic)."""
    pb = _pb2().CostProfile(
        magic=_MAGIC,
        format_version=_FORMAT_VERSION,
        graph_fingerprint=profile.graph_fingerprint,
        tf_version=profile.tf_version,
        num_traced_steps=profile.num_traced_steps,
        traced_compute_us=profile.traced_compute_us,
        end_marker=_END,
    )
    for node in profile.graph_nodes:
        pb.graph_nodes.add(name=node.name, op_type=node.op_type, inputs_digest=node.inputs_digest)
    for name in sorted(profile.ops):
        c = profile.ops[name]
        pb.ops.add(
            name=c.name,
            op_type=c.op_type,
            device=c.device,
            compute_us=c.compute_us,
            output_bytes=list(c.output_bytes),
            temp_bytes=c.temp_bytes,
            persistent_bytes=c.persistent_bytes,
            num_steps=c.num_steps,
            fused_into=c.fused_into,
            output_alias=list(c.output_alias),
            held_bytes=c.held_bytes,
            held_until=c.held_until,
        )
    for node_type, us in sorted((profile.unmatched_compute_us or {}).items()):
        pb.unmatched.add(node_type=node_type, compute_us=us)
    load = profile.machine_load
    if load is not None:
        pb.machine_load.CopyFrom(_pb2().MachineLoad(
            wall_s=load.wall_s, cpus=load.cpus, others_cpu_s=load.others_cpu_s, steal_s=load.steal_s))
    return pb.SerializeToString(deterministic=True)


def _not_a_profile(source: str, why: str) -> ProfileError:
    return ProfileError(
        f"{source} is not a baechi_tf cost profile ({why}); profile the graph again to make one "
        "(train.py --costgen, BaechiSession(cost_path=...) or baechi_tf.cost_model.profile_fetch; "
        "baechi place also takes traced steps' RunMetadata, --run_metadata)"
    )


def profile_from_bytes(data: bytes, source: str = "the cost profile") -> CostProfile:
    """Parses a serialized profile; `ProfileError` for anything that is not a whole one."""
    from google.protobuf.message import DecodeError

    if not data:
        raise _not_a_profile(source, "the file is empty")
    if data[:1] == b"\x80" and data[-1:] == b".":
        raise _not_a_profile(source, "it looks like a Python pickle, which is never loaded")
    pb = _pb2().CostProfile()
    try:
        pb.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise _not_a_profile(source, f"its bytes do not parse: {e}") from None
    if pb.magic != _MAGIC:
        raise _not_a_profile(source, "it lacks the CostProfile marker")
    if pb.format_version not in _READ_VERSIONS:
        raise ProfileError(
            f"{source} has profile format {pb.format_version}, this baechi_tf reads formats "
            f"{', '.join(map(str, _READ_VERSIONS[:-1]))} and {_READ_VERSIONS[-1]}; profile the graph again"
        )
    if pb.end_marker != _END:
        raise ProfileError(
            f"{source} is truncated (its end marker is missing); it was cut short while being "
            "copied or written: profile the graph again"
        )
    ops: dict[str, OpCost] = {}
    for c in pb.ops:
        if c.name in ops:
            raise ProfileError(f"{source} lists op {c.name!r} twice; the file is corrupt")
        if not (c.compute_us >= 0) or c.temp_bytes < 0 or c.persistent_bytes < 0 or c.held_bytes < 0 or any(
            b < 0 for b in c.output_bytes
        ):
            raise ProfileError(
                f"{source} gives op {c.name!r} a negative or non-numeric cost; the file is corrupt"
            )
        if any(a < NO_BUFFER for a in c.output_alias) or len(c.output_alias) > len(c.output_bytes):
            raise ProfileError(
                f"{source} gives op {c.name!r} output buffers {list(c.output_alias)} for "
                f"{len(c.output_bytes)} outputs (each -2, -1 or an input's position); the file is corrupt"
            )
        ops[c.name] = OpCost(
            name=c.name,
            op_type=c.op_type,
            compute_us=float(c.compute_us),
            output_bytes=tuple(int(b) for b in c.output_bytes),
            temp_bytes=int(c.temp_bytes),
            persistent_bytes=int(c.persistent_bytes),
            device=c.device,
            num_steps=int(c.num_steps),
            fused_into=c.fused_into,
            output_alias=tuple(int(a) for a in c.output_alias),
            held_bytes=int(c.held_bytes),
            held_until=c.held_until,
        )
    load = None
    if pb.HasField("machine_load"):
        m = pb.machine_load
        if not (m.wall_s >= 0 and m.others_cpu_s >= 0 and m.steal_s >= 0):
            raise ProfileError(f"{source} gives a negative or non-numeric machine load; the file is corrupt")
        load = MachineLoad(wall_s=float(m.wall_s), cpus=int(m.cpus), others_cpu_s=float(m.others_cpu_s),
                           steal_s=float(m.steal_s))
    return CostProfile(
        ops=ops,
        graph_fingerprint=pb.graph_fingerprint,
        graph_nodes=tuple(
            GraphNode(n.name, n.op_type, int(n.inputs_digest)) for n in pb.graph_nodes
        ),
        tf_version=pb.tf_version,
        num_traced_steps=int(pb.num_traced_steps),
        traced_compute_us=float(pb.traced_compute_us),
        unmatched_compute_us=(
            {u.node_type: float(u.compute_us) for u in pb.unmatched} if pb.format_version >= 3 else None
        ),
        machine_load=load,
    )


def save_profile(profile: CostProfile, path: str | os.PathLike) -> None:
    """Writes `profile` to `path` atomically (a reader never sees half a file)."""
    atomic_write(os.fspath(path), profile_to_bytes(profile))


def not_a_profile_to_replace(path: str) -> Optional[str]:
    """Why writing a profile to `path` would replace a file that holds something else (a typo
    that names a source file): None when nothing is there, or it is not a regular file, or it is
    empty, or it is a profile to replace: one of ours (of any format version, or cut short: the
    marker heads the file) or the original Baechi's pickle."""
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        head = f.read(64)
        f.seek(-1 if head else 0, os.SEEK_END)
        last = f.read(1)
    if not head or _MAGIC.encode() in head or (head[:1] == b"\x80" and last == b"."):
        return None
    return "it does not start as one, nor as the original's pickle"


def read_bytes(path: str, what: str, error: type = ProfileError) -> bytes:
    """The bytes of the file `path` (called `what` in messages); `error` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise error(f"{what} {path!r} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {path!r} is a directory; give a file") from None
    except OSError as e:
        raise error(f"cannot read {what} {path!r}: {e.strerror}") from None


def load_profile(path: str | os.PathLike) -> CostProfile:
    """Reads a profile written by `save_profile`; `ProfileError` if it is not one."""
    path = os.fspath(path)
    data = read_bytes(path, "cost profile")
    return profile_from_bytes(data, f"cost profile {path!r}")
