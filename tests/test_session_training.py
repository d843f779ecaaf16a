"""BaechiSession trains as a plain session does: losses, variables, the default session, seeded
random ops, savers, monitored sessions, memory limits."""

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf import BaechiSession, PlacementOptions
from baechi_tf.cluster import GiB
from baechi_tf.cost_model import load_profile
from baechi_tf.cost_model.executed import where_ops_ran
from baechi_tf.errors import InfeasiblePlacementError
from session_helpers import TASK, fast
from tf_models import build_lstm

pytestmark = pytest.mark.tf


STEPS = 4


def plain_losses(model, start=0, steps=STEPS, sess=None):
    own = sess is None
    sess = sess or tf.compat.v1.Session(graph=model.graph)
    try:
        if own:
            sess.run(model.init)
        return [sess.run([model.loss, model.train_op], model.feed(start + i))[0] for i in range(steps)]
    finally:
        if own:
            sess.close()


@pytest.fixture(scope="module")
def resource_model():
    model = build_lstm()
    return model, plain_losses(model)


def test_training_reproduces_plain_losses(resource_model, tmp_path):
    model, expected = resource_model
    cost_path = tmp_path / "cost.pb"
    with BaechiSession(
        graph=model.graph, placement_method="m_etf", num_devices=4, cost_path=str(cost_path),
        **fast(),
    ) as sess:
        assert sess.placement is None
        sess.run(model.init)
        first = sess.placement
        losses = [sess.run([model.loss, model.train_op], model.feed(i))[0] for i in range(STEPS)]
        report = sess.placement
        assert report is not first  # the training fetch had new ops: placed again
        # Later runs of known fetches, and of fetches whose ops were all profiled, reuse it.
        sess.run({"loss": model.loss}, model.feed(0))
        sess.run(model.predictions.name, model.feed_by_name(0))
        assert sess.placement is report
        # Traced through the session: every op that ran, ran where the placement put it (those
        # Grappler rewrote or fused too).
        metadata = tf.compat.v1.RunMetadata()
        sess.run(
            [model.loss, model.train_op], model.feed(0),
            options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE, output_partition_graphs=True),
            run_metadata=metadata,
        )
        ran = where_ops_ran(metadata.step_stats, sess.placed_graph_def, metadata.partition_graphs)
        checked = [n for n in ran if n in report.op_to_device]
        assert len(checked) > 250
        assert all(ran[n] == {report.op_to_device[n]} for n in checked)
        assert sess.graph is model.graph
        names = {d.name for d in sess.list_devices()}
        assert names == {f"{TASK}/device:CPU:{i}" for i in range(5)}
        placed_def = sess.placed_graph_def
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    # The report.
    assert set(report.op_to_device) == {n.name for n in model.graph.as_graph_def().node}
    assert set(report.op_to_device.values()) <= {f"{TASK}/device:CPU:{i}" for i in range(1, 5)}
    assert {n.name: n.device for n in placed_def.node} == report.op_to_device
    assert report.makespan_us >= report.lower_bound_us > 0
    assert 0.5 < report.coverage.op_share <= 1 and report.coverage.compute_share > 0.5
    # The profile of both fetches was written.
    profile = load_profile(cost_path)
    assert "train" in profile.ops and "init" in profile.ops


def test_wrapping_a_session_that_already_trained(resource_model):
    model, expected = resource_model
    user = tf.compat.v1.Session(graph=model.graph)
    user.run(model.init)
    head = plain_losses(model, steps=2, sess=user)
    np.testing.assert_allclose(head, expected[:2], rtol=1e-5)
    sess = BaechiSession(user, placement_method="m_topo", num_devices=3, **fast())
    with sess:
        tail = [sess.run([model.loss, model.train_op], model.feed(2 + i))[0] for i in range(2)]
        # Ops added to the graph after a placement make the next run place again.
        with model.graph.as_default():
            doubled = tf.multiply(model.loss, 2.0, name="doubled_loss_for_test")
        before = sess.placement
        value = sess.run(doubled, model.feed(9))
        assert sess.placement is not before
        assert "doubled_loss_for_test" in sess.placement.op_to_device
    np.testing.assert_allclose(tail, expected[2:4], rtol=1e-5)  # variables carried over
    assert user._closed  # closing the BaechiSession closed the session it wrapped
    with pytest.raises(RuntimeError, match="closed"):
        sess.run(model.loss, model.feed(0))
    assert np.isfinite(value)


