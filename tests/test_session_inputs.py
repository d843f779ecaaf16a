"""BaechiSession reads its inputs as a plain session does: iterators, string handles, datasets that
run out, staging areas, queues and queue runners, summary writers."""

import logging
import os
import types

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf import BaechiSession
from session_helpers import fast

pytestmark = pytest.mark.tf


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
