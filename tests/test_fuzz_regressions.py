"""Regressions found by fuzzing the placement pipeline and the JSON reader (each case minimised).

A valid graph must be placed wherever a placement exists, and bad input must be a `BaechiError`
naming the problem, never an internal error (OverflowError, RecursionError, ...) nor a silently
changed graph.
"""

import json
import os
import sys

import numpy as np
import pytest

from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.errors import InfeasiblePlacementError, InvalidGraphError
from baechi_tf.graph import OpGraph
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.json_io import load_graph_json, parse_graph_json
from baechi_tf.placer.grouping import coplace, make_groups
from baechi_tf.placer.pipeline import PlacementOptions, place

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from invariants import assert_valid_schedule  # noqa: E402
from quality_graphs import rnn  # noqa: E402

MiB = 1 << 20


def _doc(ops, edges=(), memory_bytes=1 << 30):
    return {
        "devices": [{"name": "/device:GPU:0", "memory_bytes": memory_bytes}],
        "ops": list(ops),
        "edges": list(edges),
    }


# ---------------------------------------------------------------- grouping and pins


@pytest.mark.parametrize("method", ["m_etf", "auto"])
def test_coplace_does_not_merge_groups_pinned_to_different_devices(method):
    # a's only consumer is b, so coplace joined them, and then refused its own group because a
    # and b are pinned apart ("must be colocated ... pinned to GPU:0 and GPU:1").
    b = OpGraphBuilder()
    b.add_op("a", 10, [4], device="/device:GPU:0")
    b.add_op("b", 10, [4], device="/device:GPU:1")
    b.add_edge("a", "b")
    graph = b.build()
    options = PlacementOptions(placement_method=method, grouper="coplace", refine_seconds=0)
    result = place(graph, Cluster.homogeneous(2, 1 << 30), options)
    assert result.op_to_device() == {"a": "/device:GPU:0", "b": "/device:GPU:1"}


def test_coplace_still_merges_a_pinned_op_into_an_unpinned_consumer():
    b = OpGraphBuilder()
    b.add_op("a", 10, [4], device="/device:GPU:1")
    b.add_op("b", 10, [4])
    b.add_op("c", 10, [4], device="GPU:1")  # another spelling of a's device
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    groups = coplace(b.build())
    assert groups.num_groups == 1


@pytest.mark.parametrize("grouper", ["tf", "coplace"])
def test_colocated_ops_pinned_to_two_spellings_of_one_device(grouper):
    # '/device:GPU:0' and 'GPU:0' are one device; the strings differ, which was reported as two
    # pins that contradict each other.
    b = OpGraphBuilder()
    b.add_op("a", 10, [4], device="/device:GPU:0", colocation=["g"])
    b.add_op("b", 10, [4], device="GPU:0", colocation=["g"])
    b.add_op("c", 10, [4], device="/job:localhost/replica:0/task:0/device:GPU:0", colocation=["g"])
    b.add_edge("a", "b")
    graph = b.build()
    cluster = Cluster.homogeneous(2, 1 << 30, prefix="/job:localhost/replica:0/task:0")
    result = place(graph, cluster, PlacementOptions(placement_method="m_etf", grouper=grouper))
    assert set(result.op_to_device().values()) == {"/job:localhost/replica:0/task:0/device:GPU:0"}


def test_colocated_ops_pinned_to_different_devices_are_still_an_error():
    b = OpGraphBuilder()
    b.add_op("a", 10, [4], device="/job:a/replica:0/task:0/device:GPU:0", colocation=["g"])
    b.add_op("b", 10, [4], device="GPU:0", colocation=["g"])
    b.add_op("c", 10, [4], device="/job:b/replica:0/task:0/device:GPU:0", colocation=["g"])
    with pytest.raises(InvalidGraphError, match="must be colocated"):
        make_groups(b.build(), "tf")
    from baechi_tf.cluster import merged_device_name

    assert merged_device_name("GPU:1", "/device:GPU:0") is None
    assert merged_device_name("/gpu:1", "/job:w/task:2/device:GPU:1") == "/job:w/task:2/device:GPU:1"


