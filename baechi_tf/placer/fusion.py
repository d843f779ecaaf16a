"""Operator fusion (``--placer_type=fusion``): place a smaller graph whose ops are runs of ops.

Fusion (Baechi, SoCC 2020, section 4.4) folds a consumer into its producer when both are
in the same group (they will share a device anyway) and the edge between them is direct. Placing
the fused graph is faster, and the placement maps back to every original op (`FusedGraph.expand`).

A fused op adds up the compute and persistent memory of its ops and keeps the largest temporary
memory (they run one at a time); its outputs are the distinct tensors its ops send to other fused
ops, in the order of the graph's edges (a tensor used only inside it is no longer an output, nor
is one nobody reads). An op fused with no other is unchanged. Edges between fused ops keep their
tensors, so a tensor is still sent once.
These are the original's rules; they can understate the memory of a fused op (a tensor internal
to it is alive while its consumer runs), which the placement check on the original graph sees.

Merging u -> v closes a cycle exactly when another path u ~> v exists. The *conservative* rule
refuses the merge whenever u has another successor and v another predecessor (such a path may
exist). The *exact* check searches for the path, visiting only ops ranked between u and v in a
topological order that is kept valid after every merge (Pearce and Kelly, "A dynamic topological
sort algorithm for directed acyclic graphs", JEA 2007: the ops that reach v are moved before the
ops u reaches). ``path_check='auto'`` (the default) runs exact checks while the ops they have
visited stay within `FusionOptions.search_budget` times (ops + edges), then falls back to the
conservative rule, so fusion stays linear in the worst case.

Pairs are taken per group (in group order) in the order of the graph's edges, and a new edge
between two ops of the group, made by a merge, is queued too (as in the original).

Time: O(V + E) for the conservative rule plus the bounded searches, merges costing the degree of
the op folded away; memory O(V + E).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

import numpy as np

from baechi_tf.errors import ConfigError
from baechi_tf.graph import CONTROL, OpGraph
from baechi_tf.placer.grouping import Groups, bounded_search
from baechi_tf.placer.schedule import Placement
from baechi_tf.placer.union_find import UnionFind

__all__ = ["FusedGraph", "FusionOptions", "fuse"]

_CHECKS = ("auto", "exact", "conservative")


@dataclasses.dataclass(frozen=True)
class FusionOptions:
    """Options of `fuse`."""

    path_check: str = "auto"  # 'auto' (exact within the budget), 'exact' or 'conservative'
    search_budget: float = 8.0  # 'auto': ops the exact searches may visit, per op and edge


@dataclasses.dataclass(frozen=True, eq=False)
class FusedGraph:
    """A fused graph and the way back to the original."""

    graph: OpGraph  # the fused ops, each named after the op the others were folded into
    groups: Groups  # the original's groups (same ids and names) over the fused ops
    fused_of: np.ndarray  # int32 [original ops]: the fused op each original op belongs to
    members: tuple[np.ndarray, ...]  # original ops of each fused op, ascending

    def expand(self, placement: Placement) -> Placement:
        """The placement of every original op: the device of its fused op."""
        device_of = np.asarray(placement.device_of)
        if device_of.shape != (self.graph.num_ops,):
            raise ValueError(
                f"placement has {device_of.shape[0]} ops, the fused graph {self.graph.num_ops}"
            )
        return Placement(device_of[self.fused_of], placement.method)


def fuse(graph: OpGraph, groups: Groups, *, options: FusionOptions = FusionOptions()) -> FusedGraph:
    """Fuses directly connected ops of one group without creating a cycle (module docstring)."""
    if options.path_check not in _CHECKS:
        raise ConfigError(f"unknown path check {options.path_check!r}; choose one of {', '.join(_CHECKS)}")
    merger = _Merger(graph, groups, options)
    merger.run()
    return merger.result()


class _Merger:
    """The contracted graph while fusing: adjacency sets, ranks, sums; ops named by survivors."""

    def __init__(self, graph: OpGraph, groups: Groups, options: FusionOptions) -> None:
        n = graph.num_ops
        self.graph, self.groups = graph, groups
        self.succ = [set(s) for s in graph.successors]
        self.pred = [set(p) for p in graph.predecessors]
        self.rank = graph.topo_index.tolist()
        self.into = UnionFind(n)  # the op each op was folded into (itself while alive)
        self.compute = graph.compute_us.tolist()
        self.temp = graph.temp_bytes.tolist()
        self.persistent = graph.persistent_bytes.tolist()
        self.group_of = groups.group_of.tolist()
        self.exact = options.path_check != "conservative"
        unlimited = options.path_check == "exact"
        self.budget = float("inf") if unlimited else options.search_budget * (n + graph.num_edges)

    def find(self, op: int) -> int:
        """The op that `op` was folded into, itself while alive."""
        return self.into.find(op)

    def run(self) -> None:
        queues: list[collections.deque] = [collections.deque() for _ in range(self.groups.num_groups)]
        seen: set[tuple[int, int]] = set()
        for u, v in zip(self.graph.edge_src.tolist(), self.graph.edge_dst.tolist()):
            g = self.group_of[u]
            if g == self.group_of[v] and (u, v) not in seen:
                seen.add((u, v))
                queues[g].append((u, v))
        for queue in queues:
            while queue:
                u, v = queue.popleft()
                u, v = self.find(u), self.find(v)
                if u != v and v in self.succ[u] and self._acyclic_after(u, v):
                    self._merge(u, v, queue)

    def _acyclic_after(self, u: int, v: int) -> bool:
        """Whether folding v into u keeps the graph acyclic; reorders ranks when it does."""
        if len(self.succ[u]) == 1:
            self.rank[u] = self.rank[v]  # u's only successor is v: u can sit where v was
            return True
        if len(self.pred[v]) == 1:
            return True  # v's only predecessor is u: v can sit where u is
        if not self.exact:
            return False
        lo, hi = self.rank[u], self.rank[v]
        forward = self._search(u, v, self.succ, lambda r: r < hi)
        if forward is None:
            return False  # another path u ~> v, or the search ran out of budget
        backward = self._search(v, u, self.pred, lambda r: r > lo)
        if backward is None:
            return False
        # Pearce-Kelly: what reaches v goes first, then v and u (to be one op), then what u
        # reaches, in the ranks they held between them.
        rank = self.rank
        order = sorted(backward, key=rank.__getitem__) + [v, u] + sorted(forward, key=rank.__getitem__)
        for op, r in zip(order, sorted(rank[x] for x in order)):
            rank[op] = r
        return True

    def _search(self, start: int, target: int, edges, inside) -> Optional[list[int]]:
        """Ops reachable from `start` other than through its direct edge to `target`, among
        ranks where `inside` holds; None if `target` is reached or the budget runs out (from
        then on the conservative rule holds)."""
        found, self.budget = bounded_search(start, target, edges, self.rank, inside, self.budget)
        if self.budget < 0:
            self.exact = False
        return found

    def _merge(self, u: int, v: int, queue: collections.deque) -> None:
        """Folds v into u; queues the new edges of u inside its group."""
        g = self.group_of[u]
        self.compute[u] += self.compute[v]
        self.persistent[u] += self.persistent[v]
        self.temp[u] = max(self.temp[u], self.temp[v])
        self.succ[u].discard(v)
        self.pred[v].discard(u)
        for x in self.pred[v]:
            self.succ[x].discard(v)
            if u not in self.succ[x]:
                self.succ[x].add(u)
                self.pred[u].add(x)
                if self.group_of[x] == g:
                    queue.append((x, u))
        for y in self.succ[v]:
            self.pred[y].discard(v)
            if y not in self.succ[u]:
                self.succ[u].add(y)
                self.pred[y].add(u)
                if self.group_of[y] == g:
                    queue.append((u, y))
        self.succ[v] = set()
        self.pred[v] = set()
        self.into.fold(v, into=u)

    def result(self) -> FusedGraph:
        graph, groups = self.graph, self.groups
        n = graph.num_ops
        root = np.fromiter((self.find(op) for op in range(n)), dtype=np.int64, count=n)
        alive = np.flatnonzero(root == np.arange(n))  # fused ops keep the order of their roots
        new_id = np.full(n, -1, dtype=np.int64)
        new_id[alive] = np.arange(alive.shape[0])
        fused_of = new_id[root].astype(np.int32)

        order = np.argsort(fused_of, kind="stable")
        bounds = np.searchsorted(fused_of[order], np.arange(alive.shape[0] + 1))
        members = tuple(order[bounds[f] : bounds[f + 1]].astype(np.int32) for f in range(alive.shape[0]))

        # Outputs: an op fused with no other keeps its own; a fused op of several has the
        # distinct tensors that leave it, in edge order.
        single = (np.diff(bounds) == 1).tolist()
        outputs = [list(graph.output_bytes[r]) if one else [] for r, one in zip(alive.tolist(), single)]
        src = fused_of[graph.edge_src].tolist()
        dst = fused_of[graph.edge_dst].tolist()
        slot_of: dict[int, int] = {}  # tensor -> output slot of its fused producer
        edges: dict[tuple[int, int, int], None] = {}
        for a, b, t, out in zip(src, dst, graph.edge_tensor.tolist(), graph.edge_src_output.tolist()):
            if a == b:
                continue
            if out != CONTROL and not single[a]:
                if t not in slot_of:
                    slot_of[t] = len(outputs[a])
                    outputs[a].append(int(graph.tensor_bytes[t]))
                out = slot_of[t]
            edges[(a, b, out)] = None
        keys = list(edges)
        group_ids = groups.group_of[alive]
        pins = [None] * alive.shape[0]
        for op, pin in enumerate(graph.pinned_device):
            if pin is not None and pins[fused_of[op]] is None:
                pins[fused_of[op]] = pin
        op_types = ()
        if graph.op_types:
            op_types = tuple(
                graph.op_types[r] if len(m) == 1 else "Fused" for r, m in zip(alive.tolist(), members)
            )
        fused = OpGraph.from_arrays(
            names=[graph.names[r] for r in alive.tolist()],
            compute_us=np.asarray(self.compute)[alive],
            output_bytes=outputs,
            temp_bytes=np.asarray(self.temp, dtype=np.int64)[alive],
            persistent_bytes=np.asarray(self.persistent, dtype=np.int64)[alive],
            pinned_device=pins,
            colocation=[(groups.names[g],) for g in group_ids.tolist()],
            edge_src=[k[0] for k in keys],
            edge_dst=[k[1] for k in keys],
            edge_src_output=[k[2] for k in keys],
            op_types=op_types,
        )
        fused_of.setflags(write=False)
        return FusedGraph(
            graph=fused,
            groups=Groups(np.asarray(group_ids, dtype=np.int32), groups.names),
            fused_of=fused_of,
            members=members,
        )
