"""Profiles: step stats -> CostProfile (real traces and hand-written ones), the file, coverage."""

import dataclasses
import os
import pathlib
import pickle
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2

from baechi_tf.cost_model import (
    CostProfile,
    OpCost,
    compare_to_graph,
    graph_fingerprint,
    graph_nodes,
    load_profile,
    merge_profiles,
    profile_coverage,
    profile_fetch,
    profile_from_bytes,
    profile_from_step_stats,
    profile_to_bytes,
    profiling_config,
    save_profile,
    unrun_ops,
)
from baechi_tf.cost_model.profile import NO_BUFFER, OWN_BUFFER
from baechi_tf.cost_model.profiler import output_buffers, with_types_not_run
from baechi_tf.errors import ProfileError
from baechi_tf.proto import cost_profile_pb2
from tf_models import BATCH, HIDDEN, INPUT_DIM, profiled_lstm

pytestmark = pytest.mark.tf

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ a real profile


@pytest.fixture(scope="module")
def lstm():
    return profiled_lstm()


def test_real_profile_keeps_graph_ops_only(lstm):
    graph_ops = {n.name: n.op for n in lstm.graph_def.node}
    profile = lstm.profile
    assert profile.num_traced_steps == 2
    assert profile.tf_version == tf.__version__
    assert profile.graph_fingerprint == graph_fingerprint(lstm.graph_def)
    assert len(profile.ops) > 300
    for name, cost in profile.ops.items():
        assert name in graph_ops, name  # no _SOURCE, _arg_*, _retval_*, send/recv
        assert cost.op_type == graph_ops[name]
        assert cost.compute_us >= 0
        assert cost.num_steps == 2
        assert cost.device.endswith("device:CPU:0")


def test_real_profile_sizes(lstm):
    ops = lstm.profile.ops
    # The gate matmul of a step: [BATCH, 4 * HIDDEN] float32.
    assert ops["lstm0/t0/MatMul"].output_bytes == (BATCH * 4 * HIDDEN * 4,)
    # A read of a resource variable aliases its buffer (allocates nothing) but still has a size.
    read = ops["lstm0/t0/MatMul/ReadVariableOp"]
    assert read.output_bytes == ((INPUT_DIM + HIDDEN) * 4 * HIDDEN * 4,)
    # Split has four outputs, each recorded by slot.
    assert ops["lstm1/t2/split"].output_bytes == (BATCH * HIDDEN * 4,) * 4
    # A variable's handle is host memory, made when the kernel is built (TF describes it as 200
    # bytes that no allocation record shows): no device bytes.
    handles = [n.name for n in lstm.graph_def.node if n.op == "VarHandleOp"]
    assert handles and all(ops[h].output_bytes == (0,) for h in handles), [ops[h].output_bytes for h in handles]
    # The training fetch's ops ran; the initialisers did not.
    assert "train" in ops and "init" not in ops


def test_real_profile_coverage(lstm):
    coverage = profile_coverage(lstm.profile, lstm.graph_def)
    assert coverage.num_graph_ops == len(lstm.graph_def.node)
    assert coverage.num_profiled_ops == len(lstm.profile.ops)
    # The ops the fetch did not run cost nothing, but for the fed placeholders.
    assert set(coverage.estimated_ops) == {"inputs", "targets"}
    assert set(coverage.unrun_ops) == {n.name for n in lstm.graph_def.node} - set(lstm.profile.ops) - {"inputs", "targets"}
    assert 0.5 < coverage.op_share < 1
    # Runtime nodes (_arg_, _retval_, _SOURCE) are the only traced time outside the graph's ops.
    assert 0.9 < coverage.compute_share <= 1
    assert "2 ops have estimated costs" in coverage.describe()
    assert f"{len(coverage.unrun_ops)} ops ran in no traced step and cost nothing" in coverage.describe()


