"""Refinement: never worse, never breaks memory or groups, deterministic, incremental == full."""

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import CommCost
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import Placement, colocation_groups, place_m_etf, simulate
from baechi_tf.placer.pipeline import PlacementOptions, place
from baechi_tf.placer.auto.refine import WORK_PER_SECOND, RefineOptions, refine, simulation_work, work_budget
from invariants import assert_valid_schedule


def refined(graph, cluster, placement, seconds=0.5, seed=0):
    groups = colocation_groups(graph)
    out, schedule, stats = refine(graph, cluster, groups, placement, options=RefineOptions(seconds, seed))
    return groups, out, schedule, stats


@pytest.mark.parametrize("seed", range(12))
def test_never_worse_and_valid(seed):
    graph = graphs.random_dag(seed, 40, edge_prob=0.08, group_prob=0.2, persistent_prob=0.3, max_bytes=8 << 20)
    cluster = graphs.cluster(3, memory_bytes=96 << 20)  # tight: some moves must be refused
    groups = colocation_groups(graph)
    start = place_m_etf(graph, cluster, groups)
    before = simulate(graph, cluster, start).makespan_us
    groups, out, schedule, stats = refined(graph, cluster, start)
    assert schedule.makespan_us <= before + 1e-6
    assert stats.final_makespan_us == schedule.makespan_us
    assert stats.initial_makespan_us == pytest.approx(before)
    # The incrementally re-simulated schedule is the simulator's schedule of the result.
    again = simulate(graph, cluster, out)
    np.testing.assert_allclose(again.end_us, schedule.end_us)
    assert_valid_schedule(graph, cluster, groups, again)


def test_improves_a_bad_placement():
    # Four independent heavy ops all on one device: moving them apart is the obvious fix.
    graph = graphs.independent(4, compute_us=1000)
    cluster = graphs.cluster(4)
    _, out, schedule, stats = refined(graph, cluster, Placement(np.zeros(4), "test"))
    assert schedule.makespan_us == pytest.approx(1000)
    assert stats.moves_accepted >= 3


def test_moves_groups_only_among_the_free_devices():
    """Devices 2 and 3 stand for a host that runs only the op pinned to it ('pin', on device 3):
    refinement spreads the other ops over devices 0 and 1 and never onto the host."""
    b = OpGraphBuilder()
    for i in range(3):
        b.add_op(f"op{i}", 1000, [4])
    b.add_op("pin", 10, [4], device="/device:GPU:3")
    graph = b.build()
    cluster = graphs.cluster(4)
    groups = colocation_groups(graph)
    start = Placement([0, 0, 0, 3], "test")
    anywhere = refine(graph, cluster, groups, start, options=RefineOptions(0.5))[0]
    assert len(set(anywhere.device_of[:3].tolist())) == 3  # unrestricted, it uses a third device
    free = refine(graph, cluster, groups, start, options=RefineOptions(0.5), free_devices=2)[0]
    assert set(free.device_of[:3].tolist()) == {0, 1}
    assert free.device_of[3] == 3
    assert simulate(graph, cluster, free).makespan_us == pytest.approx(2000)


def test_brings_an_op_next_to_its_producer():
    # A chain split over two devices with a costly link: refinement joins it.
    graph = graphs.chain(4, compute_us=100, nbytes=8 << 20)
    cluster = graphs.cluster(2)
    _, out, schedule, _ = refined(graph, cluster, Placement([0, 0, 1, 1], "test"))
    assert len(set(out.device_of.tolist())) == 1
    assert schedule.makespan_us == pytest.approx(400)


def test_respects_memory_limits():
    # Two 60 MiB weights, devices of 100 MiB: the ops cannot gather on one device even though
    # that would save the transfer.
    mib = 1 << 20
    b = OpGraphBuilder()
    b.add_op("w0", 5, [4 * mib], persistent_bytes=60 * mib)
    b.add_op("w1", 5, [4 * mib], persistent_bytes=60 * mib)
    b.add_op("join", 100, [4])
    b.add_edge("w0", "join")
    b.add_edge("w1", "join")
    graph = b.build()
    cluster = graphs.cluster(2, 100 * mib)
    groups, out, schedule, _ = refined(graph, cluster, Placement([0, 1, 0], "test"))
    assert out.device_of[0] != out.device_of[1]
    assert_valid_schedule(graph, cluster, groups, simulate(graph, cluster, out))


def test_groups_move_whole_and_pins_stay():
    b = OpGraphBuilder()
    b.add_op("v", 1, [1024], colocation=["v"])
    b.add_op("r", 500, [1024], colocation=["v"])
    b.add_op("p", 500, [4], device="/device:GPU:1")
    b.add_op("q", 500, [4])
    b.add_edge("v", "r")
    b.add_edge("r", "p")
    b.add_edge("r", "q")
    graph = b.build()
    cluster = graphs.cluster(3, comm=CommCost(0.0001, 10))
    groups, out, schedule, _ = refined(graph, cluster, Placement([0, 0, 1, 0], "test"))
    assert out.device_of[0] == out.device_of[1]
    assert out.device_of[2] == 1
    assert_valid_schedule(graph, cluster, groups, schedule)


