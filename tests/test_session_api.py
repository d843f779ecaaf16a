"""BaechiSession's arguments, pins, threads, errors and reports: what it refuses and how it says so,
runs in flight across a new placement, the report folder, memory that runs out at run time."""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import baechi_tf
from baechi_tf import BaechiSession, PlacementOptions
from baechi_tf.cluster import CommCost, GiB
from baechi_tf.cost_model import CostProfile, save_profile
from baechi_tf.cost_model.executed import is_runtime, source_op
from baechi_tf.errors import ConfigError
from session_helpers import TASK, fast
from tf_models import build_lstm

pytestmark = pytest.mark.tf


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
    for name in ("BaechiSession", "place_graph_def", "function", "PlacementOptions", "Cluster", "Device",
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


def test_numpy_integers_are_taken_as_the_counts_they_are():
    # num_devices=np.int64(2) (from a sweep over np.arange) was refused: "is not a whole number".
    g = tf.Graph()
    with g.as_default():
        y = tf.matmul(tf.ones([4, 4]), tf.ones([4, 4])) + 1.0
    with BaechiSession(graph=g, num_devices=np.int64(2), memory_bytes_per_device=np.int64(GiB),
                       warmup_steps=np.int32(0), profile_steps=np.int32(1)) as sess:
        np.testing.assert_array_equal(sess.run(y), np.full((4, 4), 5.0))
        assert len(sess.placement.result.cluster.devices) == 2


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
