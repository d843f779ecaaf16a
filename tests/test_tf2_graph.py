"""A trace of a tf.function as the GraphDef the pipeline places (baechi_tf/tf2/graph.py): its
variables pinned where they live, its inputs fed, its profile taken on copies."""

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf.errors import ConfigError
from baechi_tf.rewriter.devices import LOCAL_TASK, session_config, standin_cluster
from baechi_tf.tf2.graph import function_graph, profile_function, trace_signature

pytestmark = pytest.mark.tf

HOST = f"{LOCAL_TASK}/device:CPU:0"


def _training_step():
    w = tf.Variable(np.full([64, 32], 0.01, np.float32), name="w")
    b = tf.Variable(np.zeros([32], np.float32), name="b")
    scale = tf.constant(0.5)  # a captured tensor that is not a variable

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.tanh(tf.matmul(x, w) + b) * scale)
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.1 * gw)
        b.assign_sub(0.1 * gb)
        return loss

    return step, w, b


def test_variables_become_handles_pinned_where_they_live():
    step, w, b = _training_step()
    x = tf.ones([8, 64])
    trace = tf.function(step).get_concrete_function(x)
    traced = function_graph(trace, (x,), {})
    nodes = {n.name: n for n in traced.graph_def.node}
    handles = {name: nodes[name] for name in traced.variables}
    assert sorted(v.name for v in traced.variables.values()) == ["b:0", "w:0"]
    for name, node in handles.items():
        variable = traced.variables[name]
        assert node.op == "VarHandleOp" and node.device == variable.device == HOST
        assert tf.TensorShape(node.attr["shape"].shape) == variable.shape
        assert node.attr["dtype"].type == tf.float32.as_datatype_enum
    # The argument and the captured constant are fed, pinned where their values are.
    assert nodes["x"].op == "Placeholder" and nodes["x"].device == HOST
    assert "x:0" in traced.feeds and len(traced.feeds) == 2
    # The loss, and the updates that nothing fetched would run otherwise.
    assert traced.fetches[0] == trace.graph.outputs[0].name
    assert {"AssignSubVariableOp", "AssignSubVariableOp_1"} <= set(traced.fetches)


def test_profile_is_taken_on_copies_of_the_variables():
    step, w, b = _training_step()
    x = tf.random.stateless_normal([256, 64], seed=[1, 2])
    trace = tf.function(step).get_concrete_function(x)
    before = w.numpy(), b.numpy()
    setup = standin_cluster(2, prefix=LOCAL_TASK)
    profile = profile_function(
        function_graph(trace, (x,), {}), session_config(setup), warmup_steps=1, traced_steps=2
    )
    # Seven training steps ran, on copies: the variables did not move.
    np.testing.assert_array_equal(w.numpy(), before[0])
    np.testing.assert_array_equal(b.numpy(), before[1])
    assert profile.num_traced_steps == 2
    # Grappler's remapper runs MatMul + add + Tanh as one node, named after the Tanh, as it will
    # in the placed function; the profile says so.
    assert profile.ops["MatMul"].fused_into == "Tanh"
    assert profile.ops["Tanh"].compute_us > 0 and profile.ops["Tanh"].output_bytes == (256 * 32 * 4,)
    assert profile.ops["gradient_tape/MatMul/MatMul"].compute_us > 0


def test_a_captured_resource_that_is_not_a_variable_is_refused():
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant([1, 2], tf.int64), tf.constant([3.0, 4.0])), 0.0
    )

    def lookup(keys):
        return table.lookup(keys)

    keys = tf.constant([1, 2], tf.int64)
    trace = tf.function(lookup).get_concrete_function(keys)
    with pytest.raises(ConfigError, match="not a tf.Variable .* make the resource outside"):
        function_graph(trace, (keys,), {})


def test_two_traces_of_one_function_share_a_signature():
    w = tf.Variable(tf.ones([4, 4]))

    def branchy(x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(x, w), lambda: x)

    x = tf.ones([4, 4])
    first = tf.function(branchy).get_concrete_function(x).graph.as_graph_def()
    second = tf.function(branchy).get_concrete_function(x).graph.as_graph_def()
    # The cond's branches are new functions, under new names; the ops are the same.
    assert {f.signature.name for f in first.library.function} != {f.signature.name for f in second.library.function}
    assert trace_signature(first) == trace_signature(second)


def test_python_state_that_changes_the_trace_changes_the_signature():
    calls = []

    def counting(x):
        calls.append(1)
        return x * float(len(calls))

    x = tf.ones([2])
    first = tf.function(counting).get_concrete_function(x).graph.as_graph_def()
    second = tf.function(counting).get_concrete_function(x).graph.as_graph_def()
    assert trace_signature(first) != trace_signature(second)


def test_a_summary_names_at_most_thirty_variables_per_device():
    """A ResNet50 reads 324 variables: the summary names 30 of a device's and counts the rest."""
    import types

    from baechi_tf.tf2.function import _variable_notes
    from baechi_tf.tf2.graph import FunctionGraph

    variables = {f"v{i:02d}": tf.Variable(0.0, name=f"v{i:02d}") for i in range(35)}
    host = next(iter(variables.values())).device
    traced = FunctionGraph(graph_def=None, feeds={}, fetches=(), variables=variables, pinned_inputs={})
    (note,) = _variable_notes(traced, types.SimpleNamespace(host=types.SimpleNamespace(name=host)))
    assert note.startswith("variables: 35 pinned where they live")
    assert "v29:0 and 5 more on " + host + " (the host)" in note
    assert "v30:0" not in note
