"""`baechi place`: GraphDef and MetaGraphDef, binary and text; every bad input ends in exit 2."""

import hashlib
import logging
import os
import pathlib
import pickle
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from google.protobuf import text_format

from baechi_tf.cli import main
from baechi_tf.cost_model import save_profile
from tf_models import profiled_lstm

pytestmark = pytest.mark.tf

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    lstm = profiled_lstm()
    d = tmp_path_factory.mktemp("cli")
    paths = {
        "pb": d / "graph.pb",
        "pbtxt": d / "graph.pbtxt",
        "meta": d / "model.meta",
        "cost": d / "cost.pb",
    }
    paths["pb"].write_bytes(lstm.graph_def.SerializeToString())
    paths["pbtxt"].write_text(text_format.MessageToString(lstm.graph_def))
    with lstm.model.graph.as_default():
        meta = tf.compat.v1.train.export_meta_graph(graph=lstm.model.graph)
    paths["meta"].write_bytes(meta.SerializeToString())
    save_profile(lstm.profile, paths["cost"])
    return lstm, paths


def _digest(*paths):
    return {str(p): hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest() for p in paths}


def _devices_only(a, b):
    a, b = type(a).FromString(a.SerializeToString()), type(b).FromString(b.SerializeToString())
    for graph in (a, b):
        for node in graph.node:
            node.device = ""
    return a == b


def place(*args):
    return main(["place", *map(str, args)])


def test_a_placer_memory_fraction_out_of_range_names_the_flag(tmp_path, capsys):
    # It said 'memory fraction 3.0 must be in (0, 1]', naming no flag of the command.
    out = tmp_path / "placed.pb"
    assert place("--graph", tmp_path / "g.pb", "--cost_path", tmp_path / "c.pb", "--out", out,
                 "--placer_memory_fraction", "3") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["baechi place: error: --placer_memory_fraction=3 must be in (0, 1]: the share of "
                   "each device's memory the placer may fill (1 fills it all)"], err
    assert not out.exists()


def test_places_a_binary_graphdef(files, tmp_path, capsys):
    lstm, p = files
    out = tmp_path / "placed.pb"
    before = _digest(p["pb"], p["cost"])
    assert place("--graph", p["pb"], "--cost_path", p["cost"], "--num_devices", 4,
                 "--placement_method", "m_etf", "--out", out) == 0
    printed = capsys.readouterr().out
    assert "makespan (simulated)" in printed and "profile covers" in printed
    assert f"placed GraphDef written to {out}" in printed
    assert _digest(p["pb"], p["cost"]) == before
    placed = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert _devices_only(placed, lstm.graph_def)
    assert {n.device for n in placed.node} <= {f"/device:GPU:{i}" for i in range(4)}
    assert len({n.device for n in placed.node}) >= 2


def test_the_inter_host_line_without_a_cluster_is_said_to_be_unused(files, tmp_path, caplog, monkeypatch):
    # It was dropped without a word (train.py says so).
    _, p = files
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with caplog.at_level(logging.WARNING, logger="baechi_tf.rewriter.cli_place"):
        assert place("--graph", p["pb"], "--cost_path", p["cost"], "--placement_method", "single",
                     "--inter_host_comm_cost_coeffs", "0.001,500", "--out", tmp_path / "placed.pb") == 0
    assert [r.getMessage() for r in caplog.records if r.name == "baechi_tf.rewriter.cli_place"] == [
        "--inter_host_comm_cost_coeffs is not used: every device is on this host (give "
        "--cluster_spec, or TF_CONFIG, to place across hosts)"]


def test_places_text_and_meta_graphs(files, tmp_path, capsys):
    lstm, p = files
    out = tmp_path / "placed.pbtxt"
    assert place("--graph", p["pbtxt"], "--cost_path", p["cost"], "--num_devices", 2,
                 "--device_type", "CPU", "--placement_method", "m_topo", "--out", out) == 0
    placed = text_format.Parse(out.read_text(), tf.compat.v1.GraphDef())
    assert _devices_only(placed, lstm.graph_def)
    assert {n.device for n in placed.node} <= {"/device:CPU:1", "/device:CPU:2"}

    out = tmp_path / "placed.meta"
    assert place("--graph", p["meta"], "--cost_path", p["cost"], "--placement_method", "m_etf",
                 "--out", out) == 0
    assert "placed MetaGraphDef" in capsys.readouterr().out
    meta_in = tf.compat.v1.MetaGraphDef.FromString(p["meta"].read_bytes())
    meta_out = tf.compat.v1.MetaGraphDef.FromString(out.read_bytes())
    assert _devices_only(meta_out.graph_def, meta_in.graph_def)
    assert meta_out.meta_info_def == meta_in.meta_info_def
    assert meta_out.collection_def == meta_in.collection_def
    assert any(n.device for n in meta_out.graph_def.node)


