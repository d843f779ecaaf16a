"""BaechiSession: both forms, training losses equal a plain session's, re-placement, the API."""

import collections
import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import baechi_tf
from baechi_tf import BaechiSession, PlacementOptions
from baechi_tf.cluster import CommCost, GiB
from baechi_tf.cost_model import CostProfile, load_profile, save_profile
from baechi_tf.cost_model.executed import is_runtime, source_op, where_ops_ran
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from tf_models import build_lstm

STEPS = 4
TASK = "/job:localhost/replica:0/task:0"


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


def fast(**kwargs):
    return dict(warmup_steps=0, profile_steps=1, **kwargs)


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


def test_iterators_and_queues_keep_their_state_across_new_fetches(caplog):
    # Each new fetch below would once have been profiled and placed again, in a new session with
    # fresh iterators and queues: get_next failed (not initialised), the dequeue hung, and the
    # one-shot iterator read its dataset again from the start.
    g = tf.Graph()
    with g.as_default():
        data = tf.compat.v1.placeholder(tf.float32, [None], name="data")
        it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(data).batch(2))
        batch = it.get_next()
        one_shot = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(100).batch(2)).get_next()
        doubled = one_shot * 2
        q = tf.queue.FIFOQueue(10, tf.float32, shapes=[3])
        enqueue = q.enqueue_many(tf.ones([2, 3]))
        dequeue = q.dequeue()
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(it.initializer, {data: np.arange(6, dtype=np.float32)})
        np.testing.assert_array_equal(sess.run(batch), [0.0, 1.0])
        np.testing.assert_array_equal(sess.run(batch), [2.0, 3.0])
        np.testing.assert_array_equal(sess.run(one_shot), [0, 1])
        got = sess.run([one_shot, doubled])
        np.testing.assert_array_equal(got[0], [2, 3])
        np.testing.assert_array_equal(got[1], [4, 6])
        np.testing.assert_array_equal(sess.run(one_shot), [4, 5])
        sess.run(enqueue)
        np.testing.assert_array_equal(sess.run(dequeue), [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(sess.run(batch), [4.0, 5.0])
        # An op made after the runs is not in the placed graph: placing again restarts the
        # queues, and says so; the iterators are copied into the new session and go on.
        with g.as_default():
            tripled = one_shot * 3
        with caplog.at_level("WARNING", logger="baechi_tf.rewriter.session"):
            np.testing.assert_array_equal(sess.run(tripled), [18, 21])
            with pytest.raises(tf.errors.OutOfRangeError):  # read to its end before
                sess.run(batch)
        assert "placing it again restarts the queues" in caplog.text


def test_one_op_placed_by_estimates_is_counted_as_one_op(caplog):
    # The warning said "where 1 of its ops were placed by estimated costs".
    g = tf.Graph()
    with g.as_default():
        q = tf.queue.FIFOQueue(10, tf.float32, shapes=[])
        enqueue = q.enqueue_many([[1.0, 2.0]])
        size = q.size()
    with caplog.at_level(logging.WARNING, logger="baechi_tf"), BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(enqueue)
        assert sess.run(size) == 2  # on the placement as it is: the queue keeps its elements
    assert "running a new fetch on the placement as it is, where 1 of its ops was placed by estimated costs" in caplog.text


def test_an_iterator_made_again_reads_what_was_fed_not_what_the_buffer_holds_now(caplog):
    # The initializer's run is replayed in each new session (the profiling copies' and the placed
    # one) with its feeds, which were kept by reference: a caller that refilled its buffer after
    # the initializer (a data loader reusing it) had the iterator read the new contents, where a
    # Session's iterator holds what was fed. (TF copies a fed array unless it is 64-byte aligned;
    # an aligned one it reads in place, where changing it is undefined behaviour. The buffer here,
    # one float past a 16-byte aligned start, is copied.)
    g = tf.Graph()
    with g.as_default():
        data = tf.compat.v1.placeholder(tf.float32, [None], name="data")
        it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(data).batch(2))
        batch = it.get_next()

    def buffer():
        b = np.zeros(7, np.float32)[1:]
        assert b.ctypes.data % 64 != 0
        b[:] = np.arange(6)
        return b

    with tf.compat.v1.Session(graph=g) as plain:
        b = buffer()
        plain.run(it.initializer, {data: b})
        b[:] = -1.0
        expected = plain.run(batch)
    np.testing.assert_array_equal(expected, [0.0, 1.0])
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        b = buffer()
        sess.run(it.initializer, {data: b})
        b[:] = -1.0
        np.testing.assert_array_equal(sess.run(batch), expected)  # placed here: the replay
        with g.as_default():
            tripled = batch * 3
        with caplog.at_level("WARNING", logger="baechi_tf.rewriter.session"):
            # Placed again: the initializer again (what was fed), then the iterator where it was.
            np.testing.assert_array_equal(sess.run(tripled), [6.0, 9.0])
        assert "restarts" not in caplog.text


def _feedable_iterators():
    g = tf.Graph()
    with g.as_default():
        train = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(100, 200).repeat())
        val = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(3))
        handles = [train.string_handle(), val.string_handle()]
        handle = tf.compat.v1.placeholder(tf.string, [])
        value = tf.compat.v1.data.Iterator.from_string_handle(handle, tf.int64, []).get_next() * 2

    def steps(sess):
        train_handle, val_handle = sess.run(handles)
        sess.run(val.initializer)
        read = [sess.run(value, {handle: train_handle}) for _ in range(2)]
        read += [sess.run(value, {handle: val_handle}) for _ in range(3)]
        return read + [sess.run(value, {handle: train_handle})]

    return g, steps


def _staging_area():
    from tensorflow.python.ops import data_flow_ops

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2])
        area = data_flow_ops.StagingArea([tf.float32], shapes=[[2]])
        put, get = area.put([x * 3.0]), area.get()

    def steps(sess):
        sess.run(put, {x: [1.0, 2.0]})
        return sess.run(get)

    return g, steps


@pytest.mark.parametrize(
    "build, placer", [(_feedable_iterators, dict(num_devices=4, placement_method="m_topo")), (_staging_area, {})]
)
def test_feedable_iterators_and_staging_areas_run_as_on_a_session(build, placer):
    # A feedable iterator failed ("create an iterator on device CPU:2 from handle defined on
    # device CPU:1": nothing linked the iterators to from_string_handle, so they were placed
    # apart). A staging area's get, a new fetch after the put, was placed again, and its Unstage
    # waited for ever on another device than the put's Stage (TF's run timeout does not stop it).
    import threading

    g, steps = build()
    with tf.compat.v1.Session(graph=g) as plain:
        expected = steps(plain)
    g, steps = build()
    sess = BaechiSession(graph=g, **{"num_devices": 2, **placer}, **fast())
    got = []
    run = threading.Thread(target=lambda: got.append(steps(sess)), daemon=True)
    run.start()
    run.join(60)
    assert not run.is_alive(), "the steps never ended"
    sess.close()
    got = got[0]
    if build is _feedable_iterators:
        assert got == expected == [200, 202, 0, 2, 4, 204]
    else:
        np.testing.assert_array_equal(got, [[3.0, 6.0]])
        np.testing.assert_array_equal(got, expected)


