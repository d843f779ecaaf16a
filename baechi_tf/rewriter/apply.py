"""Placement + GraphDef -> a placed GraphDef in which only ``device`` fields changed.

`apply_placement` copies its input and sets the ``device`` of every node the placement names;
nothing else changes (attributes, ``_class`` colocation, the function library, versions), and the
input is never mutated. Protobuf only: this module does not import TensorFlow.

Time and memory: O(size of the GraphDef).
"""

from __future__ import annotations

from typing import Any, Mapping

from baechi_tf.errors import InvalidGraphError

__all__ = ["apply_placement"]


def apply_placement(graph_def: Any, op_to_device: Mapping[str, str]) -> Any:
    """A copy of `graph_def` whose nodes are on the devices `op_to_device` gives them.

    Nodes the mapping does not name keep their device; a name the graph does not have is an
    `InvalidGraphError` (the placement is of another graph).
    """
    names = {node.name for node in graph_def.node}
    unknown = [name for name in op_to_device if name not in names]
    if unknown:
        raise InvalidGraphError(
            f"the placement names {len(unknown)} ops the GraphDef does not have (first: "
            f"{unknown[0]!r}); place this graph, not another one"
        )
    placed = type(graph_def)()
    placed.CopyFrom(graph_def)
    for node in placed.node:
        device = op_to_device.get(node.name)
        if device is not None:
            node.device = device
    return placed
