"""`OpGraphBuilder`: an `OpGraph` built op by op and edge by edge, by name.

The importers (`baechi_tf.rewriter.importer`, `baechi_tf.json_io`) and the tests build graphs with
it; `OpGraph.from_arrays` is the other way in, from whole arrays. Names are checked as they are
added (a repeated op name, an edge naming an op not added, an output slot that is no slot), the
rest when `build` validates the graph. Adding an op or an edge is O(1); `build` is
`OpGraph.from_arrays`'s time, O((V + E) log(V + E)) for V ops and E edges.
"""

from __future__ import annotations

import types
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from baechi_tf.errors import InvalidGraphError
from baechi_tf.graph import CONTROL, HELD, OpGraph

__all__ = ["OpGraphBuilder"]


class OpGraphBuilder:
    """Builds an `OpGraph` op by op, by name.

    >>> b = OpGraphBuilder()
    >>> b.add_op("a", compute_us=10, output_bytes=[400])
    0
    >>> b.add_op("b", compute_us=5)
    1
    >>> b.add_edge("a", "b")
    >>> b.build().num_edges
    1
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._ops: list[tuple] = []
        # The edges' columns, repeats included: `OpGraph.from_arrays` keeps first occurrences.
        self._src: list[int] = []
        self._dst: list[int] = []
        self._out: list[int] = []
        self._aliases: list[tuple] = []

    def add_op(
        self,
        name: str,
        compute_us: float = 0.0,
        output_bytes: Iterable[int] = (),
        temp_bytes: int = 0,
        persistent_bytes: int = 0,
        device: Optional[str] = None,
        colocation: Iterable[str] = (),
        op_type: str = "",
        output_alias: Iterable[Optional[tuple[str, int]]] = (),
    ) -> int:
        """Adds an op and returns its id; raises `InvalidGraphError` on a repeated name.

        `output_alias`: per output slot, None, HELD, or (name of the producer, slot) of a data
        input whose buffer the output is (`OpGraph.output_alias`); empty: every output its own."""
        if name in self._ids:
            raise InvalidGraphError(f"op name {name!r} is used by two ops; op names must be unique")
        op = len(self._ops)
        self._ids[name] = op
        self._ops.append(
            (name, compute_us, tuple(output_bytes), temp_bytes, persistent_bytes, device,
             tuple(colocation), op_type)
        )
        self._aliases.append(tuple(output_alias))
        return op

    def _id(self, name: str, src: str, dst: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise InvalidGraphError(
                f"edge {src!r} -> {dst!r} names op {name!r}, which is not in the graph: "
                "add the op or drop the edge"
            ) from None

    def add_edge(self, src: str, dst: str, src_output: int = 0) -> None:
        """Adds a data edge carrying output `src_output` of `src`; a repeat is ignored."""
        s, d = self._id(src, src, dst), self._id(dst, src, dst)
        if (
            isinstance(src_output, bool)
            or not isinstance(src_output, (int, np.integer))
            or not 0 <= src_output < (1 << 31)
        ):
            # -1 is how edges store CONTROL: a data edge given it would silently carry no bytes.
            raise InvalidGraphError(
                f"edge {src!r} -> {dst!r} reads output {src_output!r} of {src!r}; an output slot "
                "is an integer from 0 to 2**31 - 1 (use a control edge for ordering only)"
            )
        self._add(s, d, int(src_output))

    def add_control_edge(self, src: str, dst: str) -> None:
        """Adds a control edge: `dst` runs after `src`, no tensor flows."""
        self._add(self._id(src, src, dst), self._id(dst, src, dst), CONTROL)

    def _add(self, s: int, d: int, o: int) -> None:
        self._src.append(s)
        self._dst.append(d)
        self._out.append(o)

    @property
    def ids(self) -> Mapping[str, int]:
        """Op name -> id, of the ops added so far (read-only)."""
        return types.MappingProxyType(self._ids)

    def add_edges_by_id(self, src: Sequence[int], dst: Sequence[int], src_output: Sequence[int]) -> None:
        """Adds edges given by op ids (`add_op`'s return values) and output slots (`CONTROL` for a
        control edge), in order; a repeat is ignored. For importers of large graphs: ids and slots
        are checked, with the ops' names in the message, when the graph is built."""
        if not len(src) == len(dst) == len(src_output):
            raise InvalidGraphError(
                f"add_edges_by_id got {len(src)} sources, {len(dst)} destinations and "
                f"{len(src_output)} output slots; give one of each per edge"
            )
        self._src.extend(src)
        self._dst.extend(dst)
        self._out.extend(src_output)

    def build(self) -> OpGraph:
        cols = list(zip(*self._ops)) if self._ops else [()] * 8
        return OpGraph.from_arrays(
            names=cols[0],
            compute_us=[float(x) for x in cols[1]],
            output_bytes=cols[2],
            temp_bytes=cols[3],
            persistent_bytes=cols[4],
            pinned_device=cols[5],
            colocation=cols[6],
            edge_src=self._src,
            edge_dst=self._dst,
            edge_src_output=self._out,
            op_types=cols[7],
            output_alias=[self._alias_ids(op, outs) for op, outs in enumerate(cols[2])],
        )

    def _alias_ids(self, op: int, outs: tuple) -> tuple:
        aliases = self._aliases[op] or (None,) * len(outs)
        out = []
        for a in aliases:
            if a is None or a == HELD:
                out.append(a)
            else:
                name = self._ops[op][0]
                out.append((self._id(a[0], a[0], name), int(a[1])))
        return tuple(out)