def test_reference_variables_train_the_same():
    model = build_lstm(use_resource=False)
    expected = plain_losses(model, steps=3)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    with BaechiSession(
        graph=model.graph, config=config, placement_method="m_etf", num_devices=2,
        memory_bytes_per_device=1 * GiB, **fast(),
    ) as sess:
        sess.run(model.init)
        losses = [sess.run([model.loss, model.train_op], model.feed(i))[0] for i in range(3)]
        assert {d.memory_bytes for d in sess.devices.cluster.devices} == {1 * GiB}
        # Reference variables' assigns are colocated with their variables (TF requires it).
        chosen = sess.placement.op_to_device
        assert chosen["lstm0/kernel/Assign"] == chosen["lstm0/kernel"]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)


def test_a_regularizer_loss_is_fetched_as_session_run_fetches_it():
    # get_variable(regularizer=...) puts a lazily made tensor into REGULARIZATION_LOSSES, a type
    # that TF registers with Session.run; BaechiSession refused it ("cannot fetch or feed").
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable(
            "w", [3, 3], initializer=tf.compat.v1.ones_initializer(),
            regularizer=lambda t: 0.01 * tf.nn.l2_loss(t),
        )
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
        assert not isinstance(losses[0], tf.Tensor)
    with BaechiSession(graph=graph, num_devices=2, **fast()) as sess:
        sess.run(w.initializer)
        fetched = sess.run({"losses": losses, "one": losses[0]})
    assert fetched["losses"] == [pytest.approx(0.045)] and fetched["one"] == pytest.approx(0.045)


def test_an_op_outside_the_fetch_that_does_not_fit_is_said_to_be_outside():
    graph = tf.Graph()
    with graph.as_default():
        v = tf.Variable(tf.ones([16, 16]))
        total = tf.reduce_sum(tf.matmul(v, v))
    user = tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(device_count={"CPU": 3}))
    user.run(v.initializer)
    with BaechiSession(user, num_devices=2, memory_bytes_per_device=100_000, **fast()) as sess:
        assert sess.run(total) == pytest.approx(256 * 16)
        with graph.as_default():
            tf.Variable(tf.ones([512, 512], name="big"))  # 1 MiB, never run
        # v's read was not profiled: the fetch is placed again, the whole graph with it, and
        # the error named only the new variable, which the fetch does not run (its initial
        # value 'big', which no profiled step ran, costs nothing: the variable holds the bytes).
        with pytest.raises(
            InfeasiblePlacementError,
            match=r"op 'Variable_1' cannot run on any device.*\(BaechiSession places the whole graph: also the \d+ ops that this fetch does not run\)$",
        ):
            sess.run(v)


def test_memory_fraction_scales_the_stand_ins_memory():
    # train.py's --memory_fraction scaled the stand-ins; BaechiSession's gave them all of it.
    graph = tf.Graph()
    with graph.as_default():
        v = tf.Variable(tf.ones([256, 256]))  # 256 KiB of weights
    sess = BaechiSession(graph=graph, num_devices=2, memory_bytes_per_device=4 << 20, memory_fraction=0.01)
    with sess:
        assert [d.memory_bytes for d in sess.devices.cluster.devices] == [int((4 << 20) * 0.01)] * 2
        with pytest.raises(InfeasiblePlacementError, match=r"over the 40.96 KiB of the largest device"):
            sess.run(v.initializer)


