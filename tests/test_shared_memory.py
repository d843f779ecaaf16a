"""Devices that share one memory (`Device.shared_memory`, `Cluster.shares_memory`) in the
scheduler's memory model, both engines: hand-drawn graphs with their peaks worked out by hand,
the memory timeline's blocks, and a session on CPU stand-ins where the rule shows.

Model: a tensor that a device reads from another of its task that shares memory with it is the
sender's buffer, handed over: nothing on the reader, and the sender holds it until the reader is
done (not until the copy is sent). A constant's value is replicated on such a reader instead (TF
replicates small constants onto each CPU device that reads them): persistent memory there, from
the start of the step. Devices without the flag (GPUs) receive a copy of their own.
"""

import dataclasses

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.graph import HELD
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import Placement, engine, simulate
from baechi_tf.placer.buffers import buffer_tables, fallback_inputs
from baechi_tf.placer.block_timeline import blocks_held_at
from baechi_tf.placer.memory_timeline import memory_blocks, memory_timeline, reordered_blocks, reordered_peaks, thread_pools

MiB = graphs.MiB
ENGINES = ["python"] + (["native"] if engine.native_available() else [])


def _cluster(nd: int, shared: bool, tasks: int = 1) -> Cluster:
    return Cluster(tuple(
        Device(f"/job:w/replica:0/task:{i % tasks}/device:CPU:{i}", 1 << 30, "CPU", shared_memory=shared)
        for i in range(nd)
    ), CommCost())


def _run(graph, devices, cluster):
    schedule = simulate(graph, cluster, Placement(np.asarray(devices, dtype=np.int32), "given"))
    timeline = tuple(m.peak_bytes for m in memory_timeline(graph, cluster, schedule))
    assert timeline == schedule.peak_memory_bytes
    return schedule


def _handover():
    """a (device 0, 10 us, 1 MiB) -> b (device 1, 100 us, 4 B, a sink)
    a ~> w (device 0, 400 us, no output; control edge) ~> z (device 0, 10 us, 2 MiB, a sink)

    The copy of a (1 MiB: 318 us on the default link) arrives at 328 us and b runs until 428;
    z allocates its 2 MiB at 410 us, after the copy is sent but before b is done."""
    b = OpGraphBuilder()
    b.add_op("a", 10, [MiB])
    b.add_op("b", 100, [4])
    b.add_op("w", 400, [])
    b.add_op("z", 10, [2 * MiB])
    b.add_edge("a", "b")
    b.add_control_edge("a", "w")
    b.add_control_edge("w", "z")
    return b.build()


@pytest.mark.parametrize("name", ENGINES)
def test_a_tensor_read_on_a_device_of_shared_memory_is_the_senders_buffer_until_read(name):
    graph, devices = _handover(), [0, 1, 0, 0]
    with engine.selected(name):
        copied = _run(graph, devices, _cluster(2, shared=False))
        shared = _run(graph, devices, _cluster(2, shared=True))
    assert copied.start_us.tolist() == shared.start_us.tolist()  # the same schedule
    assert shared.start_us[3] < shared.end_us[1]  # z allocates while b still reads a
    assert copied.peak_memory_bytes == (2 * MiB, MiB + 4)  # a freed once sent; its copy on 1
    assert shared.peak_memory_bytes == (3 * MiB, 4)  # a held for b; nothing received on 1
    blocks = memory_blocks(graph, shared, _cluster(2, shared=True))
    assert "received" not in blocks.kind
    a = [i for i, (o, k) in enumerate(zip(blocks.op, blocks.kind)) if o == 0 and k == "output"]
    assert len(a) == 1 and blocks.free_us[a[0]] == shared.end_us[1]
    # Two tasks: each its own process, so a copy between them all the same.
    with engine.selected(name):
        assert _run(graph, devices, _cluster(2, shared=True, tasks=2)).peak_memory_bytes == (2 * MiB, MiB + 4)


