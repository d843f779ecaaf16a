"""The models build deterministically, train, and have the original's structure and layout."""

import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf import models
from baechi_tf.errors import ConfigError
from baechi_tf.models import (
    GNMTHParams,
    InceptionV3HParams,
    TransformerHParams,
    build_model,
    hparams_from_flags,
)

from loaded import run_listing_modules

pytestmark = pytest.mark.tf

tf1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T = 4  # time steps of the tiny NMT models
TINY = {
    "gnmt_v2": GNMTHParams(batch_size=3, vocab_size=40, max_seq_length=T, rnn_units=8,
                           num_layers=4, num_gpus=4),
    "gnmt": GNMTHParams(batch_size=3, vocab_size=40, max_seq_length=T, rnn_units=8,
                        num_layers=3, rnn_unit_type="gru", num_gpus=2),
    "inception_v3": InceptionV3HParams(batch_size=2, image_size=75, num_classes=7,
                                       depth_multiplier=0.05, min_depth=4),
    "transformer": TransformerHParams(batch_size=3, vocab_size=40, max_seq_length=T,
                                      num_layers=2, num_heads=2, d_model=8, d_ff=16),
}


def _add_train_op(spec):
    with spec.graph.as_default():
        train = tf1.train.AdamOptimizer(0.01).minimize(
            spec.loss, colocate_gradients_with_ops=True, name="train"
        )
        init = tf1.global_variables_initializer()
    return train, init


def _ops_in(graph, prefix):
    return [op for op in graph.get_operations() if op.name.startswith(prefix)]


# --- every model ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TINY))
def test_model_trains_with_adam_and_the_loss_falls(name):
    spec = build_model(name, TINY[name])
    train, init = _add_train_op(spec)
    with tf1.Session(graph=spec.graph) as sess:
        sess.run(init)
        losses = [sess.run([spec.loss, train], spec.feeds)[0] for _ in range(4)]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0], losses
    assert spec.loss.shape == ()
    assert set(spec.feeds) == {t.name for t in spec.inputs.values()}


@pytest.mark.parametrize("name", list(TINY))
def test_same_hparams_give_the_same_graph_def(name):
    first = build_model(name, TINY[name]).graph.as_graph_def()
    second = build_model(name, TINY[name]).graph.as_graph_def()
    assert first.SerializeToString(deterministic=True) == second.SerializeToString(
        deterministic=True
    )
    assert not any(node.device for node in first.node)  # free for any placer


def test_synthetic_feeds_are_fixed_by_the_seed():
    a, b = build_model("gnmt_v2", TINY["gnmt_v2"]), build_model("gnmt_v2", TINY["gnmt_v2"])
    for key in a.feeds:
        np.testing.assert_array_equal(a.feeds[key], b.feeds[key])
        assert a.feeds[key].max() < TINY["gnmt_v2"].vocab_size


_NCHW_AGAINST_NHWC = """
import sys
import tensorflow as tf
from baechi_tf.models import InceptionV3HParams, build_model
from baechi_tf.models.inception_v3 import nchw_runs_on_cpu

tf1 = tf.compat.v1
if not nchw_runs_on_cpu():
    sys.exit("NCHW does not run on this CPU")
for data_format in ("NHWC", "NCHW"):
    hp = InceptionV3HParams(batch_size=2, image_size=75, num_classes=7, depth_multiplier=0.05,
                            min_depth=4, data_format=data_format, dropout_keep_prob=1.0)
    spec = build_model("inception_v3", hp)
    assert spec.inputs["images"].shape == ((2, 3, 75, 75) if data_format == "NCHW" else (2, 75, 75, 3))
    with spec.graph.as_default():
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=spec.graph) as sess:
        sess.run(init)
        print(data_format, repr(float(sess.run(spec.loss, spec.feeds))))
"""


def _with_onednn(on, code):
    # oneDNN is on by TF's own choice only on some CPUs; the variable decides it either way.
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1" if on else "0", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)