def test_a_pin_without_a_task_to_a_device_of_several_tasks_is_said_to_be_ambiguous():
    # '/device:GPU:0' in a cluster of two tasks with a GPU:0 each was "not among the devices
    # (...): add the device", while both devices listed were it.
    from baechi_tf.errors import ConfigError

    tasks = [f"/job:w/replica:0/task:{t}/device:GPU:0" for t in range(2)]
    doc = {
        "devices": [{"name": name, "memory_bytes": 1 << 30} for name in tasks],
        "ops": [{"name": "a", "compute_us": 1, "device": "/device:GPU:0"}],
    }
    expected = "which names 2 devices of different tasks .*: give its task too, as in '/job:w/replica:0/task:0"
    with pytest.raises(ConfigError, match=expected):
        parse_graph_json(doc)
    b = OpGraphBuilder()
    b.add_op("a", 1, [4], device="GPU:0")
    cluster = Cluster(tuple(Device(name, 1 << 30) for name in tasks))
    with pytest.raises(ConfigError, match=expected):
        place(b.build(), cluster, PlacementOptions(placement_method="m_etf"))
    with pytest.raises(ConfigError, match=expected):
        cluster.device_index("GPU:0")


def test_an_op_too_big_for_the_device_its_group_is_pinned_to_is_not_said_to_be_pinned():
    # 'b' is not pinned; its group is, by 'a'. The error said "'b' cannot run on GPU:0, where it
    # is pinned ... pin the op elsewhere" (multi-task fuzzing, where coplace had joined 'b' to a
    # pinned op's group).
    from baechi_tf.errors import InfeasiblePlacementError

    b = OpGraphBuilder()
    b.add_op("a", 1, [4], device="/device:GPU:0", colocation=["g"])
    b.add_op("b", 1, [2 * MiB], colocation=["g"])
    with pytest.raises(InfeasiblePlacementError, match=(
        r"op 'b' cannot run on '/device:GPU:0', where its group is pinned \(by 'a'\), whatever else "
        r"goes there: .*; give it more memory, or pin the group elsewhere, or split the group$"
    )):
        place(b.build(), Cluster.homogeneous(2, MiB), PlacementOptions(placement_method="m_etf"))


# ---------------------------------------------------------------- auto with fusion


def test_auto_with_fusion_judges_memory_on_the_real_graph():
    # a and b fuse into one op whose internal 4 MiB tensor the fused graph does not count: auto
    # kept the small device, the check on the real graph refused it, and auto failed although
    # every single method (falling back to a packing) placed the graph on the large device.
    b = OpGraphBuilder()
    b.add_op("a", 0, [4 * MiB], colocation=["g"])
    b.add_op("b", 0, [8 * MiB], colocation=["g"])
    b.add_edge("a", "b")
    graph = b.build()
    cluster = Cluster((Device("/device:GPU:0", 10 * MiB), Device("/device:GPU:1", 100 * MiB)))
    for method in ("m_etf", "auto"):
        options = PlacementOptions(placement_method=method, placer_type="fusion", refine_seconds=0)
        result = place(graph, cluster, options)
        assert set(result.op_to_device().values()) == {"/device:GPU:1"}, method


def test_auto_with_fusion_is_never_slower_than_a_single_method():
    # The fused a+b ends after 700 us, so on the fused graph c (on the other device) waits for
    # it and splitting gains nothing; on the real graph c starts at once. auto compared fused
    # makespans and kept 1100 us where `packed` gives 700 us.
    b = OpGraphBuilder()
    b.add_op("a", 0, [], colocation=["g"])
    b.add_op("b", 700, [], colocation=["g"])
    b.add_op("c", 400, [], persistent_bytes=16 * MiB)
    b.add_control_edge("a", "b")
    b.add_control_edge("a", "c")
    graph = b.build()
    cluster = Cluster.homogeneous(2, 20 * MiB, comm=CommCost(0, 0))
    makespan = {
        method: place(
            graph, cluster, PlacementOptions(placement_method=method, placer_type="fusion", refine_seconds=0)
        ).makespan_us
        for method in ("packed", "m_etf", "auto")
    }
    assert makespan["packed"] == pytest.approx(700.0)
    assert makespan["auto"] <= min(makespan["packed"], makespan["m_etf"]) + 1e-9


