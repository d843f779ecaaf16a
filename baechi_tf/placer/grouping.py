"""Grouping: which ops must, or should, be placed on one device.

Two groupers, as in Baechi (SoCC 2020, section 4):

* `colocation_groups` (the ``tf`` grouper) merges TF colocation constraints with union-find: an op
  that names ``loc:@x`` and ``loc:@y`` joins x and y, and the op called ``x`` is in group ``x``.
  These groups are hard constraints: TensorFlow itself requires them.
* `coplace` (the ``coplace`` grouper) then merges an op that has a single successor into that
  successor's group, so that a producer whose only consumer is X runs where X runs. A merge that
  would create a cycle among groups is refused, checked with Pearce and Kelly's bounded search on
  the graph of strongly connected components of groups (TF colocation of gradients with their
  forward ops can make that graph cyclic already; coplace never makes it more so).

Each group is named by its shortest name (then the smallest), as the original does. Groups are
numbered by their smallest op id, so the result is deterministic. Both run in time linear in ops
plus edges, apart from the bounded searches, which only visit groups ranked between the two
groups being merged.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Iterable, Optional

import numpy as np

from baechi_tf.cluster import merged_device_name
from baechi_tf.errors import ConfigError, InvalidGraphError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.union_find import UnionFind

__all__ = ["Groups", "bounded_search", "colocation_groups", "coplace", "make_groups", "GROUPERS"]

GROUPERS = ("tf", "coplace")


@dataclasses.dataclass(frozen=True, eq=False)
class Groups:
    """A partition of the ops of a graph into groups that are placed whole."""

    group_of: np.ndarray  # int32 [num_ops], group id of each op
    names: tuple[str, ...]  # name of each group

    @property
    def num_groups(self) -> int:
        return len(self.names)

    @functools.cached_property
    def members(self) -> tuple[np.ndarray, ...]:
        """Op ids of each group, ascending."""
        order = np.argsort(self.group_of, kind="stable")
        bounds = np.searchsorted(self.group_of[order], np.arange(self.num_groups + 1))
        return tuple(order[bounds[g] : bounds[g + 1]] for g in range(self.num_groups))

    def sums(self, per_op: np.ndarray) -> np.ndarray:
        """float64 [num_groups]: `per_op` summed over each group's ops."""
        return np.bincount(self.group_of, weights=per_op, minlength=self.num_groups)

    def byte_sums(self, per_op: np.ndarray) -> np.ndarray:
        """int64 [num_groups]: a per-op byte count summed over each group's ops."""
        return np.rint(self.sums(per_op)).astype(np.int64)

    @classmethod
    def singletons(cls, graph: OpGraph) -> "Groups":
        return cls(np.arange(graph.num_ops, dtype=np.int32), graph.names)


def _shortest(names: Iterable[str]) -> str:
    return min(names, key=lambda s: (len(s), s))


def _finish(graph: OpGraph, uf: UnionFind, candidates: dict[int, set[str]]) -> Groups:
    """Numbers the union-find sets by smallest op id and names each by its shortest name."""
    roots = [uf.find(i) for i in range(graph.num_ops)]
    number: dict[int, int] = {}
    group_of = np.empty(graph.num_ops, dtype=np.int32)
    for op, root in enumerate(roots):
        group_of[op] = number.setdefault(root, len(number))
    names_of: list[set[str]] = [set() for _ in number]
    for root, names in candidates.items():
        names_of[number[uf.find(root)]].update(names)
    names = tuple(_shortest(n) for n in names_of)
    group_of.setflags(write=False)
    groups = Groups(group_of, names)
    _group_pins(graph, groups)  # raises on a group pinned to two devices
    return groups


def _group_pins(graph: OpGraph, groups: Groups) -> dict[int, str]:
    """The device each pinned group is pinned to, its pins merged (`merged_device_name`: two
    spellings of one device, such as '/device:GPU:0' and 'GPU:0', are one pin, the more specific
    kept); `InvalidGraphError` when a group's pins name two devices."""
    pinned: dict[int, int] = {}  # group -> the op with its most specific pin so far
    for op, device in enumerate(graph.pinned_device):
        if device is None:
            continue
        g = int(groups.group_of[op])
        other = pinned.setdefault(g, op)
        both = merged_device_name(graph.pinned_device[other], device)
        if both is None:
            raise InvalidGraphError(
                f"ops {graph.names[other]!r} and {graph.names[op]!r} must be colocated (group "
                f"{groups.names[g]!r}) but are pinned to {graph.pinned_device[other]!r} and "
                f"{device!r}: pin them to one device or drop one pin"
            )
        if both is device:  # merged_device_name returns one of its arguments, the more specific
            pinned[g] = op
    return {g: graph.pinned_device[op] for g, op in pinned.items()}