def test_ops_no_traced_step_ran_are_unrun(lstm):
    unrun = unrun_ops(lstm.profile, lstm.graph_def)
    assert {"init", "lstm0/kernel/Initializer/random_uniform/RandomUniform", "lstm0/kernel/Assign"} <= unrun
    assert not unrun & set(lstm.profile.ops)
    # Merged with a fetch placed without a traced step, what runs is not known any more.
    untraced = CostProfile({}, lstm.profile.graph_fingerprint, lstm.profile.graph_nodes)
    for merged in (merge_profiles(lstm.profile, untraced), merge_profiles(untraced, lstm.profile)):
        assert merged.num_traced_steps == 0
        assert unrun_ops(merged, lstm.graph_def) == frozenset()
    # A node that is not the profiled graph's (changed inputs) is not known either.
    changed = tf.compat.v1.GraphDef()
    changed.CopyFrom(lstm.graph_def)
    node = next(n for n in changed.node if n.name == "init")
    node.input.append("^inputs")
    assert unrun_ops(lstm.profile, changed) == unrun - {"init"}


def test_ops_that_may_run_in_another_step_are_not_unrun():
    #   x --> Switch(p) --false--> neg --> Merge --> out
    #               \---true---> sq  --/
    #   fed --> twice --> used              unused (reads x)
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
        p = tf.compat.v1.placeholder(tf.bool, [], name="p")
        false, true = tf.raw_ops.Switch(data=x, pred=p, name="switch")
        merged = tf.raw_ops.Merge(inputs=[tf.negative(false, name="neg"), tf.square(true, name="sq")], name="merge")
        out = tf.identity(merged.output, name="out")
        fed = tf.multiply(x, 3.0, name="fed")
        used = tf.add(fed, 1.0, name="used")
        tf.multiply(x, 5.0, name="unused")
        spare = tf.compat.v1.placeholder(tf.float32, [4], name="spare")  # read by nothing that runs
        tf.negative(spare, name="unread")
        tf.compat.v1.placeholder(tf.float32, [4], name="lone")  # read by nothing
    with tf.compat.v1.Session(graph=g, config=profiling_config()) as sess:
        profile = profile_fetch(sess, [out, used], {x: np.ones(4, np.float32), p: True, fed: np.ones(4, np.float32)},
                                warmup_steps=0, traced_steps=1)
    assert "sq" in profile.ops and "neg" not in profile.ops and "fed" not in profile.ops
    unrun = unrun_ops(profile, g.as_graph_def())
    # The branch not taken, a fed op (its readers ran) and the placeholders that ran ops read may
    # run in another step; the ops that nothing the fetch runs reads are part of none (the fed
    # op's input too), placeholders among them.
    assert unrun == {"unused", "unused/y", "fed/y", "spare", "unread", "lone"}


def test_what_profiling_may_write_over(lstm, tmp_path):
    from baechi_tf.cost_model.profile import not_a_profile_to_replace

    ours = tmp_path / "cost.pb"
    save_profile(lstm.profile, ours)
    cut = tmp_path / "cut.pb"  # "profile the graph again", its error says: into the same file
    cut.write_bytes(ours.read_bytes()[:100])
    old = tmp_path / "cost.pkl"  # the original's profile, which the README's commands name
    old.write_bytes(pickle.dumps({"op": 1.0}, protocol=2))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    for path in (ours, cut, old, empty, tmp_path / "missing", tmp_path):
        assert not_a_profile_to_replace(str(path)) is None, path
    source = tmp_path / "model.py"
    source.write_text("import tensorflow as tf\n")
    assert "does not start as one" in not_a_profile_to_replace(str(source))


def test_round_trip_is_exact_and_deterministic(lstm, tmp_path):
    path = tmp_path / "cost.pb"
    save_profile(lstm.profile, path)
    assert os.listdir(tmp_path) == ["cost.pb"]  # no temporary file left behind
    again = load_profile(path)
    assert dict(again.ops) == dict(lstm.profile.ops)
    assert again.graph_nodes == lstm.profile.graph_nodes
    assert (again.graph_fingerprint, again.tf_version, again.traced_compute_us) == (
        lstm.profile.graph_fingerprint,
        lstm.profile.tf_version,
        lstm.profile.traced_compute_us,
    )
    assert profile_to_bytes(again) == path.read_bytes()


