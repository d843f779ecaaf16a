"""Small real TensorFlow graphs for the tests of the TensorFlow ends (not a test module).

`build_lstm` makes a two-layer LSTM regression model written with plain ops (Keras 3 has no
``tf.compat.v1`` RNN cells), trained with Adam, gradients colocated with their forward ops: a few
hundred ops. `profiled_lstm` profiles it once per test process, so that test modules share it.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import tensorflow as tf

BATCH, STEPS, INPUT_DIM, HIDDEN, OUTPUT_DIM = 4, 3, 6, 16, 3


@dataclasses.dataclass(frozen=True)
class LstmModel:
    graph: tf.Graph
    inputs: tf.Tensor  # placeholder [BATCH, STEPS, INPUT_DIM]
    targets: tf.Tensor  # placeholder [BATCH, OUTPUT_DIM]
    predictions: tf.Tensor
    loss: tf.Tensor
    train_op: tf.Operation
    init: tf.Operation

    def feed(self, step: int = 0) -> dict:
        rng = np.random.RandomState(1000 + step)
        return {
            self.inputs: rng.standard_normal((BATCH, STEPS, INPUT_DIM)).astype(np.float32),
            self.targets: rng.standard_normal((BATCH, OUTPUT_DIM)).astype(np.float32),
        }

    def feed_by_name(self, step: int = 0) -> dict:
        return {t.name: v for t, v in self.feed(step).items()}


def _lstm_layer(inputs: list, hidden: int, name: str, use_resource: bool) -> list:
    in_dim = int(inputs[0].shape[1])
    with tf.compat.v1.variable_scope(name):
        kernel = tf.compat.v1.get_variable(
            "kernel", [in_dim + hidden, 4 * hidden], use_resource=use_resource
        )
        bias = tf.compat.v1.get_variable(
            "bias", [4 * hidden], initializer=tf.compat.v1.zeros_initializer(),
            use_resource=use_resource,
        )
        h = tf.zeros([BATCH, hidden])
        c = tf.zeros([BATCH, hidden])
        outputs = []
        for t, x in enumerate(inputs):
            with tf.name_scope(f"t{t}"):
                z = tf.matmul(tf.concat([x, h], axis=1), kernel) + bias
                i, j, f, o = tf.split(z, 4, axis=1)
                c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)
                h = tf.sigmoid(o) * tf.tanh(c)
            outputs.append(h)
    return outputs


def build_lstm(*, seed: int = 7, use_resource: bool = True) -> LstmModel:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        inputs = tf.compat.v1.placeholder(tf.float32, [BATCH, STEPS, INPUT_DIM], name="inputs")
        targets = tf.compat.v1.placeholder(tf.float32, [BATCH, OUTPUT_DIM], name="targets")
        layer = tf.unstack(inputs, axis=1)
        for k in range(2):
            layer = _lstm_layer(layer, HIDDEN, f"lstm{k}", use_resource)
        with tf.compat.v1.variable_scope("out"):
            w = tf.compat.v1.get_variable("w", [HIDDEN, OUTPUT_DIM], use_resource=use_resource)
            predictions = tf.matmul(layer[-1], w, name="predictions")
        loss = tf.reduce_mean(tf.square(predictions - targets), name="loss")
        optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
        train_op = optimizer.minimize(loss, colocate_gradients_with_ops=True, name="train")
        init = tf.compat.v1.global_variables_initializer()
    return LstmModel(graph, inputs, targets, predictions, loss, train_op, init)


@dataclasses.dataclass(frozen=True)
class Profiled:
    model: LstmModel
    graph_def: object  # GraphDef of model.graph
    profile: object  # CostProfile of one training fetch


@functools.lru_cache(maxsize=None)
def profiled_lstm() -> Profiled:
    """The LSTM model with a profile of its training step (two traced steps), made once."""
    from baechi_tf.cost_model import profile_fetch, profiling_config

    model = build_lstm()
    with tf.compat.v1.Session(graph=model.graph, config=profiling_config()) as sess:
        sess.run(model.init)
        profile = profile_fetch(
            sess, [model.loss, model.train_op], model.feed(), warmup_steps=1, traced_steps=2
        )
    return Profiled(model, model.graph.as_graph_def(), profile)