def colocation_groups(graph: OpGraph) -> Groups:
    """The ``tf`` grouper: TF colocation names merged with union-find."""
    uf = UnionFind(graph.num_ops)
    index = graph.index
    owner: dict[str, int] = {}  # colocation name -> first op seen naming it
    for op, names in enumerate(graph.colocation):
        for name in names:
            first = owner.setdefault(name, op)
            uf.union(first, op)
            target = index.get(name)
            if target is not None:
                uf.union(target, op)
    candidates: dict[int, set[str]] = {}
    for op in range(graph.num_ops):
        root = uf.find(op)
        names = graph.colocation[op] or (graph.names[op],)
        candidates.setdefault(root, set()).update(names)
    # An op named by a colocation constraint but carrying none itself contributes its own name.
    for name, op in owner.items():
        target = index.get(name)
        if target is not None:
            candidates[uf.find(target)].add(name)
    return _finish(graph, uf, candidates)


def coplace(graph: OpGraph, base: Optional[Groups] = None, *, apart: Optional[np.ndarray] = None) -> Groups:
    """The ``coplace`` grouper: single-successor ops join their successor's group.

    Starts from `base` (default: `colocation_groups`). Refuses any merge that would close a new
    cycle among groups, and any that joins a group holding an op of `apart` (bool per op: the
    ops that run on the host outside the cluster, `graph_pass.place_with_host`, which the
    placers see unpinned) with one that holds none: such a group goes to the host whole.
    """
    base = base if base is not None else colocation_groups(graph)
    ng = base.num_groups
    group_of = base.group_of.tolist()
    uf = UnionFind(ng)
    names: dict[int, str] = dict(enumerate(base.names))
    # Coplacing is a preference, a pin a hard constraint: two groups pinned to different devices
    # are never merged, or a valid graph would fail the check of the merged groups below.
    pin = _group_pins(graph, base)
    away = [False] * ng
    for op in np.flatnonzero(apart).tolist() if apart is not None else ():
        away[group_of[op]] = True
    comps = _ComponentDag(graph, group_of, ng)
    for u in range(graph.num_ops):
        succ = graph.successors[u]
        if len(succ) != 1:
            continue
        gu, gv = uf.find(group_of[u]), uf.find(group_of[succ[0]])
        if gu == gv:
            continue
        pu, pv = pin.get(gu), pin.get(gv)
        both = merged_device_name(pu, pv) if pu is not None and pv is not None else pu or pv
        if pu is not None and pv is not None and both is None:
            continue  # pinned to two devices
        if away[gu] != away[gv]:
            continue  # one of them runs on the host
        if not comps.merge(gu, gv):
            continue
        root = uf.union(gu, gv)
        away[root] = away[gu]
        names[root] = _shortest((names.pop(gu), names.pop(gv)))
        pin.pop(gu, None)
        pin.pop(gv, None)
        if both is not None:
            pin[root] = both
    op_uf = UnionFind(graph.num_ops)
    first_op: dict[int, int] = {}
    for op, g in enumerate(group_of):
        op_uf.union(first_op.setdefault(uf.find(g), op), op)
    candidates = {first_op[g]: {name} for g, name in names.items()}
    return _finish(graph, op_uf, candidates)


