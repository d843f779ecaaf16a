"""What building a model returns: graph, loss, inputs with synthetic values, and expert layout."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from baechi_tf.models.layout import ExpertLayout

__all__ = ["ModelSpec"]


@dataclasses.dataclass(frozen=True, eq=False)
class ModelSpec:
    """A model built into its own ``tf.Graph`` (no device fields: every op is free to place).

    Run a step with ``sess.run(target, feed_dict=spec.feeds)``. The feeds are keyed by tensor
    name, so they also feed a graph imported from ``spec.graph.as_graph_def()`` (placed or not).
    """

    name: str  # 'gnmt_v2', 'gnmt', 'inception_v3' or 'transformer'
    hparams: Any  # the model's frozen hyper-parameter dataclass
    graph: tf.Graph
    loss: tf.Tensor  # scalar training loss; the forward target (--only_forward)
    logits: tf.Tensor
    inputs: Mapping[str, tf.Tensor]  # placeholders by role, e.g. 'src', 'images'
    feeds: Mapping[str, np.ndarray]  # placeholder tensor name -> synthetic value (fixed seed)
    expert_layout: ExpertLayout  # the model's hand layout over its logical devices

    def expert_placement(
        self,
        devices: Sequence[str],
        graph: Optional[Union[tf.Graph, tf.compat.v1.GraphDef]] = None,
    ) -> dict[str, str]:
        """``op name -> device`` of the hand layout for `graph` (default: ``self.graph``).

        Pass the graph after adding the training ops to place those too: gradients and
        optimizer updates follow their forward ops (see `ExpertLayout`).
        """
        return self.expert_layout.placement(self.graph if graph is None else graph, devices)