def test_inception_nchw_computes_what_nhwc_computes():
    # With oneDNN, whose CPU kernels take NCHW (TF's own convolve and pool only NHWC images).
    done = _with_onednn(True, _NCHW_AGAINST_NHWC)
    assert done.returncode == 0, done.stderr
    losses = dict(line.split() for line in done.stdout.splitlines())
    # Different kernels sum in other orders through 94 batch norms: equal to ~1e-4.
    assert float(losses["NCHW"]) == pytest.approx(float(losses["NHWC"]), rel=1e-3)


def test_without_onednn_the_cpu_refuses_nchw_and_the_probe_says_so():
    code = _NCHW_AGAINST_NHWC.replace('sys.exit("NCHW does not run on this CPU")',
                                      'print("refused"); sys.exit()')
    done = _with_onednn(False, code)
    assert done.returncode == 0 and done.stdout == "refused\n", done.stdout + done.stderr
    # What the probe stands for: without it, the NCHW step fails in TensorFlow.
    unprobed = code.replace("if not nchw_runs_on_cpu():", "if False:")
    unprobed = unprobed.replace('for data_format in ("NHWC", "NCHW"):', 'for data_format in ("NCHW",):')
    done = _with_onednn(False, unprobed)
    assert "Default MaxPoolingOp only supports NHWC on device type CPU" in done.stderr, done.stderr