class _ComponentDag:
    """Strongly connected components of the group graph, kept topologically ranked.

    `merge(a, b)` joins the components of groups a and b unless that would close a new cycle,
    using the bounded forward and backward searches of Pearce and Kelly ("A dynamic topological
    sort algorithm for directed acyclic graphs", JEA 2007) and their reordering of ranks.
    """

    def __init__(self, graph: OpGraph, group_of: list[int], num_groups: int) -> None:
        succ: list[set[int]] = [set() for _ in range(num_groups)]
        for s, d in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
            gs, gd = group_of[s], group_of[d]
            if gs != gd:
                succ[gs].add(gd)
        comp_of = _tarjan(succ)
        nc = max(comp_of, default=-1) + 1
        self.uf = UnionFind(nc)
        self.comp_of = comp_of
        self.succ: list[set[int]] = [set() for _ in range(nc)]
        self.pred: list[set[int]] = [set() for _ in range(nc)]
        for g, targets in enumerate(succ):
            for h in targets:
                a, b = comp_of[g], comp_of[h]
                if a != b:
                    self.succ[a].add(b)
                    self.pred[b].add(a)
        self.rank = self._late_ranks(nc)

    def _late_ranks(self, nc: int) -> list[int]:
        """A topological rank of the components that puts each one as late as it can go.

        Components are ranked from the sinks back, depth first, so a group with one successor
        lands right before it: the bounded searches of `merge` then see few components between
        the two it joins, which keeps coplace near linear on chains of single-consumer ops.
        """
        out_left = [len(s) for s in self.succ]
        stack = [c for c in range(nc - 1, -1, -1) if out_left[c] == 0]
        rank = [0] * nc
        next_rank = nc - 1
        while stack:
            c = stack.pop()
            rank[c] = next_rank
            next_rank -= 1
            for p in sorted(self.pred[c], reverse=True):
                out_left[p] -= 1
                if out_left[p] == 0:
                    stack.append(p)
        return rank

    def merge(self, ga: int, gb: int) -> bool:
        a, b = self.uf.find(self.comp_of[ga]), self.uf.find(self.comp_of[gb])
        if a == b:
            return True
        if self.rank[a] > self.rank[b]:
            a, b = b, a
        lo, hi = self.rank[a], self.rank[b]
        forward = self._search(a, b, self.succ, lambda r: r < hi)
        if forward is None:
            return False  # a reaches b through another component: merging closes a cycle
        backward = self._search(b, a, self.pred, lambda r: r > lo)
        if backward is None:
            return False
        slots = sorted([lo, hi] + [self.rank[c] for c in forward] + [self.rank[c] for c in backward])
        order = sorted(backward, key=self.rank.__getitem__) + [a] + sorted(
            forward, key=self.rank.__getitem__
        )
        for c, r in zip(order, slots):
            self.rank[c] = r
        self._contract(a, b)
        return True

    def _search(self, start, avoid, edges, in_bounds) -> Optional[list[int]]:
        return bounded_search(start, avoid, edges, self.rank, in_bounds)[0]

    def _contract(self, a: int, b: int) -> None:
        keep = self.uf.union(a, b)
        gone = b if keep == a else a
        for x in self.succ[gone]:
            self.pred[x].discard(gone)
            if x != keep:
                self.pred[x].add(keep)
                self.succ[keep].add(x)
        for x in self.pred[gone]:
            self.succ[x].discard(gone)
            if x != keep:
                self.succ[x].add(keep)
                self.pred[keep].add(x)
        self.succ[keep].discard(gone)
        self.pred[keep].discard(gone)
        self.succ[keep].discard(keep)
        self.pred[keep].discard(keep)
        self.succ[gone] = set()
        self.pred[gone] = set()
        self.rank[keep] = self.rank[a]  # `a` holds the merged component's slot


def bounded_search(
    start: int, avoid: int, edges, rank, in_bounds: Callable[[int], bool], budget: float = math.inf
) -> tuple[Optional[list[int]], float]:
    """The nodes reachable from `start` (not through its direct edge to `avoid`) whose rank is
    within bounds, and the budget left after one unit per node found. The nodes are None when
    `avoid` is reached through another node (joining the two would close a cycle) or when the
    budget runs out (budget left < 0). The search of Pearce and Kelly (JEA 2007) in a DAG kept
    in topological rank order."""
    seen = {start}
    stack = [x for x in edges[start] if x != avoid]
    found: list[int] = []
    while stack:
        x = stack.pop()
        if x in seen or not in_bounds(rank[x]):
            continue
        seen.add(x)
        found.append(x)
        budget -= 1
        if budget < 0:
            return None, budget
        for y in edges[x]:
            if y == avoid:
                return None, budget
            if y not in seen:
                stack.append(y)
    return found, budget


def _tarjan(succ: list[set[int]]) -> list[int]:
    """Iterative Tarjan: component id of each node, in reverse topological order of components."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    counter = 0
    ncomp = 0
    adj = [sorted(s) for s in succ]
    for root in range(n):
        if index[root] != -1:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            if i < len(adj[v]):
                work[-1] = (v, i + 1)
                w = adj[v][i]
                if index[w] == -1:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
    return comp


def make_groups(graph: OpGraph, grouper: str = "tf", *, apart: Optional[np.ndarray] = None) -> Groups:
    """Runs the named grouper: ``'tf'`` (colocation only) or ``'coplace'`` (with `apart`, see
    `coplace`)."""
    if grouper == "tf":
        return colocation_groups(graph)
    if grouper == "coplace":
        return coplace(graph, apart=apart)
    raise ConfigError(f"unknown grouper {grouper!r}; choose one of {', '.join(GROUPERS)}")