def _in_place_of_handed_over(other_reader: str):
    """a (device 0, 1 MiB) -> i (device 1, in place of a) -> c (device 0, 100 us, 4 B, a sink);
    with `other_reader` "concurrent" a second reader r of a (device 0, 10 us, no output), with
    "ancestor" the same r with a control edge r ~> i, with "" none."""
    b = OpGraphBuilder()
    b.add_op("a", 10, [MiB])
    b.add_op("i", 10, [MiB], output_alias=[("a", 0)])
    b.add_op("c", 100, [4])
    b.add_edge("a", "i")
    b.add_edge("i", "c")
    if other_reader:
        b.add_op("r", 10, [])
        b.add_edge("a", "r")
        if other_reader == "ancestor":
            b.add_control_edge("r", "i")
    return b.build()


@pytest.mark.parametrize("name", ENGINES)
def test_an_output_in_place_of_a_handed_over_tensor_is_counted_both_ways_where_the_order_decides(name):
    """TF writes in place only into a buffer nothing else holds. With r, which need not run before
    i, still to run, whether a's buffer is free for i depends on the order of the step, and CPU
    stand-ins did it both ways. Each device is counted for the way that gives it more: i's output
    is a buffer of its own on device 1 (held until c, which reads it back, is done), and a's
    buffer stays on device 0 until c is done, as if i had written into it. A stand-in that
    allocated anew where device 1 was counted at nothing measured 1.97 MiB against 0.02 MiB
    simulated (bench/fidelity_memory.py)."""
    graph, cluster = _in_place_of_handed_over("concurrent"), _cluster(2, shared=True)
    with engine.selected(name):
        schedule = _run(graph, [0, 1, 0, 0], cluster)
        assert schedule.peak_memory_bytes == (MiB + 4, MiB)
        # On one device, or on devices that copy (GPUs: i writes into its own copy of a), the
        # output is written in place.
        assert _run(graph, [1, 1, 0, 1], cluster).peak_memory_bytes == (4, MiB)
        assert _run(graph, [0, 1, 0, 0], _cluster(2, shared=False)).peak_memory_bytes == (MiB + 4, MiB)
    blocks = memory_blocks(graph, schedule, cluster)
    assert sorted((int(o), int(d), float(f)) for o, d, k, f in zip(blocks.op, blocks.device, blocks.kind, blocks.free_us)
                  if k == "output") == [(0, 0, float(schedule.end_us[2])), (1, 1, float(schedule.end_us[2])),
                                        (2, 0, float("inf"))]


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("other_reader", ["", "ancestor"])
def test_an_output_in_place_of_a_handed_over_tensor_is_in_place_where_every_order_frees_it(name, other_reader):
    """With no other reader of a, or one that runs before i in every order (a control edge), i
    is the last holder of a's buffer however the step runs: TF writes in place into the sender's
    buffer (`test_stand_ins_write_in_place_into_a_handed_over_buffer_they_alone_hold`). Device 1
    holds nothing; a's buffer stays on device 0 until c is done.

    In a step where device 0's executor has not yet let go of a's buffer when i starts, i (which
    has no other input to write into) allocates a buffer of its own: a block marked
    `alternative` on device 1, held until c is done. The simulated order is the rules' outcome
    and leaves it out; the peak TF may reach (`reordered_peaks`) counts it."""
    graph, cluster = _in_place_of_handed_over(other_reader), _cluster(2, shared=True)
    devices = [0, 1, 0] + ([0] if other_reader else [])
    with engine.selected(name):
        schedule = _run(graph, devices, cluster)
    assert schedule.peak_memory_bytes == (MiB + 4, 0)
    blocks = memory_blocks(graph, schedule, cluster)
    end_c = float(schedule.end_us[2])
    assert sorted((int(o), int(d), float(f), bool(x)) for o, d, k, f, x in zip(
        blocks.op, blocks.device, blocks.kind, blocks.free_us, blocks.alternative) if k == "output") == [
        (0, 0, end_c, False), (1, 1, end_c, True), (2, 0, float("inf"), False)]
    assert reordered_peaks(graph, cluster, schedule, 0) == (MiB + 4, 0)
    assert reordered_peaks(graph, cluster, schedule)[1] == MiB