def test_fingerprint_ignores_devices_and_sees_structure(lstm):
    placed = tf.compat.v1.GraphDef()
    placed.CopyFrom(lstm.graph_def)
    for node in placed.node:
        node.device = "/device:CPU:3"
    assert compare_to_graph(lstm.profile, placed) is None
    changed = tf.compat.v1.GraphDef()
    changed.CopyFrom(lstm.graph_def)
    changed.node.add(name="extra", op="NoOp")
    changed.node[5].input.append("^extra")
    mismatch = compare_to_graph(lstm.profile, changed)
    assert mismatch.missing_from_profile == ("extra",)
    assert mismatch.changed == (changed.node[5].name,)
    assert mismatch.missing_from_graph == ()
    assert "1 graph ops not in the profiled graph ('extra')" in mismatch.describe()


# ------------------------------------------------------------------ hand-written step stats


def _node(name, us, outputs=(), temp=0, persistent=0, nanos=None, op=""):
    ns = step_stats_pb2.NodeExecStats(node_name=name, op_end_rel_micros=us)
    if op:
        ns.timeline_label = f"{name} = {op}(x)"
    if nanos is not None:
        ns.op_end_rel_nanos = nanos
    for slot, nbytes in outputs:
        out = ns.output.add(slot=slot)
        out.tensor_description.allocation_description.allocated_bytes = nbytes
    ns.memory_stats.temp_memory_size = temp
    ns.memory_stats.persistent_memory_size = persistent
    return ns


def _step(a_us, b_bytes, extra=()):
    stats = step_stats_pb2.StepStats()
    cpu = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    cpu.node_stats.extend(
        [
            _node("_SOURCE", 5),
            _node("a", a_us, [(0, 400)], temp=16),
            _node("b", 7, [(1, b_bytes)], persistent=8),
            _node("b", 3),  # b ran twice in this step (a loop): times add up
            _node("a/_12", 9),  # a send/recv: skipped, but counted in the traced time
            _node("_retval_b_0_0", 1),
            *extra,
        ]
    )
    gpu = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:GPU:0")
    gpu.node_stats.extend([_node("g", 1000, [(0, 64)])])
    hw = stats.dev_stats.add(device="/device:GPU:0/stream:all")
    hw.node_stats.extend([_node("g:MatMul", 30), _node("g:Add", 12), _node("only_hw:K", 50)])
    stats.dev_stats.add(device="/device:GPU:0/stream:7").node_stats.extend([_node("g:MatMul", 999)])
    return stats


class _Graph:
    """A GraphDef stand-in: what the profiler reads of a graph is its nodes' name, op, input."""

    def __init__(self, **ops):
        self.node = [tf.compat.v1.NodeDef(name=n, op=t) for n, t in ops.items()]


GRAPH = _Graph(a="MatMul", b="Switch", g="MatMul", only_hw="Add", never="NoOp")


def test_step_stats_rules():
    steps = [_step(10, 100), _step(30, 300), _step(20, 200)]
    profile = profile_from_step_stats(steps, GRAPH, tf_version="x")
    assert sorted(profile.ops) == ["a", "b", "g"]  # only_hw: seen in the hardware trace only
    a, b, g = profile.ops["a"], profile.ops["b"], profile.ops["g"]
    assert a == OpCost("a", "MatMul", 20.0, (400,), 16, 0, a.device, 3)  # median of 10, 30, 20
    assert b.compute_us == 10.0  # 7 + 3 in every step
    assert b.output_bytes == (0, 300)  # slot 1 only; max over steps
    assert b.persistent_bytes == 8
    assert g.compute_us == 42.0  # kernel time (30 + 12) replaces the host-side 1000
    assert g.device.endswith("GPU:0")
    # Traced time per step: every executor node, runtime ones included (median step: a=20).
    assert profile.traced_compute_us == 5 + 20 + 10 + 9 + 1 + 42
    coverage = profile_coverage(profile, GRAPH)
    assert (coverage.num_graph_ops, coverage.num_profiled_ops) == (5, 3)
    assert coverage.unrun_ops == ("only_hw", "never") and coverage.estimated_ops == ()
    assert coverage.compute_share == pytest.approx(72 / 87)
    # The rest of each step, by node type (no label here: 'unknown'), measured within the step.
    assert profile.unmatched_compute_us == {"unknown": 15.0}
    assert "0.015 ms of 0.1 ms: unknown 0.015 ms" == coverage.unmatched_by_type()