def _feedable_training(one_shot=True, external_state=False):
    # A training step that reads its batches through a feedable iterator (from_string_handle).
    g = tf.Graph()
    with g.as_default():
        rows = np.arange(64, dtype=np.float32).reshape(16, 4) / 64
        data = tf.data.Dataset.from_tensor_slices(rows)
        if external_state:  # a py_func: TF cannot write down where such a dataset's iterator is
            data = data.map(lambda r: tf.numpy_function(lambda v: v * 2, [r], tf.float32, stateful=True))
            data = data.map(lambda r: tf.ensure_shape(r, [4]))
        data = data.shuffle(8, seed=1).batch(2).repeat()
        make = tf.compat.v1.data.make_one_shot_iterator if one_shot else tf.compat.v1.data.make_initializable_iterator
        source = make(data)
        handle = tf.compat.v1.placeholder(tf.string, [], name="handle")
        batch = tf.compat.v1.data.Iterator.from_string_handle(
            handle, tf.compat.v1.data.get_output_types(source), tf.compat.v1.data.get_output_shapes(source)
        ).get_next()
        w = tf.compat.v1.get_variable("w", [4, 4], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_sum(tf.tanh(tf.matmul(batch, w)))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
        peek, make_handle = source.get_next(), source.string_handle()
    return types.SimpleNamespace(
        graph=g, source=None if one_shot else source.initializer, handle=handle, loss=loss,
        train=train, init=init, peek=peek, make_handle=make_handle,
    )


def _feedable_steps(sess, m, peek=False, steps=3):
    sess.run(m.init)
    if m.source is not None:
        sess.run(m.source)  # the initializer
    out = [sess.run(m.peek).sum()] if peek else []
    train_handle = sess.run(m.make_handle)
    return out + [sess.run([m.loss, m.train], {m.handle: train_handle})[0] for _ in range(steps)]


FOUR_CPUS = dict(config=tf.compat.v1.ConfigProto(device_count={"CPU": 4}), num_devices=4)


@pytest.mark.parametrize("one_shot", [True, False], ids=["one_shot", "initializable"])
@pytest.mark.parametrize("peek", [False, True], ids=["", "batch_read_first"])
def test_a_training_step_fed_a_string_handle_is_profiled_and_trains_as_on_a_session(one_shot, peek):
    # The fetch of train_iterator.string_handle() counted as a use of the iterator, and a batch
    # read before the first step (peek) used it: the training step then ran on the placement as it
    # was, its gradients placed by estimated costs, never profiled. Fetching a handle now uses
    # nothing; the handle fed is swapped for the same iterator's handle in the session the run goes
    # to (the scratch copy, the new placed session), and a new placement copies where the iterators
    # that runs read are into its sessions.
    m = _feedable_training(one_shot)
    with tf.compat.v1.Session(graph=m.graph) as plain:
        expected = _feedable_steps(plain, m, peek)
    m = _feedable_training(one_shot)
    with BaechiSession(graph=m.graph, **FOUR_CPUS, **fast()) as sess:
        got = _feedable_steps(sess, m, peek)
        assert any(name.startswith("gradients/") for name in sess.profile.ops), sorted(sess.profile.ops)
        # Not placed by estimates: most of its ops measured (Grappler folds shape ops away).
        assert sess.placement.coverage.op_share > 0.35, sess.placement.coverage.describe()
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_string_handle_names_its_iterator_after_a_new_placement():
    # A fetch of ops made after the handle was fetched is placed again, in a new session: the
    # handle named an iterator of the session it replaced ("Attempted create an iterator on device
    # CPU:0 from handle defined on device CPU:1", or "Resource ... does not exist"), and the
    # iterator would have been read from its start there. It goes on where it was, as on a Session.
    def steps(sess, m):
        out = _feedable_steps(sess, m, steps=2)
        with m.graph.as_default():
            doubled = m.loss * 2
        train_handle = sess.run(m.make_handle)
        return out + [sess.run(doubled, {m.handle: train_handle}), sess.run(m.loss, {m.handle: train_handle})]

    m = _feedable_training()
    with tf.compat.v1.Session(graph=m.graph) as plain:
        expected = steps(plain, m)
    m = _feedable_training()
    with BaechiSession(graph=m.graph, **FOUR_CPUS, **fast()) as sess:
        got = steps(sess, m)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_a_string_handle_of_the_wrapped_session_is_named_in_the_error():
    # TF's "Resource localhost/_0_OneShotIterator/... does not exist" did not say that the handle
    # came from the wrapped session, whose iterators do not carry over.
    m = _feedable_training()
    user = tf.compat.v1.Session(graph=m.graph)
    user.run(m.init)
    foreign = user.run(m.make_handle)
    with BaechiSession(user, **fast()) as sess:
        with pytest.raises(tf.errors.NotFoundError, match=(
            "(?s)does not exist.*BaechiSession: the string handle fed to handle:0 was not fetched "
            "through the BaechiSession: it names an iterator of the session it wraps.*fetch "
            r"iterator.string_handle\(\) through the BaechiSession"
        )):
            sess.run(m.loss, {m.handle: foreign})
        assert sess.run(m.loss, {m.handle: sess.run(m.make_handle)}) > 0  # as the error says


def test_an_iterator_whose_state_cannot_be_copied_stays_where_it_is_and_says_so(caplog):
    # A dataset that calls a py_func: where its iterator is cannot be written down, so a new fetch
    # after a batch was read runs on the placement as it is (its iterator goes on), with a warning
    # that names the iterator and why.
    m = _feedable_training(external_state=True)
    with tf.compat.v1.Session(graph=m.graph) as plain:
        expected = _feedable_steps(plain, m, peek=True)
    m = _feedable_training(external_state=True)
    with caplog.at_level(logging.WARNING, logger="baechi_tf"), BaechiSession(graph=m.graph, **FOUR_CPUS, **fast()) as sess:
        got = _feedable_steps(sess, m, peek=True)
        assert (
            "placing it again would restart the iterator 'OneShotIterator' (read again from its "
            "start: its state cannot be copied into a new session," in caplog.text
        )
        with m.graph.as_default():  # an op made now has to be placed again: the warning says so
            doubled = m.loss * 2
        sess.run(doubled, {m.handle: sess.run(m.make_handle)})
        assert "placing it again restarts the iterator 'OneShotIterator' (read again" in caplog.text
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_hash_tables_carry_over_from_the_wrapped_session_and_to_a_new_placement():
    # Tables initialised (or filled) in the wrapped session were empty in the placed one: the
    # first lookup failed with "Table not initialized". A placement made again after new ops
    # emptied them too.
    def build():
        g = tf.Graph()
        with g.as_default():
            words = tf.compat.v1.placeholder(tf.string, [None])
            vocab = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(["a", "b", "c"], tf.constant([1, 2, 3], tf.int64)), -1
            )
            seen = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0)
            ids = vocab.lookup(words)
            count = seen.lookup(words)
            note = seen.insert(words, ids * 10)
            w = tf.compat.v1.get_variable("w", [], tf.int64, initializer=tf.compat.v1.zeros_initializer())
            train = tf.compat.v1.assign_add(w, tf.reduce_sum(ids))
            init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()]
        return g, words, ids, count, note, train, init

    def steps(sess, g, words, ids, count, note, train):
        out = [sess.run(ids, {words: ["b", "z", "c"]}).tolist(), sess.run(count, {words: ["a", "b"]}).tolist()]
        sess.run(train, {words: ["a", "c"]})
        with g.as_default():  # made after the runs: a new placement
            total = tf.identity(count) + 1
        out.append(sess.run(total, {words: ["a", "b"]}).tolist())
        return out

    results = []
    for wrap in (False, True):
        g, words, ids, count, note, train, init = build()
        user = tf.compat.v1.Session(graph=g)
        user.run(init)
        user.run(note, {words: ["a", "b"]})  # the mutable table holds a -> 10, b -> 20
        sess = BaechiSession(user, num_devices=2, **fast()) if wrap else user
        with sess:
            results.append(steps(sess, g, words, ids, count, note, train))
    assert results[1] == results[0] == [[2, -1, 3], [10, 20], [11, 21]]


def test_failed_first_runs_add_the_table_readers_to_the_users_graph_once():
    # Each first run that failed added five more baechi_tf_read_tables_N ops to the user's graph.
    g = tf.Graph()
    with g.as_default():
        words = tf.compat.v1.placeholder(tf.string, [None])
        vocab = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], tf.constant([1, 2], tf.int64)), -1
        )
        ids = vocab.lookup(words)
        with tf.control_dependencies([tf.debugging.assert_non_negative(ids)]):
            checked = tf.identity(ids)
        init = tf.compat.v1.tables_initializer()
    user = tf.compat.v1.Session(graph=g)
    user.run(init)
    with BaechiSession(user, num_devices=2, **fast()) as sess:
        sizes = []
        for _ in range(3):
            with pytest.raises(tf.errors.InvalidArgumentError):
                sess.run(checked, {words: ["a", "z"]})
            sizes.append(len(g.get_operations()))
        assert sizes[0] > 0 and sizes == [sizes[0]] * 3
        assert sess.run(checked, {words: ["b", "a"]}).tolist() == [2, 1]

def test_the_saved_profile_matches_the_graph_written_before_or_after_the_table_readers(tmp_path):
    # The ops that read the wrapped session's tables are added to the user's graph: a graph
    # written after the first run held them, and `baechi place` refused the profile saved by
    # cost_path= ("5 graph ops not in the profiled graph").
    from baechi_tf.cost_model.profile import compare_to_graph

    g = tf.Graph()
    with g.as_default():
        words = tf.compat.v1.placeholder(tf.string, [None])
        vocab = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], tf.constant([1.0, 2.0])), 0.0
        )
        y = vocab.lookup(words) * 3.0
        init = tf.compat.v1.tables_initializer()
        # A resource variable no op reads nor asks about (tf.Variable makes a reader and a
        # VarIsInitializedOp): one of each is added for it too.
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="unread")
        set_v = tf.raw_ops.AssignVariableOp(resource=handle, value=2.0)
    before = g.as_graph_def()
    user = tf.compat.v1.Session(graph=g)
    user.run([init, set_v])
    with BaechiSession(user, num_devices=2, cost_path=str(tmp_path / "cost.pb"), **fast()) as sess:
        with g.as_default(), tf.name_scope("eval"):  # the readers are made at the root all the same
            assert sess.run(y, {words: ["b", "z"]}).tolist() == [6.0, 0.0]
    after = g.as_graph_def()
    added = {n.name for n in after.node} - {n.name for n in before.node}
    assert len(added) == 7 and all(n.startswith("baechi_tf_read_tables/") for n in added), added
    profile = load_profile(str(tmp_path / "cost.pb"))
    assert compare_to_graph(profile, before) is None and compare_to_graph(profile, after) is None
    placed, _ = baechi_tf.place_graph_def(after, profile, baechi_tf.Cluster.homogeneous(2, GiB))
    assert len(placed.node) == len(after.node)


