"""The real training graphs that bench/fidelity_memory.py (and the time half of bench/fidelity.py)
places, runs and measures.

Each graph is one training step built into its own ``tf.compat.v1`` graph without device fields,
returned as a `FidelityGraph`: the GraphDef to profile and place, the names of the step's target
and of the variables' initializers, and feeds keyed by tensor name (so they feed any placed copy
imported from the GraphDef). The set:

* ``gnmt_v2``, ``inception_v3``, ``transformer``: baechi_tf.models at the small sizes of
  bench/make_profiles.py (Adam, SGD for Inception-v3), gradients colocated with their ops; they
  carry their expert layout.
* ``resnet50``, ``mobilenetv2``: tf_keras applications (``weights=None``), one Momentum step as
  bench/keras_graphs.py builds it, at `KERAS_BATCH` images of `KERAS_IMAGE_SIZE` pixels and
  `KERAS_CLASSES` classes. Their graphs keep the functional model's construction ops, which the
  step never runs. Needs ``pip install --no-deps tf-keras==2.21.0``; this module sets
  ``TF_USE_LEGACY_KERAS=1``, which must be set before TensorFlow is imported.
* ``rnn``: a language model of `RNN_LAYERS` LSTM layers unrolled over `RNN_STEPS` steps, written
  with plain ops (baechi_tf.models' `lstm_step`), trained with Adam.

Building a graph takes a few seconds (ResNet50, some 9.5k ops, the longest).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf_keras 2.x, not Keras 3: read when TF loads
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

__all__ = ["FIDELITY_GRAPHS", "FidelityGraph", "Runnable", "build", "runnable"]

KERAS_BATCH, KERAS_IMAGE_SIZE, KERAS_CLASSES = 8, 64, 100
RNN_BATCH, RNN_STEPS, RNN_LAYERS, RNN_UNITS, RNN_VOCAB = 32, 20, 2, 256, 2000


@dataclasses.dataclass(frozen=True, eq=False)
class FidelityGraph:
    """One training step, unplaced, and what running it needs."""

    name: str
    graph_def: Any  # tf.compat.v1.GraphDef, no device fields
    target: str  # name of the op one step runs
    init: tuple[str, ...]  # names of the variables' initializer ops
    feeds: Mapping[str, Any]  # tensor name -> numpy value
    # devices -> op name -> device of the model's hand layout; None when the model has none
    expert: Optional[Callable[[Sequence[str]], Mapping[str, str]]] = None


def _from_model(name: str) -> FidelityGraph:
    """A baechi_tf.models graph at bench/make_profiles.py's size, as train.py builds it."""
    import tensorflow as tf

    from make_profiles import MODELS
    from train import TrainConfig, build_graph

    hparams, optimizer = MODELS[name]
    built = build_graph(TrainConfig(name, hparams, optimizer=optimizer, colocate_grads_with_ops=True))
    with built.spec.graph.as_default():
        init = tuple(v.initializer.name for v in tf.compat.v1.global_variables())
    graph_def = built.graph_def
    return FidelityGraph(
        name=name, graph_def=graph_def, target=built.target.name, init=init,
        feeds=dict(built.spec.feeds),
        expert=lambda devices: built.spec.expert_placement(devices, graph_def),
    )


def _from_keras(name: str) -> FidelityGraph:
    """A tf_keras application's Momentum step, as bench/keras_graphs.py builds it."""
    import keras_graphs

    graph, _, train_op, init, feeds = keras_graphs.build(name, KERAS_BATCH, KERAS_IMAGE_SIZE, KERAS_CLASSES)
    return FidelityGraph(
        name=name, graph_def=graph.as_graph_def(), target=train_op.name, init=(init.name,),
        feeds={t.name: v for t, v in feeds.items()},
    )


def _rnn() -> FidelityGraph:
    """An LSTM language model, `RNN_LAYERS` layers of `RNN_UNITS` unrolled over `RNN_STEPS`."""
    import tensorflow as tf

    from baechi_tf.models._layers import lstm_step, sequence_loss, token_inputs, weight

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        inputs, feeds = token_inputs(RNN_BATCH, RNN_STEPS, RNN_VOCAB, seed=1)
        table = weight("embedding", [RNN_VOCAB, RNN_UNITS])
        layer = tf.unstack(tf.nn.embedding_lookup(table, inputs["src"]), axis=1)
        for k in range(RNN_LAYERS):
            with tf1.variable_scope(f"lstm{k}"):
                kernel = weight("kernel", [2 * RNN_UNITS, 4 * RNN_UNITS])
                bias = weight("bias", [4 * RNN_UNITS], tf1.zeros_initializer())
                zeros = tf.zeros([RNN_BATCH, RNN_UNITS])
                state, outputs = (zeros, zeros), []
                for t, x in enumerate(layer):
                    with tf.name_scope(f"t{t}"):
                        h, state = lstm_step(x, state, kernel, bias, forget_bias=1.0)
                    outputs.append(h)
                layer = outputs
        with tf1.variable_scope("softmax"):
            logits = tf.matmul(tf.concat(layer, 0), weight("w", [RNN_UNITS, RNN_VOCAB]))
        labels = tf.reshape(tf.transpose(inputs["tgt_out"]), [-1])
        loss = sequence_loss(logits, labels, RNN_BATCH)
        train_op = tf1.train.AdamOptimizer(0.001).minimize(loss, colocate_gradients_with_ops=True)
        init = tuple(v.initializer.name for v in tf1.global_variables())
    return FidelityGraph(name="rnn", graph_def=graph.as_graph_def(), target=train_op.name, init=init,
                         feeds=feeds)


FIDELITY_GRAPHS: dict[str, Callable[[], FidelityGraph]] = {
    "gnmt_v2": lambda: _from_model("gnmt_v2"),
    "inception_v3": lambda: _from_model("inception_v3"),
    "transformer": lambda: _from_model("transformer"),
    "resnet50": lambda: _from_keras("resnet50"),
    "mobilenetv2": lambda: _from_keras("mobilenetv2"),
    "rnn": _rnn,
}


def build(name: str) -> FidelityGraph:
    """The graph `name` of `FIDELITY_GRAPHS`, built anew."""
    return FIDELITY_GRAPHS[name]()


@dataclasses.dataclass(frozen=True, eq=False)
class Runnable:
    """A (placed) copy of a `FidelityGraph` imported into a graph of its own."""

    graph: Any  # tf.Graph
    target: Any  # tf.Operation
    init: list  # tf.Operation
    feeds: dict  # tf.Tensor -> numpy value


def runnable(case: FidelityGraph, graph_def: Any = None) -> Runnable:
    """`graph_def` (default: the case's own, unplaced) imported into a new graph, with the
    case's target, initializers and feeds looked up in it."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(case.graph_def if graph_def is None else graph_def, name="")
    return Runnable(
        graph=graph,
        target=graph.get_operation_by_name(case.target),
        init=[graph.get_operation_by_name(n) for n in case.init],
        feeds={graph.get_tensor_by_name(k): v for k, v in case.feeds.items()},
    )