def test_grappler_and_fused_nodes_count_for_the_ops_they_come_from():
    graph = tf.compat.v1.GraphDef()
    for name, op, inputs in [("x", "Placeholder", ()), ("w", "Const", ()), ("conv", "Conv2D", ("x", "w")),
                             ("relu", "Relu", ("conv",)), ("shape", "Shape", ("relu",)), ("id", "Identity", ("relu",))]:
        graph.node.add(name=name, op=op).input.extend(inputs)
    ran = tf.compat.v1.GraphDef()
    for name, op, inputs in [("w", "Const", ()), ("relu", "_FusedConv2D", ("_arg_x_0_0", "w"))]:
        ran.node.add(name=name, op=op).input.extend(inputs)
    stats = step_stats_pb2.StepStats()
    stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0").node_stats.extend([
        _node("relu", 50, [(0, 64)], op="_FusedConv2D"),
        _node("ConstantFolding/shape-folded-0", 2, [(0, 999)], op="Const"),  # Grappler's, of shape
        _node("relu/_3", 4, op="_Send"), _node("_arg_x_0_0", 1, op="_Arg"), _node("elsewhere", 7, op="Exp"),
    ])
    profile = profile_from_step_stats([stats], graph, partition_graphs=[ran])
    assert profile.ops["relu"].compute_us == 50 and profile.ops["relu"].output_bytes == (64,)
    assert profile.ops["shape"].compute_us == 2 and profile.ops["shape"].output_bytes == ()  # not its outputs
    assert profile.ops["conv"] == OpCost("conv", "Conv2D", 0.0, (), device=profile.ops["relu"].device,
                                         fused_into="relu")
    assert "x" not in profile.ops and "id" not in profile.ops  # fed; not run
    assert profile.unmatched_compute_us == {"_Send": 4.0, "_Arg": 1.0, "Exp": 7.0}
    assert profile_coverage(profile, graph).compute_share == pytest.approx(52 / 64)
    # Saved and read back whole; a format-2 file knows nothing of the unmatched time.
    again = profile_from_bytes(profile_to_bytes(profile))
    assert dict(again.ops) == dict(profile.ops) and again.unmatched_compute_us == profile.unmatched_compute_us
    pb = cost_profile_pb2.CostProfile.FromString(profile_to_bytes(profile))
    pb.format_version = 2
    del pb.unmatched[:]
    old = profile_from_bytes(pb.SerializeToString())
    assert old.unmatched_compute_us is None and profile_coverage(old, graph).unmatched_by_type() == ""
    # Merged: the larger time of each type; unknown when either profile does not know it.
    merged = merge_profiles(profile, dataclasses.replace(profile, unmatched_compute_us={"_Send": 9.0}))
    assert merged.unmatched_compute_us == {"_Send": 9.0, "_Arg": 1.0, "Exp": 7.0}
    assert merged.traced_compute_us == pytest.approx(merged.profiled_compute_us + 17.0)
    assert merge_profiles(old, profile).unmatched_compute_us is None


def test_types_grappler_removed_from_the_fetch_are_measured_as_not_run():
    graph = tf.compat.v1.GraphDef()
    for name, op in [("a", "MatMul"), ("b", "MatMul"), ("i", "Identity"), ("n", "NoOp"), ("out", "Exp")]:
        graph.node.add(name=name, op=op)
    profile = CostProfile({"a": OpCost("a", "MatMul", 5.0, (4,))}, "f", ())
    got = with_types_not_run(profile, graph, {"a", "b", "i", "out"})
    # b's type was measured: it keeps its type's time at import; n is not in the fetch.
    assert sorted(got.ops) == ["a", "i", "out"]
    assert got.ops["i"] == OpCost("i", "Identity", 0.0, (), num_steps=0)
    assert with_types_not_run(profile, graph, None) is profile


