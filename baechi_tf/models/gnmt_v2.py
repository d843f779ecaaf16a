"""GNMT v2 (Wu et al., 2016; the TF NMT tutorial's ``gnmt_v2``), statically unrolled.

As the model Baechi (SoCC 2020) placed, section 9 of the reference description:

- encoder: embedding [V, U]; one bidirectional layer (forward and backward cells, outputs
  concatenated to 2U); L-1 unidirectional layers, the top L-2 of them residual; outputs stacked.
- decoder: embedding [V, U]; L layers. The bottom layer is wrapped with Bahdanau (additive,
  unnormalised) attention over the encoder outputs: its input is the embedding concatenated with
  the previous step's attention, its output is the query. Every upper layer gets its input
  concatenated with the attention of the *current* step (v2; v1, ``gnmt``, uses the previous
  step's). Layers 2..L-1 are residual over their input without the attention part. The initial
  state is the encoder's: the bidirectional layer's backward state, then the L-1 layers' states.
- output: projection [U, V] without bias, sparse softmax cross entropy summed and divided by B.

Cells are written with plain ops (LSTM with the gate layout of ``LSTMBlockCell`` and forget bias
1.0, or GRU as ``GRUBlockCellV2``), unrolled over ``max_seq_length`` steps for source and target.

Colocation (``colocation=True``, ``--disable_nmt_colocation`` turns it off), the original's
``ColocationWrapper``: every (layer, time step) cell invocation is one TF colocation group
``<layer>/t<step>/colocation``; so are each embedding with its lookup, the projection and the
loss. The attention of each step is its own group whatever the flag (as in the original). The
concatenation that makes a decoder layer's input (``<layer>/t<step>/input``) stays outside the
group, as the original's did. Unlike the original, the first step of each layer is grouped too
(its variables are made outside it).

Expert layout (the original's ``tf.device`` round-robin over ``num_gpus``): bidirectional layer,
embeddings and attention on device 0; encoder layer l and decoder layer l on ``l % G``; the
stacked encoder and decoder outputs on ``(L-1) % G``; projection and loss on
``(L if L < G else L-1) % G``. A decoder layer's input concatenation goes with its layer (the
original built it outside the layer's ``tf.device``, so it ran on the default device, GPU 0).

Graph size: O(L * T) ops; seed size (B=128, T=40, V=30000, U=512, L=4, LSTM): see the tests.
"""

from __future__ import annotations

import tensorflow as tf

from baechi_tf.models import _layers
from baechi_tf.models._layers import colocation_group, tf1, weight
from baechi_tf.models.hparams import GNMTHParams
from baechi_tf.models.layout import ExpertLayout
from baechi_tf.models.spec import ModelSpec

__all__ = ["GNMTHParams", "build_gnmt", "gnmt_expert_layout"]


class _Cell:
    """The variables of one RNN layer and its step function."""

    def __init__(self, scope: str, hp: GNMTHParams, input_dim: int):
        units = hp.rnn_units
        self._lstm = hp.rnn_unit_type == "lstm"
        self._forget_bias = hp.forget_bias
        self._batch_size = hp.batch_size
        self._units = units
        with tf1.variable_scope(scope):
            if self._lstm:
                self._weights = (
                    weight("kernel", [input_dim + units, 4 * units]),
                    weight("bias", [4 * units], tf1.zeros_initializer()),
                )
            else:
                self._weights = (
                    weight("gates/kernel", [input_dim + units, 2 * units]),
                    weight("gates/bias", [2 * units], tf1.ones_initializer()),
                    weight("candidate/kernel", [input_dim + units, units]),
                    weight("candidate/bias", [units], tf1.zeros_initializer()),
                )

    def zero_state(self):
        zeros = tf.zeros([self._batch_size, self._units])
        return (zeros, zeros) if self._lstm else zeros

    def step(self, x, state):
        if self._lstm:
            return _layers.lstm_step(x, state, *self._weights, self._forget_bias)
        return _layers.gru_step(x, state, *self._weights)


def _run_step(cell, scope, x, state, *, hp, residual_input=None, zero_state=False):
    """One cell invocation in its own name scope and (optionally) colocation group."""
    with tf1.name_scope(scope + "/"), colocation_group(hp.colocation, "colocation"):
        if zero_state:
            state = cell.zero_state()
        out, new_state = cell.step(x, state)
        if residual_input is not None:
            out = out + residual_input
    return out, new_state


def _embed(scope: str, ids: tf.Tensor, hp: GNMTHParams) -> list[tf.Tensor]:
    """Embedding table and lookup (one colocation group), unstacked over time."""
    with tf1.variable_scope(scope):
        with colocation_group(hp.colocation, "embedding_noop"):
            table = tf1.get_variable(
                "table", [hp.vocab_size, hp.rnn_units], dtype=tf.float32, use_resource=True
            )
            embedded = tf.nn.embedding_lookup(table, ids)
        return tf.unstack(embedded, axis=1)


