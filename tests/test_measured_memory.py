"""Memory per device rebuilt from a traced step's allocation records, on CPU stand-ins.

The graph below is small enough to count its bytes by hand. Every tensor is 64 x 64 float32
(16 KiB) but the concatenation (32 KiB) and the sum (4 bytes)::

    CPU:0   one = 1.0
    CPU:1   v (variable, 16 KiB) -> read (aliases v's buffer) -> a = read + one (16 KiB)
                                                                   |
    CPU:2   b = concat([a, a]) (32 KiB) -> s = sum(b) (4 B) <------+
                                           -> m = fill([64, 64], s) (16 KiB) -> w.assign(m)

CPU:1 holds v, then also a until b (on CPU:2, which reads a's buffer without a copy) is done:
16 + 16 KiB. CPU:2 holds w and 20 bytes of constants (the concat axis, the sum's two axes, the
fill's two dimensions), then b and s together; m comes after s, and its buffer becomes w's,
replacing the old one, so that it is never more than w: 16 KiB + 20 B + 32 KiB + 4 B.
"""

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf.cost_model.measured_memory import measured_memory, variable_bytes

pytestmark = pytest.mark.tf

tf1 = tf.compat.v1
KiB = 1024


@pytest.fixture(scope="module")
def traced():
    g = tf.Graph()
    with g.as_default():
        with tf.device("/cpu:0"):
            one = tf.constant(1.0, name="one")
        with tf.device("/cpu:1"):
            v = tf1.get_variable("v", initializer=tf.ones([64, 64]), use_resource=True)
            a = tf.add(v.read_value(), one, name="a")
        with tf.device("/cpu:2"):
            b = tf.concat([a, a], 0, name="b")
            s = tf.reduce_sum(b, name="s")
            w = tf1.get_variable("w", initializer=tf.zeros([64, 64]), use_resource=True)
            m = tf.fill([64, 64], s, name="m")
            update = w.assign(m, read_value=False, name="update")
        step = tf.group(s, update, name="step")
        init = tf1.global_variables_initializer()
    config = tf1.ConfigProto(device_count={"CPU": 5})
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf1.OptimizerOptions.L0
    with tf1.Session(graph=g, config=config) as sess:
        sess.run(init)
        sess.run(step)  # warm-up
        metadata = tf1.RunMetadata()
        sess.run(step, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
    graph_def = g.as_graph_def()
    return measured_memory(metadata.step_stats, graph_def), metadata.step_stats, graph_def


def _device(measured, index):
    return next(m for name, m in measured.items() if name.endswith(f"device:CPU:{index}"))


def test_each_device_holds_what_its_ops_allocate_and_its_variables(traced):
    measured, _, _ = traced
    cpu1, cpu2 = _device(measured, 1), _device(measured, 2)
    assert (cpu1.variable_bytes, cpu1.persistent_bytes) == (16 * KiB, 16 * KiB)
    assert cpu1.step_peak_bytes == 16 * KiB and cpu1.peak_bytes == 32 * KiB
    assert cpu1.live_at_peak == {"a": 16 * KiB}
    assert (cpu2.variable_bytes, cpu2.persistent_bytes) == (16 * KiB, 16 * KiB + 20)
    assert cpu2.step_peak_bytes == 32 * KiB + 4
    assert cpu2.peak_bytes == 48 * KiB + 20 + 4
    assert cpu2.live_at_peak == {"b": 32 * KiB, "s": 4}
    assert _device(measured, 0).peak_bytes == 4  # the constant one
    # The devices share one allocator: its peak is no device's.
    assert not any(name.endswith(("CPU:3", "CPU:4")) for name in measured)


def test_a_buffer_that_becomes_a_variables_is_freed_at_the_assignment(traced):
    measured, step_stats, _ = traced
    cpu2 = _device(measured, 2)
    assert cpu2.replaced_bytes == 16 * KiB  # m's buffer is w's now: no record frees it
    ends = {ns.node_name: ns.all_start_micros + ns.all_end_rel_micros
            for dev in step_stats.dev_stats for ns in dev.node_stats}
    # The running sum is back to nothing once the assignment is done.
    assert cpu2.level_bytes[-1] == 0
    assert cpu2.times_us[-1] >= ends["update"]


def test_a_tensor_read_on_another_stand_in_is_not_copied(traced):
    measured, step_stats, _ = traced
    cpu1 = _device(measured, 1)
    starts = {ns.node_name: ns.all_start_micros for dev in step_stats.dev_stats for ns in dev.node_stats}
    # a is freed on CPU:1 only after b, on CPU:2, started reading it; CPU:2 allocates nothing for it.
    assert list(np.diff(np.concatenate(([0], cpu1.level_bytes)))) == [16 * KiB, -16 * KiB]
    assert cpu1.times_us[-1] >= starts["b"]
    assert "a" not in _device(measured, 2).live_at_peak


def test_variable_bytes():
    g = tf.Graph()
    with g.as_default():
        tf1.get_variable("r", [3, 5], dtype=tf.float64, use_resource=True)
        tf1.get_variable("ref", [7], dtype=tf.int32, use_resource=False)
        tf.constant(1.0, name="c")
    nodes = {n.name: n for n in g.as_graph_def().node}
    assert variable_bytes(nodes["r"]) == 3 * 5 * 8
    assert variable_bytes(nodes["ref"]) == 7 * 4
    assert variable_bytes(nodes["c"]) == 0
    # The op types of a variable are the importer's: a GraphDef of older contrib code may hold an
    # AutoReloadVariable (with the attributes of a VariableV2), which the importer counts as one.
    old = tf1.NodeDef()
    old.CopyFrom(nodes["ref"])
    old.op = "AutoReloadVariable"
    assert variable_bytes(old) == 7 * 4


@pytest.fixture(scope="module")
def two_tasks():
    """Two worker tasks, each its own process and allocator, one op at a time: (target, CPU:0 of
    task 0, CPU:0 of task 1)."""
    from baechi_tf.rewriter.distributed import start_local_workers

    with start_local_workers(2, 0, inter_op_threads=1, intra_op_threads=1) as workers:
        yield (workers.target, *(f"{t.name}/device:CPU:0" for t in workers.spec.tasks))


def _traced_on_tasks(target, graph, fetch, feeds):
    """The StepStats of the second of two runs of `fetch` (the first warms up), Grappler off."""
    return _steps_on_tasks(target, graph, fetch, feeds, 1)[0]


def _steps_on_tasks(target, graph, fetch, feeds, count):
    """The StepStats of `count` traced runs of `fetch` in one session, after one run that warms
    up, Grappler off."""
    from baechi_tf.cost_model.profiler import profiling_config
    from baechi_tf.rewriter.distributed import remote_session_config

    steps = []
    with tf1.Session(target, graph=graph, config=remote_session_config(profiling_config())) as sess:
        sess.run(fetch, feeds)
        for _ in range(count):
            metadata = tf1.RunMetadata()
            sess.run(fetch, feeds, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                     run_metadata=metadata)
            steps.append(metadata.step_stats)
    return steps


def _allocated(m) -> int:
    """All the bytes a device's events allocated in the step."""
    deltas = np.diff(np.concatenate(([0], m.level_bytes)))
    return int(deltas[deltas > 0].sum())


def test_tensors_received_from_another_task_and_fed_values_are_held_by_the_reader(two_tasks):
    """On task 0, ``c = matmul(a, p)`` (256 KiB each, ``p`` fed) is read on task 1 by ``b =
    matmul(c, c)`` (256 KiB): gRPC allocates task 1's copy of ``c`` outside any kernel's
    records, and task 1 holds it and ``b`` together; task 0 holds ``a``, ``p`` and ``c``. Each
    task's allocator samples the bytes it has in use at each node's end
    (``allocator_bytes_in_use``): a lower bound of the peak that the rebuild must reach."""
    target, d0, d1 = two_tasks
    g = tf.Graph()
    with g.as_default():
        p = tf1.placeholder(tf.float32, [256, 256], name="p")
        with tf.device(d0):
            a = tf.random.uniform([256, 256], name="a")
            c = tf.matmul(a, p, name="c")  # a buffer of its own, never an input's
        with tf.device(d1):
            b = tf.matmul(c, c, name="b")
            s = tf.reduce_sum(b, name="s")
    step_stats = _traced_on_tasks(target, g, s, {p: np.ones([256, 256], np.float32)})
    graph_def = g.as_graph_def()
    fed = {"p:0": 256 * 256 * 4}
    measured = measured_memory(step_stats, graph_def, fed)
    without_fed = measured_memory(step_stats, graph_def)
    sampled: dict[str, int] = {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            for used in ns.memory:
                sampled[dev.device] = max(sampled.get(dev.device, 0), int(used.allocator_bytes_in_use))
    task0, task1 = measured[d0], measured[d1]
    # Task 1: its copy of c, held until b is done, and b.
    assert task1.step_peak_bytes == 512 * KiB
    assert task1.live_at_peak == {"c": 256 * KiB, "b": 256 * KiB}
    assert task1.level_bytes[-1] == 0
    # Task 0: a (whose buffer c takes over) and the fed p together.
    # Task 0: a, p and c together while c runs.
    assert task0.step_peak_bytes == 768 * KiB
    assert task0.live_at_peak == {"a/RandomUniform": 256 * KiB, "p": 256 * KiB, "c": 256 * KiB}
    assert without_fed[d0].step_peak_bytes == 512 * KiB
    assert without_fed[d1].step_peak_bytes == 512 * KiB  # received tensors need no caller's word
    for device, m in measured.items():
        assert m.step_peak_bytes >= sampled.get(device, 0), (device, sampled)
    # What the kernels' records alone miss: 256 KiB on each task.
    assert sampled[d0] >= 768 * KiB and sampled[d1] >= 512 * KiB


def test_a_received_tensor_written_in_place_is_held_until_the_writers_readers_are_done(two_tasks):
    """``c`` (256 KiB) made on task 0 is received on task 1, where ``relu`` writes into that
    buffer when it holds the only reference to it (its output then allocates nothing and has the
    bytes of ``c``) and ``b = matmul(r, r)`` reads it: task 1 holds the received buffer until
    ``b`` is done, beside ``b``'s own 256 KiB, not only until ``relu`` is. TF writes in place or
    not by whether gRPC has let go of the buffer yet (``relu`` runs after ``w``, another reader of
    ``c``, to leave it time); a step where ``relu`` allocated holds ``r`` instead. Both hold 512
    KiB, which the allocator's own count at ``b``'s end reaches too; the in-place steps are the
    ones the rule is for, and at least one of eight must be one."""
    target, d0, d1 = two_tasks
    g = tf.Graph()
    with g.as_default():
        p = tf1.placeholder(tf.float32, [256, 256], name="p")
        with tf.device(d0):
            c = tf.matmul(tf.random.uniform([256, 256], name="a"), p, name="c")
        with tf.device(d1):
            w = tf.reduce_sum(c, name="w")
            with tf.control_dependencies([w]):
                r = tf.nn.relu(c, name="r")
            b = tf.matmul(r, r, name="b")
            s = tf.add(tf.reduce_sum(b), w, name="s")
    in_place = 0
    for step_stats in _steps_on_tasks(target, g, s, {p: np.ones([256, 256], np.float32)}, 8):
        task1 = measured_memory(step_stats, g.as_graph_def(), {"p:0": 256 * KiB})[d1]
        held = {node: n for node, n in task1.live_at_peak.items() if n >= KiB}  # w's 4 bytes aside
        stats = {ns.node_name: ns for dev in step_stats.dev_stats if dev.device == d1 for ns in dev.node_stats}
        written = stats["r"].output[0].tensor_description.allocation_description
        assert written.requested_bytes == 256 * KiB and written.ptr != 0
        if written.allocated_bytes == 0:  # relu wrote into the received buffer
            in_place += 1
            assert held == {"c": 256 * KiB, "b": 256 * KiB}
        else:  # its own buffer, held with c while it runs and with b after
            assert held in ({"c": 256 * KiB, "r": 256 * KiB}, {"r": 256 * KiB, "b": 256 * KiB})
        assert 512 * KiB <= task1.step_peak_bytes < 513 * KiB and task1.level_bytes[-1] == 0
        assert max(int(used.allocator_bytes_in_use) for used in stats["b"].memory) >= 512 * KiB
    assert in_place >= 1


def test_a_fed_value_is_held_on_the_master_task_and_received_where_it_is_read(two_tasks):
    """A placeholder placed on task 1 is fed on task 0, the master's device, where the client's
    value arrives, and sent on to task 1: task 0 holds it until sent, task 1 holds its copy once,
    as a received tensor. ``r``, placed on task 1 and read on task 0 only, never goes there."""
    target, d0, d1 = two_tasks
    g = tf.Graph()
    with g.as_default():
        with tf.device(d1):
            q = tf1.placeholder(tf.float32, [64, 64], name="q")
            r = tf1.placeholder(tf.float32, [64, 64], name="r")
            qq = tf.reduce_sum(tf.matmul(q, q), name="qq")
        with tf.device(d0):
            rr = tf.reduce_sum(tf.matmul(r, r), name="rr")
        s = tf.add(qq, rr, name="s")
    value = np.ones([64, 64], np.float32)
    step_stats = _traced_on_tasks(target, g, s, {q: value, r: value})
    graph_def = g.as_graph_def()
    measured = measured_memory(step_stats, graph_def, {"q:0": 16 * KiB, "r:0": 16 * KiB})
    without_fed = measured_memory(step_stats, graph_def)
    labels = [ns.timeline_label for dev in step_stats.dev_stats for ns in dev.node_stats if ns.node_name == "RecvTensor"]
    assert any(f"_recv_q_0 from {d0} to {d1}" in label for label in labels), labels
    assert _allocated(measured[d0]) - _allocated(without_fed[d0]) == 32 * KiB  # q until sent, r until read
    assert list(measured[d1].level_bytes) == list(without_fed[d1].level_bytes)  # q's copy, received, once
    assert _allocated(measured[d1]) >= 16 * KiB


def test_a_received_tensor_is_there_by_its_first_readers_start_whatever_its_rpc_end_says():
    """A hand-made trace whose ``RecvTensor`` of ``c`` ends (150 us) after its reader ``b`` on
    task 1 started (120 us): ``c`` was there when ``b`` started, and is held with ``b``'s own
    output (2 KiB, 120 to 135 us) until ``b`` is done (130 us)."""
    d0 = "/job:worker/replica:0/task:0/device:CPU:0"
    d1 = "/job:worker/replica:0/task:1/device:CPU:0"
    g = tf.Graph()
    with g.as_default():
        with tf.device(d0):
            c = tf.ones([16, 16], name="c")
        with tf.device(d1):
            tf.identity(tf.matmul(c, c, name="b"), name="s")
    step = tf1.RunMetadata().step_stats
    received = step.dev_stats.add(device=d1)
    recv = received.node_stats.add(node_name="RecvTensor", all_start_micros=100, all_end_rel_micros=50,
                                   timeline_label=f"[1KiB] edge_5_c from {d0} to {d1}")
    recv.output.add().tensor_description.allocation_description.requested_bytes = 1024
    b = received.node_stats.add(node_name="b", all_start_micros=120, all_end_rel_micros=10)
    records = b.memory.add(allocator_name="cpu").allocation_records
    records.add(alloc_micros=120, alloc_bytes=2048)
    records.add(alloc_micros=135, alloc_bytes=-2048)
    out = b.output.add().tensor_description.allocation_description
    out.requested_bytes = out.allocated_bytes = 2048
    out.ptr = 1
    task1 = measured_memory(step, g.as_graph_def())[d1]
    assert task1.step_peak_bytes == 3072
    assert task1.live_at_peak == {"c": 1024, "b": 2048}