def test_the_tables_of_a_finalized_graph_are_initialised_again(caplog):
    # No op can be added to a finalized graph to read its tables: they started empty in the
    # placed session ("Table not initialized") where a Session looked the keys up.
    g = tf.Graph()
    with g.as_default():
        words = tf.compat.v1.placeholder(tf.string, [None])
        vocab = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(["a", "b"], tf.constant([1, 2], tf.int64)), -1
        )
        v = tf.Variable(10, dtype=tf.int64, name="v")
        fed = tf.compat.v1.placeholder(tf.string, [2])  # an initializer that needs a feed
        other = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(fed, [7, 8]), -1)
        ids = vocab.lookup(words) + v
        doubled = ids * 2  # a new fetch: placed again, in a new session
        init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()]
        assign = v.assign(100)
    user = tf.compat.v1.Session(graph=g)
    user.run(init, {fed: ["x", "y"]})
    user.run(assign)
    g.finalize()
    with caplog.at_level("WARNING", logger="baechi_tf"):
        with BaechiSession(user, num_devices=2, **fast()) as sess:
            assert sess.run(ids, {words: ["a", "z"]}).tolist() == [101, 99]
            assert sess.run(doubled, {words: ["b"]}).tolist() == [204]
    assert "cannot read the lookup tables of a finalized graph" in caplog.text
    assert "their initializers are run again in each new session" in caplog.text
    # The one that needs a feed cannot run again: the others still do, and the warning says why.
    assert "could not run the initializer key_value_init_1/LookupTableImportV2 again" in caplog.text
    assert "You must feed a value for placeholder tensor" in caplog.text


@pytest.mark.parametrize(
    "init_where", ["wrapped", "baechi", "baechi, logdir fed", "baechi, with the variables", "in the step", "nowhere"])
def test_tf2_summary_writers_write_each_step_once(init_where, tmp_path):
    # A writer's resource lives in the session: the scratch copy and the placed session had none
    # ("Resource .../create_file_writer/... does not exist"), whether writer.init() ran in the
    # wrapped session or through the BaechiSession. Profiling must not write into the user's logs.
    import glob

    logdir = str(tmp_path / "logs")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [])
        step = tf.compat.v1.train.get_or_create_global_step()
        fed = tf.compat.v1.placeholder(tf.string, [])
        writer = tf.summary.create_file_writer(fed if "fed" in init_where else logdir)
        with writer.as_default(), tf.control_dependencies(
                [writer.init()] if init_where == "in the step" else []):
            write = tf.summary.write("loss", x * 2.0, step=step)
        with tf.control_dependencies([write]):
            train = step.assign_add(1)
        init, writer_init, flush = tf.compat.v1.global_variables_initializer(), writer.init(), writer.flush()
    user = tf.compat.v1.Session(graph=g)
    user.run(init)
    if init_where == "wrapped":
        user.run(writer_init)
    with BaechiSession(user, num_devices=2, warmup_steps=1, profile_steps=2) as sess:
        if init_where == "baechi, with the variables":  # not replayed whole: it resets step
            sess.run([init, writer_init])
        elif init_where.startswith("baechi"):
            sess.run(writer_init, {fed: logdir})
        if init_where == "nowhere":  # as on a Session: no writer, no events file made for it
            with pytest.raises(tf.errors.NotFoundError, match="create_file_writer"):
                sess.run(train, {x: 1.0})
            assert not os.path.exists(logdir)
            return
        for value in (1.0, 2.0, 3.0):
            sess.run(train, {x: value})
        sess.run(flush)
    written = sorted(
        (e.step, tf.make_ndarray(v.tensor).item())
        for f in glob.glob(logdir + "/*")
        for e in tf.compat.v1.train.summary_iterator(f)
        for v in e.summary.value
    )
    assert written == [(0, 2.0), (1, 4.0), (2, 6.0)]


def test_profiling_runs_write_no_rows_into_a_summary_database(tmp_path):
    # A database writer's profiling copy wrote the seven profiling steps into the user's database.
    import sqlite3

    db = str(tmp_path / "summaries.sqlite")
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [])
        step = tf.compat.v1.train.get_or_create_global_step()
        writer = tf.raw_ops.SummaryWriter(shared_name="db", container="")
        writer_init = tf.raw_ops.CreateSummaryDbWriter(
            writer=writer, db_uri=db, experiment_name="e", run_name="r", user_name="u")
        write = tf.raw_ops.WriteScalarSummary(writer=writer, step=step, tag="loss", value=x * 2.0)
        with tf.control_dependencies([write]):
            train = tf.compat.v1.assign_add(step, 1)
        flush = tf.raw_ops.FlushSummaryWriter(writer=writer)
        init = tf.compat.v1.global_variables_initializer()
    user = tf.compat.v1.Session(graph=g)
    user.run([init, writer_init])
    with BaechiSession(user, num_devices=2, warmup_steps=2, profile_steps=5) as sess:
        for value in (1.0, 2.0, 3.0):
            sess.run(train, {x: value})
        sess.run(flush)
    user.close()
    rows = sqlite3.connect(db).execute("select step from Tensors where step is not null order by step")
    assert rows.fetchall() == [(0,), (1,), (2,)]


def test_an_iterator_initialised_in_the_wrapped_session_is_named_in_the_error():
    # TF's "GetNext() failed because the iterator has not been initialized" did not say that the
    # wrapped session's initialisation does not carry over.
    g = tf.Graph()
    with g.as_default():
        it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(5))
        value = it.get_next()
    user = tf.compat.v1.Session(graph=g)
    user.run(it.initializer)
    with BaechiSession(user, num_devices=2, **fast()) as sess:
        with pytest.raises(tf.errors.FailedPreconditionError, match=(
            "(?s)iterator has not been initialized.*BaechiSession: iterators do not carry over from the "
            "session it wraps; if you initialized this one there, run its initializer through the BaechiSession"
        )):
            sess.run(value)
        sess.run(it.initializer)  # as the error says
        assert [sess.run(value) for _ in range(2)] == [0, 1]



@pytest.mark.parametrize("use_resource", [True, False])
def test_a_variable_initialised_in_the_wrapped_session_after_the_first_run_is_named_in_the_error(use_resource):
    # The wrapped session's values are read at the first placement; a variable initialised there
    # later failed with TF's "Could not find variable w" ("uninitialized value w") alone, though a
    # Session would have run: the error did not say why, nor where to initialise it.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        doubled = x * 2.0
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.ones_initializer(), use_resource=use_resource)
        y = tf.reduce_sum(x * w)
        init = tf.compat.v1.global_variables_initializer()
    user = tf.compat.v1.Session(graph=g)
    with BaechiSession(user, num_devices=2, **fast()) as sess:
        np.testing.assert_array_equal(sess.run(doubled, {x: [1.0, 2.0]}), [2.0, 4.0])
        user.run(init)
        with pytest.raises(tf.errors.FailedPreconditionError, match=(
            "(?s)(Could not find variable w|uninitialized value w).*BaechiSession: the variables of the "
            "session it wraps carry over as they are at its first run; initialize or restore them there "
            "before that run, or through the BaechiSession"
        )):
            sess.run(y, {x: [1.0, 2.0]})
        sess.run(init)  # as the error says
        assert sess.run(y, {x: [1.0, 2.0]}) == 3.0


@pytest.mark.parametrize("use_resource", [True, False])
def test_the_first_run_of_the_initializer_logs_no_failed_reads(use_resource, capfd):
    # The usual first run, of the initializer, read the wrapped session's variables to carry them
    # over; none was initialised, and TF logged a failed read crossing devices for several of
    # them ("Local rendezvous is aborting ... Could not find variable w3"): alarming, and wrong.
    g = tf.Graph()
    with g.as_default():
        x = tf.ones([8, 64])
        for i in range(20):
            w = tf.compat.v1.get_variable(
                f"w{i}", [64, 64], initializer=tf.compat.v1.initializers.identity(), use_resource=use_resource
            )
            x = tf.tanh(tf.matmul(x, w))
        y = tf.reduce_sum(x)
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 4})
    with BaechiSession(tf.compat.v1.Session(graph=g, config=config), num_devices=4, **fast()) as sess:
        sess.run(init)
        got = [sess.run(y) for _ in range(3)]
    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        assert got == [plain.run(y)] * 3
    err = capfd.readouterr().err
    assert "Could not find variable" not in err and "uninitialized value" not in err


def test_an_iterator_initialised_through_the_session_lets_the_training_step_be_profiled():
    # Running the initializer through the BaechiSession (as the error above says to) marked the
    # iterator as in use, so the training step that followed ran on the placement made for the
    # initializer: its ops placed by estimated costs, never profiled. The initializer is now run
    # again in each new session, and the step is profiled and placed.
    def build():
        g = tf.Graph()
        with g.as_default():
            data = tf.compat.v1.placeholder(tf.float32, [None, 4], name="data")
            it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(data).batch(2))
            batch = it.get_next()
            w = tf.compat.v1.get_variable("w", [4, 4], initializer=tf.compat.v1.ones_initializer())
            loss = tf.reduce_sum(tf.tanh(tf.matmul(batch, w)))
            train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
            init = tf.compat.v1.global_variables_initializer()
        return g, data, it, loss, train, init

    first = np.arange(48, dtype=np.float32).reshape(12, 4) / 48
    second = first[::-1].copy()
    results = []
    for wrap in (False, True):
        g, data, it, loss, train, init = build()
        user = tf.compat.v1.Session(graph=g)
        user.run(init)
        sess = BaechiSession(user, num_devices=2, **fast()) if wrap else user
        with sess:
            sess.run(it.initializer, {data: first})
            out = [sess.run([loss, train])[0] for _ in range(3)]
            if wrap:
                profiled = set(sess.profile.ops)
                assert any(name.startswith("gradients/") for name in profiled), sorted(profiled)
                assert sess.placement.coverage.op_share > 0.5, sess.placement.coverage.describe()
            sess.run(it.initializer, {data: second})  # again, with other data: read from its start
            out += [sess.run(loss) for _ in range(6)]
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(loss)
        results.append(out)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


