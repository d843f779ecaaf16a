"""Placing across hosts, on JSON graphs (no TensorFlow): each pair of devices pays its link.

Two hosts (TF tasks) of two devices each. Devices of one host share the intra-host line
(``comm``), devices of different hosts the inter-host one (``inter_host_comm``). When the
inter-host link is slow the placers keep every transfer inside one host and still use that host's
two devices; when compute dominates they use both hosts.
"""

import math

import pytest

from baechi_tf.cluster import CommCost
from baechi_tf.errors import BaechiError
from baechi_tf.json_io import graph_to_json, parse_graph_json
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions, place
from baechi_tf.placer.schedule import Placement
from baechi_tf.placer.simulator import simulate
from invariants import assert_valid_schedule

GiB = 1 << 30
MiB = 1 << 20
TASKS = ("/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1")
DEVICES = [f"{t}/device:GPU:{i}" for t in TASKS for i in range(2)]
FAST = {"slope_us_per_byte": 0.0001, "intercept_us": 10.0}  # inside a host
METHODS = ("m_etf", "m_sct", "auto")


def fork_join_doc(*, branches: int, branch_ops: int, op_us: float, nbytes: int, inter: dict) -> dict:
    """
              src
          /   |   ...  \\
        b0.0 b1.0 ... b{n-1}.0      each branch a chain of `branch_ops` ops
         |    |         |
        b0.k b1.k ... b{n-1}.k
          \\   |   ...  /
              sink
    """
    ops = [{"name": "src", "compute_us": 10, "output_bytes": [nbytes]},
           {"name": "sink", "compute_us": 10, "output_bytes": [4]}]
    edges = []
    for b in range(branches):
        prev = "src"
        for k in range(branch_ops):
            name = f"b{b}.{k}"
            ops.append({"name": name, "compute_us": op_us, "output_bytes": [nbytes]})
            edges.append({"src": prev, "dst": name})
            prev = name
        edges.append({"src": prev, "dst": "sink"})
    return {
        "devices": [{"name": d, "memory_bytes": 16 * GiB} for d in DEVICES],
        "comm": FAST,
        "inter_host_comm": inter,
        "ops": ops,
        "edges": edges,
    }


def _place(doc: dict, method: str):
    if method not in PLACEMENT_METHODS:
        pytest.skip(f"placement method {method!r} is not registered in this build")
    graph, cluster = parse_graph_json(doc)
    options = PlacementOptions(placement_method=method, refine_seconds=0.5)
    result = place(graph, cluster, options)
    assert_valid_schedule(graph, cluster, result.groups, result.schedule)
    return graph, cluster, result


def _task(cluster, device: int) -> str:
    return cluster.devices[device].task


def test_each_pair_pays_its_own_link():
    """a -> b: to the other device of a's host costs the intra line, to another host the inter one."""
    doc = {
        "devices": [{"name": d, "memory_bytes": GiB} for d in DEVICES],
        "comm": FAST,
        "inter_host_comm": {"slope_us_per_byte": 0.001, "intercept_us": 500.0},
        "ops": [{"name": "a", "compute_us": 5, "output_bytes": [MiB]},
                {"name": "b", "compute_us": 7, "output_bytes": [4]}],
        "edges": [{"src": "a", "dst": "b"}],
    }
    graph, cluster = parse_graph_json(doc)
    intra = 0.0001 * MiB + 10.0
    inter = 0.001 * MiB + 500.0
    for dst, cost in ((0, 0.0), (1, intra), (2, inter), (3, inter)):
        schedule = simulate(graph, cluster, Placement([0, dst], "by hand"))
        assert schedule.makespan_us == pytest.approx(5 + cost + 7)
        assert [t.end_us - t.start_us for t in schedule.transfers] == (
            [pytest.approx(cost)] if dst else []
        )
    # From host 1's first device, host 0's devices are the remote ones.
    assert cluster.transfer_us(2, 3, MiB) == pytest.approx(intra)
    assert cluster.transfer_us(2, 0, MiB) == pytest.approx(inter)