def test_auto_with_fusion_and_coplace_places_a_tight_rnn():
    # The README's original-workflow flags (--placer_type=fusion --grouper=coplace) on a small
    # RNN with 20 MiB devices: every candidate's simulation on the fused graph ran out of memory
    # and auto failed, while m-ETF and the packing (and auto's candidates, on the real graph) fit.
    graph, cluster = rnn(2, 4), Cluster.homogeneous(4, 20 * MiB)  # bench/quality_graphs.py's
    makespan = {}
    for method in ("m_etf", "packed", "auto"):
        options = PlacementOptions(
            placement_method=method, placer_type="fusion", grouper="coplace", refine_seconds=0
        )
        result = place(graph, cluster, options)  # raised InfeasiblePlacementError for auto
        assert max(result.schedule.peak_memory_bytes) <= 20 * MiB
        makespan[method] = result.makespan_us
    assert makespan["auto"] <= min(makespan["m_etf"], makespan["packed"]) + 1e-6, makespan


# ---------------------------------------------------------------- channels


def test_a_transfer_too_short_to_move_the_clock_books_no_channel_time():
    # At t = 1e9 us a 1-byte copy on a link of 1e-8 us/byte ends where it starts (s + w == s).
    # Booked anyway, it went into a dry run's tentative bookings before a's 100 us copy of the
    # same start, left their ends unsorted, and p's copy to GPU:2 was put on GPU:2's channel
    # while a's 100 us copy still used it: the step came out 50 us short.
    from baechi_tf.placer.schedule import Placement
    from baechi_tf.placer.simulator import simulate

    b = OpGraphBuilder()
    b.add_op("a", 1e9, [1, 10**10])  # on GPU:0; its copies to GPU:2 take 1e-8 us and 100 us
    b.add_op("p", 1e9, [10])  # on GPU:1, another task: its copy to GPU:2 takes 50 us
    b.add_op("c", 1, [])  # on GPU:2
    b.add_edge("a", "c", 0)
    b.add_edge("a", "c", 1)
    b.add_edge("p", "c")
    graph = b.build()
    task = "/job:w/replica:0/task:{}/device:GPU:{}"
    devices = tuple(Device(task.format(t, i), 1 << 40) for i, t in enumerate((0, 1, 0)))
    cluster = Cluster(devices, CommCost(1e-8, 0), inter_task_comm=CommCost(0, 50))
    schedule = simulate(graph, cluster, Placement(np.array([0, 1, 2]), "fixed"))
    on_gpu2 = sorted((t.start_us, t.end_us) for t in schedule.transfers if t.end_us > t.start_us)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(on_gpu2, on_gpu2[1:])), on_gpu2
    assert schedule.makespan_us == pytest.approx(1e9 + 151)


# ---------------------------------------------------------------- sizes, slots and JSON


@pytest.mark.parametrize("field", ["output_bytes", "temp_bytes", "persistent_bytes"])
def test_sizes_beyond_int64_are_clear_errors(field):
    op = {"name": "a", "compute_us": 1, "output_bytes": [4]}
    op[field] = [2**70] if field == "output_bytes" else 2**70  # was OverflowError from numpy
    with pytest.raises(InvalidGraphError, match=f"op 'a' has {field}="):
        parse_graph_json(_doc([op]))


def test_sizes_whose_sum_overflows_int64_are_a_clear_error():
    # Each below 2**63, their sum not: was OverflowError in output_total_bytes.
    op = {"name": "a", "compute_us": 1, "output_bytes": [2**61, 2**61, 2**61]}
    with pytest.raises(InvalidGraphError, match="add up to"):
        parse_graph_json(_doc([op]))


def test_builder_refuses_fractional_or_nan_sizes():
    for value in (1.5, float("nan"), float("inf")):
        b = OpGraphBuilder()
        b.add_op("a", 1, [4], temp_bytes=value)  # 1.5 was truncated to 1, nan a ValueError
        with pytest.raises(InvalidGraphError, match="whole numbers of bytes"):
            b.build()


@pytest.mark.parametrize("slot", [2**32, 2**70, -1])
def test_output_slot_out_of_range_is_an_error_not_another_edge(slot):
    # 2**32 was narrowed to int32 and read output 0; -1 (CONTROL) made a control edge that
    # carries no bytes; 2**70 was an OverflowError.
    ops = [{"name": "a", "compute_us": 1, "output_bytes": [4096]}, {"name": "b", "compute_us": 1}]
    with pytest.raises(InvalidGraphError, match="reads output"):
        parse_graph_json(_doc(ops, [{"src": "a", "dst": "b", "src_output": slot}]))


