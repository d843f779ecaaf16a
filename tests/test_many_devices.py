"""Placing on many devices: untouched twins (`Cluster.twins`, `UntouchedTwins`) weighed once give
the placements and schedules that weighing every device gives."""

from __future__ import annotations

import os
import sys

import pytest

import graphs
from baechi_tf.cluster import Cluster, CommCost, Device, GiB
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.placer import Groups, colocation_groups, simulate
from baechi_tf.placer.list_scheduler import ListScheduler
from baechi_tf.placer.policies import EarliestStartPolicy
from baechi_tf.placer.twins import UntouchedTwins
from baechi_tf.placer.m_sct import FavouriteChildPolicy, favourite_children_of
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from layered import layered_graph  # noqa: E402

MiB = graphs.MiB


def _tasks(num_tasks: int, per_task: int, memory_bytes: int = GiB) -> Cluster:
    """Hosts of `per_task` devices, copies between hosts dearer; local parts unique (GPU:0, ...),
    so that a graph's '/device:GPU:k' pins name one device."""
    devices = [
        Device(f"/job:worker/replica:0/task:{t}/device:GPU:{t * per_task + i}", memory_bytes)
        for t in range(num_tasks)
        for i in range(per_task)
    ]
    return Cluster(tuple(devices), CommCost(0.0001, 20), CommCost(0.001, 300))


def _unequal(n: int, memory_bytes: int = GiB) -> Cluster:
    """Every third device has a quarter of the memory of the others."""
    return Cluster(tuple(
        Device(f"/device:GPU:{i}", memory_bytes // 4 if i % 3 == 2 else memory_bytes) for i in range(n)
    ))


_CLUSTERS = {
    "homogeneous": lambda: graphs.cluster(24),
    "tight memory": lambda: graphs.cluster(24, memory_bytes=6 * MiB),  # ops wait for memory
    "free link": lambda: graphs.cluster(24, comm=CommCost(0.0, 0.0)),
    "unequal memory": lambda: _unequal(24, 12 * MiB),
    "three hosts": lambda: _tasks(3, 8),
}


def test_twins_are_the_devices_that_can_be_swapped():
    assert graphs.cluster(4).twins() == ((0, 1, 2, 3),)
    assert graphs.cluster(1).twins() == ()
    assert _unequal(6).twins() == ((0, 1, 3, 4), (2, 5))
    assert _tasks(2, 3).twins() == ((0, 1, 2), (3, 4, 5))
    # Copies between hosts that cost what copies within do: any two devices can be swapped.
    one_link = Cluster(_tasks(2, 3).devices, CommCost(0.0001, 20))
    assert one_link.twins() == ((0, 1, 2, 3, 4, 5),)
    cpu = Device("/device:CPU:0", GiB, "CPU")
    assert Cluster((cpu, *graphs.cluster(2).devices)).twins() == ((1, 2),)


def _graph(seed: int):
    return graphs.random_dag(
        seed, 40, edge_prob=0.12, max_bytes=MiB, group_prob=0.15, pin_prob=0.04, num_devices=24,
        persistent_prob=0.15,
    )


def _schedule(graph, cluster, make_policy, skip: bool, monkeypatch):
    """(what the run scheduled, dry runs, hand-overs); None when it ran out of memory."""
    monkeypatch.setattr(UntouchedTwins, "skip", skip)
    scheduler = ListScheduler(graph, cluster, colocation_groups(graph), make_policy())
    hand_over, handed = scheduler._hand_over, []
    scheduler._hand_over = lambda dev, twin: (handed.append(twin), hand_over(dev, twin))
    try:
        scheduler.run()
    except InfeasiblePlacementError:
        return None, scheduler.evaluations, len(handed)
    s = scheduler.state
    return (s.device, s.start, s.end, s.order, s.transfers, s.peak), scheduler.evaluations, len(handed)


@pytest.mark.parametrize("kind", sorted(_CLUSTERS))
@pytest.mark.parametrize("policy", ["m_etf", "m_sct"])
def test_schedules_are_the_same_with_twins_weighed_once(kind, policy, monkeypatch):
    """Each seeded graph (groups, pins, weights) on 24 devices, weighing one of each set of
    untouched twins and weighing every device: the same devices, times, copies and peaks (or the
    same run out of memory), in far fewer dry runs, and the twins took over from each other as
    the schedule touched them."""
    cluster = _CLUSTERS[kind]()
    runs = every_runs = handed = placed = 0
    for seed in range(6):
        graph = _graph(seed)
        if policy == "m_etf":
            make = EarliestStartPolicy
        else:
            child = favourite_children_of(graph, cluster).tolist()
            make = lambda: FavouriteChildPolicy(child, cluster.num_devices)  # noqa: E731
        skipped, skipped_runs, handed_here = _schedule(graph, cluster, make, True, monkeypatch)
        every, all_runs, none = _schedule(graph, cluster, make, False, monkeypatch)
        assert skipped == every, seed
        assert none == 0
        placed += skipped is not None
        runs, every_runs, handed = runs + skipped_runs, every_runs + all_runs, handed + handed_here
    assert runs < 0.6 * every_runs, (runs, every_runs)
    assert handed > 0 and placed >= 3  # most runs compared real schedules


@pytest.mark.slow
@pytest.mark.parametrize("method", ["m_topo", "m_etf", "m_sct", "heft", "auto"])
def test_placements_are_the_same_with_twins_weighed_once(method, monkeypatch):
    """Through the placers, on a layered graph and on 64 devices of one host and of four: the
    same device for every op and the same makespan, and the placers that weigh devices (all
    but m-TOPO) were left fewer to weigh than there are."""
    made: list[UntouchedTwins] = []
    init = UntouchedTwins.__init__

    def counted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(UntouchedTwins, "__init__", counted)
    options = PlacementOptions(placement_method=method, refine_seconds=0.2)
    graph = layered_graph(300, seed=3)
    for cluster in (graphs.cluster(64, memory_bytes=256 * MiB), _tasks(4, 16, 256 * MiB)):
        groups = colocation_groups(graph)
        placed = []
        for skip in (True, False):
            monkeypatch.setattr(UntouchedTwins, "skip", skip)
            made.clear()
            placement = PLACEMENT_METHODS[method](graph, cluster, groups, options)
            placed.append((placement.device_of.tolist(), simulate(graph, cluster, placement).makespan_us))
            if skip and method != "m_topo":
                assert min(len(t.distinct) for t in made) < cluster.num_devices
        assert placed[0] == placed[1]