def test_the_inter_host_line_survives_a_json_round_trip():
    graph, cluster = parse_graph_json(fork_join_doc(
        branches=2, branch_ops=1, op_us=1, nbytes=4,
        inter={"slope_us_per_byte": 0.002, "intercept_us": 700.0}))
    doc = graph_to_json(graph, cluster)
    assert doc["inter_host_comm"] == {"slope_us_per_byte": 0.002, "intercept_us": 700.0}
    _, again = parse_graph_json(doc)
    assert again == cluster
    assert again.link(0, 2) == CommCost(0.002, 700.0) and again.link(0, 1) == CommCost(0.0001, 10.0)



@pytest.mark.parametrize("k, parsed", [(2.5, 2.5), (3, 3.0), ("unlimited", math.inf)])
def test_copies_in_flight_survive_a_json_round_trip(k, parsed):
    inter = {"slope_us_per_byte": 0.002, "intercept_us": 700.0, "copies_in_flight": k}
    graph, cluster = parse_graph_json(fork_join_doc(branches=2, branch_ops=1, op_us=1, nbytes=4, inter=inter))
    assert cluster.link(0, 2) == CommCost(0.002, 700.0, copies_in_flight=parsed)
    doc = graph_to_json(graph, cluster)
    assert doc["inter_host_comm"]["copies_in_flight"] == k and "copies_in_flight" not in doc["comm"]
    assert parse_graph_json(doc)[1] == cluster


@pytest.mark.parametrize("k", [0.5, -1, "many", True, None, [2]])
def test_copies_in_flight_below_one_in_json_is_refused(k):
    with pytest.raises(BaechiError, match=r"'inter_host_comm' has copies_in_flight=.*; give a number "
                       r">= 1 \(1: one copy at a time\) or 'unlimited'"):
        parse_graph_json(fork_join_doc(branches=2, branch_ops=1, op_us=1, nbytes=4, inter={
            "slope_us_per_byte": 0.002, "intercept_us": 700.0, "copies_in_flight": k}))


@pytest.mark.parametrize("method", METHODS)
def test_a_slow_inter_host_link_keeps_traffic_inside_a_host(method):
    # Four branches of 3 ms each: two devices of one host halve the step (0.1 ms transfers),
    # while a transfer to the other host takes 60 ms, more than the whole graph on one device.
    doc = fork_join_doc(branches=4, branch_ops=3, op_us=1000.0, nbytes=MiB,
                        inter={"slope_us_per_byte": 0.01, "intercept_us": 50000.0})
    graph, cluster, result = _place(doc, method)
    device_of = result.placement.device_of
    hosts = {_task(cluster, int(d)) for d in device_of}
    assert len(hosts) == 1, f"{method} placed ops on both hosts: {result.op_to_device()}"
    crossing = [t for t in result.schedule.transfers
                if _task(cluster, t.src_device) != _task(cluster, t.dst_device)]
    assert crossing == []
    assert len(set(device_of.tolist())) == 2  # still parallel inside the host
    assert result.makespan_us < 0.75 * result.single_device_makespan_us


@pytest.mark.parametrize("method", METHODS)
def test_when_compute_dominates_both_hosts_are_used(method):
    # Four branches of 300 ms; an inter-host transfer takes about 0.6 ms. One host can do no
    # better than two branches per device (600 ms); four devices on two hosts take about 300 ms.
    doc = fork_join_doc(branches=4, branch_ops=3, op_us=100000.0, nbytes=1024,
                        inter={"slope_us_per_byte": 0.0005, "intercept_us": 600.0})
    graph, cluster, result = _place(doc, method)
    device_of = result.placement.device_of
    assert {_task(cluster, int(d)) for d in device_of} == set(TASKS)
    assert len(set(device_of.tolist())) == 4
    one_host_bound_us = sum(graph.compute_us) / 2
    assert result.makespan_us < 0.6 * one_host_bound_us
    assert any(_task(cluster, t.src_device) != _task(cluster, t.dst_device)
               for t in result.schedule.transfers)