def test_of_the_buffers_tf_may_allocate_for_handed_over_writes_one_at_a_time_is_counted():
    """a (device 0, 1 MiB) -> i (device 1, in place of a) and b (device 0, 2 MiB) -> j (device 1,
    in place of b), both read by c (device 1, 100 us, 4 B, a sink). TF allocates for such a write
    only when it starts before the sender has let go of the buffer, in a few steps of many
    (`memory_blocks`); both at once on one device is not counted. The peak TF may reach on device
    1 holds the larger of i's and j's buffers with c's output, not both."""
    g = OpGraphBuilder()
    g.add_op("a", 10, [MiB])
    g.add_op("b", 10, [2 * MiB])
    g.add_op("i", 10, [MiB], output_alias=[("a", 0)], op_type="Relu")
    g.add_op("j", 10, [2 * MiB], output_alias=[("b", 0)], op_type="Relu")
    g.add_op("c", 100, [4])
    for src, dst in (("a", "i"), ("b", "j"), ("i", "c"), ("j", "c")):
        g.add_edge(src, dst)
    graph, cluster = g.build(), _cluster(2, shared=True)
    schedule = _run(graph, [0, 0, 1, 1, 1], cluster)
    blocks = memory_blocks(graph, schedule, cluster)
    held = [(int(n), float(a), float(f)) for n, a, f, x in zip(blocks.nbytes, blocks.alloc_us, blocks.free_us,
                                                                blocks.alternative) if x]
    end_c = float(schedule.end_us[4])
    assert sorted(held) == [(MiB, float(schedule.start_us[2]), end_c), (2 * MiB, float(schedule.start_us[3]), end_c)]
    assert reordered_peaks(graph, cluster, schedule, 0) == (3 * MiB, 4)
    assert reordered_peaks(graph, cluster, schedule)[1] == 2 * MiB + 4
    # What the timeline counts at c's start on device 1: j's buffer (not i's as well) and c's output.
    reordered = reordered_blocks(graph, schedule, blocks, None, thread_pools(cluster))
    counted = blocks_held_at(reordered, 1, float(schedule.start_us[4]))
    assert sorted((int(o), int(n)) for o, n in zip(reordered.op[counted], reordered.nbytes[counted])) == [
        (3, 2 * MiB), (4, 4)]


def _in_place_with_fallback(other_reader: bool = False, view: bool = False):
    """a (device 0, 1 MiB) and x (device 1, 10 us, 1 MiB) -> i (device 1, in place of a, reads
    a then x) -> c (device 1, 100 us, 2 MiB, a sink); with `other_reader` a second reader r of
    a (device 0, no output) that need not run before i; with `view` i is an Identity-like view."""
    b = OpGraphBuilder()
    b.add_op("a", 10, [MiB])
    b.add_op("x", 10, [MiB])
    b.add_op("i", 10, [MiB], output_alias=[("a", 0)], op_type="Reshape" if view else "ReluGrad")
    b.add_op("c", 100, [2 * MiB])
    b.add_edge("a", "i")
    b.add_edge("x", "i")
    b.add_edge("i", "c")
    if other_reader:
        b.add_op("r", 10, [])
        b.add_edge("a", "r")
    return b.build()