def test_nanoseconds_win_over_microseconds():
    stats = step_stats_pb2.StepStats()
    dev = stats.dev_stats.add(device="/device:CPU:0")
    dev.node_stats.extend([_node("a", 3, nanos=2500)])
    profile = profile_from_step_stats([stats], GRAPH)
    assert profile.ops["a"].compute_us == 2.5


def test_no_trace_is_an_error():
    with pytest.raises(ProfileError, match="no traced step"):
        profile_from_step_stats([], GRAPH)


def test_merge_keeps_old_ops_and_takes_new_costs():
    old = profile_from_step_stats([_step(10, 100)], GRAPH)
    new = CostProfile(
        ops={"a": OpCost("a", "MatMul", 99.0, (1,))},
        graph_fingerprint="f",
        graph_nodes=(),
        traced_compute_us=100.0,
    )
    merged = merge_profiles(old, new)
    assert merged.ops["a"].compute_us == 99.0 and "b" in merged.ops and "g" in merged.ops
    assert merged.graph_fingerprint == "f"
    assert merged.num_traced_steps == 0  # new's fetch was placed without a traced step
    overhead = old.traced_compute_us - old.profiled_compute_us
    assert merged.traced_compute_us == pytest.approx(merged.profiled_compute_us + overhead)


# ------------------------------------------------------------------ files that are not profiles


class _Trap:
    """Unpickling this touches a file: proof that a loader ran code from the data."""

    def __init__(self, flag):
        self.flag = flag

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.flag),))


def _bad_files(tmp_path, good: bytes):
    flag = tmp_path / "unpickled"
    return flag, {
        "pickle": pickle.dumps({"graphdef": None, "cost_dict": {"a": _Trap(str(flag))}}),
        "pickle_protocol0": pickle.dumps({"a": 1}, protocol=0),
        "text": b"this is a text file\nnot a profile\n",
        "empty": b"",
        "truncated_half": good[: len(good) // 2],
        "truncated_before_end": good[: good.rindex(b"end") - 2],
        "truncated_one_byte": good[:-1],
        "graphdef": tf.compat.v1.GraphDef(node=[tf.compat.v1.NodeDef(name="a", op="NoOp")])
        .SerializeToString(),
    }


def test_files_that_are_not_profiles_are_refused(lstm, tmp_path):
    flag, files = _bad_files(tmp_path, profile_to_bytes(lstm.profile))
    for label, data in files.items():
        path = tmp_path / f"{label}.pkl"
        path.write_bytes(data)
        with pytest.raises(ProfileError, match=r"not a baechi_tf cost profile|truncated") as e:
            load_profile(path)
        assert str(path) in str(e.value), label
    assert not flag.exists()  # nothing was unpickled
    with pytest.raises(ProfileError, match="empty"):
        profile_from_bytes(b"")
    with pytest.raises(ProfileError, match="pickle, which is never loaded"):
        profile_from_bytes(files["pickle"])
    with pytest.raises(ProfileError, match="truncated"):
        profile_from_bytes(files["truncated_before_end"])


def test_the_same_model_at_another_size_is_another_graph():
    # The fingerprint covered names, types and inputs only: train.py took a profile of GNMT with
    # 512 units for one with 256, and placed by the wrong costs without a word.
    def model(units):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [4, units], name="x")
            w = tf.compat.v1.get_variable("w", [units, units])
            tf.matmul(x, w, name="y")
        return g.as_graph_def()

    small, large = model(8), model(16)
    assert [n.name for n in small.node] == [n.name for n in large.node]
    assert graph_fingerprint(small) != graph_fingerprint(large)
    profile = CostProfile({}, graph_fingerprint(small), graph_nodes(small))
    mismatch = compare_to_graph(profile, large)
    assert mismatch is not None and {"x", "w"} <= set(mismatch.changed) and not mismatch.missing_from_graph
    # Devices and TF's own attributes (colocation) are not part of it: a placed copy matches.
    placed = tf.compat.v1.GraphDef.FromString(small.SerializeToString())
    for node in placed.node:
        node.device = "/device:GPU:1"
        node.attr["_class"].list.s.append(b"loc:@w")
    assert compare_to_graph(profile, placed) is None