def test_from_arrays_checks_edge_ids_before_narrowing_them():
    with pytest.raises(InvalidGraphError, match="dangling edge"):
        OpGraph.from_arrays(["a", "b"], [1, 1], [[4], [4]], edge_src=[2**32], edge_dst=[1], edge_src_output=[0])


def test_json_memory_of_2_to_the_63_minus_1_is_a_whole_number(tmp_path):
    # float(2**63 - 1) != 2**63 - 1, which was reported as "give a whole number of bytes".
    doc = _doc([{"name": "a", "compute_us": 1, "output_bytes": [4]}], memory_bytes=2**63 - 1)
    graph, cluster = parse_graph_json(doc)
    assert cluster.devices[0].memory_bytes == 2**63 - 1
    assert place(graph, cluster, PlacementOptions(placement_method="m_etf")).op_to_device() == {
        "a": "/device:GPU:0"
    }


def test_json_nested_too_deeply_is_a_clear_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)  # was RecursionError from json
    with pytest.raises(InvalidGraphError, match="too deeply"):
        load_graph_json(str(path))


def test_cli_gives_one_line_for_an_oversized_output(tmp_path, capsys):
    from baechi_tf.cli import main

    path, out = tmp_path / "g.json", tmp_path / "p.json"
    path.write_text(json.dumps(_doc([{"name": "a", "compute_us": 1, "output_bytes": [2**64]}])))
    assert main(["place-json", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output_bytes" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("names", ["ab", "a"])
def test_cli_gives_one_line_for_compute_times_too_large_to_schedule(tmp_path, capsys, names):
    # numpy's sum once added two "RuntimeWarning: overflow" lines to the error's one; one op of
    # 1e308 us was placed, its makespan printed with 300 digits and auto's numpy overflow warnings.
    import warnings

    from baechi_tf.cli import main

    path, out = tmp_path / "g.json", tmp_path / "p.json"
    ops = [{"name": n, "compute_us": 1e308, "output_bytes": [4]} for n in names]
    path.write_text(json.dumps(_doc(ops)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be printed: fail on it instead
        assert main(["place-json", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compute times add up to " in err[0] and "check that they are in microseconds" in err[0]
    assert not out.exists()


def test_cli_refuses_device_memory_beyond_what_byte_counts_hold(tmp_path, capsys):
    # memory_bytes 10**40 was taken and printed as 9313225746154785439172786126848.00 GiB.
    from baechi_tf.cli import main

    path = tmp_path / "g.json"
    doc = _doc([{"name": "a", "compute_us": 1.0, "output_bytes": [4]}])
    doc["devices"][0]["memory_bytes"] = 10**40
    path.write_text(json.dumps(doc))
    assert main(["place-json", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "memory_bytes=10000000000000000000000000000000000000000" in err[0]
    assert "at most 2**63 - 1" in err[0]


# ---------------------------------------------------------------- options


def test_infinite_refine_seconds_is_a_config_error(tmp_path, capsys):
    # `--refine_seconds inf` passed validation and the refinement's int(seconds * rate) raised
    # OverflowError.
    from baechi_tf.cli import main
    from baechi_tf.errors import ConfigError

    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    with pytest.raises(ConfigError, match="refine_seconds inf"):
        place(b.build(), Cluster.homogeneous(2, 1 << 30), PlacementOptions(refine_seconds=float("inf")))
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_doc([{"name": "a", "compute_us": 1, "output_bytes": [4]}])))
    assert main(["place-json", str(path), "--refine_seconds", "inf"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "options",
    [dict(memory_fraction="0.5"), dict(refine_seconds="1"), dict(placement_method="expert", expert={"a": 0})],
)
def test_options_of_the_wrong_type_are_config_errors(options):
    # Were TypeErrors from a comparison with a string, or from matching a device name.
    from baechi_tf.errors import ConfigError

    b = OpGraphBuilder()
    b.add_op("a", 1, [4])
    with pytest.raises(ConfigError):
        place(b.build(), Cluster.homogeneous(2, 1 << 30), PlacementOptions(**options))


# ---------------------------------------------------------------- auto against each method alone


def _data_graph(name):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", name)) as f:
        return parse_graph_json(json.load(f))


def _placed(graph, cluster, method, **options):
    from baechi_tf.errors import InfeasiblePlacementError

    try:
        return place(graph, cluster, PlacementOptions(placement_method=method, **options))
    except InfeasiblePlacementError:
        return None


def test_auto_judges_the_fit_search_that_a_method_alone_falls_back_to():
    # 18 ops on three devices of 52 MiB to 680 MiB (a fuzzed graph, minimised): HEFT, m-ETF and
    # m-SCT run out of memory, so does the packing, and the fit search that they fall back to
    # finds a placement of 1,780.9 ms. auto kept m-TOPO's, 2,718.4 ms, refined to 2,545.9 ms:
    # it had no such candidate.
    graph, cluster = _data_graph("auto_misses_the_fit_search_fallback.json")
    heft = _placed(graph, cluster, "heft")
    assert heft.placement.method == "heft+fit"
    auto = place(graph, cluster, PlacementOptions(refine_seconds=0.05))
    assert auto.candidates["packed"] is None and auto.candidates["fit"] == pytest.approx(heft.makespan_us)
    assert auto.makespan_us <= heft.makespan_us
    assert_valid_schedule(graph, cluster, auto.groups, auto.schedule)
    # Where the packing fits, a method alone falls back to it, auto's candidate already: no search.
    roomy = Cluster.homogeneous(3, 1 << 40, comm=cluster.comm)
    assert "fit" not in place(graph, roomy, PlacementOptions(refine_seconds=0.05)).candidates


def test_auto_runs_the_originals_m_topo_variant_too():
    # 7 ops, a copy costing 10 ms plus 1 us a byte (fuzzed, minimised): m_topo_nonuniform, which
    # fills each device to its capacity in turn, simulates at 836.2 us, and auto without
    # refinement kept m-TOPO's 838.5 us: it did not run that method.
    graph, cluster = _data_graph("m_topo_nonuniform_beats_the_rest.json")
    options = dict(grouper="coplace", placer_type="fusion", memory_fraction=0.5, refine_seconds=0.0)
    variant = _placed(graph, cluster, "m_topo_nonuniform", **options)
    auto = place(graph, cluster, PlacementOptions(**options))
    assert auto.makespan_us <= variant.makespan_us
    assert auto.candidates["m_topo_nonuniform"] == pytest.approx(variant.makespan_us)


def test_auto_places_with_fusion_what_a_method_alone_places():
    # 14 ops on five devices (fuzzed, minimised), fused before placing: no placement of the fused
    # graph fits, whose ops hold their outputs longer, and auto failed ("ran out of memory");
    # HEFT alone, whose fused placement did not fit the real graph either, fell back to m-ETF's
    # placement of the real graph, which fits. auto now falls back as it does.
    graph, cluster = _data_graph("fits_only_unfused.json")
    options = dict(grouper="coplace", placer_type="fusion", memory_fraction=0.5, refine_seconds=0.2)
    heft = _placed(graph, cluster, "heft", **options)
    assert heft is not None and heft.placement.method == "heft+m_etf"
    auto = place(graph, cluster, PlacementOptions(**options))
    assert auto.placement.method == "auto(m_etf)"
    assert auto.makespan_us <= heft.makespan_us
    assert_valid_schedule(graph, cluster, auto.groups, auto.schedule)


def test_auto_places_with_fusion_what_the_search_of_the_fused_graph_finds():
    # 18 ops on four devices (fuzzed, minimised), fused: every candidate of auto runs out of
    # memory, and so did the search of the real graph that auto fell back to (389 tries); the
    # packing alone, falling back to the search of the fused graph that it placed, found one.
    graph, cluster = _data_graph("fits_only_through_the_fused_search.json")
    options = dict(placer_type="fusion", memory_fraction=0.5, refine_seconds=0.05)
    packed = _placed(graph, cluster, "packed", **options)
    assert packed.placement.method == "packed+fit"
    auto = place(graph, cluster, PlacementOptions(**options))
    assert auto.placement.method == "auto(fit)" and auto.candidates["fit+unfused"] is None
    assert auto.makespan_us <= packed.makespan_us
    assert_valid_schedule(graph, cluster, auto.groups, auto.schedule)


# ---------------------------------------------------------------- ops pinned to the host


def test_auto_with_host_ops_is_never_slower_than_a_method_that_searched_for_a_fit():
    # No candidate of auto fits (three 16 MiB weights, 22 MB devices but one). Every other method
    # ran out of memory without the host's op too, and searched the graph without it: that
    # placement, with `h` moved to the host, fits and takes 1 us. auto searched only the graph as
    # it runs, whose first fit (the search ignores time) takes 2 us, and kept that.
    from baechi_tf.rewriter.graph_pass import place_with_host

    b = OpGraphBuilder()
    for name, compute_us, outputs, weights in (
        ("w0", 0, [], 16 * MiB), ("x", 0, [5310284], 0), ("y", 0, [5397421], 0), ("c", 1, [], 0),
        ("w1", 0, [7337685], 16 * MiB), ("z", 1, [], 16 * MiB), ("u", 0, [], 0),
    ):
        b.add_op(name, compute_us, outputs, persistent_bytes=weights)
    b.add_op("h", 0, [], device="/device:CPU:0")
    for src, dst in (("y", "z"), ("x", "h"), ("x", "u")):
        b.add_edge(src, dst)
    graph = b.build()
    cluster = Cluster(
        tuple(Device(f"/device:GPU:{i}", m) for i, m in enumerate((46_220_000, 22_020_000, 22_100_000))),
        CommCost(0, 0),
    )
    host = Device("/device:CPU:0", 1 << 40, "CPU")
    makespan = {}
    for method in ("m_topo", "auto"):
        result = place_with_host(graph, cluster, host, PlacementOptions(method, refine_seconds=0))
        assert result.op_to_device()["h"] == "/device:CPU:0"
        makespan[method] = result.makespan_us
    assert makespan == {"m_topo": 1.0, "auto": 1.0}


@pytest.mark.parametrize("pin", ["CPU:0", "/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:0"])
@pytest.mark.parametrize("method", ["m_etf", "auto"])
def test_any_spelling_of_the_host_pins_to_the_host(pin, method):
    # place_with_host compared pins with the host's name letter for letter: an op pinned to
    # 'CPU:0' with the host '/device:CPU:0' was "pinned to 'CPU:0', which is not in the cluster".
    from baechi_tf.rewriter.graph_pass import place_with_host

    b = OpGraphBuilder()
    b.add_op("h", 1, [4], device=pin)
    b.add_op("a", 1, [4])
    b.add_edge("h", "a")
    host = Device("/device:CPU:0", 1 << 30, "CPU")
    options = PlacementOptions(method, refine_seconds=0)
    graph = b.build()
    result = place_with_host(graph, Cluster.homogeneous(2, 1 << 30), host, options)
    assert result.op_to_device()["h"] == "/device:CPU:0"
    # The peak out of the simulated order, of the placement with the host's op on the host.
    from baechi_tf.placer.executor_order import expected_peaks

    assert result.reordered_peak_bytes == expected_peaks(graph, result.cluster, result.schedule)
    assert len(result.reordered_peak_bytes) == 3


@pytest.mark.parametrize("method", ["m_etf", "single", "auto"])
def test_coplace_joins_no_other_op_to_the_host_s_ops(method):
    # The placers see the host's ops unpinned, so coplace joined 'ids' (whose one consumer is
    # 'emb') and 'mm' and 'loss' (each the one consumer of the one before) to the host's
    # embedding, and the whole group went to the host: every op ran on the host CPU, none on the
    # GPUs (multi-task fuzzing with host pins and --grouper coplace).
    from baechi_tf.rewriter.graph_pass import place_with_host

    b = OpGraphBuilder()
    b.add_op("ids", 1, [64])
    b.add_op("emb", 1, [4000], persistent_bytes=10**6, device="/device:CPU:0")
    b.add_op("mm", 5000, [4000])
    b.add_op("loss", 3000, [4])
    for src, dst in (("ids", "emb"), ("emb", "mm"), ("mm", "loss")):
        b.add_edge(src, dst)
    host = Device("/device:CPU:0", 1 << 30, "CPU")
    options = PlacementOptions(method, grouper="coplace", refine_seconds=0)
    where = place_with_host(b.build(), Cluster.homogeneous(2, 1 << 30), host, options).op_to_device()
    assert where["emb"] == "/device:CPU:0"
    assert all(where[op].startswith("/device:GPU:") for op in ("ids", "mm", "loss")), where


def test_auto_with_host_ops_judges_the_search_a_method_falls_back_to_once_the_host_runs_them():
    # Ops of no time, copies of 100 us (multi-task fuzzing, minimised). m_topo_nonuniform's
    # placement fits without the host's 'h', not once its 7.1 MB go to the two readers; the
    # packing of the graph as it runs does not fit either, and the search of that graph gives
    # 100 us. auto's candidates, judged with 'h' on the host, were that packing and the placers'
    # placements, some of which fit: it kept the packing of the graph without 'h' (200 us), and
    # judged no search.
    from baechi_tf.rewriter.graph_pass import place_with_host

    task0, task1 = "/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"
    b = OpGraphBuilder()
    b.add_op("h", 0, [7103352], device=f"{task0}/device:CPU:0")
    b.add_op("x", 0, [3082370])
    b.add_op("w0", 0, [], persistent_bytes=MiB)
    b.add_op("g1", 0, [], colocation=["g"])
    b.add_op("w1", 0, [], persistent_bytes=MiB)
    b.add_op("p", 0, [3395019, 2468589], device=f"{task0}/device:GPU:0")
    b.add_op("y", 0, [5357034])
    b.add_op("g2", 0, [], colocation=["g"])
    for src, dst in (("h", "x"), ("h", "p"), ("x", "g2"), ("y", "g2")):
        b.add_edge(src, dst)
    graph = b.build()
    cluster = Cluster(
        (Device(f"{task0}/device:GPU:0", 17_631_000), Device(f"{task1}/device:GPU:0", 23_100_000)),
        CommCost(0, 100),
    )
    host = Device(f"{task0}/device:CPU:0", 1 << 40, "CPU")
    makespan = {}
    for method in ("m_topo_nonuniform", "auto"):
        result = place_with_host(graph, cluster, host, PlacementOptions(method, refine_seconds=0))
        makespan[method] = (result.placement.method, result.makespan_us)
    assert makespan["m_topo_nonuniform"][0] == "m_topo_nonuniform+fit"
    assert makespan["auto"][1] <= makespan["m_topo_nonuniform"][1], makespan


@pytest.mark.parametrize("method", ["auto", "m_etf", "m_topo"])
def test_where_coplace_groups_fit_nowhere_tf_groups_are_placed(method, caplog):
    # coplace joins an op to the group of its only consumer whatever that group then holds: here
    # 100 MiB of weights joined to an op pinned to a device of 50 MiB, and every method failed
    # ("cannot run on '/device:GPU:0' ... whatever else goes there"), though with TF's groups the
    # weights fit on the other device (a helper's fuzzing of multi-task clusters, minimised).
    b = OpGraphBuilder()
    b.add_op("weights", 10, [MiB], persistent_bytes=100 * MiB)
    b.add_op("use", 10, [MiB], device="/device:GPU:0")
    b.add_edge("weights", "use")
    graph = b.build()
    cluster = Cluster((Device("/device:GPU:0", 50 * MiB), Device("/device:GPU:1", 1 << 30)), CommCost(0.0001754, 134))
    with caplog.at_level("WARNING", logger="baechi_tf.placer.pipeline"):
        result = place(graph, cluster, PlacementOptions(placement_method=method, grouper="coplace"))
    assert result.op_to_device() == {"weights": "/device:GPU:1", "use": "/device:GPU:0"}
    assert result.groups.num_groups == 2
    assert "nothing fits with the coplace groups (op 'use' cannot run on '/device:GPU:0'" in caplog.text
    assert_valid_schedule(graph, cluster, result.groups, result.schedule)
    # Where nothing fits with TF's groups either, that is the error.
    small = Cluster((Device("/device:GPU:0", 50 * MiB), Device("/device:GPU:1", 60 * MiB)), cluster.comm)
    with pytest.raises(InfeasiblePlacementError, match=r"step 'place \(tf groups\)' failed .*'weights'"):
        place(graph, small, PlacementOptions(placement_method=method, grouper="coplace"))
