"""Disjoint sets of the integers 0..n-1 (union-find), the one used by grouping and fusion.

`find` walks to the root, then points every element it passed at the root (path compression,
iteratively: TF graphs pass Python's recursion limit), O(log n) amortised. The callers choose
each union's root (`union`: the smaller one; `fold`: the one named), and their results (group
numbers, fused ops' names) depend on that choice, so there is no union by rank.
"""

from __future__ import annotations

__all__ = ["UnionFind"]


class UnionFind:
    """Disjoint sets of 0..n-1, each named by its root element."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        """The root of `x`'s set."""
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:  # path compression, iteratively
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> int:
        """Joins the sets of `a` and `b`; returns the root of the union, the smaller root."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if rb < ra:
                ra, rb = rb, ra
            self.parent[rb] = ra
        return ra

    def fold(self, root: int, into: int) -> None:
        """Joins the set of the root `root` to that of the root `into`, which stays its root."""
        self.parent[root] = into
