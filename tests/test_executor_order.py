"""TF's executor emulated on a pool of threads (`executor_order`): hand-drawn graphs whose emulated
times follow from the pool's rules by hand, and the peaks those times hold.

Rules: a task a thread of the pool schedules goes to the front of its own queue, and a thread
takes the front of its own queue, or the back of another's; of the ops an op makes ready on its
device, the inexpensive ones run next on its thread, then the last expensive one where none
waits, the others as tasks; an op made ready from another device is a task.
"""

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import Placement, simulate
from baechi_tf.placer.executor_order import (emulated_peak_steps, emulated_peaks, emulated_step_peaks, emulated_times,
                                             expected_peaks)
from baechi_tf.placer.memory_timeline import blocks_timeline, reordered_peaks

MiB = graphs.MiB


def _times(graph, devices, threads, pools=None):
    devices = np.asarray(devices, dtype=np.int64)
    nd = int(devices.max()) + 1
    pools = [0] * nd if pools is None else pools
    duration = graph.compute_us.astype(float)
    return emulated_times(graph, devices, duration, pools, [threads] * nd, np.random.default_rng(0).random(2 * graph.num_ops))


def _fan_out(cheap=()):
    """r (10 us) -> x, y, z (10 us each, 1 MiB outputs), ops named in `cheap` of type Identity."""
    b = OpGraphBuilder()
    b.add_op("r", 10, [4])
    for name in "xyz":
        b.add_op(name, 10, [MiB], op_type="Identity" if name in cheap else "MatMul")
        b.add_edge("r", name)
    return b.build()


def test_one_thread_runs_the_last_expensive_op_next_and_the_others_last_in_first_out():
    start, end = _times(_fan_out(), [0, 0, 0, 0], threads=1)
    # r, then z on r's thread, then the tasks x and y from the front of the queue: y, then x.
    assert start.tolist() == [0, 30, 20, 10]
    assert end.tolist() == [10, 40, 30, 20]


def test_inexpensive_ops_run_first_on_the_thread_in_the_order_they_were_made_ready():
    start, _ = _times(_fan_out(cheap="xz"), [0, 0, 0, 0], threads=1)
    # x and z inline after r (in that order), y a task after them.
    assert start.tolist() == [0, 10, 30, 20]


def test_an_idle_thread_steals_from_the_back_of_another_threads_queue():
    start, _ = _times(_fan_out(), [0, 0, 0, 0], threads=2)
    # r's thread queues x then y at its front ([y, x]) and runs z; the idle thread takes the
    # back, x, at once; y waits for the first of them to end.
    assert start.tolist() == [0, 10, 20, 10]


def test_an_op_made_ready_from_another_device_is_a_task_even_when_inexpensive():
    b = OpGraphBuilder()
    b.add_op("r", 10, [4])
    b.add_op("a", 10, [4], op_type="MatMul")
    b.add_op("i", 5, [4], op_type="Identity")  # on the other device
    b.add_edge("r", "a")
    b.add_edge("r", "i")
    start, _ = _times(b.build(), [0, 0, 1], threads=1)
    # a runs inline next on r's thread; i, a task at the front of the queue, after it.
    assert start.tolist() == [0, 10, 20]


def test_a_chain_runs_back_to_back_and_every_op_after_its_inputs():
    g = graphs.random_dag(3, 40)
    devices = np.arange(g.num_ops) % 3
    for threads in (1, 2, 4):
        start, end = _times(g, devices, threads)
        assert np.allclose(end - start, g.compute_us)
        for u, v in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
            assert start[v] >= end[u] - 1e-9
    chain = graphs.chain(5, 10.0, MiB)
    start, end = _times(chain, [0] * 5, threads=2)
    assert start.tolist() == [0, 10, 20, 30, 40]


