"""A model's hand-made ("expert") device layout, as rules on op names.

The original GNMT wrapped each layer in ``tf.device('/gpu:<i % num_gpus>')`` while building it
(Baechi, SoCC 2020, section 9 of the reference description). Our models build graphs without
device fields, so that a placer is free to place every op; each model records instead which name
scope goes to which logical device, and :meth:`ExpertLayout.placement` turns those rules into
``op name -> device`` for any graph built from the model, the training ops included:

1. an op in a TF colocation group (``_class: loc:@<root>``) goes where ``<root>`` goes (the
   gradients made with ``colocate_gradients_with_ops`` and the optimizer's slots and updates);
2. otherwise the longest rule prefix of its name decides, after dropping a leading
   ``gradients/`` scope (gradients made without colocation);
3. otherwise the layout's default device.

Cost: O(ops * rules) time, O(ops) memory.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence, Union

import tensorflow as tf

from baechi_tf.errors import ConfigError

__all__ = ["ExpertLayout"]

_GRADIENT_SCOPE = re.compile(r"^gradients(?:_\d+)?/")


@dataclasses.dataclass(frozen=True)
class ExpertLayout:
    """Op-name prefixes mapped to logical device indices 0 .. num_devices-1."""

    num_devices: int  # logical devices the layout uses (GNMT: --num_gpus)
    rules: tuple[tuple[str, int], ...]  # (op-name prefix ending in '/', logical device)
    default_device: int = 0  # for ops no rule matches (inputs, optimizer bookkeeping)

    def __post_init__(self) -> None:
        if self.num_devices < 1:
            raise ConfigError(f"an expert layout needs at least one device, not {self.num_devices}")
        for prefix, index in self.rules:
            if not 0 <= index < self.num_devices:
                raise ConfigError(
                    f"expert rule {prefix!r} -> device {index} is outside 0..{self.num_devices - 1}"
                )
        # Longest prefix first, so that the first match is the most specific.
        ordered = tuple(sorted(self.rules, key=lambda rule: (-len(rule[0]), rule[0])))
        object.__setattr__(self, "rules", ordered)

    def device_index(self, op_name: str) -> int:
        """The logical device of an op by its name alone (steps 2 and 3 above)."""
        name = _GRADIENT_SCOPE.sub("", op_name)
        for prefix, index in self.rules:
            if name.startswith(prefix):
                return index
        return self.default_device

    def placement(
        self, graph: Union[tf.Graph, tf.compat.v1.GraphDef], devices: Sequence[str]
    ) -> dict[str, str]:
        """``op name -> devices[logical device]`` for every op of `graph`."""
        devices = list(devices)
        if len(devices) < self.num_devices:
            raise ConfigError(
                f"the expert layout uses {self.num_devices} devices but {len(devices)} were "
                "given: pass as many devices as the model's num_gpus"
            )
        graph_def = graph.as_graph_def() if isinstance(graph, tf.Graph) else graph
        out = {}
        for node in graph_def.node:
            root = node.name
            if "_class" in node.attr:
                groups = [s.decode() for s in node.attr["_class"].list.s if s.startswith(b"loc:@")]
                if groups:
                    root = groups[0][len("loc:@"):]
            out[node.name] = devices[self.device_index(root)]
        return out
