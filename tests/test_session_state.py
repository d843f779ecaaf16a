"""BaechiSession carries the wrapped session's state over to each placement: hash tables,
initializers run once, iterators and variables initialised in the wrapped session."""

import numpy as np
import pytest
import tensorflow as tf

import baechi_tf
from baechi_tf import BaechiSession
from baechi_tf.cluster import GiB
from baechi_tf.cost_model import load_profile
from session_helpers import fast

pytestmark = pytest.mark.tf


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