def test_missing_directory_and_future_format(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope.pb")
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(tmp_path)
    pb = cost_profile_pb2.CostProfile(magic="baechi_tf.CostProfile", format_version=9, end_marker="end")
    with pytest.raises(ProfileError, match="format 9"):
        profile_from_bytes(pb.SerializeToString())
    pb.format_version = 1  # digests of types and inputs only: a profile to take again
    with pytest.raises(ProfileError, match="profile format 1, this baechi_tf reads formats 2, 3, 4, 5 and 6; profile the graph again"):
        profile_from_bytes(pb.SerializeToString())
    pb.format_version = 2
    pb.ops.add(name="a", compute_us=-1.0)
    with pytest.raises(ProfileError, match="negative"):
        profile_from_bytes(pb.SerializeToString())


def test_generated_module_matches_the_proto_file():
    text = (ROOT / "baechi_tf" / "proto" / "cost_profile.proto").read_text()
    declared: dict[str, dict[str, int]] = {}
    for message, body in re.findall(r"message (\w+) \{(.*?)\n\}", text, re.S):
        declared[message] = {
            name: int(number)
            for name, number in re.findall(r"^\s+(?:repeated )?\w+ (\w+) = (\d+);", body, re.M)
        }
    generated = {
        name: {f.name: f.number for f in desc.fields}
        for name, desc in cost_profile_pb2.DESCRIPTOR.message_types_by_name.items()
    }
    assert declared == generated
    assert cost_profile_pb2.DESCRIPTOR.name == "baechi_tf/proto/cost_profile.proto"
    assert np.all([f.number < 15 for f in cost_profile_pb2.OpCost.DESCRIPTOR.fields])


def test_a_function_bodys_op_does_not_add_to_the_graphs_op_of_its_name():
    # The body of f has a 'MatMul' of 1024 x 1024 floats, as the graph has a 'MatMul' of 2 x 2:
    # traced under one name, the body's time and 4 MiB output went to the graph's op.
    tf1 = tf.compat.v1

    @tf.function
    def f(a):
        b = tf.tile(a, [512, 512])
        return tf.reduce_sum(tf.matmul(b, b))

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 2], name="x")
        total = f(tf.matmul(x, x, name="MatMul"))
    steps = []
    with tf1.Session(graph=g) as sess:
        for _ in range(3):
            rm = tf1.RunMetadata()
            sess.run(total, {x: np.ones([2, 2], np.float32)},
                     options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=rm)
            steps.append(rm.step_stats)
    traced_names = [ns.node_name for d in steps[0].dev_stats for ns in d.node_stats]
    assert traced_names.count("MatMul") == 2  # the graph's and the body's
    profile = profile_from_step_stats(steps, g.as_graph_def())
    matmul, call = profile.ops["MatMul"], next(c for n, c in profile.ops.items() if n != "MatMul")
    assert call.op_type in ("PartitionedCall", "StatefulPartitionedCall")
    assert matmul.output_bytes == (16,)  # 2 x 2 floats, not the body's 4 MiB
    assert matmul.compute_us < call.compute_us / 10


def test_outputs_fit_to_a_graph_def_as_to_its_graph():
    # `baechi place --run_metadata` has a GraphDef, not a tf.Graph: the outputs are counted from
    # the ops' definitions (lists, counts, a library function's signature), as TF counts them.
    import dataclasses

    from baechi_tf.cost_model.profiler import fit_outputs_to_graph

    tf1 = tf.compat.v1

    @tf.function
    def f(a):
        return a + 1.0, tf.reduce_sum(a)

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 6], name="x")
        parts = tf.split(x, 3, axis=1)
        ids = tf.unique(tf.cast(tf.reshape(x, [-1]), tf.int32))
        both = tf.identity_n([parts[0], parts[2], ids.idx])
        top = tf.nn.top_k(x, 2)
        total = tf.add_n([tf.reduce_sum(t) for t in (*tf.unstack(x), top.values, *f(both[0]))])
    with tf1.Session(graph=g) as sess:
        rm = tf1.RunMetadata()
        sess.run([total, both[2]], {x: np.ones([4, 6], np.float32)}, run_metadata=rm,
                 options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE))
    graph_def = g.as_graph_def()
    profile = profile_from_step_stats([rm.step_stats], graph_def)
    widened = dataclasses.replace(profile, ops={
        n: dataclasses.replace(c, output_bytes=c.output_bytes + (64,) * 3) for n, c in profile.ops.items()
    })
    by_graph, by_def = fit_outputs_to_graph(widened, g), fit_outputs_to_graph(widened, graph_def)
    assert by_def.ops == by_graph.ops
    outputs = {op.name: len(op.outputs) for op in g.get_operations()}
    assert all(len(c.output_bytes) <= outputs[n] for n, c in by_def.ops.items())
    assert len(by_def.ops[parts[0].op.name].output_bytes) == 3
    assert by_def.ops[both[0].op.name].temp_bytes >= 3 * 64