def test_an_iterator_initialised_with_the_variables_lets_the_training_step_be_profiled():
    # sess.run([init, iterator.initializer]) marked the iterator as in use (the run also assigns
    # variables, so it is not run again whole), and the training step that followed ran on the
    # placement made for the initializers, never profiled (its gradients placed by estimated
    # costs). The iterator's initializer alone is now run again in each new session.
    def build():
        g = tf.Graph()
        with g.as_default():
            data = tf.compat.v1.placeholder(tf.float32, [None, 4], name="data")
            it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(data).batch(2))
            w = tf.compat.v1.get_variable("w", [4, 4], initializer=tf.compat.v1.ones_initializer())
            loss = tf.reduce_sum(tf.tanh(tf.matmul(it.get_next(), w)))
            train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
            init = tf.compat.v1.global_variables_initializer()
        return g, data, it, w, loss, train, init

    rows = np.arange(24, dtype=np.float32).reshape(6, 4) / 24
    results = []
    for wrap in (False, True):
        g, data, it, w, loss, train, init = build()
        sess = BaechiSession(graph=g, num_devices=2, **fast()) if wrap else tf.compat.v1.Session(graph=g)
        with sess:
            sess.run([init, it.initializer], {data: rows})
            out = [sess.run([loss, train])[0] for _ in range(2)]
            if wrap:
                assert any(name.startswith("gradients/") for name in sess.profile.ops), sorted(sess.profile.ops)
                assert sess.placement.coverage.op_share > 0.5, sess.placement.coverage.describe()
            out.append(sess.run(loss))
            with pytest.raises(tf.errors.OutOfRangeError):
                sess.run(loss)
            out.append(sess.run(w).sum())
        results.append(out)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


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


def test_errors_name_the_ops_of_the_users_graph_with_where_they_were_made():
    # e.op was an op of the placed copy, and "Original stack trace for 'x':" was empty: the copy
    # is an imported GraphDef. Both for an error while profiling and one in the placed session.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        y = tf.reduce_sum(tf.square(x), name="y")
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        for feeds in (None, {x: np.ones((1, 2))}):
            if feeds is not None:
                assert sess.run(y, feeds) == 2.0  # placed: the next error comes from its session
            with pytest.raises(tf.errors.InvalidArgumentError) as e:
                sess.run(y)
            assert e.value.op is x.op and e.value.op.graph is g
            trace = str(e.value).split("Original stack trace for 'x':")[1]
            assert f'File "{__file__}"' in trace, e.value.message


def test_an_initializer_run_with_the_variables_initializer_is_not_run_again():
    # [global_variables_initializer, iterator.initializer] in one run was taken for an iterator
    # initializer and run again in the next placed session: the variables went back to their
    # initial values (3 increments, then 0.0 read by a new fetch).
    g = tf.Graph()
    with g.as_default():
        it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.range(5))
        value = it.get_next()
        v = tf.compat.v1.get_variable("v", [], initializer=tf.compat.v1.zeros_initializer())
        inc = tf.compat.v1.assign_add(v, 1.0)
        init = tf.compat.v1.global_variables_initializer()
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run([init, it.initializer])
        assert sess.run(value) == 0
        for _ in range(3):
            sess.run(inc)
        with g.as_default():
            read = tf.identity(v)  # made after the runs: placed again, in a new session
        before = sess.placement
        assert sess.run(read) == 3.0
        assert sess.placement is not before


def test_a_run_whose_reports_cannot_be_written_is_not_left_in_flight(tmp_path):
    # The reports were written before the run was counted as ended: when they failed, the run
    # stayed "in flight", and the next placement waited two minutes for it, every thread blocked.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        y = tf.reduce_sum(tf.square(x))
    folder = tmp_path / "reports"
    with BaechiSession(graph=g, num_devices=2, report_dir=str(folder), **fast()) as sess:
        folder.rmdir() if folder.exists() else None
        folder.write_text("in the way")  # after the checks: the reports fail when written
        with pytest.raises(OSError):
            sess.run(y, {x: [1.0, 2.0]})
        assert sess._placed.runs == 0
        folder.unlink()
        with g.as_default():
            z = y + 1.0
        assert sess.run(z, {x: [1.0, 2.0]}) == 6.0