@pytest.mark.parametrize("name", ENGINES)
def test_an_in_place_write_into_a_handed_over_buffer_holds_the_ops_other_input_until_read(name):
    """TF writes into a's buffer, handed over by device 0, only once device 0's executor has let
    go of it; when it has not yet, it writes into i's next candidate, x, which then stays held
    until c has read i (Inception-v3's ReluGrad on CPU stand-ins, in one to three of four traced
    steps). Device 1 holds x until c is done (1 + 2 MiB), device 0 holds a until then as well.
    On one device nothing is handed over: x is freed when i is done."""
    graph, cluster = _in_place_with_fallback(), _cluster(2, shared=True)
    with engine.selected(name):
        schedule = _run(graph, [0, 1, 1, 1], cluster)
        alone = _run(graph, [1, 1, 1, 1], cluster)
    assert schedule.peak_memory_bytes == (MiB, 3 * MiB)
    assert alone.peak_memory_bytes == (0, 3 * MiB)  # a (held for c) and c's output; x freed at i's end
    blocks = memory_blocks(graph, schedule, cluster)
    frees = {(int(o), int(d)): float(f) for o, d, k, f in zip(blocks.op, blocks.device, blocks.kind, blocks.free_us)
             if k == "output"}
    end_c = float(schedule.end_us[3])
    assert frees == {(0, 0): end_c, (1, 1): end_c, (3, 1): float("inf")}
    alone_blocks = memory_blocks(graph, alone, cluster)
    assert [float(f) for o, k, f in zip(alone_blocks.op, alone_blocks.kind, alone_blocks.free_us)
            if o == 1 and k == "output"] == [float(alone.end_us[2])]


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("variant", ["other_reader", "view"])
def test_no_fallback_input_for_a_view_or_an_output_with_a_buffer_of_its_own(name, variant):
    """A view shares a's buffer whatever holds it, so x is freed when i is done (device 1: 2 MiB at
    c). Where another reader of a may still run, i's output is counted with a buffer of its own on
    device 1 (`_cut`), which stands for the fallback: x is freed when i is done there too."""
    graph = _in_place_with_fallback(other_reader=variant == "other_reader", view=variant == "view")
    cluster = _cluster(2, shared=True)
    devices = [0, 1, 1, 1] + ([0] if variant == "other_reader" else [])
    with engine.selected(name):
        schedule = _run(graph, devices, cluster)
    own = MiB if variant == "other_reader" else 0  # i's buffer of its own, held until c is done
    assert schedule.peak_memory_bytes == (MiB, 2 * MiB + own)
    blocks = memory_blocks(graph, schedule, cluster)
    assert [float(f) for o, k, f in zip(blocks.op, blocks.kind, blocks.free_us)
            if o == 1 and k == "output"] == [float(schedule.end_us[2])]