def _encoder(hp: GNMTHParams, inputs: list[tf.Tensor]):
    steps = range(hp.max_seq_length)
    units = hp.rnn_units
    fw = _Cell("encoder/bi/fw", hp, units)
    bw = _Cell("encoder/bi/bw", hp, units)
    fw_out, bw_out = [None] * len(inputs), [None] * len(inputs)
    state = None
    for t in steps:
        fw_out[t], state = _run_step(fw, f"encoder/bi/fw/t{t}", inputs[t], state, hp=hp,
                                     zero_state=t == 0)
    state = None
    for t in reversed(steps):
        bw_out[t], state = _run_step(bw, f"encoder/bi/bw/t{t}", inputs[t], state, hp=hp,
                                     zero_state=t == len(inputs) - 1)
    bw_state = state
    with tf1.name_scope("encoder/bi/outputs/"):
        outputs = [tf.concat([fw_out[t], bw_out[t]], 1, name=f"t{t}") for t in steps]

    layers = range(1, hp.num_layers)
    cells = {l: _Cell(f"encoder/layer_{l}", hp, 2 * units if l == 1 else units) for l in layers}
    states = {l: None for l in layers}
    top = []
    for t in steps:
        x = outputs[t]
        for l in layers:
            residual = x if hp.residual and l >= 2 else None
            x, states[l] = _run_step(cells[l], f"encoder/layer_{l}/t{t}", x, states[l], hp=hp,
                                     residual_input=residual, zero_state=t == 0)
        top.append(x)
    with tf1.name_scope("encoder/outputs/"):
        memory = tf.stack(top, axis=1, name="stack")
    return memory, [bw_state] + [states[l] for l in layers]


class _BahdanauAttention:
    """Additive attention over the encoder outputs; keys are projected once."""

    def __init__(self, memory: tf.Tensor, hp: GNMTHParams):
        b, t, u = hp.batch_size, hp.max_seq_length, hp.rnn_units
        self._memory = memory
        with tf1.variable_scope("decoder/attention"):
            memory_kernel = weight("memory_layer/kernel", [u, u])
            self._query_kernel = weight("query_layer/kernel", [u, u])
            self._v = weight("attention_v", [u])
            flat = tf.reshape(memory, [b * t, u])
            self._keys = tf.reshape(tf.matmul(flat, memory_kernel), [b, t, u], name="keys")
            self.initial = tf.zeros([b, u], name="initial_attention")

    def __call__(self, query: tf.Tensor, scope: str) -> tf.Tensor:
        with tf1.name_scope(scope + "/"), colocation_group(True, "colocation"):
            processed = tf.expand_dims(tf.matmul(query, self._query_kernel), 1)
            score = tf.reduce_sum(self._v * tf.tanh(self._keys + processed), [2])
            alignments = tf.nn.softmax(score)
            context = tf.matmul(tf.expand_dims(alignments, 1), self._memory)
            return tf.squeeze(context, [1], name="attention")


def _decoder(hp: GNMTHParams, inputs: list[tf.Tensor], memory: tf.Tensor, states: list):
    units = hp.rnn_units
    attention = _BahdanauAttention(memory, hp)
    layers = range(hp.num_layers)
    # Bottom layer: embedding + attention; upper layers: output below + attention.
    cells = [_Cell(f"decoder/layer_{i}", hp, 2 * units) for i in layers]
    previous = attention.initial
    top = []
    for t in range(hp.max_seq_length):
        with tf1.name_scope(f"decoder/layer_0/t{t}/"):
            x = tf.concat([inputs[t], previous], 1, name="input")
        x, states[0] = _run_step(cells[0], f"decoder/layer_0/t{t}", x, states[0], hp=hp)
        current = attention(x, f"decoder/attention/t{t}")
        feed = current if hp.use_new_attention else previous
        for i in layers[1:]:
            with tf1.name_scope(f"decoder/layer_{i}/t{t}/"):
                inp = tf.concat([x, feed], 1, name="input")
            residual = x if hp.residual and i >= 2 else None
            x, states[i] = _run_step(cells[i], f"decoder/layer_{i}/t{t}", inp, states[i], hp=hp,
                                     residual_input=residual)
        top.append(x)
        previous = current
    with tf1.name_scope("decoder/outputs/"):
        return tf.stack(top, axis=1, name="stack")


def gnmt_expert_layout(hp: GNMTHParams) -> ExpertLayout:
    """The original's round-robin of layers over ``hp.num_gpus`` devices (module docstring)."""
    g, top = hp.num_gpus, hp.num_layers - 1
    output = (hp.num_layers if hp.num_layers < g else top) % g
    rules = [("encoder/embedding/", 0), ("decoder/embedding/", 0), ("encoder/bi/", 0),
             ("decoder/attention/", 0), ("encoder/outputs/", top % g),
             ("decoder/outputs/", top % g), ("output_projection/", output), ("loss/", output)]
    rules += [(f"encoder/layer_{l}/", l % g) for l in range(1, hp.num_layers)]
    rules += [(f"decoder/layer_{i}/", i % g) for i in range(hp.num_layers)]
    return ExpertLayout(num_devices=g, rules=tuple(rules))


def build_gnmt(hp: GNMTHParams, graph: tf.Graph, name: str = "gnmt_v2") -> ModelSpec:
    """Builds GNMT into `graph` (which should be empty) and returns its `ModelSpec`."""
    b, t, v, u = hp.batch_size, hp.max_seq_length, hp.vocab_size, hp.rnn_units
    with graph.as_default():
        tf1.set_random_seed(hp.seed)
        inputs, feeds = _layers.token_inputs(b, t, v, hp.seed)
        memory, states = _encoder(hp, _embed("encoder/embedding", inputs["src"], hp))
        decoded = _decoder(hp, _embed("decoder/embedding", inputs["tgt_in"], hp), memory, states)
        with tf1.variable_scope("output_projection"):
            kernel = weight("kernel", [u, v])
            with colocation_group(hp.colocation, "output_projection_noop"):
                logits = tf.reshape(
                    tf.matmul(tf.reshape(decoded, [b * t, u]), kernel), [b, t, v], name="logits"
                )
        with tf1.name_scope("loss/"), colocation_group(hp.colocation, "noop"):
            loss = _layers.sequence_loss(logits, inputs["tgt_out"], b)
    return ModelSpec(
        name=name, hparams=hp, graph=graph, loss=loss, logits=logits, inputs=inputs,
        feeds=feeds, expert_layout=gnmt_expert_layout(hp),
    )