def test_an_initializer_that_fails_when_run_again_does_not_fail_the_placement(tmp_path, caplog):
    # Run again in each new session, an initializer whose file is gone failed every later
    # placement, for good.
    import logging

    path = tmp_path / "words.txt"
    path.write_text("a b c")
    g = tf.Graph()
    with g.as_default():
        words = tf.strings.split(tf.io.read_file(str(path)))
        it = tf.compat.v1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(words))
        first = it.get_next()
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(it.initializer)
        path.unlink()
        with g.as_default():
            later = tf.constant(2.0) * 3.0  # made after the runs: placed again, in a new session
        with caplog.at_level(logging.WARNING, logger="baechi_tf.rewriter.session"):
            assert sess.run(later) == 6.0
        assert any("could not run the initializer" in r.getMessage() and "NotFoundError" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        with pytest.raises(tf.errors.FailedPreconditionError, match="iterator has not been initialized"):
            sess.run(first)

def test_a_tensor_kept_by_a_session_handle_is_refused_with_the_reason():
    # get_session_tensor's ops are made after the run that kept the tensor, so they are placed
    # again in a new session, without it: TF's error said the handle was not in the session store.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2])
        keep = tf.compat.v1.get_session_handle(x * 10)
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        kept = sess.run(keep, {x: [1.0, 2.0]})
        with g.as_default():
            fed, tensor = tf.compat.v1.get_session_tensor(kept.handle, tf.float32)
        with pytest.raises(NotImplementedError, match="cannot run .* a get_session_tensor: .* fetch the tensor's value and feed it back"):
            sess.run(tensor + 1, {fed: kept.handle})


def _read_to_the_end(sess, get_next, train):
    """The TF1 input loop: run until the dataset ends; the values read and the last weight."""
    seen = []
    while True:
        try:
            seen.append(sess.run([get_next, train])[0].tolist())
        except tf.errors.OutOfRangeError:
            return seen


@pytest.mark.parametrize("elements", [0, 1, 4])
def test_a_dataset_shorter_than_the_profiling_runs_is_read_as_by_a_session(elements, caplog):
    # With warmup_steps=2 and profile_steps=5, a dataset of fewer than 7 elements ran out on the
    # scratch copy: the first run raised OutOfRangeError, and a training loop trained nothing.
    def build():
        g = tf.Graph()
        with g.as_default():
            batch = tf.compat.v1.data.make_one_shot_iterator(
                tf.data.Dataset.range(elements).map(lambda i: tf.cast(i, tf.float32) + 1.0)
            ).get_next()
            w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
            train = tf.compat.v1.assign_add(w, batch)
            init = tf.compat.v1.global_variables_initializer()
        return g, batch, w, train, init

    g, batch, w, train, init = build()
    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        expected = _read_to_the_end(plain, batch, train), plain.run(w)
    g, batch, w, train, init = build()
    with caplog.at_level("INFO", logger="baechi_tf"):
        with BaechiSession(graph=g, num_devices=2, warmup_steps=2, profile_steps=5) as sess:
            sess.run(init)
            got = _read_to_the_end(sess, batch, train), sess.run(w)
    assert got == expected and len(expected[0]) == elements
    said = caplog.text
    if elements == 0:
        assert "whose input has nothing to read" in said
    elif elements == 1:  # warm-up used it up: traced once on a new copy
        assert "ops over 1 traced steps" in said
    else:  # two warm-up steps, then two of the five traced steps before the end
        assert "the input ran out after 2 of 5 traced steps" in said and "ops over 2 traced steps" in said


@pytest.mark.parametrize("budget", [0, 1, 2, 4, 20])
def test_a_step_valid_only_so_many_times_runs_as_on_a_session(budget, caplog):
    # A step asserting on the step count fails on its budget+1-th run. The scratch copy runs it
    # warmup_steps + profile_steps times from the user's state: that failure was raised from the
    # first real run (global_step 5 in the message while the user's was 0).
    def build():
        g = tf.Graph()
        with g.as_default():
            step = tf.compat.v1.train.get_or_create_global_step()
            check = tf.debugging.assert_less(step, tf.constant(budget, tf.int64), message="over budget")
            with tf.control_dependencies([check]):
                train = tf.compat.v1.assign_add(step, 1)
            init = tf.compat.v1.global_variables_initializer()
        return g, step, train, init

    def run_to_failure(sess, train, step):
        done = []
        for _ in range(budget + 1):
            try:
                done.append(int(sess.run(train)))
            except tf.errors.InvalidArgumentError as e:
                return done, int(sess.run(step)), "over budget" in e.message
        return done, int(sess.run(step)), False

    g, step, train, init = build()
    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        expected = run_to_failure(plain, train, step)
    assert expected == (list(range(1, budget + 1)), budget, True)
    g, step, train, init = build()
    with caplog.at_level("INFO", logger="baechi_tf"):
        with BaechiSession(graph=g, num_devices=2, warmup_steps=2, profile_steps=5) as sess:
            sess.run(init)
            got = run_to_failure(sess, train, step)
    assert got == expected
    said = caplog.text
    if budget in (1, 2):  # a warm-up run or the first traced one failed: one traced on a new copy
        assert "ops over 1 traced steps" in said
        assert f"profiling run {budget + 1} of 7 failed before any step was traced" in said
        assert "assertion failed: [over budget]" in said  # not TF's "Graph execution error:"
    elif budget == 4:  # two warm-up runs, two traced, then the fifth run failed
        assert "profiling run 5 of 7 failed (InvalidArgumentError: assertion failed: [over budget]" in said
        assert "placing by the 2 step(s) traced before it" in said and "ops over 2 traced steps" in said
    elif budget == 20:
        assert "ops over 5 traced steps" in said and "failed" not in said


def test_sparse_tensors_are_fed_and_fetched_as_a_session_does():
    g = tf.Graph()
    with g.as_default():
        sp = tf.compat.v1.sparse_placeholder(tf.float32, name="sp")
        w = tf.compat.v1.get_variable("w", [5, 2], initializer=tf.compat.v1.ones_initializer())
        y = tf.sparse.sparse_dense_matmul(sp, w)
        doubled = sp * 2.0  # a SparseTensor
        init = tf.compat.v1.global_variables_initializer()
    value = tf.compat.v1.SparseTensorValue(indices=[[0, 1], [2, 4]], values=[1.0, 2.0], dense_shape=[3, 5])
    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        expected_y, expected_doubled = plain.run([y, doubled], {sp: value})
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(init)
        got_y, got_doubled = sess.run([y, doubled], {sp: value})
        as_tuple = sess.run({"d": doubled}, {sp: (value.indices, value.values, value.dense_shape)})
        np.testing.assert_array_equal(sess.make_callable(y, [sp])(value), expected_y)
        with pytest.raises(TypeError, match="a SparseTensorValue or \\(indices, values, dense_shape\\)"):
            sess.run(y, {sp: [1.0, 2.0]})
        # A RaggedTensor's graph element is its flat values: fetched as such, its rows were lost.
        with g.as_default():
            ragged = tf.RaggedTensor.from_row_splits([1.0, 2.0, 3.0], [0, 1, 3])
        with pytest.raises(TypeError, match="RaggedTensor .* whole: fetch .*flat_values and nested_row_splits"):
            sess.run(ragged)
        np.testing.assert_array_equal(sess.run(ragged.nested_row_splits[0]), [0, 1, 3])
    np.testing.assert_array_equal(got_y, expected_y)
    for got in (got_doubled, as_tuple["d"]):
        assert isinstance(got, tf.compat.v1.SparseTensorValue)
        np.testing.assert_array_equal(got.indices, expected_doubled.indices)
        np.testing.assert_array_equal(got.values, expected_doubled.values)
        np.testing.assert_array_equal(got.dense_shape, expected_doubled.dense_shape)


def test_indexed_slices_are_fetched_as_a_session_does():
    # A gather's gradient, an IndexedSlices, was refused (TypeError).
    g = tf.Graph()
    with g.as_default():
        ids = tf.compat.v1.placeholder(tf.int32, [3])
        emb = tf.compat.v1.get_variable("emb", [10, 4], initializer=tf.compat.v1.ones_initializer())
        (grad,) = tf.gradients(tf.reduce_sum(tf.gather(emb, ids) * 3.0), [emb])
        no_shape = tf.IndexedSlices(grad.values, grad.indices)
        init = tf.compat.v1.global_variables_initializer()
    assert isinstance(grad, tf.IndexedSlices)
    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        expected = plain.run(grad, {ids: [1, 2, 2]})
        expected_no_shape = plain.run(no_shape, {ids: [1, 2, 2]})
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(init)
        got = sess.run({"g": [grad]}, {ids: [1, 2, 2]})["g"][0]
        # One without a dense_shape comes back with dense_shape None, as from a Session.
        got_no_shape = sess.run((no_shape, grad.values), {ids: [1, 2, 2]})
        callable_no_shape = sess.make_callable([no_shape], [ids])([1, 2, 2])
    assert type(got) is type(expected)
    for field in ("values", "indices", "dense_shape"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field))
    for slices in (got_no_shape[0], callable_no_shape[0]):
        assert type(slices) is type(expected_no_shape) and expected_no_shape.dense_shape is None
        assert slices.dense_shape is None
        np.testing.assert_array_equal(slices.values, expected_no_shape.values)
        np.testing.assert_array_equal(slices.indices, expected_no_shape.indices)
    np.testing.assert_array_equal(got_no_shape[1], expected.values)