def test_fallback_inputs_take_the_first_other_input_of_as_many_bytes_and_no_variables_value():
    """i writes in place into a; its other inputs in turn: v (a view of persistent memory, a
    variable's value), s (smaller than i's output), x (as large): x is the fallback. A view op,
    and an op written into its only input, have none."""
    b = OpGraphBuilder()
    b.add_op("a", 1, [MiB])
    b.add_op("v", 1, [MiB], persistent_bytes=MiB, output_alias=[HELD])
    b.add_op("s", 1, [MiB // 2])
    b.add_op("x", 1, [MiB])
    b.add_op("i", 1, [MiB], output_alias=[("a", 0)], op_type="AddN")
    b.add_op("w", 1, [MiB], output_alias=[("a", 0)], op_type="Identity")
    b.add_op("u", 1, [MiB], output_alias=[("x", 0)], op_type="Relu")
    for src in ("a", "v", "s", "x"):
        b.add_edge(src, "i")
    b.add_edge("a", "w")
    b.add_edge("x", "u")
    for op in ("i", "w", "u"):
        b.add_op(op + "_reader", 1, [4])
        b.add_edge(op, op + "_reader")
    graph = b.build()
    _, alias, _ = buffer_tables(graph)
    fallback = fallback_inputs(graph, alias)
    tensor = {graph.names[s]: t for t, (s, o) in enumerate(zip(graph.tensor_src.tolist(), graph.tensor_src_output.tolist()))
              if o >= 0}
    assert {name: int(fallback[tensor[name]]) for name in ("i", "w", "u")} == {"i": tensor["x"], "w": -1, "u": -1}
    assert (fallback >= 0).sum() == 1


@pytest.mark.parametrize("name", ENGINES)
def test_a_constant_read_on_a_device_of_shared_memory_is_replicated_there(name):
    """k (device 0, a constant: 64 B of persistent memory, its output a view of it) -> m (device
    1, 10 us, 1 MiB, a sink). With shared memory, device 1 holds a replica of k's 64 bytes from
    the start of the step, persistent; without, a copy from m's start."""
    b = OpGraphBuilder()
    b.add_op("k", 1, [64], persistent_bytes=64, output_alias=[HELD])
    b.add_op("m", 10, [MiB])
    b.add_edge("k", "m")
    graph = b.build()
    for shared in (False, True):
        cluster = _cluster(2, shared=shared)
        with engine.selected(name):
            schedule = _run(graph, [0, 1], cluster)
        assert schedule.peak_memory_bytes == (64, MiB + 64)
        blocks = memory_blocks(graph, schedule, cluster)
        on_1 = {k: (float(a), float(f)) for d, k, a, f in zip(blocks.device, blocks.kind, blocks.alloc_us, blocks.free_us)
                if d == 1 and k != "output"}
        assert on_1 == ({"persistent": (0.0, float("inf"))} if shared else
                        {"received": (float(schedule.start_us[1]), float(schedule.end_us[1]))})


@pytest.mark.parametrize("name", ENGINES)
def test_timeline_peak_is_the_schedule_peak_on_devices_of_shared_memory(name):
    """Random DAGs with views and constants, spread at random over devices of two tasks that
    share memory within each (but one device): the timeline's blocks give the scheduler's peak,
    and no device holds more than it would receiving copies, but the senders, which hold their
    buffers until read."""
    import random

    for seed in range(60):
        rng = random.Random(seed)
        base = graphs.random_dag(seed, rng.randint(2, 40), persistent_prob=0.3)
        graph = graphs.with_aliases(base, random.Random(seed + 1), 0.6)
        nd = rng.randint(1, 4)
        devices = np.asarray([rng.randrange(nd) for _ in range(graph.num_ops)], dtype=np.int32)
        cluster = Cluster(tuple(
            Device(f"/job:w/replica:0/task:{i % 2}/device:CPU:{i}", 1 << 40, "CPU", shared_memory=i != 1)
            for i in range(nd)
        ))
        with engine.selected(name):
            schedule = simulate(graph, cluster, Placement(devices, "given"))
        timeline = tuple(m.peak_bytes for m in memory_timeline(graph, cluster, schedule))
        assert timeline == schedule.peak_memory_bytes, seed
        senders = set(devices[graph.tensor_src].tolist())
        copied = simulate(graph, dataclasses.replace(cluster, devices=tuple(
            dataclasses.replace(d, shared_memory=False) for d in cluster.devices)), Placement(devices, "given"))
        for d in set(range(nd)) - senders:
            assert schedule.peak_memory_bytes[d] <= copied.peak_memory_bytes[d], seed


def test_shared_memory_is_a_bool_and_pairs_of_one_task_share():
    from baechi_tf.errors import ConfigError

    with pytest.raises(ConfigError, match=r"shared_memory='yes'; give True .* or False"):
        Device("/device:CPU:0", 1 << 30, "CPU", shared_memory="yes")
    cluster = Cluster(tuple(
        Device(f"/job:w/replica:0/task:{i // 2}/device:CPU:{i}", 1 << 30, "CPU", shared_memory=i != 3)
        for i in range(4)
    ))
    assert cluster.shares_memory() == (
        (False, True, False, False),
        (True, False, False, False),
        (False, False, False, False),  # 2 and 3 are one task, but 3 has its own memory
        (False, False, False, False),
    )
    # Devices with and without the flag are not interchangeable.
    mixed = Cluster(tuple(Device(f"/device:CPU:{i}", 1 << 30, "CPU", shared_memory=i < 2) for i in range(4)))
    assert mixed.twins() == ((0, 1), (2, 3))


def _placed_and_traced(g, init, fetch, setup, device_of, feed=None):
    """`g` profiled on `setup`'s stand-ins (one warm-up, two traced steps, Grappler off), placed
    with each op on `device_of(name)`, and one step of the placed graph run after a warm-up,
    traced: (placed GraphDef, its `PlacementReport`, the traced step's StepStats, the profile)."""
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profile_fetch
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.devices import session_config
    from baechi_tf.rewriter.graph_pass import place_graph_def

    tf1 = tf.compat.v1
    config = session_config(setup, grappler=False)
    graph_def = g.as_graph_def()
    with tf1.Session(graph=g, config=config) as sess:
        sess.run(init)
        profile = profile_fetch(sess, fetch.name, feed_dict=feed, warmup_steps=1, traced_steps=2, graph_def=graph_def)
    expert = {n.name: device_of(n.name) for n in graph_def.node}
    placed, report = place_graph_def(graph_def, profile, setup.cluster,
                                     PlacementOptions(placement_method="expert", expert=expert),
                                     host_device=setup.host, device_aliases=setup.aliases)
    run = tf.Graph()
    with run.as_default():
        tf1.import_graph_def(placed, name="")
    with tf1.Session(graph=run, config=config) as sess:
        sess.run(init.name)
        sess.run(fetch.name, feed_dict=feed)
        metadata = tf1.RunMetadata()
        sess.run(fetch.name, feed_dict=feed, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
    return placed, report, metadata.step_stats, profile


@pytest.mark.tf
def test_stand_ins_hand_tensors_over_as_the_simulator_counts_them():
    """A session on two stand-ins: a = x @ x (256 KiB, x a variable's value) on the first, b = a @ a
    and its sum on the second, traced. The second holds b and never a copy of a (measured from the allocation
    records); the simulator, given the profile, counts the same on stand-ins of shared memory (b
    and replicas of the sum's constant axes), and b with a copy of a where devices copy (the
    same names, without the flag)."""
    import tensorflow as tf

    from baechi_tf.cost_model.measured_memory import measured_memory
    from baechi_tf.rewriter.devices import LOCAL_TASK, standin_cluster

    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        v = tf1.get_variable("v", initializer=tf.ones([256, 256]) / 256, use_resource=True)
        x = v.read_value()
        a = tf.matmul(x, x, name="a")
        b = tf.matmul(a, a, name="b")
        s = tf.reduce_sum(b, name="s")
        init = tf1.global_variables_initializer()
    setup = standin_cluster(2, prefix=LOCAL_TASK, shared_memory=True)
    first, second = setup.cluster.names
    placed, report, step_stats, _ = _placed_and_traced(
        g, init, s, setup, lambda name: second if name in ("b", "s") else first)
    measured = {name.split("/")[-1]: m.peak_bytes for name, m in measured_memory(step_stats, placed).items()}
    result = report.result
    simulated = dict(zip((n.split("/")[-1] for n in result.cluster.names), result.schedule.peak_memory_bytes))
    tensor = 256 * 256 * 4
    assert tensor <= measured["device:CPU:2"] < 2 * tensor  # b, never a copy of a
    assert measured["device:CPU:2"] <= simulated["device:CPU:2"] <= 1.25 * measured["device:CPU:2"]
    assert measured["device:CPU:1"] <= simulated["device:CPU:1"] <= 1.25 * measured["device:CPU:1"]
    gpus = dataclasses.replace(result.cluster, devices=tuple(
        dataclasses.replace(d, shared_memory=False) for d in result.cluster.devices))
    copying = simulate(result.graph, gpus, result.placement)
    assert copying.peak_memory_bytes[1] == 2 * tensor  # b and a copy of a


@pytest.mark.tf
def test_a_fed_value_holds_no_memory_of_a_stand_in():
    """A session on two stand-ins, traced: x (a fed 512 KiB placeholder) @ w (a variable) on the
    second. TF hands the step the caller's array: no allocation record of the second stand-in
    holds x's bytes, and the import gives the Placeholder no buffer on stand-ins of one process
    (`import_graph_def`'s caller_feeds), so the simulated peak is within [1.0, 1.25] of the
    measured one. Devices that copy (GPUs) keep x's bytes."""
    import tensorflow as tf

    from baechi_tf.cost_model.measured_memory import measured_memory
    from baechi_tf.rewriter.devices import LOCAL_TASK, standin_cluster
    from baechi_tf.rewriter.importer import import_graph_def

    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [512, 256], name="x")
        w = tf1.get_variable("w", initializer=tf.ones([256, 64]) / 256, use_resource=True)
        y = tf.matmul(x, w.read_value(), name="y")
        s = tf.reduce_sum(y, name="s")
        init = tf1.global_variables_initializer()
    setup = standin_cluster(2, prefix=LOCAL_TASK, shared_memory=True)
    second = setup.cluster.names[1]
    placed, report, step_stats, profile = _placed_and_traced(
        g, init, s, setup, lambda name: second, {"x:0": np.ones([512, 256], np.float32)})
    measured = measured_memory(step_stats, placed)
    peak = next(m.peak_bytes for name, m in measured.items() if name.endswith("device:CPU:2"))
    x_bytes, y_bytes = 512 * 256 * 4, 512 * 64 * 4
    assert y_bytes <= peak < x_bytes  # y and w, never x
    result = report.result
    simulated = result.schedule.peak_memory_bytes[1]
    assert peak <= simulated <= 1.25 * peak
    graph = result.graph
    assert graph.output_alias[graph.index["x"]] == (HELD,)
    gpus = standin_cluster(2, prefix=LOCAL_TASK)  # devices that copy
    copied = import_graph_def(g.as_graph_def(), profile, gpus.cluster, host_device=gpus.host,
                              device_aliases=gpus.aliases).graph
    assert not copied.output_alias or copied.output_alias[copied.index["x"]] != (HELD,)


@pytest.mark.tf
@pytest.mark.parametrize("later_reader", [False, True])
def test_stand_ins_write_in_place_into_a_handed_over_buffer_they_alone_hold(later_reader):
    """The premise of `buffers.always_reused_tensors`, on a session of two stand-ins (Grappler off,
    traced): a = x @ x on the first, b = relu(a) on the second. With no other reader of a, b
    allocates nothing: TF wrote it into the first stand-in's buffer. With one more reader of a
    that runs after b (a control edge b ~> it), a's buffer is still held when b runs, and b
    allocates a buffer of its own, in every step.

    Without the later reader, the first stand-in's executor may not yet have let go of a when b
    runs (a race between the two executors, most often in a session's first steps), and b then
    allocates its own buffer: so the claim is over eight traced steps, in place in at least
    one and never anything but in place or b's own bytes."""
    import tensorflow as tf

    from baechi_tf.rewriter.devices import LOCAL_TASK, session_config, standin_cluster

    tf1 = tf.compat.v1
    setup = standin_cluster(2, prefix=LOCAL_TASK, shared_memory=True)
    first, second = setup.cluster.names
    g = tf.Graph()
    with g.as_default():
        with tf.device(first):
            x = tf.ones([256, 256])
            a = tf.matmul(x, x, name="a")
        with tf.device(second):
            b = tf.nn.relu(a, name="b")
            out = tf.reduce_sum(b)
        if later_reader:
            with tf.device(first), tf.control_dependencies([b]):
                out += tf.reduce_sum(a * 2.0)
    allocated = []
    with tf1.Session(graph=g, config=session_config(setup, grappler=False)) as sess:
        sess.run(out)
        for _ in range(8):
            metadata = tf1.RunMetadata()
            sess.run(out, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=metadata)
            allocated += [sum(r.alloc_bytes for m in ns.memory for r in m.allocation_records if r.alloc_bytes > 0)
                          for dev in metadata.step_stats.dev_stats for ns in dev.node_stats if ns.node_name == "b"]
    own = 256 * 256 * 4
    assert len(allocated) == 8
    if later_reader:
        assert allocated == [own] * 8
    else:
        assert 0 in allocated and set(allocated) <= {0, own}, allocated


def test_a_handed_over_tensor_waits_for_its_reader_in_the_order_of_the_process():
    """
    device 0:  g (100 us, 1 MiB) -> u on device 1; then h1, h2, h3 (100 us each, 1 KiB, no inputs)
    device 1:  u (10 us, 4 B, a sink), idle before and after it

    A link of 50 us: u runs from 150 to 160 us. On its own device u is never held back, the device
    having nothing else to run, so g's buffer is freed at u's end. But stand-ins of one process
    take turns on its threads: in the order of both (g, h1, u, h2, h3 by start), u may end as late
    as the op `pool_window` places on (`ORDER_WINDOW_PROCESS` by default), and g's buffer is held
    until then; with no window for the devices, not at all. Devices of their own (no shared
    memory) run on pools of their own.
    """
    from baechi_tf.placer.memory_timeline import ORDER_WINDOW_PROCESS, reordered_blocks, reordered_peaks, thread_pools

    b = OpGraphBuilder()
    b.add_op("g", 100, [MiB])
    b.add_op("u", 10, [4])
    for name in ("h1", "h2", "h3"):
        b.add_op(name, 100, [1024])
    b.add_edge("g", "u")
    g = b.build()
    c = dataclasses.replace(_cluster(2, shared=True), comm=CommCost(0.0, 50.0))
    s = simulate(g, c, Placement(np.array([0, 1, 0, 0, 0], np.int32), "given"))
    assert s.start_us.tolist() == [0.0, 150.0, 100.0, 200.0, 300.0]
    assert thread_pools(c) == (0, 0)

    def freed(window, pools, pool_window=None):
        blocks = reordered_blocks(g, s, memory_blocks(g, s, c), window, pools, pool_window=pool_window)
        return {float(f) for k, o, d, f in zip(blocks.kind, blocks.op, blocks.device, blocks.free_us)
                if k == "output" and g.names[o] == "g" and d == 0}

    assert freed(0, (0, 0)) == freed(2, None) == freed(0, (0, 0), 2) == {160.0}
    assert freed(1, (0, 0), 1) == {300.0}  # h2's end
    assert freed(1, (0, 0), 2) == freed(1, (0, 0)) == {400.0}  # h3's end
    assert ORDER_WINDOW_PROCESS >= 2
    peaks = reordered_peaks(g, c, s, 2)
    assert peaks[0] == MiB + 3 * 1024 > s.peak_memory_bytes[0]
    with pytest.raises(ValueError, match="pool_window must be at least 0, not -1"):
        reordered_blocks(g, s, memory_blocks(g, s, c), 1, (0, 0), pool_window=-1)
    # Three stand-ins in two processes, and devices of their own.
    assert thread_pools(_cluster(3, shared=True, tasks=2)) == (0, 1, 0)
    assert thread_pools(_cluster(3, shared=False)) == (0, 1, 2)


def test_a_device_of_its_own_pool_moves_its_ops_fewer_places():
    """
    device 0:  a -> ra, u1, ..., u9, b -> rb (100 us each, in turn; a and b with 1 MiB of output,
               the others sinks of 4 B)

    b is ten places after ra, which frees a's output. Where ops move `ORDER_WINDOW` (8) places,
    ra may end as late as u7 and b start as early as u3: both outputs are held at once. At
    `ORDER_WINDOW_OWN_POOL` (4), ra ends by u3 and b starts from u7: one at a time, as simulated.
    Stand-ins of one process take the first by default, devices of pools of their own the second.
    """
    from baechi_tf.placer.memory_timeline import (
        ORDER_WINDOW, ORDER_WINDOW_OWN_POOL, order_windows, reordered_blocks, reordered_peaks, thread_pools,
    )

    assert (ORDER_WINDOW, ORDER_WINDOW_OWN_POOL) == (8, 4)
    b = OpGraphBuilder()
    names = ["a", "ra"] + [f"u{i}" for i in range(1, 10)] + ["b", "rb"]
    for name in names:
        b.add_op(name, 100, [MiB if name in ("a", "b") else 4])
    b.add_edge("a", "ra")
    b.add_edge("b", "rb")
    g = b.build()
    held_once = MiB + 4 * (len(names) - 2)  # one output, and every sink's (kept)
    for shared, expected in ((True, held_once + MiB), (False, held_once)):
        c = _cluster(2, shared=shared)
        s = simulate(g, c, Placement(np.zeros(len(names), np.int32), "given"))
        assert s.start_us.tolist() == [100.0 * i for i in range(len(names))]
        assert s.peak_memory_bytes == (held_once, 0)
        assert reordered_peaks(g, c, s)[0] == expected, shared
        assert reordered_peaks(g, c, s, order_windows(thread_pools(c))) == reordered_peaks(g, c, s)
    # One window per device, or one for all; the pools' windows by how many devices share them.
    assert reordered_peaks(g, c, s, (ORDER_WINDOW_OWN_POOL, ORDER_WINDOW))[0] == held_once
    assert reordered_peaks(g, c, s, (ORDER_WINDOW, ORDER_WINDOW_OWN_POOL))[0] == held_once + MiB
    assert order_windows((0, 1, 0)) == (ORDER_WINDOW, ORDER_WINDOW_OWN_POOL, ORDER_WINDOW)
    with pytest.raises(ValueError, match="window gives 1 devices a window, but there are 2: give one per"):
        reordered_blocks(g, s, memory_blocks(g, s, c), (4,), thread_pools(c))
    with pytest.raises(ValueError, match="window must be at least 0, not -1"):
        reordered_blocks(g, s, memory_blocks(g, s, c), (4, -1))
