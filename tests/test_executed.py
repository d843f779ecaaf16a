"""What a traced step ran, named by the graph's ops (baechi_tf.cost_model.executed): Grappler's
nodes, fused nodes and the runtime's."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2

from baechi_tf.cost_model.executed import fused_ops, source_op, where_ops_ran
from baechi_tf.rewriter.devices import session_config, standin_cluster

pytestmark = pytest.mark.tf

tf1 = tf.compat.v1

GRAPH_NAMES = {
    "gradients/conv/Conv2D_grad/ShapeN", "block/add", "block/relu", "dense/MatMul", "loss/mean",
    "conv/Conv2D", "a/b",
}


@pytest.mark.parametrize("traced, op", [
    ("block/relu", "block/relu"),
    ("ConstantFolding/gradients/conv/Conv2D_grad/ShapeN-matshapes-1", "gradients/conv/Conv2D_grad/ShapeN"),
    ("ConstantFolding/loss/mean_recip", "loss/mean"),
    ("block/ArithmeticOptimizer/SimplifyAggregation_Mul_add", "block/add"),
    ("block/ArithmeticOptimizer/AddOpsRewrite_add", "block/add"),
    ("conv/Conv2D-0-TransposeNHWCToNCHW-LayoutOptimizer", "conv/Conv2D"),
    ("conv/Conv2D-0-0-TransposeNCHWToNHWC-LayoutOptimizer", "conv/Conv2D"),
    ("swap_out_dense/MatMul_0", "dense/MatMul"),
    ("Recomputed/dense/MatMul", "dense/MatMul"),
    ("a/b/PartitionedCall/Exp", "a/b"),  # an inlined function's node: its call
    ("block/relu/_12", None),  # a copy between devices
    ("dense/MatMul/replicate/_3", None),  # a constant replicated where it is read
    ("GroupCrossDeviceControlEdges_0/block/relu", None),
    ("block/relu_S41", None),  # a distributed session's control-edge helper
    ("_SOURCE", None),
    ("_arg_images_0_0", None),
    ("unrelated/node", None),
])
def test_source_op_names_the_op_a_traced_node_comes_from(traced, op):
    assert source_op(traced, GRAPH_NAMES) == op


def _node(graph_def, name, op, inputs=()):
    node = graph_def.node.add(name=name, op=op)
    node.input.extend(inputs)
    return node


def test_fused_ops_follow_the_fused_node_up_to_what_ran():
    #  x   w      b          x ─ conv ─ bias ─ relu ─ out      (the graph)
    #   \ /       |          relu ran as _FusedConv2D(x, w, b): conv and bias did not run;
    #   conv ─ bias ─ relu   shape read conv but was folded: it does not keep conv out.
    #           └─ shape     bn ran as _FusedBatchNormEx, its relu2 as Identity(bn).
    graph = tf1.GraphDef()
    for name, op, inputs in [
        ("x", "Placeholder", ()), ("w", "Const", ()), ("b", "Const", ()),
        ("conv", "Conv2D", ("x", "w")), ("bias", "BiasAdd", ("conv", "b")), ("relu", "Relu", ("bias",)),
        ("shape", "Shape", ("conv",)), ("out", "Identity", ("relu",)),
        ("bn", "FusedBatchNormV3", ("out", "b", "b", "b", "b")), ("relu2", "Relu", ("bn",)),
        ("mm", "MatMul", ("x", "w")), ("keep", "Add", ("mm", "relu2")), ("add2", "AddV2", ("mm", "b")),
    ]:
        _node(graph, name, op, inputs)
    ran = tf1.GraphDef()
    for name, op, inputs in [
        ("w", "Const", ()), ("b", "Const", ()), ("relu", "_FusedConv2D", ("_arg_x_0_0", "w", "b")),
        ("out", "Identity", ("relu",)), ("bn", "_FusedBatchNormEx", ("out", "b", "b", "b", "b")),
        ("relu2", "Identity", ("bn",)), ("keep", "Add", ("mm", "relu2")), ("mm", "_MklMatMul", ("_arg_x_0_0", "w")),
        ("add2", "_FusedMatMul", ("_arg_x_0_0", "w", "b")),
    ]:
        _node(ran, name, op, inputs)
    # mm ran (as oneDNN's MatMul) and is read by keep: add2's fusion did not replace it.
    assert fused_ops(graph, [ran]) == {"conv": "relu", "bias": "relu", "relu2": "bn"}


def test_fused_ops_find_siblings_rewritten_sums_and_workspaces():
    # oneDNN ran fgrad as one node with bgrad's output as its second, read through the Identity
    # `bid` that was removed; the arithmetic optimizer ran s2 = (a + b) + c as one AddN under a
    # new name, neither s1 nor s2 ran; oneDNN's pool grad read the pool's workspace (pool:1).
    graph = tf1.GraphDef()
    for name, op, inputs in [
        ("x", "Placeholder", ()), ("g", "Placeholder", ()), ("w", "Const", ()),
        ("fgrad", "Conv2DBackpropFilter", ("x", "w", "g")), ("bgrad", "BiasAddGrad", ("g",)),
        ("bid", "Identity", ("bgrad",)), ("upd", "Mul", ("fgrad", "bid")),
        ("a", "Relu", ("x",)), ("b", "Relu", ("g",)), ("s1", "AddV2", ("a", "b")),
        ("s2", "AddV2", ("s1", "x")), ("out", "Relu", ("s2",)),
        ("pool", "MaxPool", ("x",)), ("pgrad", "MaxPoolGrad", ("x", "pool", "g")),
    ]:
        _node(graph, name, op, inputs)
    ran = tf1.GraphDef()
    for name, op, inputs in [
        ("w", "Const", ()), ("fgrad", "_MklNativeConv2DBackpropFilterWithBias", ("_arg_x", "w", "_arg_g")),
        ("upd", "Mul", ("fgrad", "fgrad:1")), ("a", "Relu", ("_arg_x",)), ("b", "Relu", ("_arg_g",)),
        ("ArithmeticOptimizer/AddOpsRewrite_s2", "AddN", ("a", "b", "_arg_x")),
        ("out", "Relu", ("ArithmeticOptimizer/AddOpsRewrite_s2",)),
        ("pool", "_MklNativeMaxPool", ("_arg_x",)), ("pgrad", "_MklNativeMaxPoolGrad", ("_arg_x", "pool", "_arg_g", "pool:1")),
    ]:
        _node(ran, name, op, inputs)
    assert fused_ops(graph, [ran]) == {"bgrad": "fgrad", "s1": "s2", "pgrad": "pool"}


def test_where_ops_ran_reads_executors_and_puts_fused_ops_with_their_node():
    graph = tf1.GraphDef()
    for name, op, inputs in [("x", "Placeholder", ()), ("mm", "MatMul", ("x", "x")), ("bias", "BiasAdd", ("mm", "x")),
                             ("s", "Shape", ("bias",))]:
        _node(graph, name, op, inputs)
    ran = tf1.GraphDef()
    _node(ran, "bias", "_FusedMatMul", ("_arg_x_0_0", "_arg_x_0_0", "_arg_x_0_0"))
    stats = step_stats_pb2.StepStats()
    cpu1 = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:1")
    cpu1.node_stats.extend([step_stats_pb2.NodeExecStats(node_name=n, timeline_label=f"{n} = {t}()")
                            for n, t in [("bias", "_FusedMatMul"), ("bias/_4", "_Send"),
                                         ("ConstantFolding/s-folded-0", "Const")]])
    cpu2 = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:2")
    cpu2.node_stats.extend([step_stats_pb2.NodeExecStats(node_name="bias/_5", timeline_label="bias/_5 = _Recv()")])
    # A GPU's stream entries repeat its executor's: not read.
    stats.dev_stats.add(device="/device:GPU:0/stream:all").node_stats.add(node_name="s:Kernel")
    where = where_ops_ran(stats, graph, [ran])
    assert where == {op: {cpu1.device} for op in ("bias", "mm", "s")}


def test_ops_merged_with_an_equal_op_or_replicated_are_no_fused_readers_ops():
    # Two equal constants of CPU:4, each read by one batch norm, on CPU:1 and CPU:2 (oneDNN's
    # kernels: fused nodes by type). Common-subexpression elimination keeps one; TF replicates it
    # (a constant of at most 16 elements) onto both devices, where the batch norms read it.
    # Neither constant was replaced by its batch norm: the one merged away ran nowhere, the one
    # kept only as replicas, which are the runtime's nodes.
    task = "/job:localhost/replica:0/task:0"
    cpu = {i: f"{task}/device:CPU:{i}" for i in (1, 2, 4)}
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4, 4, 3], name="x")
        with tf.device(cpu[4]):
            zeros = {1: tf.zeros([0], name="zeros"), 2: tf.zeros([0], name="zeros_1")}
            scale, offset = tf.ones([3], name="scale"), tf.zeros([3], name="offset")
        outs = []
        for i in (1, 2):
            with tf.device(cpu[i]):
                y = tf1.nn.fused_batch_norm(x, scale, offset, mean=zeros[i], variance=zeros[i], name=f"bn{i}")[0]
                outs.append(tf.reduce_sum(y, name=f"out{i}"))
    config = session_config(standin_cluster(4, prefix=task))
    with tf1.Session(graph=graph, config=config) as sess:
        metadata = tf1.RunMetadata()
        sess.run(outs, {x: np.ones([2, 4, 4, 3], np.float32)}, run_metadata=metadata, options=tf1.RunOptions(
            trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True))
    graph_def = graph.as_graph_def()
    ran = {n.name for p in metadata.partition_graphs for n in p.node}
    assert len({"zeros", "zeros_1"} - ran) == 2 and any("zeros" in n and "/replicate/" in n for n in ran), ran
    where = where_ops_ran(metadata.step_stats, graph_def, metadata.partition_graphs)
    assert where["bn1"] == {cpu[1]} and where["bn2"] == {cpu[2]}
    assert "zeros" not in where and "zeros_1" not in where
    assert not {"zeros", "zeros_1"} & set(fused_ops(graph_def, metadata.partition_graphs))