def _traced_views():
    """A traced step of a graph whose outputs reuse buffers: a variable's reads, views of a
    MatMul's output, element-wise ops TF runs in place, and a Split of a buffer."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
        v = tf.compat.v1.get_variable("v", [64, 64], initializer=tf.compat.v1.ones_initializer(),
                                      use_resource=True)
        mm = tf.matmul(x, v.read_value(), name="mm")
        view = tf.squeeze(tf.expand_dims(tf.reshape(tf.identity(mm, name="ident"), [-1], name="resh"), 0), name="sq")
        tanh = tf.tanh(view, name="tanh")  # its input's only reader: done in place
        parts = tf.split(tf.exp(x, name="exp"), 2, name="split")
        out = tf.add(tf.reduce_sum(tanh), tf.reduce_sum(parts[0] * parts[1]), name="out")
        init = tf.compat.v1.global_variables_initializer()
    stats = []
    with tf.compat.v1.Session(graph=g, config=profiling_config()) as sess:
        sess.run(init)
        for _ in range(2):
            metadata = tf.compat.v1.RunMetadata()
            sess.run(out, {x: np.ones((64, 64), np.float32)}, run_metadata=metadata,
                     options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
            stats.append(metadata.step_stats)
    return g.as_graph_def(), stats


def test_outputs_that_reuse_a_buffer_are_read_from_the_trace():
    graph_def, stats = _traced_views()
    profile = profile_from_step_stats(stats, graph_def)
    alias = {name: c.output_alias for name, c in profile.ops.items()}
    read = next(n for n, c in profile.ops.items() if c.op_type == "ReadVariableOp")
    assert alias[read] == (NO_BUFFER,)  # the variable's buffer
    for name in ("ident", "resh", "sq", "tanh"):
        assert alias[name] == (0,), name
    assert alias["split"] == (1, 1)  # input 0 is the axis
    # Each part is the half of exp's buffer its shape says (TF describes it by the whole buffer).
    assert profile.ops["exp"].output_bytes == (64 * 64 * 4,)
    assert profile.ops["split"].output_bytes == (32 * 64 * 4, 32 * 64 * 4)
    assert profile.ops["sq"].output_bytes == (64 * 64 * 4,)
    assert alias["mm"] == alias["exp"] == ()  # their own buffers
    # Format 4 keeps them; a format-3 file has none; a slot out of range is refused.
    again = profile_from_bytes(profile_to_bytes(profile))
    assert dict(again.ops) == dict(profile.ops)
    pb = cost_profile_pb2.CostProfile.FromString(profile_to_bytes(profile))
    assert pb.format_version == 6
    pb.format_version = 3
    for op in pb.ops:
        del op.output_alias[:]
    assert all(c.output_alias == () for c in profile_from_bytes(pb.SerializeToString()).ops.values())
    pb.ops[0].output_alias.extend([-3])
    with pytest.raises(ProfileError, match=f"gives op {pb.ops[0].name!r} output buffers \\[-3\\].*corrupt"):
        profile_from_bytes(pb.SerializeToString())


def test_an_output_reuses_a_buffer_only_if_it_did_in_every_step():
    graph_def, stats = _traced_views()
    first = stats[0]
    changed = step_stats_pb2.StepStats()
    changed.CopyFrom(stats[1])
    for dev in changed.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name == "tanh":  # not done in place in this step
                ns.output[0].tensor_description.allocation_description.ptr += 64
    profile = profile_from_step_stats([first, changed], graph_def)
    assert profile.ops["tanh"].output_alias == ()
    assert profile.ops["sq"].output_alias == (0,)


def _traced_in_place(second_reader_runs: bool):
    """A profile of a step in which 'twice' writes in place into 'exp', its input, which a second
    op reads too: 'never', which the fetch does not run, or 'tanh', which it runs."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
        e = tf.exp(x, name="exp")
        out = tf.reduce_sum(tf.multiply(e, 2.0, name="twice"), name="out")
        other = tf.reduce_sum(tf.tanh(e, name="tanh"), name="other")
        tf.zeros_like(e, name="never")  # as a loss's gradient has for an output not differentiated
    fetch = [out, other] if second_reader_runs else out
    with tf.compat.v1.Session(graph=g, config=profiling_config()) as sess:
        profile = profile_fetch(sess, fetch, {x: np.ones((64, 64), np.float32)}, warmup_steps=1, traced_steps=2)
    return profile