@pytest.mark.parametrize("use_resource", [True, False])
def test_variables_are_fetched_like_a_session_does(use_resource):
    # A variable stands for its value, alone or inside a structure; it once crashed on
    # `element() or x`, which asks a graph tensor for a truth value.
    g = tf.Graph()
    with g.as_default():
        v = tf.compat.v1.get_variable(
            "v", [2], initializer=tf.compat.v1.constant_initializer([1.0, 2.0]), use_resource=use_resource
        )
        bump = tf.compat.v1.assign_add(v, [10.0, 20.0])
        init = tf.compat.v1.global_variables_initializer()
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(init)
        np.testing.assert_array_equal(sess.run(v), [1.0, 2.0])
        sess.run(bump)
        got = sess.run({"value": v, "pair": (v, [v])})
    np.testing.assert_array_equal(got["value"], [11.0, 22.0])
    np.testing.assert_array_equal(got["pair"][0], [11.0, 22.0])
    np.testing.assert_array_equal(got["pair"][1][0], [11.0, 22.0])


def test_with_block_makes_it_the_default_session_as_a_session_does():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        v = tf.compat.v1.get_variable("v", [2], initializer=tf.compat.v1.ones_initializer())
        y = v * x
        bump = tf.group(tf.compat.v1.assign_add(v, [1.0, 1.0]))
        init = tf.compat.v1.global_variables_initializer()
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        # tensor.eval() and op.run() find it, and ops built in the block join its graph.
        assert tf.compat.v1.get_default_session() is sess
        assert tf.compat.v1.get_default_graph() is g
        init.run()
        np.testing.assert_array_equal(y.eval(feed_dict={x: [2.0, 3.0]}), [2.0, 3.0])
        bump.run()
        z = tf.identity(y, name="z")
        np.testing.assert_array_equal(sess.run(z, {x: [2.0, 3.0]}), [4.0, 6.0])
        with pytest.raises(RuntimeError, match="not re-entrant"):
            sess.__enter__()
    assert tf.compat.v1.get_default_session() is None
    assert tf.compat.v1.get_default_graph() is not g
    other = BaechiSession(graph=g, num_devices=2, **fast())
    try:
        with g.as_default(), other.as_default():  # as_default leaves the graph alone, as TF's
            init.run()  # a new session: its own variables
            np.testing.assert_array_equal(v.eval(), [1.0, 1.0])
    finally:
        other.close()


def test_seeded_random_ops_do_not_draw_their_numbers_again_after_a_new_placement():
    # With set_random_seed, a new placement (any new fetch: a metric, Saver.save) started every
    # random op's sequence again: the same dropout masks as in the first steps.
    def build():
        g = tf.Graph()
        with g.as_default():
            tf.compat.v1.set_random_seed(0)
            noise = tf.random.uniform([3], seed=1)
            fresh = tf.random.uniform([3], seed=2)  # first run after the new placement
            # A random op in a loop's body function (control flow v2): the function's op is seeded.
            _, looped = tf.while_loop(
                lambda i, acc: i < 2, lambda i, acc: (i + 1, acc + tf.random.uniform([3], seed=4)),
                [tf.constant(0), tf.zeros([3])],
            )
            other = tf.constant(1.0, name="other")
        return g, noise, fresh, looped, other

    draws = []
    for wrap in (False, True):
        g, noise, fresh, looped, other = build()
        assert g.as_graph_def().library.function  # the loop's body is a function
        sess = BaechiSession(graph=g, num_devices=2, **fast()) if wrap else tf.compat.v1.Session(graph=g)
        with sess:
            a, b = sess.run([noise, looped]), sess.run([noise, looped])
            placements = sess.placement if wrap else None
            sess.run(other)  # a new fetch: placed again
            if wrap:
                assert sess.placement is not placements
            draws.append((a, b, sess.run([noise, looped]), sess.run([fresh])))
    plain, placed = draws
    for i in (0, 1, 3):  # before the new placement, and an op first run after it: as in a Session
        for x, y in zip(placed[i], plain[i]):
            np.testing.assert_array_equal(x, y)
    # After it, `noise` and the loop go on with numbers they have not drawn (a Session's would be
    # plain[2]).
    for k in range(2):
        assert not np.array_equal(placed[2][k], placed[0][k]) and not np.array_equal(placed[2][k], placed[1][k])