def test_inception_has_the_slim_modules_and_batch_norm_updates():
    spec = build_model("inception_v3", TINY["inception_v3"])
    g = spec.graph
    for module in ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c",
                   "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c"):
        assert _ops_in(g, f"InceptionV3/{module}/"), module
    names = {v.name for v in g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
    assert "InceptionV3/Mixed_6b/Branch_2/Conv2d_0e_1x7/weights:0" in names
    assert "InceptionV3/Mixed_7c/Branch_1/Conv2d_0c_3x1/BatchNorm/moving_mean:0" in names
    convs = [op for op in g.get_operations() if op.type == "Conv2D"]
    norms = [op for op in g.get_operations() if op.type == "FusedBatchNormV3"]
    assert len(convs) == 95 and len(norms) == 94  # all but the logits convolution
    updates = [op for op in g.get_operations() if op.type == "AssignSubVariableOp"]
    assert len(updates) == 2 * 94
    assert set(spec.loss.op.control_inputs) == set(updates)


def test_transformer_layers_and_causal_mask():
    spec = build_model("transformer", TINY["transformer"])
    g = spec.graph
    for side in ("encoder", "decoder"):
        for i in range(2):
            assert _ops_in(g, f"{side}/layer_{i}/self_attention/")
    assert _ops_in(g, "decoder/layer_1/cross_attention/")
    assert not _ops_in(g, "encoder/layer_0/cross_attention/")
    masks = [op.name for op in g.get_operations() if op.name.endswith("causal_mask")]
    assert masks == [f"decoder/layer_{i}/self_attention/causal_mask" for i in range(2)]
    layout = spec.expert_placement([f"/device:CPU:{i}" for i in range(4)])
    assert layout["decoder/layer_1/ffn/inner/MatMul"] == "/device:CPU:1"
    assert layout["loss/loss"] == "/device:CPU:2"  # L=2 < G=4: the device after the last layer


# --- GNMT structure ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gnmt():
    return build_model("gnmt_v2", TINY["gnmt_v2"])


def _inputs_from(op, prefix):
    return [t.op.name for t in op.inputs if t.op.name.startswith(prefix)]


def _residual_adds(graph, scope, below):
    """Adds in `scope` that take an input from the layer `below` at the same step: residuals."""
    return [op for op in _ops_in(graph, scope)
            if op.type == "AddV2" and _inputs_from(op, below)]


def test_gnmt_first_encoder_layer_is_bidirectional(gnmt):
    g = gnmt.graph
    var_shapes = {v.op.name: v.shape.as_list() for v in g.get_collection("trainable_variables")}
    u = 8
    assert var_shapes["encoder/bi/fw/kernel"] == [2 * u, 4 * u]
    assert var_shapes["encoder/bi/bw/kernel"] == [2 * u, 4 * u]
    assert var_shapes["encoder/layer_1/kernel"] == [3 * u, 4 * u]  # reads fw ++ bw
    for t in range(T):
        concat = g.get_operation_by_name(f"encoder/bi/outputs/t{t}")
        sources = _inputs_from(concat, "encoder/bi/")
        axis = concat.inputs[2].op.name
        assert sources == [f"encoder/bi/fw/t{t}/mul_2", f"encoder/bi/bw/t{t}/mul_2", axis]
    # The backward cell runs from the last step to the first.
    first_bw = g.get_operation_by_name(f"encoder/bi/bw/t{T - 1}/concat")
    assert [t.op.name for t in first_bw.inputs][:2] == [
        "encoder/embedding/unstack", f"encoder/bi/bw/t{T - 1}/zeros"]
    assert _inputs_from(g.get_operation_by_name("encoder/bi/bw/t0/concat"), "encoder/bi/bw/t1/")


def test_gnmt_residual_layers_are_the_original_ones(gnmt):
    g = gnmt.graph
    # Encoder: layers 1..3 are unidirectional; the top two (2, 3) are residual.
    assert not _residual_adds(g, "encoder/layer_1/t0/", "encoder/bi/outputs/")
    assert len(_residual_adds(g, "encoder/layer_2/t0/", "encoder/layer_1/t0/")) == 1
    assert len(_residual_adds(g, "encoder/layer_3/t0/", "encoder/layer_2/t0/")) == 1
    # Decoder: layer 1 reads the bottom output ++ attention, no residual; layers 2, 3 residual.
    assert not _residual_adds(g, "decoder/layer_1/t0/", "decoder/layer_0/t0/")
    assert len(_residual_adds(g, "decoder/layer_2/t0/", "decoder/layer_1/t0/")) == 1
    assert len(_residual_adds(g, "decoder/layer_3/t0/", "decoder/layer_2/t0/")) == 1
    plain = build_model("gnmt_v2", GNMTHParams(**{**TINY["gnmt_v2"].__dict__, "residual": False}))
    assert not _residual_adds(plain.graph, "decoder/layer_3/t0/", "decoder/layer_2/t0/")


@pytest.mark.parametrize(("name", "lag"), [("gnmt_v2", 0), ("gnmt", 1)])
def test_gnmt_attention_of_the_bottom_layer_feeds_every_upper_layer(name, lag):
    hp = TINY["gnmt_v2"]
    g = build_model(name, hp).graph
    for t in range(1, T):
        softmax = [op for op in _ops_in(g, f"decoder/attention/t{t}/") if op.type == "Softmax"]
        assert len(softmax) == 1
        query = _inputs_from(g.get_operation_by_name(f"decoder/attention/t{t}/MatMul"),
                             "decoder/layer_")
        assert query == [f"decoder/layer_0/t{t}/mul_2"]  # the bottom cell's output h
        bottom = g.get_operation_by_name(f"decoder/layer_0/t{t}/input")
        assert _inputs_from(bottom, "decoder/attention/") == [
            f"decoder/attention/t{t - 1}/attention"]
        for i in range(1, hp.num_layers):
            upper = g.get_operation_by_name(f"decoder/layer_{i}/t{t}/input")
            assert _inputs_from(upper, "decoder/attention/") == [
                f"decoder/attention/t{t - lag}/attention"]


def test_gnmt_decoder_starts_from_the_encoder_states(gnmt):
    g = gnmt.graph
    # LSTM state (c, h): the cell memory c enters the first step's `mul` (c * forget gate).
    expected = {0: "encoder/bi/bw/t0/", 1: "encoder/layer_1/t3/", 2: "encoder/layer_2/t3/",
                3: "encoder/layer_3/t3/"}
    for layer, source in expected.items():
        forget = g.get_operation_by_name(f"decoder/layer_{layer}/t0/mul")
        assert _inputs_from(forget, source), (layer, [t.op.name for t in forget.inputs])


def _step_groups(graph):
    """Colocation groups of the ops of each (layer, step) scope but its input concatenation."""
    groups = {}
    for op in graph.get_operations():
        match = re.match(r"^((?:en|de)coder/[^/]+(?:/[fb]w)?/t\d+)/", op.name)
        if match and "/input" not in op.name:
            groups.setdefault(match.group(1), set()).update(
                c.decode() for c in op.colocation_groups())
    return groups


def test_gnmt_each_layer_step_is_one_colocation_group(gnmt):
    groups = _step_groups(gnmt.graph)
    layers = 2 + 3 + 4 + 1  # bi fw, bi bw, 3 encoder layers, 4 decoder layers, attention
    assert len(groups) == layers * T
    for scope, classes in groups.items():
        assert classes == {f"loc:@{scope}/colocation"}, scope

    hp = TINY["gnmt_v2"]
    loose = build_model("gnmt_v2", GNMTHParams(**{**hp.__dict__, "colocation": False}))
    for scope, classes in _step_groups(loose.graph).items():
        if scope.startswith("decoder/attention/"):  # always grouped, as in the original
            assert classes == {f"loc:@{scope}/colocation"}
        else:  # no op has a colocation attribute: each is its own group
            assert not [op for op in _ops_in(loose.graph, scope + "/")
                        if "_class" in op.node_def.attr], scope


def test_gnmt_unrolls_statically(gnmt):
    def forward_ops(steps):
        hp = GNMTHParams(**{**TINY["gnmt_v2"].__dict__, "max_seq_length": steps})
        return len(build_model("gnmt_v2", hp).graph.get_operations())

    counts = [forward_ops(steps) for steps in (2, 3, 4)]
    assert counts[2] - counts[1] == counts[1] - counts[0] > 0
    assert counts[2] == len(gnmt.graph.get_operations())
    assert not [op for op in gnmt.graph.get_operations()
                if op.type in ("While", "Enter", "Exit", "NextIteration", "TensorListReserve")]


# --- GNMT expert layout ------------------------------------------------------------------------


def test_gnmt_expert_layout_is_the_original_round_robin():
    devices = [f"/device:GPU:{i}" for i in range(4)]
    hp = GNMTHParams(**{**TINY["gnmt_v2"].__dict__, "num_gpus": 3})
    spec = build_model("gnmt_v2", hp)
    train, _ = _add_train_op(spec)
    where = spec.expert_placement(devices, spec.graph)
    assert len(where) == len(spec.graph.get_operations())
    gpu = {name: int(device[-1]) for name, device in where.items()}
    assert gpu["encoder/embedding/table"] == 0
    assert gpu["encoder/bi/fw/t2/MatMul"] == gpu["encoder/bi/bw/t2/MatMul"] == 0
    assert [gpu[f"encoder/layer_{l}/t1/MatMul"] for l in (1, 2, 3)] == [1, 2, 0]
    assert [gpu[f"decoder/layer_{l}/t1/MatMul"] for l in (0, 1, 2, 3)] == [0, 1, 2, 0]
    assert gpu["decoder/attention/t1/Softmax"] == 0
    assert gpu["encoder/outputs/stack"] == gpu["decoder/outputs/stack"] == 0  # (L-1) % G
    assert gpu["loss/loss"] == gpu["output_projection/logits"] == 0  # L >= G: (L-1) % G
    # Gradients and Adam's updates go where their forward ops and variables go.
    assert gpu["gradients/encoder/layer_2/t1/MatMul_grad/MatMul"] == 2
    assert gpu["train/update_decoder/layer_1/kernel/ResourceApplyAdam"] == 1
    assert gpu["decoder/layer_1/kernel/Adam"] == 1
    assert set(gpu.values()) == {0, 1, 2}  # 3 logical devices of the 4 given
    # L < G: projection and loss on the device after the last layer.
    small = build_model("gnmt_v2", GNMTHParams(**{**TINY["gnmt_v2"].__dict__, "num_layers": 2}))
    assert small.expert_placement(devices)["loss/loss"] == "/device:GPU:2"
    with pytest.raises(ConfigError, match="uses 3 devices but 2 were given"):
        spec.expert_placement(devices[:2])


def test_gnmt_expert_layout_runs_on_virtual_devices():
    spec = build_model("gnmt_v2", TINY["gnmt_v2"])
    train, init = _add_train_op(spec)
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)]
    where = spec.expert_placement(devices, spec.graph)
    graph_def = spec.graph.as_graph_def()
    for node in graph_def.node:
        node.device = where[node.name]
    placed = tf.Graph()
    with placed.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    config = tf1.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=False)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    metadata = tf1.RunMetadata()
    with tf1.Session(graph=placed, config=config) as sess:
        sess.run(init.name)
        sess.run([spec.loss.name, train.name], spec.feeds,
                 options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
    ran = {}
    for dev in metadata.step_stats.dev_stats:
        for stats in dev.node_stats:
            ran.setdefault(stats.node_name, set()).add(dev.device)
    for name in ("encoder/layer_3/t0/MatMul", "decoder/layer_2/t1/MatMul",
                 "gradients/decoder/layer_1/t2/MatMul_grad/MatMul", "loss/loss"):
        assert ran[name] == {where[name]}, name
    assert {d for names in ran.values() for d in names if "CPU" in d} >= set(devices)


# --- hyper-parameters -------------------------------------------------------------------------


def test_hparams_from_train_py_flags():
    flags = {"batch_size": 16, "vocab_size": 100, "max_seq_length": 7, "rnn_units": 32,
             "num_layers": 3, "rnn_unit_type": "gru", "encoder_type": "gnmt", "residual": True,
             "num_gpus": 2, "disable_nmt_colocation": True, "learning_rate": 0.1,
             "data_format": "NCHW", "costgen": True}
    hp = hparams_from_flags("gnmt_v2", flags)
    assert hp == GNMTHParams(batch_size=16, vocab_size=100, max_seq_length=7, rnn_units=32,
                             num_layers=3, rnn_unit_type="gru", residual=True, num_gpus=2,
                             colocation=False)
    assert hparams_from_flags("gnmt", flags).use_new_attention is False
    image = hparams_from_flags("inception_v3", {"batch_size": 8, "data_format": "NCHW"})
    assert (image.batch_size, image.data_format, image.image_size) == (8, "NCHW", 299)
    assert models.default_hparams("transformer") == TransformerHParams()
    assert (TransformerHParams().num_layers, TransformerHParams().d_model) == (6, 512)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: build_model("resnet"), "unknown model 'resnet'"),
        (lambda: GNMTHParams(num_layers=1), "num_layers >= 2"),
        (lambda: GNMTHParams(encoder_type="bi"), "only --encoder_type=gnmt"),
        (lambda: GNMTHParams(rnn_unit_type="nas"), "rnn_unit_type='nas'"),
        (lambda: InceptionV3HParams(image_size=64), "at least 75"),
        (lambda: InceptionV3HParams(data_format="NWHC"), "NHWC or NCHW"),
        # --depth_multiplier=inf passed the check and ended in an OverflowError traceback
        (lambda: InceptionV3HParams(depth_multiplier=float("inf")), "finite number > 0"),
        (lambda: InceptionV3HParams(depth_multiplier=float("nan")), "finite number > 0"),
        (lambda: InceptionV3HParams(depth_multiplier=-1.0), "finite number > 0"),
        (lambda: TransformerHParams(d_model=10, num_heads=4), "not a multiple"),
        (lambda: build_model("gnmt_v2", TransformerHParams()), "takes GNMTHParams"),
    ],
)
def test_bad_hparams_are_refused_with_the_fix(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_hyper_parameters_load_without_tensorflow(tmp_path):
    # A command line checks its model flags and prints its --help with them before TensorFlow
    # loads (examples/gnmt_v2.py did not: seconds for a bad flag).
    code = (
        "from baechi_tf.models import GNMTHParams, default_hparams, hparams_from_flags\n"
        "assert GNMTHParams().rnn_units == 512\n"
        "assert default_hparams('transformer').d_model == 512\n"
        "assert hparams_from_flags('gnmt', {'disable_nmt_colocation': True}).colocation is False\n"
        "try:\n"
        "    GNMTHParams(num_layers=1)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
    )
    done, loaded = run_listing_modules([sys.executable, "-c", code], tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout == "ConfigError\n", done.stderr
    assert "tensorflow" not in loaded