def test_deterministic_for_a_seed():
    graph = graphs.random_dag(3, 60, edge_prob=0.06)
    cluster = graphs.cluster(3)
    groups = colocation_groups(graph)
    start = place_m_etf(graph, cluster, groups)
    a = refine(graph, cluster, groups, start, options=RefineOptions(0.3, 7))[0]
    b = refine(graph, cluster, groups, start, options=RefineOptions(0.3, 7))[0]
    assert a.same_as(b)


def test_zero_seconds_changes_nothing():
    graph = graphs.fork_join(4)
    cluster = graphs.cluster(2)
    start = Placement(np.zeros(graph.num_ops), "test")
    _, out, _, stats = refined(graph, cluster, start, seconds=0)
    assert out.same_as(start) and stats.moves_tried == 0


def test_auto_skips_a_refinement_that_one_simulation_would_overrun(caplog):
    graph = graphs.random_dag(1, 60, edge_prob=0.1)
    cluster = graphs.cluster(3)
    assert simulation_work(graph) > 100
    short = place(graph, cluster, PlacementOptions(refine_seconds=100 / WORK_PER_SECOND))  # 100 units
    assert short.refine_stats is None
    assert "refinement skipped: one simulation of 60 ops" in caplog.text
    assert short.makespan_us == min(v for v in short.candidates.values() if v is not None)
    enough = place(graph, cluster, PlacementOptions(refine_seconds=10 * simulation_work(graph) / WORK_PER_SECOND))
    stats = enough.refine_stats
    assert stats is not None and stats.work > simulation_work(graph) // 2
    assert stats.moves_tried + stats.windows_tried > 0  # it refined, not only simulated


@pytest.mark.parametrize("simulations", [30, 50, 80])
def test_a_move_the_budget_cannot_finish_is_dropped_not_run_over(simulations):
    """A move that began just before the budget ran out was simulated to its end: up to one
    simulation more (a 3 s refinement of the 25,841 ops of `make demo` took 5.2 s). Now the work
    stays within the budget but for the last step's few units and a scheduler's restart. (The
    result of window balancing is still simulated to its end: from one device it is the big
    step, and a budget of a few simulations would lose it.)"""
    graph = graphs.random_dag(3, 400, edge_prob=0.02)
    cluster = graphs.cluster(4)
    start = Placement(np.zeros(graph.num_ops, dtype=np.int32), "single")
    seconds = simulations * simulation_work(graph) / WORK_PER_SECOND
    groups, out, schedule, stats = refined(graph, cluster, start, seconds=seconds)
    budget = work_budget(seconds)
    assert stats.moves_tried > 0 and budget <= stats.work < budget + simulation_work(graph) // 8, stats
    assert schedule.makespan_us < simulate(graph, cluster, start).makespan_us
    assert_valid_schedule(graph, cluster, groups, schedule)


