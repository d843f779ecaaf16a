"""bench/fidelity_time.py: its layouts, trace reading and figures, and one real run of it on two
single-core worker tasks (tf.distribute.Server processes on loopback ports)."""

import io
import json
import os
import re
import statistics
import sys

import pytest
import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import fidelity_time as ft  # noqa: E402
from tf_models import build_lstm  # noqa: E402

pytestmark = pytest.mark.tf

D0, D1 = "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"


def _chain_graph_def(length: int = 6):
    """x -> op0 -> op1 -> ... -> op{length-1}, and a control edge op0 -> op{length-1}."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [], name="x")
        y, first = x, None
        for i in range(length):
            deps = [first] if i == length - 1 else []
            with tf.control_dependencies(deps):
                y = tf.identity(y, name=f"op{i}")
            first = first if first is not None else y.op
    return g.as_graph_def()


def _timed(graph_def, layout=None):
    return ft.TimedGraph("chain", graph_def, ("op5",), (), {}, layout)


def test_topological_names_follow_data_and_control_edges():
    order = ft._topo_names(_chain_graph_def())
    assert order == ["x", "op0", "op1", "op2", "op3", "op4", "op5"]


def test_fixed_layouts_have_the_shapes_they_are_named_for():
    graph = _timed(_chain_graph_def())
    order = ["x", "op0", "op1", "op2", "op3", "op4", "op5"]
    halves = ft.fixed_layout("halves", graph, [D0, D1])
    assert [halves[n] for n in order] == [D0, D0, D0, D1, D1, D1, D1]
    alternate = ft.fixed_layout("alternate", graph, [D0, D1])
    assert [alternate[n] for n in order] == [D0, D1, D0, D1, D0, D1, D0]
    blocks = ft.fixed_layout("blocks", graph, [D0, D1])
    assert set(blocks) == set(order) and set(blocks.values()) <= {D0, D1}
    assert blocks == ft.fixed_layout("blocks", graph, [D0, D1])  # seeded by the graph's name
    assert ft.fixed_layout("expert", graph, [D0, D1]) is None  # the graph has no layout
    own = _timed(graph.graph_def, layout=lambda devices: {"op0": devices[1]})
    assert ft.fixed_layout("expert", own, [D0, D1]) == {"op0": D1}
    with pytest.raises(ValueError, match="unknown layout 'diagonal'"):
        ft.fixed_layout("diagonal", graph, [D0, D1])


def test_union_of_windows_counts_overlaps_once():
    assert ft._union_us([]) == 0.0
    assert ft._union_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20.0


def test_spearman_ranks_with_ties_averaged():
    assert ft.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert ft.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert ft.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.866025, rel=1e-5)
    assert ft.spearman([1], [2]) != ft.spearman([1], [2])  # nan: one point ranks nothing


def test_a_trace_is_read_into_ops_per_device_and_copies_between_tasks():
    stats = step_stats_pb2.StepStats()
    dev0 = stats.dev_stats.add(device=D0)
    dev0.node_stats.add(node_name="op0", all_start_nanos=1_000_000, all_end_rel_nanos=5_000,
                        op_end_rel_nanos=4_000)
    dev0.node_stats.add(node_name="_SOURCE", all_start_nanos=900_000, all_end_rel_nanos=100)
    dev1 = stats.dev_stats.add(device=D1)
    dev1.node_stats.add(node_name="op1", all_start_nanos=1_300_000, all_end_rel_nanos=2_000,
                        op_end_rel_nanos=2_000)
    dev1.node_stats.add(
        node_name="RecvTensor", all_start_micros=1_001, all_end_rel_micros=250,
        timeline_label=f"[4000B] [128.0Mb/s] edge_7_op0 from {D0} to {D1}")
    trace = ft.read_trace(stats, {"op0": 0, "op1": 1})
    assert trace["ops"] == {D0: {"op0": (1000.0, 1005.0, 4.0)}, D1: {"op1": (1300.0, 1302.0, 2.0)}}
    assert trace["copies"] == [("op0", D0, D1, 4000, 1001.0, 1251.0)]


def _row(method, sim_ms, times_ms, graph="g"):
    return ft.Measured(graph, method, method, sim_ms, times_s=[t / 1e3 for t in times_ms])


def test_figures_per_graph_and_against_the_targets():
    rows = [_row("single", 10.0, [10.0, 11.0, 12.0]), _row("auto", 5.0, [11.3, 11.4, 11.5]),
            _row("alternate", 40.0, [30.0, 31.0, 29.0])]
    out = io.StringIO()
    figures = ft.print_graph(rows, out)
    assert figures["spearman"] == pytest.approx(0.5)
    assert figures["auto_ratio"] == pytest.approx(11.4 / 11.0) and figures["auto_ok"] is True
    text = out.getvalue()
    assert re.search(r"^g +alternate +alternate +40\.00 +30\.00 +\+33\.3% +3%$", text, re.M), text
    assert "auto (auto) 11.40 ms, fastest single 11.00 ms: x1.036 ok" in text
    summary = io.StringIO()
    met = ft.print_summary(rows, {"g": figures}, summary)
    errors = [abs(r.error) for r in rows]
    assert f"median |simulated / measured - 1|: {100 * statistics.median(errors):.1f}%" in summary.getvalue()
    assert met is False  # Spearman 0.5 < 0.9
    assert "Spearman per graph: g 0.500 (target >= 0.9) NOT met" in summary.getvalue()
    no_auto = ft.print_graph(rows[:1] + rows[2:], io.StringIO())
    assert no_auto["auto_ok"] is None
    # auto chose single's placement: the two rows are one candidate, their steps pooled.
    same = [_row("single", 10.0, [10.0, 10.2]), _row("auto", 10.0, [10.9, 11.0]),
            _row("halves", 20.0, [10.7, 10.8])]
    same[1].same_as = "single"
    out = io.StringIO()
    pooled = ft.print_graph(same, out)
    assert pooled["auto_ratio"] == pytest.approx(1.0) and pooled["auto_ok"] is True
    assert "auto (auto, = single) 10.55 ms, fastest single 10.55 ms: x1.000 ok" in out.getvalue()


@pytest.mark.distributed
def test_the_step_time_half_runs_on_two_single_core_tasks(tmp_path):
    lstm = build_lstm()
    feeds = {t.name: v for t, v in lstm.feed(0).items()}
    graph = ft.TimedGraph("lstm", lstm.graph.as_graph_def(), (lstm.train_op.name,),
                          (lstm.init.name,), feeds)
    options = ft.TimeOptions(rounds=2, steps=1, warmup=1, traced_steps=2, link_exponent=3,
                             link_runs=2, refine_seconds=0, diagnose=True, save=str(tmp_path))
    out = io.StringIO()
    rows, per_graph, _ = ft.run([graph], ["single", "alternate", "expert", "auto"], options,
                                out=out, log=lambda text: None)
    text = out.getvalue()
    assert [r.method for r in rows] == ["single", "alternate", "auto"]  # no layout of its own
    assert all(len(r.times_s) == 2 and r.sim_ms > 0 for r in rows)
    single, alternate = rows[0], rows[1]
    assert set(single.report.op_to_device.values()) == {D0}
    assert set(alternate.report.op_to_device.values()) == {D0, D1}
    assert alternate.diagnosis["copies"]["measured"] > 0  # ran across the gRPC link
    k, spacing, pairs = alternate.diagnosis["copies"]["in_flight"]  # read off the traced step
    assert pairs > 0 and k >= 1 and spacing > 0
    assert alternate.sim_ms > single.sim_ms
    assert set(per_graph) == {"lstm"}
    assert "link fitted to one ways:" in text and "copy of a scalar task 0 -> 1:" in text
    assert "step time over 3 placements of 1 graphs:" in text
    assert sorted(os.listdir(tmp_path)) == ["lstm.json", "lstm.pb", "lstm.profile"]
    # The link's copies in flight are fitted to copies sent together, printed and saved.
    k = re.search(r"^link fitted to one ways: .* us \(rms relative error \d+%\), (\S+) copies in "
                  r"flight \(copies sent together (\S+) us apart", text, re.M)
    assert k, text
    saved = json.loads((tmp_path / "lstm.json").read_text())["comm"]
    assert len(saved) == 3 and saved[2] >= 1 and f"{saved[2]:.2f}" == k.group(1)
    # How much of the machine other work took over the rounds (machine_load.LoadMeter).
    share = json.loads((tmp_path / "lstm.json").read_text())["others_cpu_share"]
    assert 0.0 <= share <= 1.0
