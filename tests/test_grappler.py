"""Placed graphs run with Grappler and keep their placement (baechi_tf.cost_model.executed, the
placed sessions' config in baechi_tf.rewriter.devices, BaechiSession's default)."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf import BaechiSession
from baechi_tf.cost_model.executed import fused_ops, is_runtime, node_type, source_op, where_ops_ran
from baechi_tf.models import GNMTHParams, build_model
from baechi_tf.models.inception_v3 import InceptionV3HParams
from baechi_tf.rewriter.devices import placed_graph_config, session_config, standin_cluster

pytestmark = pytest.mark.tf

tf1 = tf.compat.v1
TASK = "/job:localhost/replica:0/task:0"
STEPS = 3


def cpu(i):
    return f"{TASK}/device:CPU:{i}"


def test_the_remapper_fuses_ops_of_three_devices_into_one_node_unless_told_not_to():
    # The reason for `placed_graph_config(remapping=False)`: Conv2D, BiasAdd and Relu on three
    # devices ran as one node named 'relu' on the Conv2D's device.
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
        with tf.device(cpu(1)):
            y = tf.nn.conv2d(x, tf.ones([3, 3, 3, 4]), 1, "SAME", name="conv")
        with tf.device(cpu(2)):
            y = tf.nn.bias_add(y, tf.ones([4]), name="bias")
        with tf.device(cpu(3)):
            tf.nn.relu(y, name="relu")
    setup = standin_cluster(3, prefix=TASK)
    where = {}
    for remapping in (True, False):
        config = session_config(setup, remapping=remapping)
        with tf1.Session(graph=graph, config=config) as sess:
            metadata = tf1.RunMetadata()
            sess.run("relu:0", {"x:0": np.ones([2, 8, 8, 3], np.float32)},
                     options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True),
                     run_metadata=metadata)
        where[remapping] = where_ops_ran(metadata.step_stats, graph.as_graph_def(), metadata.partition_graphs)
    assert {op: where[True][op] for op in ("conv", "bias", "relu")} == dict.fromkeys(("conv", "bias", "relu"), {cpu(1)})
    assert {op: where[False][op] for op in ("conv", "bias", "relu")} == {
        "conv": {cpu(1)}, "bias": {cpu(2)}, "relu": {cpu(3)}}


def test_placed_graph_config_turns_off_what_moves_ops_and_keeps_the_rest():
    off, on = 2, 1  # RewriterConfig.OFF, ON
    base = tf1.ConfigProto(allow_soft_placement=True)
    base.graph_options.rewrite_options.pin_to_host_optimization = on
    base.graph_options.rewrite_options.auto_parallel.enable = True
    base.graph_options.rewrite_options.constant_folding = off
    base.graph_options.optimizer_options.opt_level = tf1.OptimizerOptions.L1
    config = placed_graph_config(base)
    rewrite = config.graph_options.rewrite_options
    assert rewrite.pin_to_host_optimization == off and not rewrite.auto_parallel.enable
    assert rewrite.remapping != off and rewrite.layout_optimizer != off and not rewrite.disable_meta_optimizer
    assert rewrite.constant_folding == off and config.allow_soft_placement  # the rest as given
    assert config.graph_options.optimizer_options.opt_level == tf1.OptimizerOptions.L1
    assert placed_graph_config(base, remapping=False).graph_options.rewrite_options.remapping == off
    assert base.graph_options.rewrite_options.pin_to_host_optimization == on  # not changed


# -------------------------------------------------- real models placed and run with Grappler on


def _gnmt():
    return build_model("gnmt_v2", GNMTHParams(batch_size=3, vocab_size=40, max_seq_length=4,
                                              rnn_units=8, num_layers=2, num_gpus=4))


def _inception():
    return build_model("inception_v3", InceptionV3HParams(batch_size=2, image_size=75, num_classes=7,
                                                          depth_multiplier=0.05, min_depth=4))


class _Keras:
    """A small tf_keras network (convolutions with biases, batch norm, a residual add, a dense
    layer), as a ModelSpec-like value: graph, loss, feeds."""

    def __init__(self):
        # `make test` installs it (Makefile); it is not in the test extra because its
        # dependency on `tensorflow` would pull the GPU wheel over tensorflow-cpu.
        import tf_keras
        layers = tf_keras.layers
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf_keras.utils.set_random_seed(3)  # Keras draws its initializers' seeds in Python
            images = tf1.placeholder(tf.float32, [4, 16, 16, 3], name="images")
            labels = tf1.placeholder(tf.int32, [4], name="labels")
            inputs = tf_keras.Input((16, 16, 3))
            y = layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
            z = layers.Conv2D(8, 3, padding="same")(y)
            z = layers.BatchNormalization()(z)
            y = layers.ReLU()(layers.Add()([y, z]))
            y = layers.GlobalAveragePooling2D()(y)
            logits = layers.Dense(5)(layers.Dense(16, activation="relu")(y))
            net = tf_keras.Model(inputs, logits)
            self.loss = tf.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=net(images, training=True)))
        rng = np.random.default_rng(0)
        self.feeds = {images.name: rng.standard_normal([4, 16, 16, 3]).astype(np.float32),
                      labels.name: np.arange(4, dtype=np.int32) % 5}


MODELS = {"gnmt_v2": _gnmt, "inception_v3": _inception, "keras": _Keras}


def _training(make):
    spec = make()
    with spec.graph.as_default():
        train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(spec.loss, colocate_gradients_with_ops=True)
        with tf.control_dependencies([train]):
            step = tf.identity(spec.loss, name="step_loss")
        init = tf1.global_variables_initializer()
    return spec, step, init


def _plain_losses(make):
    spec, step, init = _training(make)
    with tf1.Session(graph=spec.graph) as sess:
        sess.run(init)
        return [sess.run(step, spec.feeds) for _ in range(STEPS)]


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return request.param, MODELS[request.param], _plain_losses(MODELS[request.param])


def _grappler_nodes(step_stats, graph_def):
    """Traced nodes that are neither graph ops nor the runtime's, with the op each maps to."""
    names = {n.name for n in graph_def.node}
    out = {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name not in names and not is_runtime(ns.node_name, node_type(ns)):
                out[ns.node_name] = source_op(ns.node_name, names)
    return out


def _placed_run(make, method):
    """Losses of STEPS steps of BaechiSession(`method`) on 4 stand-ins, from the plain session's
    weights, the last step traced: (losses, run metadata, placed GraphDef, op -> device, profile)."""
    spec, step, init = _training(make)
    with BaechiSession(graph=spec.graph, placement_method=method, num_devices=4,
                       warmup_steps=0, profile_steps=1) as sess:
        sess.run(init)
        got = [sess.run(step, spec.feeds) for _ in range(STEPS - 1)]
        metadata = tf1.RunMetadata()
        got.append(sess.run(step, spec.feeds, run_metadata=metadata, options=tf1.RunOptions(
            trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True)))
        return got, metadata, sess.placed_graph_def, sess.placement.op_to_device, sess.profile


def test_single_device_placement_computes_what_a_session_computes_to_the_bit(model):
    name, make, expected = model
    got = _placed_run(make, "single")[0]
    np.testing.assert_array_equal(got, expected)


def test_placed_ops_run_where_placed_with_grappler_on(model):
    name, make, expected = model
    got, metadata, placed_def, placement, profile = _placed_run(make, "m_etf")
    ran = where_ops_ran(metadata.step_stats, placed_def, metadata.partition_graphs)
    assert len(ran) > 80 and len({d for devices in ran.values() for d in devices}) >= 2, name
    moved = {op: (sorted(devices), placement[op]) for op, devices in ran.items() if devices != {placement[op]}}
    assert not moved, name
    # Checked among them: the nodes Grappler made (folded constants...), each mapped to its op,
    # and the ops a fused node replaced, placed with the op it ran as.
    made = _grappler_nodes(metadata.step_stats, placed_def)
    assert made and all(op is not None for op in made.values()), made
    fused = fused_ops(placed_def, metadata.partition_graphs)
    if name != "gnmt_v2":  # no fusion in its small LSTMs
        assert fused and {placement[op] for op in fused} <= {d for ds in ran.values() for d in ds}
    assert all(placement[op] == placement[into] for op, into in fused.items())
    assert {op for op, c in profile.ops.items() if c.fused_into} >= set(fused) - set(profile.ops)
    np.testing.assert_allclose(got, expected[:STEPS], rtol=2e-5)


def test_a_placement_that_splits_a_fusion_runs_without_the_remapper(caplog):
    # The user pins a Conv2D and its BiasAdd to two devices: the remapper would run both in one
    # node on the Conv2D's device, so the placed session turns it off. (Unpinned, the placement
    # keeps them together: `test_placed_ops_run_where_placed_with_grappler_on`.)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
        w = tf1.get_variable("w", [3, 3, 3, 4], initializer=tf1.ones_initializer())
        b = tf1.get_variable("b", [4], initializer=tf1.ones_initializer())
        with tf.device("/device:GPU:0"):  # the stand-in of GPU 0
            y = tf.nn.conv2d(x, w, 1, "SAME", name="conv")
        with tf.device("/device:GPU:1"):
            out = tf.nn.relu(tf.nn.bias_add(y, b, name="bias"), name="relu")
        init = tf1.global_variables_initializer()
    feed = {x: np.ones([2, 8, 8, 3], np.float32)}
    with tf1.Session(graph=graph) as plain:
        plain.run(init)
        expected = plain.run(out, feed)
    with BaechiSession(graph=graph, placement_method="m_etf", num_devices=2, warmup_steps=0,
                       profile_steps=1) as sess:
        sess.run(init)
        with caplog.at_level(logging.WARNING, logger="baechi_tf.rewriter.session"):
            metadata = tf1.RunMetadata()
            value = sess.run(out, feed, run_metadata=metadata, options=tf1.RunOptions(
                trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True))
        assert sess.profile.ops["conv"].fused_into == "relu"
        placement = sess.placement.op_to_device
    assert "runs without the remapper's fusions" in caplog.text
    ran = where_ops_ran(metadata.step_stats, graph.as_graph_def(), metadata.partition_graphs)
    ops = ("conv", "bias", "relu")
    assert {op: ran[op] for op in ops} == {"conv": {cpu(1)}, "bias": {cpu(2)}, "relu": {cpu(2)}}
    assert {op: placement[op] for op in ops} == {"conv": cpu(1), "bias": cpu(2), "relu": cpu(2)}
    np.testing.assert_allclose(value, expected, rtol=1e-6)