@pytest.mark.parametrize("name, text", [
    ("placed.pbtxt", True), ("placed.pbtext", True), ("placed.txt", True),
    ("placed.PBTXT", True), ("placed.PbText", True), ("placed.TXT", True),  # were written binary
    ("placed.pb", False), ("placed.PB", False), ("placed.txt.pb", False),
])
def test_the_out_suffix_says_text_or_binary_in_any_case(files, tmp_path, name, text):
    lstm, p = files
    out = tmp_path / name
    assert place("--graph", p["pb"], "--cost_path", p["cost"], "--placement_method", "single",
                 "--out", out) == 0
    if text:
        placed = text_format.Parse(out.read_text(), tf.compat.v1.GraphDef())
    else:
        placed = tf.compat.v1.GraphDef.FromString(out.read_bytes())
        assert not out.read_bytes().isascii()
    assert _devices_only(placed, lstm.graph_def)


def test_the_out_help_lists_every_text_suffix(capsys):
    with pytest.raises(SystemExit):
        main(["place", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "text when the name ends in .pbtxt, .pbtext or .txt, in any case; else binary" in help_text


def test_a_placed_graph_placed_again_says_its_pins_placed_it_and_replace_devices_places_it(
        files, tmp_path, capsys, caplog):
    # Every op carried a device, so each counted as pinned: the summary said "method single"
    # over the old layout, with no warning.
    lstm, p = files
    first, again, anew = tmp_path / "placed.pb", tmp_path / "again.pb", tmp_path / "anew.pb"
    with caplog.at_level(logging.WARNING, logger="baechi_tf"):
        assert place("--graph", p["pb"], "--cost_path", p["cost"], "--placement_method", "m_topo",
                     "--out", first) == 0
        assert "pinned to a device by the graph" not in caplog.text
        assert re.search(r"^method +m_topo$", capsys.readouterr().out, re.M)
        assert place("--graph", first, "--cost_path", p["cost"], "--placement_method", "single",
                     "--out", again) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^method +none: every op pinned by the graph$", printed, re.M), printed
    assert (f"every op is pinned to a device by the graph ({len(lstm.graph_def.node)} ops: a graph "
            "placed before?), so placement method 'single' placed none and the placement is the "
            "graph's own; to place them again, clear the graph's device fields (baechi place "
            "--replace_devices)") in caplog.text
    placed = tf.compat.v1.GraphDef.FromString(first.read_bytes())
    assert tf.compat.v1.GraphDef.FromString(again.read_bytes()) == placed
    assert len({n.device for n in placed.node}) >= 2

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="baechi_tf"):
        assert place("--graph", first, "--cost_path", p["cost"], "--placement_method", "single",
                     "--replace_devices", "--out", anew) == 0
    assert "pinned to a device by the graph" not in caplog.text
    assert re.search(r"^method +single$", capsys.readouterr().out, re.M)
    placed_anew = tf.compat.v1.GraphDef.FromString(anew.read_bytes())
    assert _devices_only(placed_anew, lstm.graph_def)
    assert len({n.device for n in placed_anew.node}) == 1


class _Trap:
    def __init__(self, flag):
        self.flag = flag

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.flag),))


