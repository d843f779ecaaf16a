"""Building blocks of the models, written with plain ``tf.compat.v1`` ops (no Keras, no contrib).

Variables are resource variables made by ``tf.compat.v1.get_variable`` and read **once**, where
they are created: every user shares that one ``ReadVariableOp``, as TF1's ``<var>/read`` was
shared, so the per-step ops of an unrolled RNN do not each read the variable.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

__all__: list[str] = []  # private helpers of baechi_tf.models


def variable(
    name: str,
    shape: list[int],
    initializer: Optional[Any] = None,
    *,
    trainable: bool = True,
) -> tuple[tf.Variable, tf.Tensor]:
    """A resource variable in the current variable scope and its single read."""
    var = tf1.get_variable(
        name, shape, dtype=tf.float32, initializer=initializer, trainable=trainable,
        use_resource=True,
    )
    return var, var.value()


def weight(name: str, shape: list[int], initializer: Optional[Any] = None) -> tf.Tensor:
    """The read of a new trainable variable (Glorot-uniform unless `initializer` is given)."""
    return variable(name, shape, initializer)[1]


def dense(x: tf.Tensor, units: int, name: str, *, use_bias: bool = True) -> tf.Tensor:
    """``x @ W (+ b)`` for a 2-D `x`; variables ``<name>/kernel`` and ``<name>/bias``."""
    with tf1.variable_scope(name):
        kernel = weight("kernel", [int(x.shape[-1]), units])
        y = tf.matmul(x, kernel)
        if use_bias:
            y = tf.nn.bias_add(y, weight("bias", [units], tf1.zeros_initializer()))
    return y


@contextlib.contextmanager
def colocation_group(enabled: bool, name: str) -> Iterator[None]:
    """Ops made inside form one TF colocation group around ``no_op(name)`` (if `enabled`).

    This is the original's ``ColocationWrapper``: each op gets ``_class: loc:@<no_op>``.
    """
    if not enabled:
        yield
        return
    anchor = tf.no_op(name=name)
    with tf1.colocate_with(anchor):
        yield


def lstm_step(
    x: tf.Tensor,
    state: tuple[tf.Tensor, tf.Tensor],
    kernel: tf.Tensor,
    bias: tf.Tensor,
    forget_bias: float,
) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor]]:
    """One LSTM step (the gate layout of LSTMBlockCell: i, j, f, o); returns (h, (c, h))."""
    c, h = state
    gates = tf.nn.bias_add(tf.matmul(tf.concat([x, h], 1), kernel), bias)
    i, j, f, o = tf.split(gates, 4, axis=1)
    new_c = c * tf.sigmoid(f + forget_bias) + tf.sigmoid(i) * tf.tanh(j)
    new_h = tf.tanh(new_c) * tf.sigmoid(o)
    return new_h, (new_c, new_h)


def gru_step(
    x: tf.Tensor,
    h: tf.Tensor,
    gate_kernel: tf.Tensor,
    gate_bias: tf.Tensor,
    candidate_kernel: tf.Tensor,
    candidate_bias: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor]:
    """One GRU step (GRUBlockCellV2's equations); returns (h, h)."""
    r_u = tf.sigmoid(tf.nn.bias_add(tf.matmul(tf.concat([x, h], 1), gate_kernel), gate_bias))
    r, u = tf.split(r_u, 2, axis=1)
    candidate = tf.tanh(
        tf.nn.bias_add(tf.matmul(tf.concat([x, r * h], 1), candidate_kernel), candidate_bias)
    )
    new_h = u * h + (1.0 - u) * candidate
    return new_h, new_h


def sequence_loss(logits: tf.Tensor, labels: tf.Tensor, batch_size: int) -> tf.Tensor:
    """Sparse softmax cross entropy summed over all positions, divided by the batch size."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits, name="xentropy"
    )
    return tf.math.divide(tf.reduce_sum(losses), float(batch_size), name="loss")


def token_inputs(
    batch_size: int, seq_length: int, vocab_size: int, seed: int
) -> tuple[dict[str, tf.Tensor], dict[str, np.ndarray]]:
    """Placeholders ``inputs/src``, ``inputs/tgt_in``, ``inputs/tgt_out`` (int32 [B, T]) and
    their synthetic values: token ids drawn uniformly with a fixed seed."""
    rng = np.random.default_rng(seed)
    inputs, feeds = {}, {}
    with tf1.name_scope("inputs"):
        for role in ("src", "tgt_in", "tgt_out"):
            ph = tf1.placeholder(tf.int32, [batch_size, seq_length], name=role)
            inputs[role] = ph
            feeds[ph.name] = rng.integers(0, vocab_size, (batch_size, seq_length), dtype=np.int32)
    return inputs, feeds
