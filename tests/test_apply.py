"""Placement -> GraphDef (only devices change), and the placed LSTM running where it was placed."""

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf.cluster import CommCost
from baechi_tf.cost_model.executed import where_ops_ran
from baechi_tf.errors import InvalidGraphError
from baechi_tf.placer.pipeline import PlacementOptions
from baechi_tf.rewriter.apply import apply_placement
from baechi_tf.rewriter.devices import session_config, standin_cluster
from baechi_tf.rewriter.graph_pass import place_graph_def
from test_importer import _while_loop_graph, empty_profile
from tf_models import profiled_lstm

pytestmark = pytest.mark.tf

TASK = "/job:localhost/replica:0/task:0"


@pytest.fixture(scope="module")
def lstm():
    return profiled_lstm()


@pytest.fixture(scope="module")
def lstm_fused():
    """The LSTM profiled with the optimizations placed graphs run with: its profile knows which
    ops the remapper fuses (MatMul + the bias' Add)."""
    from baechi_tf.cost_model import profile_fetch

    model = profiled_lstm().model
    with tf.compat.v1.Session(graph=model.graph, config=session_config(standin_cluster(4, prefix=TASK))) as s:
        s.run(model.init)
        profile = profile_fetch(s, [model.loss, model.train_op], model.feed(), warmup_steps=1, traced_steps=2)
    return profile


def _without_devices(graph_def):
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for node in copy.node:
        node.device = ""
    return copy


def test_round_trip_changes_devices_only(lstm):
    before = lstm.graph_def.SerializeToString(deterministic=True)
    setup = standin_cluster(4, prefix=TASK)
    placed, report = place_graph_def(
        lstm.graph_def, lstm.profile, setup.cluster, PlacementOptions("m_etf"),
        host_device=setup.host, device_aliases=setup.aliases,
    )
    assert lstm.graph_def.SerializeToString(deterministic=True) == before  # input untouched
    assert placed is not lstm.graph_def
    assert _without_devices(placed) == _without_devices(lstm.graph_def)
    assert [n.name for n in placed.node] == [n.name for n in lstm.graph_def.node]
    assert {n.device for n in placed.node} <= set(setup.cluster.names)
    assert report.op_to_device == {n.name: n.device for n in placed.node}
    assert report.makespan_us >= report.lower_bound_us > 0
    assert report.result.cluster == setup.cluster  # nothing needed the host
    assert set(report.step_seconds) == {"import", "place", "apply"}
    summary = report.summary()
    assert "profile covers" in summary and "traced time no op accounts for" in summary
    # The initialisers ran in no traced step: the summary says so once, naming the first of them.
    unrun = len(report.coverage.unrun_ops)
    assert unrun and summary.count(f"{unrun} ops ran in no traced step") == 1
    assert f"{unrun} ops ran in no traced step (first: " in summary


def test_same_inputs_same_placed_bytes(lstm):
    setup = standin_cluster(3, prefix=TASK)
    runs = [
        place_graph_def(lstm.graph_def, lstm.profile, setup.cluster, PlacementOptions("m_etf"),
                        host_device=setup.host)[0].SerializeToString(deterministic=True)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_apply_keeps_unnamed_nodes_and_refuses_strangers(lstm):
    first = lstm.graph_def.node[0].name
    placed = apply_placement(lstm.graph_def, {first: "/device:CPU:1"})
    assert placed.node[0].device == "/device:CPU:1"
    assert [n.device for n in placed.node[1:]] == [n.device for n in lstm.graph_def.node[1:]]
    with pytest.raises(InvalidGraphError, match="1 ops the GraphDef does not have.*'ghost'"):
        apply_placement(lstm.graph_def, {"ghost": "/device:CPU:1"})


@pytest.mark.parametrize("method", ["m_etf", "m_topo"])
def test_placed_lstm_runs_where_placed_and_computes_the_same(lstm, lstm_fused, method):
    model = lstm.model
    fused = {n: c.fused_into for n, c in lstm_fused.ops.items() if c.fused_into}
    assert "lstm0/t0/MatMul" in fused  # fused into the bias' add: placed with it
    # Virtual CPU devices share the host's memory: a transfer between them is cheap.
    setup = standin_cluster(4, comm=CommCost(1e-6, 1.0), prefix=TASK)
    placed, report = place_graph_def(
        lstm.graph_def, lstm_fused, setup.cluster, PlacementOptions(method),
        host_device=setup.host, device_aliases=setup.aliases,
    )
    assert all(report.op_to_device[n] == report.op_to_device[into] for n, into in fused.items())
    assert len(report.devices_used) >= 2

    fetches = [model.loss.name, model.predictions.name, model.train_op.name]
    # Unplaced: the user's graph in a plain session.
    with tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        expected = [sess.run(fetches, model.feed(step))[:2] for step in range(2)]
        expected_after = sess.run(model.predictions, model.feed(5))

    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(placed, name="")
    with tf.compat.v1.Session(graph=graph, config=session_config(setup)) as sess:
        assert len(sess.list_devices()) == 5  # 4 stand-ins and the host
        sess.run(model.init.name)
        metadata = tf.compat.v1.RunMetadata()
        got = [
            sess.run(
                fetches, model.feed_by_name(step),
                options=tf.compat.v1.RunOptions(
                    trace_level=tf.compat.v1.RunOptions.FULL_TRACE, output_partition_graphs=True),
                run_metadata=metadata,
            )[:2]
            for step in range(2)
        ]
        got_after = sess.run(model.predictions.name, model.feed_by_name(5))

    # Every op of the graph that ran, ran on the device the placement chose (Grappler's nodes and
    # fused nodes on that of the ops they were made of).
    ran = where_ops_ran(metadata.step_stats, placed, metadata.partition_graphs)
    chosen = report.op_to_device
    checked = {name: devices for name, devices in ran.items() if name in chosen}
    assert len(checked) > 250  # Grappler folds some of the ops away
    wrong = {n: (d, chosen[n]) for n, d in checked.items() if d != {chosen[n]}}
    assert not wrong
    assert len(set().union(*checked.values())) >= 2
    # TF colocation is respected, in the placement and in the run.
    colocated = 0
    for node in placed.node:
        for target in (s.decode()[len("loc:@"):] for s in node.attr["_class"].list.s):
            assert chosen[node.name] == chosen[target]
            if node.name in ran and target in ran:
                assert ran[node.name] == ran[target]
                colocated += 1
    assert colocated > 20
    # Same numbers as the unplaced graph.
    for (loss, pred), (loss0, pred0) in zip(got, expected):
        np.testing.assert_allclose(loss, loss0, rtol=1e-5)
        np.testing.assert_allclose(pred, pred0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_after, expected_after, rtol=1e-5, atol=1e-6)


def test_placed_v1_loop_runs_across_devices():
    gd = _while_loop_graph()
    setup = standin_cluster(2, prefix=TASK)
    placed, report = place_graph_def(
        gd, empty_profile(gd), setup.cluster, PlacementOptions("m_topo"),
        host_device=setup.host, device_aliases=setup.aliases,
    )
    x = np.array([1.0, 2.0, 3.0], np.float32)
    values = []
    for graph_def, config in ((gd, None), (placed, session_config(setup))):
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            values.append(sess.run("result:0", {"x:0": x}))
    np.testing.assert_allclose(values[0], values[1])
    expected = np.zeros(3, np.float32)
    for _ in range(4):
        expected = expected * 1.5 + x
    np.testing.assert_allclose(values[0], expected)
    assert len(report.devices_used) == 2
