"""The Transformer (Vaswani et al., 2017), encoder-decoder, with plain ops.

The Baechi paper (SoCC 2020) placed a Transformer; the original repository has none, so this is
the paper's base model: ``num_layers`` = 6 encoder and 6 decoder layers, ``d_model`` 512,
``num_heads`` 8, ``d_ff`` 2048, dropout 0.1, sinusoidal positions, post-layer-norm residual
sub-layers (self-attention, for the decoder causal self-attention then attention over the
encoder output, then a ReLU feed-forward layer). Attention projections have no bias (as in
tensor2tensor). Source and target embeddings are separate tables scaled by sqrt(d_model); the
output projection [d_model, V] has no bias; the loss is the sparse softmax cross entropy summed
and divided by the batch size, as GNMT's. Inputs are GNMT's: token ids [B, T] for the source,
the decoder input and the decoder target.

Expert layout, GNMT's convention (the original had none for this model): embeddings on device 0,
encoder layer i and decoder layer i on ``i % num_gpus``, projection and loss on
``(L if L < G else L-1) % G``.

Graph size: O(num_layers) ops, each with tensors of O(B * T * d_model + B * heads * T^2).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from baechi_tf.models import _layers
from baechi_tf.models._layers import dense, tf1, weight
from baechi_tf.models.hparams import TransformerHParams
from baechi_tf.models.layout import ExpertLayout
from baechi_tf.models.spec import ModelSpec

__all__ = ["TransformerHParams", "build_transformer", "transformer_expert_layout"]


def _positions(length: int, width: int) -> np.ndarray:
    """The sinusoidal position encodings [length, width]."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    rates = np.exp(-math.log(10000.0) * (np.arange(0, width, 2, dtype=np.float64) / width))
    table = np.zeros([length, width], dtype=np.float64)
    table[:, 0::2] = np.sin(pos * rates)
    table[:, 1::2] = np.cos(pos * rates[: width // 2])
    return table.astype(np.float32)


class _Builder:
    def __init__(self, hp: TransformerHParams):
        self.hp = hp
        self.rows = hp.batch_size * hp.max_seq_length

    def dropout(self, x: tf.Tensor) -> tf.Tensor:
        return tf.nn.dropout(x, rate=self.hp.dropout) if self.hp.dropout > 0 else x

    def embed(self, scope: str, ids: tf.Tensor) -> tf.Tensor:
        """[B*T, d_model]: scaled embeddings plus positions."""
        hp = self.hp
        with tf1.variable_scope(scope):
            table = tf1.get_variable("table", [hp.vocab_size, hp.d_model], dtype=tf.float32,
                                     use_resource=True)
            x = tf.nn.embedding_lookup(table, ids) * math.sqrt(hp.d_model)
            x = x + tf.constant(_positions(hp.max_seq_length, hp.d_model), name="positions")
            return self.dropout(tf.reshape(x, [self.rows, hp.d_model]))

    def layer_norm(self, x: tf.Tensor, scope: str) -> tf.Tensor:
        with tf1.variable_scope(scope):
            gamma = weight("gamma", [self.hp.d_model], tf1.ones_initializer())
            beta = weight("beta", [self.hp.d_model], tf1.zeros_initializer())
            mean, variance = tf.nn.moments(x, [1], keepdims=True)
            return (x - mean) * tf.math.rsqrt(variance + 1e-6) * gamma + beta

    def _heads(self, x: tf.Tensor) -> tf.Tensor:
        hp = self.hp
        x = tf.reshape(x, [hp.batch_size, hp.max_seq_length, hp.num_heads,
                           hp.d_model // hp.num_heads])
        return tf.transpose(x, [0, 2, 1, 3])

    def attention(self, query: tf.Tensor, memory: tf.Tensor, scope: str, causal: bool):
        hp = self.hp
        with tf1.variable_scope(scope):
            q = self._heads(dense(query, hp.d_model, "q", use_bias=False))
            k = self._heads(dense(memory, hp.d_model, "k", use_bias=False))
            v = self._heads(dense(memory, hp.d_model, "v", use_bias=False))
            scores = tf.matmul(q, k, transpose_b=True) * (hp.d_model // hp.num_heads) ** -0.5
            if causal:
                t = hp.max_seq_length
                future = np.triu(np.full([t, t], -1e9, dtype=np.float32), 1)
                scores = scores + tf.constant(future, name="causal_mask")
            context = tf.matmul(self.dropout(tf.nn.softmax(scores)), v)
            context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [self.rows, hp.d_model])
            return dense(context, hp.d_model, "output", use_bias=False)

    def feed_forward(self, x: tf.Tensor, scope: str) -> tf.Tensor:
        with tf1.variable_scope(scope):
            return dense(tf.nn.relu(dense(x, self.hp.d_ff, "inner")), self.hp.d_model, "outer")

    def residual(self, x: tf.Tensor, sublayer: tf.Tensor, norm_scope: str) -> tf.Tensor:
        return self.layer_norm(x + self.dropout(sublayer), norm_scope)

    def encoder(self, x: tf.Tensor) -> tf.Tensor:
        for i in range(self.hp.num_layers):
            with tf1.variable_scope(f"encoder/layer_{i}"):
                x = self.residual(x, self.attention(x, x, "self_attention", False),
                                  "self_attention_norm")
                x = self.residual(x, self.feed_forward(x, "ffn"), "ffn_norm")
        return x

    def decoder(self, x: tf.Tensor, memory: tf.Tensor) -> tf.Tensor:
        for i in range(self.hp.num_layers):
            with tf1.variable_scope(f"decoder/layer_{i}"):
                x = self.residual(x, self.attention(x, x, "self_attention", True),
                                  "self_attention_norm")
                x = self.residual(x, self.attention(x, memory, "cross_attention", False),
                                  "cross_attention_norm")
                x = self.residual(x, self.feed_forward(x, "ffn"), "ffn_norm")
        return x


def transformer_expert_layout(hp: TransformerHParams) -> ExpertLayout:
    g, layers = hp.num_gpus, hp.num_layers
    output = (layers if layers < g else layers - 1) % g
    rules = [("encoder/embedding/", 0), ("decoder/embedding/", 0),
             ("output_projection/", output), ("loss/", output)]
    for i in range(layers):
        rules += [(f"encoder/layer_{i}/", i % g), (f"decoder/layer_{i}/", i % g)]
    return ExpertLayout(num_devices=g, rules=tuple(rules))


def build_transformer(hp: TransformerHParams, graph: tf.Graph) -> ModelSpec:
    """Builds the Transformer into `graph` (which should be empty) and returns its `ModelSpec`."""
    b, t, v = hp.batch_size, hp.max_seq_length, hp.vocab_size
    with graph.as_default():
        tf1.set_random_seed(hp.seed)
        inputs, feeds = _layers.token_inputs(b, t, v, hp.seed)
        net = _Builder(hp)
        memory = net.encoder(net.embed("encoder/embedding", inputs["src"]))
        decoded = net.decoder(net.embed("decoder/embedding", inputs["tgt_in"]), memory)
        with tf1.variable_scope("output_projection"):
            logits = tf.reshape(dense(decoded, v, "dense", use_bias=False), [b, t, v],
                                name="logits")
        with tf1.name_scope("loss/"):
            loss = _layers.sequence_loss(logits, inputs["tgt_out"], b)
    return ModelSpec(
        name="transformer", hparams=hp, graph=graph, loss=loss, logits=logits, inputs=inputs,
        feeds=feeds, expert_layout=transformer_expert_layout(hp),
    )