def test_a_saver_saves_and_restores_through_it(tmp_path):
    # Saver.save once refused it: "'sess' must be a Session" (TF checks for SessionInterface).
    g = tf.Graph()
    with g.as_default():
        w = tf.compat.v1.get_variable("w", [3, 2], initializer=tf.compat.v1.ones_initializer())
        step = tf.compat.v1.assign_add(w, tf.ones([3, 2]))
        init = tf.compat.v1.global_variables_initializer()
        saver = tf.compat.v1.train.Saver()
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        assert isinstance(sess, BaechiSession)
        sess.run(init)
        sess.run(step)
        path = saver.save(sess, str(tmp_path / "ckpt"))
        sess.run(step)
        saver.restore(sess, path)
        np.testing.assert_array_equal(sess.run(w), np.full([3, 2], 2.0))
    with tf.compat.v1.Session(graph=g) as plain:
        saver.restore(plain, path)
        np.testing.assert_array_equal(plain.run(w), np.full([3, 2], 2.0))


def test_a_monitored_session_with_hooks_trains_through_it_as_through_a_session():
    g = tf.Graph()
    with g.as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.compat.v1.get_variable("w", [16, 4], initializer=tf.compat.v1.constant_initializer(0.01))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    inputs = [np.random.default_rng(i).normal(size=(8, 16)).astype(np.float32) for i in range(4)]

    class Seen(tf.compat.v1.train.SessionRunHook):  # asks for more fetches at every run
        def __init__(self):
            self.losses = []

        def before_run(self, run_context):
            return tf.compat.v1.train.SessionRunArgs({"loss": loss})

        def after_run(self, run_context, run_values):
            self.losses.append(run_values.results["loss"])

    def train_with(make_session):
        class Creator(tf.compat.v1.train.SessionCreator):
            def create_session(self):
                sess = make_session()
                sess.run(tf.compat.v1.global_variables_initializer())
                return sess

        seen = Seen()
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=len(inputs)), seen]
        losses = []
        with g.as_default(), tf.compat.v1.train.MonitoredSession(session_creator=Creator(), hooks=hooks) as ms:
            while not ms.should_stop():
                losses.append(ms.run([train, loss], {x: inputs[len(losses)]})[1])
        assert seen.losses == losses  # the hook's fetch and the caller's, in the same runs
        return losses

    expected = train_with(lambda: tf.compat.v1.Session(graph=g))
    got = train_with(lambda: BaechiSession(graph=g, num_devices=2, **fast()))
    assert len(got) == len(inputs)  # StopAtStepHook read the global step through it
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_an_embedding_pinned_to_the_host_trains_on_devices_too_small_for_it():
    # Ops pinned to the host were placed as free ops first, their weights counted on the devices:
    # a 1.28 MB embedding on CPU:0 (the usual layout) beside 256 KiB devices was refused.
    g = tf.Graph()
    with g.as_default():
        ids = tf.compat.v1.placeholder(tf.int32, [8], name="ids")
        with tf.device("/device:CPU:0"):
            emb = tf.compat.v1.get_variable("emb", [20_000, 16], initializer=tf.compat.v1.constant_initializer(0.01))
            rows = tf.gather(emb, ids, name="rows")
        w = tf.compat.v1.get_variable("w", [16, 16], initializer=tf.compat.v1.constant_initializer(0.1))
        loss = tf.reduce_sum(tf.tanh(tf.matmul(rows, w, name="mm")))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    feed = {ids: np.arange(8, dtype=np.int32)}
    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        expected = [plain.run([loss, train], feed)[0] for _ in range(2)]
    with BaechiSession(graph=g, num_devices=2, memory_bytes_per_device=256 * 1024,
                       options=PlacementOptions("auto", refine_seconds=0.5), **fast()) as sess:
        sess.run(init)
        got = [sess.run([loss, train], feed)[0] for _ in range(2)]
        where = sess.placement.op_to_device
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert where["emb"].endswith("device:CPU:0") and where["rows"].endswith("device:CPU:0")
    assert not where["mm"].endswith("device:CPU:0")