def _expect_refusal(capsys, args, out, inputs, pattern):
    before = _digest(*inputs)
    assert place(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("baechi place: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert pattern in err, err
    assert not out.exists()
    assert _digest(*inputs) == before
    assert [f for f in os.listdir(out.parent) if f.startswith(".tmp-")] == []


def test_profiles_that_are_not_profiles(files, tmp_path, capsys):
    lstm, p = files
    good = p["cost"].read_bytes()
    flag = tmp_path / "unpickled"
    bad = {
        "pickle": pickle.dumps({"graphdef": lstm.graph_def.SerializeToString(),
                                "cost_dict": {"x": _Trap(str(flag))}}),
        "text": b"loss 12.5 us\nMatMul 3 us\n",
        "truncated": good[: len(good) * 2 // 3],
        "empty": b"",
    }
    out = tmp_path / "placed.pb"
    for label, data in bad.items():
        cost = tmp_path / f"{label}.pkl"
        cost.write_bytes(data)
        _expect_refusal(
            capsys, ["--graph", p["pb"], "--cost_path", cost, "--out", out], out,
            [p["pb"], cost], "cost profile",
        )
    assert not flag.exists()


def test_profile_of_another_graph(files, tmp_path, capsys):
    lstm, p = files
    other = tf.compat.v1.GraphDef()
    other.CopyFrom(lstm.graph_def)
    other.node.add(name="extra_op", op="NoOp")
    graph = tmp_path / "other.pb"
    graph.write_bytes(other.SerializeToString())
    out = tmp_path / "placed.pb"
    args = ["--graph", graph, "--cost_path", p["cost"], "--out", out, "--placement_method", "m_topo"]
    _expect_refusal(capsys, args, out, [graph, p["cost"]], "--allow_profile_mismatch")
    assert place(*args, "--allow_profile_mismatch") == 0
    printed = capsys.readouterr().out
    assert "profile mismatch (allowed): 1 graph ops not in the profiled graph ('extra_op')" in printed
    assert out.exists()


def test_graphs_that_do_not_parse(files, tmp_path, capsys):
    _, p = files
    out = tmp_path / "placed.pb"
    for label, data in {
        "garbage": bytes(range(256)) * 4,
        "text": b"node { name: 'a' op: \n",
        "empty": b"",
    }.items():
        graph = tmp_path / f"{label}.pb"
        graph.write_bytes(data)
        _expect_refusal(capsys, ["--graph", graph, "--cost_path", p["cost"], "--out", out], out,
                        [graph, p["cost"]], "graph")
    _expect_refusal(capsys, ["--graph", tmp_path / "missing.pb", "--cost_path", p["cost"],
                             "--out", out], out, [p["cost"]], "does not exist")
    _expect_refusal(capsys, ["--graph", p["pb"], "--cost_path", p["cost"], "--out", p["pb"]],
                    p["pb"].parent / "never.pb", [p["pb"], p["cost"]], "overwrite an input")
    _expect_refusal(capsys, ["--graph", p["pb"], "--cost_path", p["cost"], "--out", out,
                             "--memory_per_device", "lots"], out, [p["pb"]], "memory size")


def test_a_saved_model_is_refused_with_how_to_take_its_meta_graph(files, tmp_path, capsys):
    # It was 'neither a GraphDef nor a MetaGraphDef'; it holds MetaGraphDefs.
    import tensorflow as tf

    class Scale(tf.Module):
        def __init__(self):
            self.v = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
        def __call__(self, x):
            return x * self.v

    tf.saved_model.save(Scale(), str(tmp_path / "model"))
    graph, out = tmp_path / "model" / "saved_model.pb", tmp_path / "placed.pb"
    _expect_refusal(capsys, ["--graph", graph, "--cost_path", files[1]["cost"], "--out", out], out,
                    [graph], "is a SavedModel, which holds one or more MetaGraphDefs: write the one to place")


def test_exit_status_of_the_real_command(files, tmp_path):
    cost = tmp_path / "cost.pkl"
    cost.write_bytes(pickle.dumps({"cost_dict": {}}))
    graph = tmp_path / "g.pb"
    graph.write_bytes(b"\n\x05\n\x01a\x12\x00")
    out = tmp_path / "placed.pb"
    done = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place", "--graph", str(graph), "--cost_path",
         str(cost), "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("baechi place: error: cost profile")
    assert "Traceback" not in done.stderr and "pickle" in done.stderr
    assert not out.exists()
    # A graph that does not parse is refused before TensorFlow loads: one line, exit 2.
    cost.write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user's
    done = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place", "--graph", str(cost), "--cost_path",
         str(files[1]["cost"]), "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env=env,
    )
    assert done.returncode == 2
    assert done.stderr == f"baechi place: error: graph {str(cost)!r} is empty; give a GraphDef or MetaGraphDef\n"
    # One that does not fit is found after TensorFlow loaded: still the one line (TensorFlow's
    # C++ start-up lines came first).
    done = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place", "--graph", str(files[1]["pb"]), "--cost_path",
         str(files[1]["cost"]), "--out", str(out), "--num_devices", "2", "--device_type", "CPU",
         "--memory_per_device", "100"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env=env,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("baechi place: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "cannot run on any device" in done.stderr, done.stderr
    assert not out.exists()


def test_report_dir(files, tmp_path, capsys):
    lstm, p = files
    reports = tmp_path / "reports"
    assert place("--graph", p["pb"], "--cost_path", p["cost"], "--num_devices", 2,
                 "--placement_method", "m_topo", "--out", tmp_path / "placed.pb",
                 "--report_dir", reports) == 0
    made = {x.name for x in reports.iterdir()}
    assert {"gantt.png", "trace.json", "summary.json", "graph.pbtxt"} <= made
    import json

    summary = json.loads((reports / "summary.json").read_text())
    assert summary["makespan_us"] > 0 and summary["lower_bound_us"] > 0
    # The profile's coverage: the traced time no op accounts for, by node type (_Arg, _Retval...).
    profile = summary["profile"]
    assert profile["num_graph_ops"] == len(lstm.graph_def.node) and 0.9 < profile["compute_share"] <= 1
    assert profile["unmatched_compute_us"] and all(us >= 0 for us in profile["unmatched_compute_us"].values())


def test_outputs_and_flags_that_would_cost_the_work_are_refused_first(files, tmp_path, capsys):
    # A --report_dir that is a file ended in a traceback after the placement, with --out written;
    # a timeout of -1 or nan s was taken ("cannot reach ... within nan s").
    lstm, p = files
    a_file, out = tmp_path / "a_file", tmp_path / "placed.pb"
    a_file.write_text("kept")
    assert place("--graph", p["pb"], "--cost_path", p["cost"], "--out", out, "--report_dir", a_file) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"baechi place: error: --report_dir {str(a_file)!r} is a file, not a folder; give a folder "
        "(it is created if missing)"
    ]
    assert not out.exists() and a_file.read_text() == "kept"
    # The same new path for both, or the reports inside --out: found once --out was written.
    for reports in (out, out / "reports"):
        assert place("--graph", p["pb"], "--cost_path", p["cost"], "--out", out, "--report_dir", reports) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"baechi place: error: --report_dir {str(reports)!r} "
            + ("and --out {!r} name the same path; give --report_dir a folder of its own" if reports == out else
               "is inside --out {!r}, which is written as a file; give --report_dir a folder elsewhere").format(str(out))
        ]
        assert sorted(os.listdir(tmp_path)) == ["a_file"]
    for timeout in ("-1", "nan"):
        assert place("--graph", p["pb"], "--cost_path", p["cost"], "--out", out,
                     "--cluster_spec", '{"worker": ["localhost:1"]}', "--cluster_timeout", timeout) == 2
        assert capsys.readouterr().err.strip() == (
            f"baechi place: error: cluster timeout {float(timeout)!r}: give a positive number of seconds "
            "(--cluster_timeout, BaechiSession's connect_timeout_s=)"
        )
    assert place("--graph", p["pb"], "--cost_path", p["cost"], "--out", out, "--cluster_spec", "[1, 2]") == 2
    assert "cannot read" not in capsys.readouterr().err  # JSON, not a file name


def test_a_missing_graph_is_reported_before_tensorflow_loads(files, tmp_path):
    # TensorFlow's start-up lines came before the error, some seconds in.
    done = subprocess.run(
        [sys.executable, "-m", "baechi_tf", "place", "--graph", str(tmp_path / "nope.pb"), "--cost_path",
         str(files[1]["cost"]), "--out", str(tmp_path / "placed.pb")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == f"baechi place: error: graph {str(tmp_path / 'nope.pb')!r} does not exist\n"


def test_places_with_the_run_metadata_of_traced_steps(files, tmp_path, capsys):
    # The graph and the RunMetadata of traced runs, as a user of a plain Session has them: no way
    # in before but a profile written from Python.
    from baechi_tf.cost_model import profiling_config

    lstm, p = files
    model = lstm.model
    paths = []
    with tf.compat.v1.Session(graph=model.graph, config=profiling_config()) as sess:
        sess.run(model.init)
        for i in range(2):
            metadata = tf.compat.v1.RunMetadata()
            sess.run([model.loss, model.train_op], model.feed(),
                     options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                     run_metadata=metadata)
            paths.append(tmp_path / f"step{i}.pb")
            paths[-1].write_bytes(metadata.SerializeToString())
    before = _digest(p["pb"], *paths)
    out = tmp_path / "placed.pb"
    assert place("--graph", p["pb"], "--run_metadata", *paths, "--num_devices", 2, "--device_type", "CPU",
                 "--placement_method", "m_etf", "--out", out) == 0
    printed = capsys.readouterr().out
    assert f"placed GraphDef written to {out}" in printed
    placed = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert _devices_only(placed, lstm.graph_def)
    assert all(n.device for n in placed.node)
    assert _digest(p["pb"], *paths) == before
    # The same placement as from the profile those steps make (the steps' median).
    out2 = tmp_path / "placed2.pb"
    from baechi_tf.cost_model.profiler import profile_from_step_stats

    profile = profile_from_step_stats(
        [tf.compat.v1.RunMetadata.FromString(x.read_bytes()).step_stats for x in paths], lstm.graph_def
    )
    save_profile(profile, tmp_path / "cost.pb")
    assert place("--graph", p["pb"], "--cost_path", tmp_path / "cost.pb", "--num_devices", 2,
                 "--device_type", "CPU", "--placement_method", "m_etf", "--out", out2) == 0
    capsys.readouterr()
    assert out2.read_bytes() == out.read_bytes()
    # In text format, as train.py --logdir writes them (run_metadata-*.pbtxt): refused before.
    from google.protobuf import text_format

    texts = []
    for i, path in enumerate(paths):
        texts.append(tmp_path / f"run_metadata-{i}.pbtxt")
        texts[-1].write_text(text_format.MessageToString(tf.compat.v1.RunMetadata.FromString(path.read_bytes())))
    out3 = tmp_path / "placed3.pb"
    assert place("--graph", p["pb"], "--run_metadata", *texts, "--num_devices", 2, "--device_type", "CPU",
                 "--placement_method", "m_etf", "--out", out3) == 0
    capsys.readouterr()
    assert out3.read_bytes() == out.read_bytes()


_TRACE_A_POOL = """
import sys
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
g = tf.Graph()
with g.as_default():
    x = v1.placeholder(tf.float32, [2, 8, 8, 3], name="x")
    w = v1.Variable(tf.ones([3, 3, 3, 4]) * 0.1, name="w")
    loss = tf.reduce_sum(tf.nn.max_pool2d(tf.nn.conv2d(x, w, 1, "SAME"), 2, 2, "VALID"), name="loss")
    train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    init = v1.global_variables_initializer()
with v1.Session(graph=g) as sess:
    sess.run(init)
    metadata = v1.RunMetadata()
    sess.run(train, {x: np.ones([2, 8, 8, 3], np.float32)}, run_metadata=metadata,
             options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE))
open(sys.argv[1], "wb").write(g.as_graph_def().SerializeToString())
open(sys.argv[2], "wb").write(metadata.SerializeToString())
"""


def test_run_metadata_of_a_training_max_pool_with_onednn(tmp_path, capsys):
    # oneDNN's training MaxPool traces a workspace, an output slot the graph does not declare:
    # the profile of those steps gave 'MaxPool2d' 2 outputs where the graph has 1, and place
    # refused the graph ('profile this graph again', which gave the same). profile_fetch (the
    # BaechiSession's and train.py's way) already counted it as temporary memory.
    graph, trace = tmp_path / "graph.pb", tmp_path / "step.pb"
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", _TRACE_A_POOL, graph, trace], check=True, env=env, timeout=120)
    metadata = tf.compat.v1.RunMetadata.FromString(trace.read_bytes())
    slots = [o.slot for d in metadata.step_stats.dev_stats for n in d.node_stats
             if n.node_name == "MaxPool2d" for o in n.output]
    assert 1 in slots  # the workspace, traced as the pool's second output
    out = tmp_path / "placed.pb"
    assert place("--graph", graph, "--run_metadata", trace, "--num_devices", 2, "--device_type", "CPU",
                 "--placement_method", "m_etf", "--out", out) == 0
    assert "placed GraphDef written" in capsys.readouterr().out
    given = tf.compat.v1.GraphDef.FromString(graph.read_bytes())
    assert _devices_only(tf.compat.v1.GraphDef.FromString(out.read_bytes()), given)


def test_a_max_pool_workspace_is_held_until_its_gradient_has_run(tmp_path):
    # oneDNN's workspace (the pool's traced second output) stays allocated past the pool's end
    # until its gradient, which reads it in the partitioned graph, is done; it had been counted
    # as the pool's scratch, freed at its end, and the simulated peak of a device holding max
    # pools came out that much under the measured one (Inception-v3, ResNet50).
    from baechi_tf.cluster import Cluster
    from baechi_tf.cost_model import load_profile, profile_from_step_stats, save_profile
    from baechi_tf.cost_model.profiler import fit_outputs_to_graph
    from baechi_tf.placer.memory_timeline import memory_blocks
    from baechi_tf.placer.pipeline import PlacementOptions, place as place_graph
    from baechi_tf.rewriter.importer import import_graph_def

    graph, trace = tmp_path / "graph.pb", tmp_path / "step.pb"
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", _TRACE_A_POOL, graph, trace], check=True, env=env, timeout=120)
    graph_def = tf.compat.v1.GraphDef.FromString(graph.read_bytes())
    stats = tf.compat.v1.RunMetadata.FromString(trace.read_bytes()).step_stats
    traced = {n.node_name: n for d in stats.dev_stats for n in d.node_stats}
    workspace = next(o.tensor_description.allocation_description.allocated_bytes
                     for o in traced["MaxPool2d"].output if o.slot == 1)
    grad = next(n.name for n in graph_def.node if n.op == "MaxPoolGrad")
    profile = fit_outputs_to_graph(profile_from_step_stats([stats], graph_def), graph_def)
    pool = profile.ops["MaxPool2d"]
    assert (pool.held_bytes, pool.held_until, pool.temp_bytes) == (workspace, grad, 0)
    save_profile(profile, tmp_path / "p.profile")
    assert load_profile(tmp_path / "p.profile").ops["MaxPool2d"] == pool  # format 5 keeps it
    # The importer gives the pool one more output of those bytes, read by the gradient alone.
    op_graph = import_graph_def(graph_def, profile, Cluster.homogeneous(1, 1 << 30)).graph
    i, g = op_graph.index["MaxPool2d"], op_graph.index[grad]
    assert op_graph.output_bytes[i][-1] == workspace
    held_slot = len(op_graph.output_bytes[i]) - 1
    readers = {int(d) for s, d, o in zip(op_graph.edge_src, op_graph.edge_dst, op_graph.edge_src_output)
               if s == i and o == held_slot}
    assert readers == {g}
    # The model holds it from the pool's start until the gradient's end.
    result = place_graph(op_graph, Cluster.homogeneous(1, 1 << 30), PlacementOptions(placement_method="single"))
    blocks = memory_blocks(op_graph, result.schedule)
    held = [(a, f) for k, o, s, a, f in zip(blocks.kind, blocks.op.tolist(), blocks.slot.tolist(),
                                            blocks.alloc_us.tolist(), blocks.free_us.tolist())
            if o == i and s == held_slot]
    assert held == [(result.schedule.start_us[i], result.schedule.end_us[g])]


def test_run_metadata_that_is_not_of_the_graph_is_refused(files, tmp_path, capsys, caplog):
    import logging

    lstm, p = files
    out = tmp_path / "placed.pb"
    # Not a RunMetadata.
    assert place("--graph", p["pb"], "--run_metadata", p["cost"], "--out", out) == 2
    assert capsys.readouterr().err.strip() == (
        f"baechi place: error: run metadata {str(p['cost'])!r} is not a RunMetadata with step "
        "statistics; trace a step with RunOptions(trace_level=FULL_TRACE) and write its "
        "run_metadata with SerializeToString() or in text format"
    )
    # Of another graph.
    g = tf.Graph()
    with g.as_default():
        y = tf.reduce_sum(tf.square(tf.ones([8, 8]), name="other_square"), name="other_sum")
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(y, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
    other = tmp_path / "other.pb"
    other.write_bytes(metadata.SerializeToString())
    assert place("--graph", p["pb"], "--run_metadata", other, "--out", out) == 2
    assert "none of the ops traced in" in capsys.readouterr().err
    # Of another graph with an op name in common ('Square'): names are all a trace can be matched
    # by (TF's kernels may have other type names), so it is placed, with a warning.
    with g.as_default():
        z = tf.square(tf.ones([4]), name="Square")
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(z, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
    other.write_bytes(metadata.SerializeToString())
    with caplog.at_level(logging.WARNING, logger="baechi_tf.rewriter.cli_place"):
        assert place("--graph", p["pb"], "--run_metadata", other, "--out", out) == 0
    assert [r.getMessage() for r in caplog.records if "traces hold" in r.getMessage()] == [
        f"the traces hold 1 of the graph's {len(lstm.graph_def.node)} ops: are they traces of this "
        "graph? The ops they lack are placed by estimated costs"
    ]
    # And estimated they are: such traces do not say which ops a step of this graph leaves out.
    from baechi_tf.cost_model import unrun_ops
    from baechi_tf.rewriter.cli_place import profile_from_run_metadata

    profile = profile_from_run_metadata([str(other)], [other.read_bytes()], lstm.graph_def)
    assert profile.num_traced_steps == 0 and unrun_ops(profile, lstm.graph_def) == frozenset()
    out.unlink()
    capsys.readouterr()
    # A missing file, before TensorFlow is needed; and a profile and traces at once.
    assert place("--graph", p["pb"], "--run_metadata", tmp_path / "nope.pb", "--out", out) == 2
    assert capsys.readouterr().err.strip().endswith(f"run metadata {str(tmp_path / 'nope.pb')!r} does not exist")
    with pytest.raises(SystemExit) as e:
        place("--graph", p["pb"], "--run_metadata", other, "--cost_path", p["cost"], "--out", out)
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not out.exists()


def test_auto_comm_fits_the_link_between_two_stand_ins_before_placing(files, tmp_path, capsys):
    _, p = files
    out = tmp_path / "placed.pb"
    assert place("--graph", p["pb"], "--cost_path", p["cost"], "--num_devices", 2, "--device_type", "CPU",
                 "--comm_cost_coeffs", "auto", "--placement_method", "m_etf", "--out", out) == 0
    printed = capsys.readouterr().out
    fitted = re.search(r"link fitted \(--comm_cost_coeffs=auto\): (\S+) us/B x \+ (\S+) us, "
                       r"/device:CPU:1 -> /device:CPU:2, 20 sizes, .*CPU stand-ins in one process", printed)
    assert fitted, printed
    slope, intercept = float(fitted.group(1)), float(fitted.group(2))
    # A hand-over of the sender's buffer: far below the default line (134 us, 5.7 GB/s).
    assert 0 <= slope < 1.754e-4 and 0 <= intercept < 134
    link = re.search(r"^link\s+(\S+) us/B x \+ (\S+) us$", printed, re.M)  # the summary's
    assert link and float(link.group(1)) == pytest.approx(slope, rel=1e-3), printed
    assert float(link.group(2)) == pytest.approx(intercept, rel=1e-3)
    assert out.exists()


def test_auto_comm_without_the_gpus_to_time_names_the_fix(files, tmp_path, capsys):
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has GPUs: auto times them")
    _, p = files
    out = tmp_path / "placed.pb"
    assert place("--graph", p["pb"], "--cost_path", p["cost"], "--num_devices", 2, "--device_type", "GPU",
                 "--comm_cost_coeffs", "auto", "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("baechi place: error: --comm_cost_coeffs=auto times copies between the devices "
                   "placed on, and this machine has 0 GPU(s): run it on the machine with the GPUs, or "
                   "give the line as SLOPE,INTERCEPT (utils/communication_benchmark.py prints it "
                   "there), or place on CPU stand-ins (--device_type=CPU)"), err
    assert not out.exists()