def test_an_in_place_write_counts_only_the_readers_the_step_runs():
    # 'never' does not run: 'twice' was the only holder of its input, and its output is that
    # buffer (before, 'never' counted as a reader and 'twice' was given a buffer of its own; on
    # devices of one memory the buffer then lived, in TF, on the device that allocated it).
    alone = _traced_in_place(second_reader_runs=False)
    assert "never" not in alone.ops
    assert alone.ops["twice"].output_alias == (0,)
    # 'tanh' runs and reads the input too: in place is not settled, whatever the trace showed.
    shared = _traced_in_place(second_reader_runs=True)
    assert shared.ops["twice"].output_alias == ()


def test_a_trace_without_addresses_falls_back_to_the_forwarding_types():
    assert output_buffers("Identity", {0: (0, 8)}, [(0, 8)], 0, 0) == {0: 0}
    assert output_buffers("IdentityN", {0: (0, 8), 1: (0, 4)}, [None, None], 0, 0) == {0: 0, 1: 1}
    assert output_buffers("ReadVariableOp", {0: (0, 8)}, [None], 0, 0) == {0: NO_BUFFER}
    assert output_buffers("Tanh", {0: (0, 8)}, [(0, 8)], 0, 0) == {0: OWN_BUFFER}
    # With addresses: a constant's value is in its persistent memory; an op that allocated
    # something may have put any output there.
    assert output_buffers("Const", {0: (7, 8)}, [], 0, 8) == {0: NO_BUFFER}
    assert output_buffers("Const", {0: (7, 8)}, [], 0, 4) == {0: OWN_BUFFER}
    assert output_buffers("Unique", {0: (7, 8), 1: (9, 8)}, [(5, 8)], 16, 0) == {0: OWN_BUFFER, 1: OWN_BUFFER}


def test_held_is_what_a_reader_freed_after_the_op_ended():
    from baechi_tf.cost_model.profiler import _held

    spans = {"r1": (6, 9), "r2": (14, 16), "other": (20, 21)}
    records = [
        (1, 200), (12, -200),  # the output's buffer, freed by its last reader: not held
        (1, 100), (9, -100),  # freed as r1 ended: held for r1
        (2, 50), (4, -50),  # freed before the op ended: scratch
        (2, 30), (20, -30),  # freed while no reader of the op ran: not counted here
        (3, 70), (15, -70),  # freed while r2 ran: held, and r2 is the later reader
        (3, 999),  # never freed in the step (a variable's new buffer)
    ]
    assert _held(records, (0, 5), [200], {"r1", "r2"}, spans) == (170, "r2")
    assert _held(records, (0, 5), [200], set(), spans) == (0, "")  # no reader: nothing held
    assert _held(records, None, [200], {"r1"}, spans) == (0, "")  # the op's own span unknown
    # Without the output in `own` (no op of the graph reads it: oneDNN's workspace slot), its
    # buffer is held too, for the reader that freed it.
    assert _held(records, (0, 5), [], {"r1", "r2", "r3"}, spans | {"r3": (11, 12)}) == (370, "r2")