def _pinned_to_gpu7():
    """A graph with one op, `y` = 2x, pinned to a GPU that two devices lack: (graph, x, y, y + 1)."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        with tf.device("/device:GPU:7"):
            y = x * 2.0
        z = y + 1.0
    return g, x, y, z


def test_pins_to_devices_it_lacks_are_an_error_unless_ignored():
    # The error named ignore_user_devices=True, which BaechiSession did not take.
    g, x, y, z = _pinned_to_gpu7()
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        with pytest.raises(ConfigError, match="pinned to '/device:GPU:7'.*ignore_user_devices=True"):
            sess.run(z, {x: [1.0, 2.0]})
    with BaechiSession(graph=g, num_devices=2, ignore_user_devices=True, **fast()) as sess:
        np.testing.assert_array_equal(sess.run(z, {x: [1.0, 2.0]}), [3.0, 5.0])
        placed = {n.name: n.device for n in sess.placed_graph_def.node}
    assert placed[y.op.name] in {f"{TASK}/device:CPU:1", f"{TASK}/device:CPU:2"}


@pytest.mark.parametrize("wrap", [False, True])
def test_pins_to_devices_it_lacks_run_elsewhere_under_soft_placement(wrap):
    # A Session whose config allows soft placement runs an op pinned to a device it lacks on
    # another; wrapped in a BaechiSession, the same session refused the first run.
    g, x, y, z = _pinned_to_gpu7()
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    with tf.compat.v1.Session(graph=g, config=config) as plain:
        np.testing.assert_array_equal(plain.run(z, {x: [1.0, 2.0]}), [3.0, 5.0])
    given = dict(sess=tf.compat.v1.Session(graph=g, config=config)) if wrap else dict(graph=g, config=config)
    with BaechiSession(num_devices=2, **given, **fast()) as sess:
        np.testing.assert_array_equal(sess.run(z, {x: [1.0, 2.0]}), [3.0, 5.0])
        placed = {n.name: n.device for n in sess.placed_graph_def.node}
        summary = sess.placement.summary()
    assert placed[y.op.name] in {f"{TASK}/device:CPU:1", f"{TASK}/device:CPU:2"}
    assert "2 ops named devices outside the cluster and were placed freely" in summary  # y and its 2.0


def test_a_graph_pinned_whole_is_said_to_need_its_pins_gone_not_a_command_line_flag(caplog):
    # Towers written for GPUs (every op under tf.device): the warning said to run
    # "baechi place --replace_devices", which a BaechiSession has no use for.
    g = tf.Graph()
    with g.as_default(), tf.device("/gpu:0"):
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        y = tf.square(x)
    with caplog.at_level(logging.WARNING, logger="baechi_tf"), BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        np.testing.assert_array_equal(sess.run(y, {x: [1.0, 2.0]}), [1.0, 4.0])
    assert "every op is pinned to a device by the graph" in caplog.text
    assert "to place them again, build the graph without its tf.device() pins" in caplog.text
    assert "baechi place" not in caplog.text


@pytest.mark.parametrize("ignore", [False, True])
def test_pins_to_a_job_or_task_only_pin_nothing_and_profile(ignore):
    # replica_device_setter pins to jobs and tasks (/job:ps/task:0); they name no device, so the
    # placement ignores them, but the profiling copy kept them and TF refused it ("Could not
    # satisfy explicit device specification"), with ignore_user_devices=True too.
    def build(setter):
        g = tf.Graph()
        with g.as_default(), g.device(setter):
            x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
            w = tf.compat.v1.get_variable("w", [3, 3], initializer=tf.compat.v1.ones_initializer())
            loss = tf.reduce_sum(tf.matmul(x, w), name="loss")
            train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
            init = tf.compat.v1.global_variables_initializer()
        return g, x, loss, train, init

    feed = np.arange(6, dtype=np.float32).reshape(2, 3)
    g, x, loss, train, init = build(None)
    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        expected = [plain.run([loss, train], {x: feed})[0] for _ in range(3)]
    g, x, loss, train, init = build(tf.compat.v1.train.replica_device_setter(
        ps_tasks=2, worker_device="/job:worker/task:0"))
    assert g.get_operation_by_name("w").device == "/job:ps/task:0"
    with BaechiSession(graph=g, num_devices=2, ignore_user_devices=ignore, **fast()) as sess:
        sess.run(init)
        got = [sess.run([loss, train], {x: feed})[0] for _ in range(3)]
        assert sess.placement.coverage.num_profiled_ops > 0
        assert all(n.device.startswith(TASK) for n in sess.placed_graph_def.node)
    assert got == expected


def test_threads_place_one_at_a_time_and_a_new_placement_waits_for_the_runs_in_flight():
    import logging
    import threading

    hold = threading.Event()  # while set, a run of `slow` waits for `release` in the placed graph
    entered, release = threading.Event(), threading.Event()

    def wait(x):
        if hold.is_set():
            entered.set()
            assert release.wait(60)
        return x

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.compat.v1.get_variable("w", [8, 8], initializer=tf.compat.v1.ones_initializer())
        h = tf.tanh(tf.matmul(x, w))
        slow = tf.py_function(wait, [tf.reduce_sum(h)], tf.float32)
        n = tf.compat.v1.get_variable("n", [], initializer=tf.compat.v1.zeros_initializer())
        with tf.control_dependencies([slow]):
            bump = tf.compat.v1.assign_add(n, 1.0)  # a training step, in effect
        fetches = [tf.reduce_mean(h), tf.reduce_max(h), tf.reduce_min(h), tf.reduce_sum(h * h)]
        later = tf.reduce_prod(h)
        init = tf.compat.v1.global_variables_initializer()
    feed = {x: np.ones((4, 8), np.float32)}
    errors = []

    def worker(fetch):
        try:
            for _ in range(5):
                sess.run(fetch, feed)
        except Exception as e:  # noqa: BLE001 - any error of any thread fails the test below
            errors.append(repr(e))

    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(init)
        # Four threads, each with a new fetch: their placements take turns (two profiles at once
        # once failed in TF: "Another profiling session active").
        threads = [threading.Thread(target=worker, args=(f,)) for f in fetches]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        # A new fetch placed while a step runs in another thread: the values it copied into the
        # new placed session lacked that step's update (a training step lost, silently). It now
        # waits for the step, which ends normally, then copies.
        assert sess.run(bump, feed) == 1.0
        first = sess._placed
        hold.set()
        result = []
        runner = threading.Thread(target=lambda: result.append(sess.run(bump, feed)))
        runner.start()
        assert entered.wait(60)

        class ReleaseWhenWaited(logging.Handler):
            def emit(self, record):
                if "in flight on the placement being replaced" in record.getMessage():
                    release.set()

        logger = logging.getLogger("baechi_tf.rewriter.session")
        handler, level = ReleaseWhenWaited(), logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            sess.run(later, feed)  # a new fetch: profiled and placed again
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            release.set()  # the old code placed without waiting, and only then let the step end
        runner.join()
        assert result == [2.0]
        assert sess._placed is not first and first.session._closed
        assert sess.run(n) == 2.0  # the step's update is in the new placed session


def test_a_dequeue_is_not_profiled_and_keeps_the_callers_time_limit():
    # A dequeue profiled on the scratch copy of the graph, whose queue nobody fills, once waited
    # for ever: with a time limit that TF would have kept, and with a producer in another thread
    # (which then waited for the lock that the profiling consumer held).
    import logging
    import threading

    g = tf.Graph()
    with g.as_default():
        q = tf.queue.FIFOQueue(4, tf.float32, shapes=[])
        enqueue = q.enqueue(42.0)
        dequeue = q.dequeue()
    limit = tf.compat.v1.RunOptions(timeout_in_ms=300)
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        with pytest.raises(tf.errors.DeadlineExceededError):
            sess.run(dequeue, options=limit)
    placed_unprofiled = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            if "without profiling a fetch that takes from or puts into a queue" in record.getMessage():
                placed_unprofiled.set()

    seen = Seen()
    logging.getLogger("baechi_tf.rewriter.session").addHandler(seen)
    got = []
    try:
        with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
            consumer = threading.Thread(target=lambda: got.append(sess.run(dequeue)))
            consumer.start()
            assert placed_unprofiled.wait(60)
            sess.run(enqueue)
            consumer.join(60)
            assert not consumer.is_alive()
    finally:
        logging.getLogger("baechi_tf.rewriter.session").removeHandler(seen)
    assert got == [42.0]


def test_queue_runners_feed_it_as_they_feed_a_session():
    # A QueueRunner's thread enqueues more than the queue holds: profiled on the scratch copy,
    # whose queue nobody drains, its first run waited for ever, holding the lock that the
    # training loop's run then waited for.
    import threading

    def losses(make_session):
        g = tf.Graph()
        with g.as_default():
            data = tf.constant(np.arange(64, dtype=np.float32).reshape(16, 4))
            q = tf.compat.v1.FIFOQueue(8, [tf.float32], shapes=[[4]])
            tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(q, [q.enqueue_many([data])]))
            w = tf.compat.v1.get_variable("w", [4, 2], initializer=tf.compat.v1.ones_initializer())
            out = tf.reduce_sum(tf.matmul(q.dequeue_many(4), w))
            init = tf.compat.v1.global_variables_initializer()
        sess = make_session(g)
        sess.run(init)
        coord = tf.train.Coordinator()
        with g.as_default():
            threads = tf.compat.v1.train.start_queue_runners(sess=sess, coord=coord)
        got = []
        loop = threading.Thread(target=lambda: got.extend(float(sess.run(out)) for _ in range(5)), daemon=True)
        loop.start()
        loop.join(120)
        # Stuck, close would wait for ever too (for the lock a stuck profiling run holds).
        assert not loop.is_alive(), "the training loop never got its batches"
        coord.request_stop()
        sess.close()  # cancels the runners' pending enqueues
        coord.join(threads, stop_grace_period_secs=60)
        return got

    expected = losses(lambda g: tf.compat.v1.Session(graph=g))
    assert len(expected) == 5
    assert losses(lambda g: BaechiSession(graph=g, num_devices=2, **fast())) == expected


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


def test_arguments_are_checked(tmp_path):
    model = build_lstm()
    with pytest.raises(ConfigError, match="contradicts"):
        BaechiSession(graph=model.graph, placement_method="m_topo",
                      options=PlacementOptions("m_etf", grouper="coplace"), num_devices=2)
    with pytest.raises(ConfigError, match="unknown placement method"):
        BaechiSession(graph=model.graph, placement_method="nope", num_devices=2)
    with pytest.raises(ConfigError, match="at least one device"):
        BaechiSession(graph=model.graph, num_devices=0)
    # Arguments of the wrong type failed only at the first run, with errors that did not name
    # them (AttributeError: 'dict' object has no attribute 'validate', TypeError: 'float' ...).
    wrong_types = [
        (dict(num_devices="4"), "num_devices='4' is not a whole number"),
        (dict(options={"placement_method": "m_etf"}), "options=.* is a dict; give a PlacementOptions"),
        (dict(comm=(0.0001, 134)), r"comm=\(0.0001, 134\) is a tuple; give a CommCost"),
        (dict(inter_host_comm=0.5), "inter_host_comm=0.5 is a float; give a CommCost"),
        (dict(profile_steps=1.5), "profile_steps=1.5 is not a whole number"),
        (dict(warmup_steps=True), "warmup_steps=True is not a whole number"),
        # These were TypeErrors from deep inside ("'>' not supported between 'str' and 'int'").
        (dict(memory_bytes_per_device="8GiB"), r"^memory_bytes_per_device='8GiB' is not a whole "
         r"number of bytes; give bytes, e.g. 8 << 30 for 8 GiB$"),
        (dict(memory_bytes_per_device=None), "memory_bytes_per_device=None is not a whole number"),
        (dict(memory_bytes_per_device=2.5), "memory_bytes_per_device=2.5 is not a whole number"),
        (dict(memory_fraction="0.5"), r"^memory_fraction='0.5' is not a number; give one in \(0, 1\]$"),
    ]
    for kwargs, message in wrong_types:
        with pytest.raises(ConfigError, match=message):
            BaechiSession(graph=model.graph, **{"num_devices": 2, **kwargs})
    user = tf.compat.v1.Session(graph=model.graph)
    with pytest.raises(ConfigError, match="differs"):
        BaechiSession(user, graph=tf.Graph(), num_devices=2)
    user.close()
    # A graph where the session goes said "AttributeError: 'Graph' object has no attribute 'graph'".
    with pytest.raises(ConfigError, match=r"first argument is a session to wrap; give a graph as BaechiSession\(graph=...\)"):
        BaechiSession(model.graph, num_devices=2)
    with pytest.raises(ConfigError, match="first argument is a str, not a session"):
        BaechiSession("grpc://localhost:2222", num_devices=2)
    # A report folder that cannot be made was found only after the first placement's run.
    with pytest.raises(ConfigError, match="report_dir '.*README.md' is a file, not a folder"):
        BaechiSession(graph=model.graph, num_devices=2, report_dir=os.path.join(os.path.dirname(__file__), "..", "README.md"))
    # The profile kept where a report of the same name would replace it.
    with pytest.raises(ConfigError, match="report_dir .* would replace .*summary.json' with a report"):
        BaechiSession(graph=model.graph, num_devices=2, report_dir=str(tmp_path), cost_path=str(tmp_path / "summary.json"))
    # A file of the user's with a report's name, found when the reports replaced it.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "trace.json").write_text("mine")
    with pytest.raises(ConfigError, match=r"^report_dir '.*mine' holds 'trace.json', not from an earlier report, which a report would replace; write the reports into another folder, or remove it$"):
        BaechiSession(graph=model.graph, num_devices=2, report_dir=str(tmp_path / "mine"))
    # The profile and the reports on one new path: found when the reports were written.
    same = str(tmp_path / "same")  # no regex characters in pytest's tmp_path
    with pytest.raises(ConfigError, match=f"^report_dir '{same}' and cost_path '{same}' name the same path; give report_dir a folder of its own$"):
        BaechiSession(graph=model.graph, num_devices=2, report_dir=same, cost_path=same)
    with pytest.raises(ConfigError, match=f"^report_dir '{same}/r' is inside cost_path '{same}', which is written as a file"):
        BaechiSession(graph=model.graph, num_devices=2, report_dir=same + "/r", cost_path=same)


def test_a_cost_path_holding_another_file_is_refused_and_left_as_it_was(tmp_path):
    # A typo naming a source file was written over with the profile at the first run.
    model = build_lstm()
    source = tmp_path / "train_model.py"
    source.write_text("import tensorflow as tf\n")
    with pytest.raises(ConfigError, match=r"^cost_path '.*train_model.py' is a file that is not a "
                       r"cost profile \(it does not start as one, nor as the original's pickle\), and "
                       r"the profile would be written over it; give another path, or remove the file first$"):
        BaechiSession(graph=model.graph, num_devices=2, cost_path=str(source))
    assert source.read_text() == "import tensorflow as tf\n"
    # A profile, and a path where nothing is yet, are written.
    profile = tmp_path / "cost.pb"
    save_profile(CostProfile({}, "x", ()), profile)
    for path in (profile, tmp_path / "new.pb"):
        BaechiSession(graph=model.graph, num_devices=2, cost_path=str(path)).close()


def test_inter_host_comm_without_a_cluster_is_said_to_be_unused(caplog):
    # It was dropped without a word.
    model = build_lstm()
    with caplog.at_level(logging.WARNING, logger="baechi_tf.rewriter.session"):
        BaechiSession(graph=model.graph, num_devices=2, inter_host_comm=CommCost(0.001, 500)).close()
    assert [r.getMessage() for r in caplog.records] == [
        "inter_host_comm= is not used: every device is on this host (give cluster_spec= or a "
        "'grpc://host:port' target to place across hosts)"]


def test_the_expert_method_without_a_layout_is_refused_before_the_first_run_profiles():
    # It was refused only once the first run had profiled the fetch (minutes for a large model).
    g = tf.Graph()
    with g.as_default():
        tf.square(tf.compat.v1.placeholder(tf.float32, [2]))
    with pytest.raises(ConfigError, match=r"^placement method 'expert' needs a hand layout and none was "
                       r"given: give PlacementOptions\(expert=\{op name: device name\}\), or choose another method$"):
        BaechiSession(graph=g, placement_method="expert", num_devices=2)
    layout = PlacementOptions(placement_method="expert", expert={"Square": f"{TASK}/device:CPU:2"})
    assert BaechiSession(graph=g, options=layout, num_devices=2).devices.cluster.num_devices == 2


def test_import_baechi_tf_does_not_import_tensorflow():
    code = (
        "import sys, baechi_tf; "
        "assert 'tensorflow' not in sys.modules; "
        "import baechi_tf.rewriter, baechi_tf.cost_model, baechi_tf.rewriter.cli_place; "
        "assert 'tensorflow' not in sys.modules; "
        "print(sorted(baechi_tf.__all__))"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for name in ("BaechiSession", "place_graph_def", "PlacementOptions", "Cluster", "Device",
                 "BaechiError", "ProfileError"):
        assert name in done.stdout
    assert baechi_tf.BaechiSession is BaechiSession


def test_report_dir_gets_the_placement(tmp_path):
    import json

    model = build_lstm()
    reports = tmp_path / "reports"
    with BaechiSession(graph=model.graph, num_devices=2, placement_method="m_topo",
                       report_dir=str(reports), profile_steps=1, warmup_steps=1) as sess:
        sess.run(model.init)
        sess.run(model.loss, feed_dict=model.feed())
        result = sess.placement.result
    summary = json.loads((reports / "summary.json").read_text())
    assert summary["method"] == result.placement.method == "m_topo"
    assert summary["makespan_us"] == pytest.approx(result.makespan_us)
    assert sum(d["ops"] for d in summary["devices"]) == result.graph.num_ops
    assert (reports / "gantt.png").stat().st_size > 1000
    # trace.json: the simulated schedule, and beside it TF's timeline of the run that followed
    # the placement (the loss step), on processes from 1001 on.
    events = json.loads((reports / "trace.json").read_text())["traceEvents"]
    tf_pids = {e["pid"] for e in events if e["name"] == "process_name" and e["args"]["name"].startswith("TensorFlow ")}
    assert tf_pids and min(tf_pids) > 1000
    ran = {e["args"]["op"] for e in events if e["pid"] in tf_pids and e["ph"] == "X"}
    assert model.loss.op.name in ran
    # Each is a graph op, a node Grappler made of one, or TF's own (_arg_, _retval_, a constant
    # replicated to a device that reads it).
    names = set(result.graph.names)
    assert all(is_runtime(n) or source_op(n, names) for n in ran), sorted(ran - names)


def test_out_of_memory_at_run_time_says_where_and_what_to_change():
    from baechi_tf.errors import InfeasiblePlacementError

    graph = tf.Graph()
    with graph.as_default():
        n = tf.compat.v1.placeholder(tf.int64, [], name="n")
        total = tf.reduce_sum(tf.ones(tf.stack([n]), tf.float32), name="total")
    with BaechiSession(graph=graph, num_devices=2, placement_method="m_topo",
                       profile_steps=1, warmup_steps=0) as sess:
        assert sess.run(total, feed_dict={n: 10}) == 10.0  # profiles and places at this size
        with pytest.raises(InfeasiblePlacementError) as e:
            sess.run(total, feed_dict={n: 1 << 42})  # 16 TiB of ones
    message = str(e.value)
    assert "ran out of memory on /job:localhost/replica:0/task:0/device:CPU:" in message
    assert "OOM when allocating tensor with shape[4398046511104]" in message  # TF's own line
    assert isinstance(e.value.__cause__, tf.errors.ResourceExhaustedError)  # and all of TF's error
    assert "the placer expected a peak of" in message
    assert "--placer_memory_fraction" in message


class _AttrsLike:
    """What TF's Session and attrs classes agree on: fields listed in `__attrs_attrs__`."""

    __attrs_attrs__ = (types.SimpleNamespace(name="first"), types.SimpleNamespace(name="rest"))

    def __init__(self, first, rest):
        self.first, self.rest = first, rest


