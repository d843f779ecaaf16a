"""The list scheduler's remembered dry runs (`SchedulerState.ready_memo`) change no schedule."""

from __future__ import annotations

import pytest

import graphs
from baechi_tf.cluster import CommCost
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.placer import Groups
from baechi_tf.placer.list_scheduler import EarliestStartPolicy, FixedPolicy, ListScheduler, byte_formatter


class _Forgetful(dict):
    """A memo that never answers: every dry run is made afresh."""

    def get(self, key, default=None):
        return default


def _run(graph, cluster, policy, *, remember: bool):
    scheduler = ListScheduler(graph, cluster, Groups.singletons(graph), policy)
    if not remember:
        scheduler.state.ready_memo = _Forgetful()
    try:
        scheduler.run()
    except InfeasiblePlacementError:
        return None
    state = scheduler.state
    return state.device, state.start, state.end, state.order, state.transfers, state.peak


_CLUSTERS = {
    "default link": lambda n: graphs.cluster(n),
    "free link": lambda n: graphs.cluster(n, comm=CommCost(0.0, 0.0)),
    "tight memory": lambda n: graphs.cluster(n, memory_bytes=3 * graphs.MiB),
    "free link, tight memory": lambda n: graphs.cluster(n, 3 * graphs.MiB, CommCost(0.0, 0.0)),
}


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("link", sorted(_CLUSTERS))
def test_remembered_dry_runs_give_the_same_schedule(seed, link):
    graph = graphs.random_dag(seed, 30, edge_prob=0.25, max_bytes=graphs.MiB)
    cluster = _CLUSTERS[link](3)
    # m-ETF's policy asks every device; a fixed round robin asks one device per op.
    etf = _run(graph, cluster, EarliestStartPolicy(), remember=True)
    assert etf == _run(graph, cluster, EarliestStartPolicy(), remember=False)
    fixed = FixedPolicy([op % 3 for op in range(graph.num_ops)])
    assert _run(graph, cluster, fixed, remember=True) == _run(graph, cluster, fixed, remember=False)
    if "tight" not in link:
        assert etf is not None  # the runs above compared real schedules


@pytest.mark.parametrize("seed, num_devices", [(48, 3), (85, 3), (123, 3), (129, 2)])
def test_a_free_copy_forgets_dry_runs(seed, num_devices):
    """A free copy books no channel time, so only the version bump on a new copy tells a dry
    run that its input has arrived and needs no more room. These seeds (found by search: about
    1 in 100) ask an op again after such a copy; without the bump their schedules differ."""
    graph = graphs.random_dag(seed, 30, edge_prob=0.25, max_bytes=graphs.MiB)
    cluster = graphs.cluster(num_devices, 6 * graphs.MiB, CommCost(0.0, 0.0))
    made = []
    for policy in (EarliestStartPolicy, lambda: FixedPolicy([op % num_devices for op in range(30)])):
        remembered = _run(graph, cluster, policy(), remember=True)
        assert remembered == _run(graph, cluster, policy(), remember=False)
        made.append(remembered is not None)
    assert any(made)


def test_memo_is_used():
    """Ops wait on busy devices and are asked again: some of those asks hit the memo."""
    graph = graphs.fork_join(width=12)
    cluster = graphs.cluster(2)
    scheduler = ListScheduler(graph, cluster, Groups.singletons(graph), EarliestStartPolicy())
    hits = []
    memo = scheduler.state.ready_memo

    class Counting(dict):
        def get(self, key, default=None):
            value = memo.get(key, default)
            hits.append(value is not None)
            return value

        def __setitem__(self, key, value):
            memo[key] = value

        def pop(self, key, default=None):
            return memo.pop(key, default)

    scheduler.state.ready_memo = Counting()
    scheduler.run()
    assert scheduler.done
    assert any(hits) and not all(hits)


def test_pinned_group_devices():
    from baechi_tf.errors import ConfigError
    from baechi_tf.graph import OpGraphBuilder
    from baechi_tf.placer import colocation_groups
    from baechi_tf.placer.list_scheduler import pinned_group_devices

    b = OpGraphBuilder()
    b.add_op("free", 1, [4])
    b.add_op("w", 1, [4])
    b.add_op("read", 1, [4], device="/device:GPU:1", colocation=["w"])  # pins w's group
    b.add_op("alone", 1, [4], device="/device:GPU:0")
    graph = b.build()
    groups = colocation_groups(graph)
    devices = pinned_group_devices(graph, graphs.cluster(2), groups)
    by_op = devices[groups.group_of]
    assert by_op.tolist() == [-1, 1, 1, 0]
    with pytest.raises(ConfigError, match="not in the cluster"):
        pinned_group_devices(graph, graphs.cluster(1), groups)


def test_sizes_that_would_print_alike_are_printed_in_bytes():
    # An out-of-memory error said that an op needing 1.17 KiB did not fit in 1.17 KiB free.
    assert byte_formatter(1200, 1199)(1200) == "1,200 B" and byte_formatter(1200, 1199)(1199) == "1,199 B"
    assert byte_formatter(1200, 1200, 5 << 20)(1200) == "1.17 KiB"  # equal sizes may look equal
    assert byte_formatter(1200, 5 << 20)(5 << 20) == "5.00 MiB"
