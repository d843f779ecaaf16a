"""Inception-v3 (Szegedy et al., 2016), the TF-slim definition, with plain ops.

The module structure is slim's ``inception_v3``: a stem of five convolutions and two max pools,
three 35x35 modules (Mixed_5b-d), a grid reduction (Mixed_6a), four 17x17 modules with
factorised 1x7/7x1 convolutions (Mixed_6b-e), a grid reduction (Mixed_7a), two 8x8 modules with
split 1x3/3x1 branches (Mixed_7b-c), then average pooling over the whole map, dropout and a 1x1
convolution to the logits. Every convolution but the last has batch norm (decay 0.9997, epsilon
0.001, no scale, as slim's arg scope) and ReLU. There are no auxiliary logits (as in the
original's copy). Names follow slim: ``InceptionV3/Mixed_6b/Branch_1/Conv2d_0b_1x7/weights``.

Unlike Baechi's original, which built the network with ``is_training=False`` and then trained
it, ``is_training=True`` (the default) normalises with batch
statistics, updates the moving averages on every step (the loss depends on those updates) and
applies dropout.

``data_format`` is NHWC or NCHW. Both build anywhere; where they run depends on the kernels.
GPUs take both. On CPUs, TF 2.21's own Conv2D, MaxPool and AvgPool kernels take only NHWC
("Default MaxPoolingOp only supports NHWC on device type CPU"), while its oneDNN kernels take
NCHW for every op used here; TF turns oneDNN on by itself only on some CPUs (with AVX-512 VNNI,
BF16 or AMX, by its 2.9 release notes), and ``TF_ENABLE_ONEDNN_OPTS=1`` turns it on elsewhere.
`nchw_runs_on_cpu` asks this process's kernels, so that train.py refuses NCHW on CPU stand-ins
up front instead of failing in the first step.

``image_size`` defaults to 299; the network needs at least 75 (the last reductions would
otherwise reach an empty map), which the tests use with a small ``depth_multiplier``. The expert
layout is one device: the original gave image models no device annotations (they ran on GPU 0).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Union

import numpy as np
import tensorflow as tf

from baechi_tf.models._layers import tf1, variable, weight
from baechi_tf.models.hparams import InceptionV3HParams
from baechi_tf.models.layout import ExpertLayout
from baechi_tf.models.spec import ModelSpec

__all__ = ["InceptionV3HParams", "build_inception_v3", "nchw_runs_on_cpu"]


# The layers of a module, as data: a convolution, a pooling, or a fork whose two parts read the
# same input and are concatenated (Mixed_7b/c).
@dataclasses.dataclass(frozen=True)
class _Conv:
    depth: int
    kernel: tuple[int, int]
    name: str
    stride: int = 1
    padding: str = "SAME"


@dataclasses.dataclass(frozen=True)
class _Pool:
    kind: str  # 'max' or 'avg'
    name: str
    stride: int = 1
    padding: str = "SAME"


@dataclasses.dataclass(frozen=True)
class _Fork:
    parts: tuple[_Conv, _Conv]


_Layer = Union[_Conv, _Pool, _Fork]


def _c(depth: int, kernel: Union[int, tuple[int, int]], name: str, stride: int = 1,
       padding: str = "SAME") -> _Conv:
    k = (kernel, kernel) if isinstance(kernel, int) else kernel
    return _Conv(depth, k, name, stride, padding)


_STEM: tuple[_Layer, ...] = (
    _c(32, 3, "Conv2d_1a_3x3", 2, "VALID"),
    _c(32, 3, "Conv2d_2a_3x3", 1, "VALID"),
    _c(64, 3, "Conv2d_2b_3x3"),
    _Pool("max", "MaxPool_3a_3x3", 2, "VALID"),
    _c(80, 1, "Conv2d_3b_1x1", 1, "VALID"),
    _c(192, 3, "Conv2d_4a_3x3", 1, "VALID"),
    _Pool("max", "MaxPool_5a_3x3", 2, "VALID"),
)


def _mixed_35(pool_depth: int, branch_1: tuple[str, str]) -> tuple[tuple[_Layer, ...], ...]:
    return (
        (_c(64, 1, "Conv2d_0a_1x1"),),
        (_c(48, 1, branch_1[0]), _c(64, 5, branch_1[1])),
        (_c(64, 1, "Conv2d_0a_1x1"), _c(96, 3, "Conv2d_0b_3x3"), _c(96, 3, "Conv2d_0c_3x3")),
        (_Pool("avg", "AvgPool_0a_3x3"), _c(pool_depth, 1, "Conv2d_0b_1x1")),
    )


def _mixed_17(n: int) -> tuple[tuple[_Layer, ...], ...]:
    return (
        (_c(192, 1, "Conv2d_0a_1x1"),),
        (_c(n, 1, "Conv2d_0a_1x1"), _c(n, (1, 7), "Conv2d_0b_1x7"),
         _c(192, (7, 1), "Conv2d_0c_7x1")),
        (_c(n, 1, "Conv2d_0a_1x1"), _c(n, (7, 1), "Conv2d_0b_7x1"),
         _c(n, (1, 7), "Conv2d_0c_1x7"), _c(n, (7, 1), "Conv2d_0d_7x1"),
         _c(192, (1, 7), "Conv2d_0e_1x7")),
        (_Pool("avg", "AvgPool_0a_3x3"), _c(192, 1, "Conv2d_0b_1x1")),
    )


def _mixed_8(split_name: str) -> tuple[tuple[_Layer, ...], ...]:
    return (
        (_c(320, 1, "Conv2d_0a_1x1"),),
        (_c(384, 1, "Conv2d_0a_1x1"),
         _Fork((_c(384, (1, 3), "Conv2d_0b_1x3"), _c(384, (3, 1), split_name)))),
        (_c(448, 1, "Conv2d_0a_1x1"), _c(384, 3, "Conv2d_0b_3x3"),
         _Fork((_c(384, (1, 3), "Conv2d_0c_1x3"), _c(384, (3, 1), "Conv2d_0d_3x1")))),
        (_Pool("avg", "AvgPool_0a_3x3"), _c(192, 1, "Conv2d_0b_1x1")),
    )


_MODULES: tuple[tuple[str, tuple[tuple[_Layer, ...], ...]], ...] = (
    ("Mixed_5b", _mixed_35(32, ("Conv2d_0a_1x1", "Conv2d_0b_5x5"))),
    ("Mixed_5c", _mixed_35(64, ("Conv2d_0b_1x1", "Conv_1_0c_5x5"))),
    ("Mixed_5d", _mixed_35(64, ("Conv2d_0a_1x1", "Conv2d_0b_5x5"))),
    ("Mixed_6a", (
        (_c(384, 3, "Conv2d_1a_1x1", 2, "VALID"),),
        (_c(64, 1, "Conv2d_0a_1x1"), _c(96, 3, "Conv2d_0b_3x3"),
         _c(96, 3, "Conv2d_1a_1x1", 2, "VALID")),
        (_Pool("max", "MaxPool_1a_3x3", 2, "VALID"),),
    )),
    ("Mixed_6b", _mixed_17(128)),
    ("Mixed_6c", _mixed_17(160)),
    ("Mixed_6d", _mixed_17(160)),
    ("Mixed_6e", _mixed_17(192)),
    ("Mixed_7a", (
        (_c(192, 1, "Conv2d_0a_1x1"), _c(320, 3, "Conv2d_1a_3x3", 2, "VALID")),
        (_c(192, 1, "Conv2d_0a_1x1"), _c(192, (1, 7), "Conv2d_0b_1x7"),
         _c(192, (7, 1), "Conv2d_0c_7x1"), _c(192, 3, "Conv2d_1a_3x3", 2, "VALID")),
        (_Pool("max", "MaxPool_1a_3x3", 2, "VALID"),),
    )),
    ("Mixed_7b", _mixed_8("Conv2d_0b_3x1")),
    ("Mixed_7c", _mixed_8("Conv2d_0c_3x1")),
)


class _Builder:
    """Applies the layer tables; collects the batch-norm moving-average updates."""

    def __init__(self, hp: InceptionV3HParams):
        self.hp = hp
        self.nchw = hp.data_format == "NCHW"
        self.channel_axis = 1 if self.nchw else 3
        self.updates: list[tf.Operation] = []

    def depth(self, d: int) -> int:
        return max(int(d * self.hp.depth_multiplier), self.hp.min_depth)

    def _strides(self, s: int) -> list[int]:
        return [1, 1, s, s] if self.nchw else [1, s, s, 1]

    def conv_bn_relu(self, x: tf.Tensor, layer: _Conv) -> tf.Tensor:
        hp = self.hp
        depth = self.depth(layer.depth)
        init = tf1.variance_scaling_initializer(scale=2.0, distribution="truncated_normal")
        with tf1.variable_scope(layer.name):
            in_depth = int(x.shape[self.channel_axis])
            kernel = weight("weights", [*layer.kernel, in_depth, depth], init)
            y = tf.nn.conv2d(x, kernel, self._strides(layer.stride), layer.padding,
                             data_format=hp.data_format)
            with tf1.variable_scope("BatchNorm"):
                beta = weight("beta", [depth], tf1.zeros_initializer())
                mean_var, mean = variable("moving_mean", [depth], tf1.zeros_initializer(),
                                          trainable=False)
                var_var, var = variable("moving_variance", [depth], tf1.ones_initializer(),
                                        trainable=False)
                gamma = tf.ones([depth], name="gamma")  # scale=False, as slim's arg scope
                if hp.is_training:
                    y, batch_mean, batch_var, *_ = tf.raw_ops.FusedBatchNormV3(
                        x=y, scale=gamma, offset=beta, mean=tf.zeros([0]), variance=tf.zeros([0]),
                        epsilon=hp.batch_norm_epsilon, data_format=hp.data_format,
                        is_training=True,
                    )
                    rate = 1.0 - hp.batch_norm_decay
                    self.updates.append(mean_var.assign_sub((mean - batch_mean) * rate,
                                                            read_value=False))
                    self.updates.append(var_var.assign_sub((var - batch_var) * rate,
                                                           read_value=False))
                else:
                    y = tf.raw_ops.FusedBatchNormV3(
                        x=y, scale=gamma, offset=beta, mean=mean, variance=var,
                        epsilon=hp.batch_norm_epsilon, data_format=hp.data_format,
                        is_training=False,
                    )[0]
            return tf.nn.relu(y)

    def pool(self, x: tf.Tensor, layer: _Pool) -> tf.Tensor:
        fn = tf.nn.max_pool2d if layer.kind == "max" else tf.nn.avg_pool2d
        return fn(x, 3, layer.stride, layer.padding, data_format=self.hp.data_format,
                  name=layer.name)

    def apply(self, x: tf.Tensor, layers: tuple[_Layer, ...]) -> tf.Tensor:
        for layer in layers:
            if isinstance(layer, _Conv):
                x = self.conv_bn_relu(x, layer)
            elif isinstance(layer, _Pool):
                x = self.pool(x, layer)
            else:
                x = tf.concat([self.conv_bn_relu(x, part) for part in layer.parts],
                              self.channel_axis)
        return x

    def module(self, x: tf.Tensor, name: str, branches) -> tf.Tensor:
        with tf1.variable_scope(name):
            outs = []
            for i, layers in enumerate(branches):
                with tf1.variable_scope(f"Branch_{i}"):
                    outs.append(self.apply(x, layers))
            return tf.concat(outs, self.channel_axis)

    def logits(self, x: tf.Tensor) -> tf.Tensor:
        hp = self.hp
        spatial = [int(d) for d in (x.shape[2:] if self.nchw else x.shape[1:3])]
        with tf1.variable_scope("Logits"):
            x = tf.nn.avg_pool2d(x, spatial, 1, "VALID", data_format=hp.data_format,
                                 name=f"AvgPool_1a_{spatial[0]}x{spatial[1]}")
            if hp.is_training and hp.dropout_keep_prob < 1.0:
                x = tf.nn.dropout(x, rate=1.0 - hp.dropout_keep_prob, name="Dropout_1b")
            with tf1.variable_scope("Conv2d_1c_1x1"):
                kernel = weight("weights", [1, 1, int(x.shape[self.channel_axis]),
                                            hp.num_classes])
                biases = weight("biases", [hp.num_classes], tf1.zeros_initializer())
                x = tf.nn.conv2d(x, kernel, [1, 1, 1, 1], "VALID", data_format=hp.data_format)
                x = tf.nn.bias_add(x, biases, data_format=hp.data_format)
            return tf.squeeze(x, [2, 3] if self.nchw else [1, 2], name="SpatialSqueeze")


def build_inception_v3(hp: InceptionV3HParams, graph: tf.Graph) -> ModelSpec:
    """Builds Inception-v3 into `graph` (which should be empty) and returns its `ModelSpec`."""
    b, s = hp.batch_size, hp.image_size
    shape = [b, 3, s, s] if hp.data_format == "NCHW" else [b, s, s, 3]
    rng = np.random.default_rng(hp.seed)
    with graph.as_default():
        tf1.set_random_seed(hp.seed)
        with tf1.name_scope("inputs"):
            images = tf1.placeholder(tf.float32, shape, name="images")
            labels = tf1.placeholder(tf.int32, [b], name="labels")
        pixels = rng.uniform(-1.0, 1.0, [b, s, s, 3]).astype(np.float32)
        if hp.data_format == "NCHW":  # the same images in either format
            pixels = np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))
        feeds = {
            images.name: pixels,
            labels.name: rng.integers(0, hp.num_classes, [b], dtype=np.int32),
        }
        net = _Builder(hp)
        with tf1.variable_scope("InceptionV3"):
            x = net.apply(images, _STEM)
            for name, branches in _MODULES:
                x = net.module(x, name, branches)
            logits = net.logits(x)
        with tf1.name_scope("loss"):
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits, name="xentropy")
            mean = tf.math.divide(tf.reduce_sum(losses), float(b), name="mean")
            with tf.control_dependencies(net.updates):  # a step updates the moving averages
                loss = tf.identity(mean, name="loss")
    return ModelSpec(
        name="inception_v3", hparams=hp, graph=graph, loss=loss, logits=logits,
        inputs={"images": images, "labels": labels}, feeds=feeds,
        expert_layout=ExpertLayout(num_devices=1, rules=()),
    )


@functools.lru_cache(maxsize=None)
def nchw_runs_on_cpu() -> bool:
    """Whether this process's CPU kernels run the NCHW ops of this network, gradients included.

    Runs one tiny step of them on /cpu:0 (a few milliseconds, once per process): TF's own CPU
    kernels refuse NCHW convolutions and pooling, its oneDNN ones take them (module docstring).
    """
    graph = tf.Graph()
    with graph.as_default(), tf.device("/cpu:0"):
        x = tf1.placeholder_with_default(np.ones((1, 2, 4, 4), np.float32), (1, 2, 4, 4))
        kernel = tf.constant(np.ones((1, 1, 2, 2), np.float32))
        y = tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME", data_format="NCHW"),
                           tf.constant([0.5, 0.5]), data_format="NCHW")
        y = tf1.nn.fused_batch_norm(y, tf.ones([2]), tf.zeros([2]), data_format="NCHW")[0]
        y = tf.nn.max_pool2d(y, 3, 1, "SAME", data_format="NCHW")
        y = tf.nn.avg_pool2d(y, 3, 1, "SAME", data_format="NCHW")
        grad = tf.gradients(tf.reduce_sum(y), [x])[0]
    try:
        with tf1.Session(graph=graph) as sess:
            sess.run(grad)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
        return False
    return True