Pair = collections.namedtuple("Pair", "left right")


def _fetch_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [2], name="y")
        v = tf.compat.v1.get_variable("v", [2], initializer=tf.compat.v1.constant_initializer([1.0, 2.0]))
        s = x * v + y
        init = tf.compat.v1.global_variables_initializer()
    return g, x, y, v, s, init


def test_fetch_structures_and_feed_keys_as_a_session_reads_them():
    # Mappings with keys of mixed types once failed in tf.nest ("'<' not supported between
    # instances"): a MonitoredSession's hooks are such keys.
    g, x, y, v, s, init = _fetch_graph()
    key = object()
    ordered = collections.OrderedDict([("z", s), ("a", v)])
    counted = collections.defaultdict(list, {3: [s, x]})
    fetches = {key: Pair(s, [v, init]), 1: ordered, "c": counted, "d": _AttrsLike(s, (v,))}
    # A nested tuple of keys, as TF allows (its values' lists would be structure: arrays).
    feeds = {(x, (y,)): (np.ones(2, np.float32), (np.asarray([10.0, 20.0], np.float32),))}

    def check(got):
        assert list(got) == [key, 1, "c", "d"]
        assert isinstance(got[key], Pair) and got[key].right[1] is None
        np.testing.assert_array_equal(got[key].left, [11.0, 22.0])
        assert type(got[1]) is collections.OrderedDict and list(got[1]) == ["z", "a"]
        np.testing.assert_array_equal(got[1]["a"], [1.0, 2.0])
        assert type(got["c"]) is collections.defaultdict and got["c"].default_factory is list
        np.testing.assert_array_equal(got["c"][3][1], [1.0, 1.0])
        assert isinstance(got["d"], _AttrsLike) and isinstance(got["d"].rest, tuple)
        np.testing.assert_array_equal(got["d"].first, [11.0, 22.0])

    with tf.compat.v1.Session(graph=g) as plain:
        plain.run(init)
        check(plain.run(fetches, feeds))
    with BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        sess.run(init)
        check(sess.run(fetches, feeds))
        with pytest.raises(TypeError, match="cannot fetch None"):
            sess.run([s, None], feeds)
        # Names as Session.run reads them: bytes too; a name not in the graph is a ValueError.
        np.testing.assert_array_equal(sess.run(s.name.encode(), feeds), [11.0, 22.0])
        for missing in ("nope:0", "nope"):
            with pytest.raises(ValueError, match=f"cannot fetch '{missing}': The name '{missing}' refers to"):
                sess.run({"a": [missing]}, feeds)