def test_pools_of_their_own_run_side_by_side():
    # Two devices, a pool each of one thread: x (device 0) and y (device 1) run at once.
    b = OpGraphBuilder()
    b.add_op("r", 10, [4])
    b.add_op("x", 10, [4], op_type="MatMul")
    b.add_op("y", 10, [4], op_type="MatMul")
    b.add_edge("r", "x")
    b.add_edge("r", "y")
    start, _ = _times(b.build(), [0, 0, 1], threads=1, pools=[0, 1])
    assert start.tolist() == [0, 10, 10]


def _standins(n, shared=True):
    return Cluster(tuple(Device(f"/job:w/replica:0/task:0/device:CPU:{i}", 1 << 30, "CPU", shared_memory=shared)
                         for i in range(n)), CommCost())


def test_two_threads_hold_two_outputs_where_the_simulator_holds_one():
    """x, y, z on one stand-in of a pool of two threads, each output read by a sink (k_) that
    runs right after it: the simulator runs them one at a time and holds one output; the pool
    runs x beside z, and holds two."""
    b = OpGraphBuilder()
    b.add_op("r", 10, [4])
    for name in "xyz":
        b.add_op(name, 10, [MiB], op_type="MatMul")
        b.add_op("k" + name, 0, [], op_type="NoOp")
        b.add_edge("r", name)
        b.add_edge(name, "k" + name)
    g = b.build()
    cluster = _standins(2)
    schedule = simulate(g, cluster, Placement(np.zeros(g.num_ops, dtype=np.int32), "given"))
    assert schedule.peak_memory_bytes[0] == MiB + 4
    peaks = emulated_peaks(g, cluster, schedule, steps=0, threads=[2, 2], window=0)
    assert peaks == (2 * MiB + 4, 0)
    assert emulated_peaks(g, cluster, schedule, steps=0, threads=[1, 1], window=0) == (MiB + 4, 0)
    # Two places out of the emulated order: each sink may run after the other two outputs.
    assert emulated_peaks(g, cluster, schedule, steps=0, threads=[1, 1], window=2) == (3 * MiB + 4, 0)


def test_peaks_are_the_same_for_the_same_placement_and_zero_on_pools_of_their_own():
    g = graphs.random_dag(5, 60)
    for shared, pooled in ((True, True), (False, False)):
        cluster = _standins(3, shared)
        schedule = simulate(g, cluster, Placement((np.arange(g.num_ops) % 3).astype(np.int32), "given"))
        first = emulated_peaks(g, cluster, schedule, threads=[2, 2, 2])
        assert first == emulated_peaks(g, cluster, schedule, threads=[2, 2, 2])
        assert all(p > 0 for p in first) if pooled else first == (0, 0, 0)
        # A shared pool's devices expect the emulated peak, pools of their own the window's.
        expected = expected_peaks(g, cluster, schedule)
        assert expected == (emulated_peaks(g, cluster, schedule) if pooled else reordered_peaks(g, cluster, schedule))


def test_a_cluster_of_both_expects_each_device_by_its_own_pool():
    """Two stand-ins of one process's pool and a GPU of its own: the stand-ins expect the emulated
    peak, the GPU the window's on the simulated order."""
    g = graphs.random_dag(11, 60)
    devices = tuple(Device(f"/job:w/replica:0/task:0/device:CPU:{i}", 1 << 30, "CPU", shared_memory=True)
                    for i in range(2)) + (Device("/job:w/replica:0/task:0/device:GPU:0", 1 << 30, "GPU"),)
    cluster = Cluster(devices, CommCost())
    schedule = simulate(g, cluster, Placement((np.arange(g.num_ops) % 3).astype(np.int32), "given"))
    emulated, windowed = emulated_peaks(g, cluster, schedule), reordered_peaks(g, cluster, schedule)
    assert emulated[2] == 0 and min(emulated[:2]) > 0
    assert expected_peaks(g, cluster, schedule) == emulated[:2] + windowed[2:]