def test_the_first_move_resimulates_only_what_it_can_change():
    """The starting schedule keeps its snapshots: moving the last op of a long chain re-runs
    the tail of the schedule, not the whole of it."""
    from baechi_tf.placer.auto.refine import _Simulation

    graph = graphs.chain(200, compute_us=100.0, nbytes=1024)
    cluster = graphs.cluster(2)
    groups = colocation_groups(graph)
    sim = _Simulation(graph, cluster, groups, np.zeros(200, dtype=np.int32))
    assert sim.snapshots
    full = sim.work  # 200 steps, their dry runs, and the scheduler's start
    last = int(groups.group_of[199])
    result = sim.try_move(((last, 0, 1),), float("inf"))
    assert result is not None
    assert result[0].placement.device_of[199] == 1
    restart = 200 // 8
    assert full >= 2 * 200 + restart
    # One snapshot interval re-run, and the moved op's input copied: tried once, then booked
    # (1.5 units each).
    assert sim.work - full <= restart + 2 * (200 // 24 + 1) + 3


def test_moves_leave_the_snapshots_they_start_from_as_they_were():
    """A move re-simulates from a copy of a snapshot patched for it; the copy shares the
    snapshot's per-device heaps until it pushes onto one (a full copy cost O(devices) per
    snapshot, most of a move's time on 200 devices)."""
    import copy

    from baechi_tf.placer.auto.refine import _Simulation

    graph = graphs.random_dag(3, 60, edge_prob=0.08, group_prob=0.2)
    cluster = graphs.cluster(3)
    groups = colocation_groups(graph)
    sim = _Simulation(graph, cluster, groups, place_m_etf(graph, cluster, groups).device_of)
    before = copy.deepcopy(sim.snapshots)
    moved = 0
    for g in range(groups.num_groups):
        d = sim.device_of[int(groups.members[g][0])]
        for to in range(3):
            if to != d:
                moved += sim.try_move(((g, d, to),), float("inf")) is not None
    assert moved > 50
    assert sim.snapshots == before


def test_candidate_moves_are_listed_once_per_accepted_move(monkeypatch):
    """Near a local optimum most random draws were tried already; listing the critical-path
    candidates again for each of them cost seconds on comm-heavy graphs, outside the budget."""
    import baechi_tf.placer.auto.refine as refine_module

    listed = []
    real = refine_module._candidates

    def counting(sim, pinned, targets):
        listed.append(1)
        return real(sim, pinned, targets)

    monkeypatch.setattr(refine_module, "_candidates", counting)
    graph = graphs.random_dag(3, 40, edge_prob=0.2, max_bytes=8 * graphs.MiB)
    cluster = graphs.cluster(3)
    groups = colocation_groups(graph)
    start = Placement(np.arange(40, dtype=np.int32) % 3, "round robin")
    _, _, stats = refine(graph, cluster, groups, start, options=RefineOptions(seconds=1.0))
    assert stats.moves_tried > stats.moves_accepted + 20  # it went on after its last success
    assert len(listed) <= stats.moves_accepted + 1


def _balanced_starts(monkeypatch, graph, cluster, start, alternatives, seconds):
    """(device_of of the placement, overlap, number of windows) of each window balancing."""
    import baechi_tf.placer.auto.refine as refine_module

    calls = []
    real = refine_module.balance_windows

    def recording(graph, cluster, groups, schedule, num_windows, *, overlap, **kw):
        calls.append((tuple(schedule.placement.device_of.tolist()), overlap, num_windows))
        return real(graph, cluster, groups, schedule, num_windows, overlap=overlap, **kw)

    monkeypatch.setattr(refine_module, "balance_windows", recording)
    groups = colocation_groups(graph)
    schedules = [simulate(graph, cluster, a) for a in alternatives]
    refine(graph, cluster, groups, start, options=RefineOptions(seconds), alternatives=schedules)
    return calls


def test_the_start_placement_tries_coarse_windows_first_and_runners_up_fine_ones(monkeypatch):
    """The start placement is already even over fine windows; a runner-up is not."""
    from baechi_tf.placer.auto.refine import _START_WINDOW_SETTINGS, _WINDOW_SETTINGS

    graph = graphs.random_dag(2, 60, edge_prob=0.08)
    cluster = graphs.cluster(3)
    start = place_m_etf(graph, cluster, colocation_groups(graph))
    # The same placement with devices renamed: as fast on identical devices, but distinct.
    other = Placement((start.device_of + 1) % 3, "renamed")
    calls = _balanced_starts(monkeypatch, graph, cluster, start, [other], seconds=0.5)
    first = {}
    for device_of, overlap, num_windows in calls:
        first.setdefault(device_of, (overlap, num_windows))
    assert first[tuple(start.device_of.tolist())] == _START_WINDOW_SETTINGS[0] == (True, 8)
    assert first[tuple(other.device_of.tolist())] == _WINDOW_SETTINGS[0] == (False, 128)


def test_a_runner_up_too_far_behind_for_the_budget_is_not_balanced(monkeypatch):
    """At a small budget a much slower runner-up cannot catch up: its share goes to the start
    placement. A larger budget buys it enough rounds, and it is balanced."""
    graph = graphs.random_dag(2, 60, edge_prob=0.08)
    cluster = graphs.cluster(3)
    start = place_m_etf(graph, cluster, colocation_groups(graph))
    slow = Placement(np.zeros(graph.num_ops, dtype=np.int32), "one device")
    ratio = simulate(graph, cluster, slow).makespan_us / simulate(graph, cluster, start).makespan_us
    assert 1.2 < ratio < 3
    small = 30 * simulation_work(graph) / WORK_PER_SECOND  # two rounds for the runner-up
    calls = _balanced_starts(monkeypatch, graph, cluster, start, [slow], seconds=small)
    assert calls and all(c[0] == tuple(start.device_of.tolist()) for c in calls)
    monkeypatch.undo()
    large = 3000 * simulation_work(graph) / WORK_PER_SECOND  # about 250 rounds
    calls = _balanced_starts(monkeypatch, graph, cluster, start, [slow], seconds=large)
    assert any(c[0] == tuple(slow.device_of.tolist()) for c in calls)


def test_copies_count_as_refinement_work(monkeypatch):
    """On layered graphs, whose ops mostly read from other devices, each dry run books copies
    on the channels: a 3 s refinement made 223k-276k of them and took 5.4-6.8 s (11k-13k and
    2.6-3.4 s on the model profiles). Each copy now counts, so the same budget tries fewer
    moves there."""
    import os
    import sys

    import baechi_tf.placer.work as work_module

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    from layered import layered_graph

    graph = layered_graph(400)
    cluster = graphs.cluster(4)
    groups = colocation_groups(graph)
    start = place_m_etf(graph, cluster, groups)
    tried = []
    for per_copy in (work_module.UNITS_PER_COPY, 0):  # counted, then not
        monkeypatch.setattr(work_module, "UNITS_PER_COPY", per_copy)
        _, schedule, stats = refine(graph, cluster, groups, start, options=RefineOptions(seconds=0.5))
        assert schedule.makespan_us <= simulate(graph, cluster, start).makespan_us
        tried.append(stats.moves_tried + stats.windows_tried)
    assert 0 < tried[0] * 4 < tried[1] * 3, tried  # 32 against 47 when written