def test_make_callable_runs_placed_as_a_session_does():
    g, x, y, v, s, init = _fetch_graph()
    with BaechiSession(graph=g, num_devices=2, placement_method="m_etf", **fast()) as sess:
        assert sess.sess_str == ""
        sess.make_callable(init)()
        step = sess.make_callable({"s": s, "v": v}, [y, x], accept_options=True)
        assert sess.placement is not None
        first = sess.placement
        got = step([10.0, 20.0], [1.0, 1.0])
        np.testing.assert_array_equal(got["s"], [11.0, 22.0])
        assert sess.placement is not first  # its first call profiled and placed the fetch
        metadata = tf.compat.v1.RunMetadata()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        got = step([0.0, 0.0], [2.0, 2.0], options=options, run_metadata=metadata)
        np.testing.assert_array_equal(got["s"], [2.0, 4.0])
        assert metadata.step_stats.dev_stats  # the caller's options reached the placed run
        with pytest.raises(ValueError, match="expected 2 feed values, got 1"):
            step([0.0, 0.0])
        with pytest.raises(TypeError, match="unexpected keyword arguments: \\['options'\\]"):
            sess.make_callable(s, [x, y])([1.0, 1.0], [0.0, 0.0], options=options)
        with pytest.raises(TypeError, match="cannot fetch or feed 3"):
            sess.make_callable(s, [3])  # refused when made, as by a Session
        with pytest.raises(NotImplementedError, match="does not make partial runs.*placed_graph_def"):
            sess.partial_run_setup([s], [x, y])


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


def test_numpy_integers_are_taken_as_the_counts_they_are():
    # num_devices=np.int64(2) (from a sweep over np.arange) was refused: "is not a whole number".
    g = tf.Graph()
    with g.as_default():
        y = tf.matmul(tf.ones([4, 4]), tf.ones([4, 4])) + 1.0
    with BaechiSession(graph=g, num_devices=np.int64(2), memory_bytes_per_device=np.int64(GiB),
                       warmup_steps=np.int32(0), profile_steps=np.int32(1)) as sess:
        np.testing.assert_array_equal(sess.run(y), np.full((4, 4), 5.0))
        assert len(sess.placement.result.cluster.devices) == 2


def test_ops_inside_v1_control_flow_are_refused_as_fetches_and_feeds_as_a_session_does():
    # TF marks a v1 loop's and cond branch's inner ops unfetchable and a loop's inner tensors
    # unfeedable; the imported copies run here lost the marks: the loop's fetch failed with
    # InternalError 'Retval[0] has already been set', the branch's returned a value, and the
    # loop's feed failed with 'has inputs from different frames'.
    previous = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    inner = {}
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [], name="x")
            p = tf.compat.v1.placeholder(tf.bool, [], name="p")

            def body(i, a):
                inner["loop"] = a * 2.0
                return i + 1, inner["loop"] + 1.0

            def branch():
                inner["branch"] = x + 1.0
                inner["sparse"] = tf.sparse.SparseTensor([[0]], tf.reshape(inner["branch"], [1]), [2])
                return inner["branch"]

            _, total = tf.compat.v1.while_loop(lambda i, a: i < 3, body, [0, x], name="loop")
            picked = tf.cond(p, branch, lambda: x - 1.0)
    finally:
        if previous:
            tf.compat.v1.enable_control_flow_v2()
    feeds = {x: 1.0, p: True}
    with tf.compat.v1.Session(graph=g) as plain, \
            BaechiSession(graph=g, num_devices=2, placement_method="m_etf", **fast()) as sess:
        for session in (plain, sess):
            assert session.run([total, picked], feeds) == [15.0, 2.0]
            for fetch in (inner["loop"], inner["branch"], inner["loop"].name, inner["sparse"]):
                with pytest.raises(ValueError, match="has been marked as not fetchable"):
                    session.run(fetch, feeds)
            with pytest.raises(ValueError, match="Tensor loop/mul:0 may not be fed"):
                session.run(total, {x: 1.0, inner["loop"]: 5.0})


def test_a_feed_is_checked_against_the_shape_the_users_graph_sets_as_a_session_does():
    # The copies run here are imported GraphDefs, whose shapes are inferred again without the
    # graph's set_shape: a feed that a Session refuses ran (3 values for 2).
    g = tf.Graph()
    with g.as_default():
        q = tf.compat.v1.placeholder(tf.float32, None, name="q")
        q.set_shape([2])
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        rows = tf.reshape(x, [-1, 2])
        rows.set_shape([3, 2])
        total = tf.reduce_sum(rows * 2.0, axis=1) + tf.reduce_sum(q)
    with tf.compat.v1.Session(graph=g) as plain, BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        for session in (plain, sess):
            good = session.run(total, {q: [1.0, 2.0], x: np.arange(6.0)})  # float64 fed to float32
            np.testing.assert_array_equal(good, [5.0, 13.0, 21.0])
            with pytest.raises(ValueError, match=r"Cannot feed value of shape \(3,\) for Tensor q:0, which has shape \(2,\)"):
                session.run(total, {q: [1.0, 2.0, 3.0], x: np.arange(6.0)})
            with pytest.raises(ValueError, match=r"Cannot feed value of shape \(2, 2\) for Tensor Reshape:0"):
                session.run(total, {q: [1.0, 2.0], rows: np.ones((2, 2))})
            with pytest.raises(TypeError, match="The value of a feed cannot be a tf.Tensor"):
                session.run(total, {q: tf.ones([2]), x: np.arange(6.0)})


def test_a_feed_of_a_tensor_made_after_the_placement_that_the_fetch_does_not_read_is_fed_unread():
    # A Session feeds it and nothing reads it; the placed session, whose graph lacks the op, refused
    # the run with "Cannot interpret feed_dict key as Tensor: The name 'later:0' refers to a Tensor
    # which does not exist" (a resource variable's v.value(), made when the feed is written).
    g, x, y, v, s, init = _fetch_graph()
    with tf.compat.v1.Session(graph=g) as plain, BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        for session in (plain, sess):
            session.run(init)
            session.run(s, {x: [1.0, 1.0], y: [0.0, 0.0]})
        with g.as_default():
            later = tf.identity(v, name="later")
        report = sess.placement
        for session in (plain, sess):
            got = session.run(s, {x: [1.0, 1.0], y: [0.0, 0.0], later: [5.0, 5.0]})
            np.testing.assert_array_equal(got, [1.0, 2.0])
            with pytest.raises(TypeError, match="Cannot interpret feed_dict key as Tensor"):
                session.run(s, {x: [1.0, 1.0], y: [0.0, 0.0], "nothing:0": [5.0, 5.0]})
        assert sess.placement is report  # not placed again for it
        # A fetch that reads it is placed again, with it.
        np.testing.assert_array_equal(sess.run(later * 2.0, {later: [5.0, 5.0]}), [10.0, 10.0])


def test_a_feed_key_of_another_graph_is_a_type_error_as_on_a_session():
    g, x, y, v, s, init = _fetch_graph()
    with tf.Graph().as_default():
        stranger = tf.compat.v1.placeholder(tf.float32, [2], name="x")
    feeds = {stranger: [1.0, 2.0], y: [0.0, 0.0]}
    with tf.compat.v1.Session(graph=g) as plain, BaechiSession(graph=g, num_devices=2, **fast()) as sess:
        for session in (plain, sess):
            session.run(init)
            with pytest.raises(TypeError, match="Cannot interpret feed_dict key as Tensor: .*x:0.* not an element of this"):
                session.run(s, feeds)
        with pytest.raises(TypeError, match="Cannot interpret feed_dict key as Tensor"):
            sess.make_callable(s, [stranger, y])


def test_comm_auto_fits_the_link_between_the_stand_ins_and_places_with_it():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
        y = tf.reduce_sum(tf.matmul(x, x) + tf.matmul(x, tf.transpose(x)))
    with BaechiSession(graph=graph, num_devices=2, comm="auto", **fast()) as sess:
        fit = sess.link_fit
        assert (fit.src, fit.dst) == (f"{TASK}/device:CPU:1", f"{TASK}/device:CPU:2")
        assert sess.devices.cluster.comm == fit.fit.comm != CommCost()
        assert fit.fit.num_sizes == 20 and "CPU stand-ins in one process" in fit.note
        assert sess.run(y, {x: np.ones([64, 64], np.float32)}) == pytest.approx(2 * 64 ** 3)
        assert sess.placement.result.cluster.comm == fit.fit.comm
        c = fit.fit.comm  # the summary's link row formats the same numbers
        assert f"{c.slope_us_per_byte:.4g} us/B x + {c.intercept_us:.4g} us" in sess.placement.summary()


def test_comm_of_another_kind_names_auto_too():
    with pytest.raises(ConfigError, match=r"comm='fast' is a str; give a CommCost .*, or comm='auto' to fit"):
        BaechiSession(graph=tf.Graph(), num_devices=2, comm="fast")