def test_the_step_of_each_devices_peak_holds_that_peak():
    """`emulated_peak_steps`: per device of the shared pool, the peak `emulated_peaks` gives and
    the emulated step that reaches it, whose blocks peak there on that device; on a GPU of its
    own pool, nothing."""
    g = graphs.random_dag(11, 60)
    devices = tuple(Device(f"/job:w/replica:0/task:0/device:CPU:{i}", 1 << 30, "CPU", shared_memory=True)
                    for i in range(2)) + (Device("/job:w/replica:0/task:0/device:GPU:0", 1 << 30, "GPU"),)
    cluster = Cluster(devices, CommCost())
    schedule = simulate(g, cluster, Placement((np.arange(g.num_ops) % 3).astype(np.int32), "given"))
    found = emulated_peak_steps(g, cluster, schedule, steps=6)
    assert tuple(p for p, _, _ in found) == emulated_peaks(g, cluster, schedule, steps=6)
    assert found[2] == (0, None, None)
    for d in (0, 1):
        peak, step, blocks = found[d]
        assert blocks_timeline(blocks, 3)[d].peak_bytes == peak > 0
        assert step.placement is schedule.placement and not step.transfers
        for u, v in zip(g.edge_src.tolist(), g.edge_dst.tolist()):
            assert step.start_us[v] >= step.end_us[u]


def test_each_steps_peaks_give_the_highest_at_every_window_and_fewer_steps_are_the_first():
    """`emulated_step_peaks`: one emulation of each step, its peak at each window; the highest
    over the steps is `emulated_peaks` at that window, the steps of a shorter run are the first
    steps of a longer one, and a GPU of its own pool has none."""
    g = graphs.random_dag(12, 80)
    devices = tuple(Device(f"/job:w/replica:0/task:0/device:CPU:{i}", 1 << 30, "CPU", shared_memory=True)
                    for i in range(2)) + (Device("/job:w/replica:0/task:0/device:GPU:0", 1 << 30, "GPU"),)
    cluster = Cluster(devices, CommCost())
    schedule = simulate(g, cluster, Placement((np.arange(g.num_ops) % 3).astype(np.int32), "given"))
    peaks = emulated_step_peaks(g, cluster, schedule, steps=6, windows=(0, 2, 4))
    assert peaks.shape == (3, 7, 3) and (peaks[:, :, :2] > 0).all() and (peaks[:, :, 2] == 0).all()
    for i, window in enumerate((0, 2, 4)):
        assert tuple(peaks[i].max(axis=0).tolist()) == emulated_peaks(g, cluster, schedule, steps=6, window=window)
    # Each op may move further with a wider window, so no step holds less.
    assert (peaks[1] >= peaks[0]).all() and (peaks[2] >= peaks[1]).all()
    assert (emulated_step_peaks(g, cluster, schedule, steps=3, windows=(2,))[0] == peaks[1, :4]).all()
    # The jittered steps differ from the schedule's own durations in some step.
    assert (peaks[0, 1:, :2] != peaks[0, :1, :2]).any()
    with pytest.raises(ValueError, match="window must be at least 0, not 6, 1.0 and -1"):
        emulated_step_peaks(g, cluster, schedule, steps=6, windows=(2, -1))


def test_bad_arguments_are_refused():
    g = graphs.chain(3, 10.0, MiB)
    cluster = _standins(2)
    schedule = simulate(g, cluster, Placement(np.zeros(3, dtype=np.int32), "given"))
    with pytest.raises(ValueError, match="at least 0"):
        emulated_peaks(g, cluster, schedule, steps=-1)
    with pytest.raises(ValueError, match="window must be at least 0, not 0, 1.0 and -1"):
        emulated_peaks(g, cluster, schedule, steps=0, window=-1)
    with pytest.raises(ValueError, match="threads must give each of the 2 devices at least 1"):
        emulated_peaks(g, cluster, schedule, threads=[2])
