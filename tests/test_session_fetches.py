"""BaechiSession takes fetches and feeds as a plain session does: structures, sparse tensors and
indexed slices, make_callable, session handles, control flow, shapes and graphs of feeds."""

import collections
import types

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf import BaechiSession
from session_helpers import fast

pytestmark = pytest.mark.tf


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
