"""Every placer: invariants on the catalogue and random graphs, exact answers, brute force."""

import dataclasses
import itertools
import os
import sys

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import CommCost
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import (
    Groups,
    Placement,
    colocation_groups,
    lower_bound_us,
    simulate,
)
from baechi_tf.placer.m_etf import schedule_m_etf
from baechi_tf.placer.m_topo import place_m_topo
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions, place
from invariants import assert_valid_schedule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from layered import fan_out_graph  # noqa: E402

# expert needs a model's own layout, layers numbered layer scopes (tests/test_layers.py has both)
METHODS = sorted(set(PLACEMENT_METHODS) - {"expert", "layers"})
MULTI = [m for m in METHODS if m != "single"]
FAST = dict(refine_seconds=0.2)  # keeps auto's refinement short in tests

CATALOGUE = {
    "chain": lambda: (graphs.chain(6), graphs.cluster(2)),
    "diamond": lambda: (graphs.diamond(), graphs.cluster(2)),
    "fork_join": lambda: (graphs.fork_join(6), graphs.cluster(4)),
    "independent": lambda: (graphs.independent(5), graphs.cluster(3)),
    "group_cycle": lambda: (graphs.group_cycle(), graphs.cluster(2)),
    "colocated_pair": lambda: (graphs.colocated_pair(), graphs.cluster(2)),
    "too_big_for_one": graphs.too_big_for_one,
}


def run(graph, cluster, method, grouper="tf"):
    result = place(graph, cluster, PlacementOptions(placement_method=method, grouper=grouper, **FAST))
    assert_valid_schedule(graph, cluster, result.groups, result.schedule)
    return result


@pytest.mark.parametrize("name", sorted(CATALOGUE))
@pytest.mark.parametrize("method", MULTI)
@pytest.mark.parametrize("grouper", ["tf", "coplace"])
def test_invariants_on_catalogue(name, method, grouper):
    graph, cluster = CATALOGUE[name]()
    result = run(graph, cluster, method, grouper)
    assert result.makespan_us >= result.lower_bound_us - 1e-6
    # The reported schedule is the simulator's schedule of the placement.
    again = simulate(graph, cluster, result.placement)
    np.testing.assert_allclose(again.end_us, result.schedule.end_us)


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("method", MULTI)
def test_invariants_on_random_graphs(seed, method):
    graph = graphs.random_dag(seed, 25, edge_prob=0.15, group_prob=0.2, persistent_prob=0.3)
    cluster = graphs.cluster(3, memory_bytes=64 << 20)
    run(graph, cluster, method)


@pytest.mark.parametrize("method", METHODS)
def test_deterministic(method):
    graph = graphs.random_dag(7, 40, edge_prob=0.1, group_prob=0.2)
    cluster = graphs.cluster(3)
    a = place(graph, cluster, PlacementOptions(placement_method=method, **FAST))
    b = place(graph, cluster, PlacementOptions(placement_method=method, **FAST))
    assert a.placement.same_as(b.placement)


def test_chain_with_costly_communication_stays_on_one_device():
    graph = graphs.chain(8, compute_us=100, nbytes=64 << 20)  # 64 MiB: ~11.8 ms per transfer
    result = run(graph, graphs.cluster(4), "m_etf")
    assert len(set(result.placement.device_of.tolist())) == 1
    assert result.makespan_us == pytest.approx(800)


def test_independent_branches_spread():
    graph = graphs.independent(4, compute_us=1000)
    result = run(graph, graphs.cluster(4), "m_etf")
    assert sorted(result.placement.device_of.tolist()) == [0, 1, 2, 3]
    assert result.makespan_us == pytest.approx(1000)


def test_fork_join_etf_beats_one_device():
    graph = graphs.fork_join(4, branch_us=5000, nbytes=4096)
    result = run(graph, graphs.cluster(4), "m_etf")
    assert result.makespan_us < result.single_device_makespan_us / 2


def test_m_topo_fills_devices_in_topological_slices():
    # 8 ops of 10 MiB output each, 4 devices: share = 80/4 + 10 = 30 MiB -> 3, 3 and 2 ops.
    graph = graphs.chain(8, nbytes=10 << 20)
    result = run(graph, graphs.cluster(4), "m_topo")
    assert result.placement.device_of.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]


def test_m_topo_moves_on_when_live_memory_is_full():
    # Same chain, devices of 25 MiB: a device holds an op's input copy and its output (20 MiB)
    # but not a third tensor, so every device takes what fits as the chain runs.
    graph = graphs.chain(8, nbytes=10 << 20)
    result = run(graph, graphs.cluster(4, 25 << 20), "m_topo")
    assert result.placement.method == "m_topo"
    assert max(result.schedule.peak_memory_bytes) <= 25 << 20


def test_m_topo_says_a_device_over_its_memory_has_none_free():
    # The weights pinned to GPU:0 already exceed it; c fits nowhere. The error listed GPU:0 as
    # having "-2.00 MiB free".
    b = OpGraphBuilder()
    for name in ("a", "b"):
        b.add_op(name, 10, [4], persistent_bytes=6 << 20, device="/device:GPU:0")
    b.add_op("c", 10, [11 << 20])
    graph, cluster = b.build(), graphs.cluster(2, 10 << 20)
    with pytest.raises(InfeasiblePlacementError) as e:
        place_m_topo(graph, cluster, colocation_groups(graph))
    assert "'c'" in str(e.value) and "GPU:0: 0 B free" in str(e.value) and "-" not in str(e.value).split("(")[-1]
    # Through the pipeline, the reason no placement can fit replaces the method's error (auto's
    # named the op that its first placer, m-TOPO, could not place, not always the one at fault).
    for method in ("m_topo", "auto"):
        with pytest.raises(InfeasiblePlacementError) as e:
            run(graph, cluster, method)
        assert str(e.value).endswith(
            "op 'c' cannot run on any device, whatever else goes there: its group 'c' holds 0 B of "
            "weights and the op 11.00 MiB of outputs, scratch and inputs while it runs, 11.00 MiB in "
            "all, over the 10.00 MiB of the largest device; give the devices more memory (more "
            "devices do not help)"
        ), str(e.value)


def test_graph_too_big_for_one_device_uses_both():
    graph, cluster = graphs.too_big_for_one()
    for method in MULTI:
        result = run(graph, cluster, method)
        dev = dict(zip(graph.names, result.placement.device_of.tolist()))
        assert dev["w0"] != dev["w1"]
        assert result.single_device_makespan_us is None


def test_single_refuses_what_does_not_fit():
    graph, cluster = graphs.too_big_for_one()
    with pytest.raises(InfeasiblePlacementError, match="does not fit on one device"):
        place(graph, cluster, PlacementOptions(placement_method="single"))


def test_auto_on_one_device_is_that_device_s_schedule():
    # The portfolio ran every placer to find the one placement there is, and named the first.
    graph = graphs.fork_join(width=6)
    result = place(graph, graphs.cluster(1), PlacementOptions(placement_method="auto"))
    single = place(graph, graphs.cluster(1), PlacementOptions(placement_method="single"))
    assert result.placement.method == "auto(single)"
    assert result.candidates == {"single": single.makespan_us}
    assert result.makespan_us == single.makespan_us == result.single_device_makespan_us


@pytest.mark.parametrize("method", ["single", "auto"])
def test_a_graph_too_big_for_the_only_device_is_refused_with_that_reason(method):
    # Weights fit the device (120 of 122 MiB), the step does not; "use a multi-device method"
    # was no advice with one device, and auto added the fit search's single try.
    graph, cluster = graphs.too_big_for_one(memory_bytes=122 * 2**20)
    one = dataclasses.replace(cluster, devices=cluster.devices[:1])
    with pytest.raises(InfeasiblePlacementError) as e:
        place(graph, one, PlacementOptions(placement_method=method))
    assert str(e.value).endswith(
        "the graph does not fit on the only device, /device:GPU:0 (122.00 MiB); use more devices or "
        "give it more memory"
    )


@pytest.mark.parametrize("method", MULTI)
def test_pinned_ops_stay_pinned(method):
    b = OpGraphBuilder()
    b.add_op("a", 100, [4])
    b.add_op("b", 100, [4], device="/device:GPU:2")
    b.add_op("c", 100, [4])
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    graph = b.build()
    result = run(graph, graphs.cluster(3), method)
    assert result.placement.device_of[1] == 2


@pytest.mark.parametrize("method", MULTI)
def test_group_that_fits_nowhere(method):
    # Two 60 MiB ops colocated: 120 MiB for devices of 100 MiB.
    b = OpGraphBuilder()
    b.add_op("w0", 1, [4], persistent_bytes=60 << 20, colocation=["w0"])
    b.add_op("w1", 1, [4], persistent_bytes=60 << 20, colocation=["w0"])
    graph = b.build()
    with pytest.raises(InfeasiblePlacementError, match=(
        r"op 'w0' cannot run on any device, whatever else goes there: its group 'w0' holds "
        r"120.00 MiB of weights .* over the 100.00 MiB of the largest device; give the devices more "
        r"memory \(more devices do not help\), or split the group$"
    )):
        place(graph, graphs.cluster(2, 100 << 20), PlacementOptions(placement_method=method, **FAST))



def test_a_placement_slower_than_one_device_is_warned_of(caplog):
    # a and b need no input, so m-ETF starts them at once on two devices, and d waits 134 us for
    # a copy: 5 times one device's 30 us, said nowhere but in the speed-up figure.
    import logging

    b = OpGraphBuilder()
    for name in ("a", "b"):
        b.add_op(name, 10, [4096])
    b.add_op("d", 10, [4])
    b.add_edge("a", "d")
    b.add_edge("b", "d")
    graph = b.build()
    with caplog.at_level(logging.WARNING, logger="baechi_tf.placer.pipeline"):
        result = place(graph, graphs.cluster(2), PlacementOptions(placement_method="m_etf"))
    assert result.makespan_us > 5 * result.single_device_makespan_us
    assert [r.getMessage() for r in caplog.records if "slower than one device" in r.getMessage()] == [
        "m_etf's placement simulates 5.16 times slower than one device (0.155 ms against 0.030 ms: its "
        "transfers cost more than the parallel work gains); --placement_method auto keeps one device "
        "when that is faster"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="baechi_tf.placer.pipeline"):
        place(graph, graphs.cluster(2), PlacementOptions(placement_method="auto"))
    assert not [r for r in caplog.records if "slower than one device" in r.getMessage()]
    # Ops of no time: one device takes 0 us, and a placement with a copy more (the ratio divided
    # by zero: ZeroDivisionError, a traceback, after the placement was made).
    z = OpGraphBuilder()
    for i in range(8):  # a chain with a side op at each link; m-TOPO cuts it in two
        z.add_op(f"a{i}", 0, [4096])
        z.add_op(f"b{i}", 0, [4096])
        z.add_edge(f"a{i}", f"b{i}")
        if i:
            z.add_edge(f"a{i - 1}", f"a{i}")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="baechi_tf.placer.pipeline"):
        result = place(z.build(), graphs.cluster(2), PlacementOptions(placement_method="m_topo"))
    assert result.makespan_us > 0 and result.single_device_makespan_us == 0
    assert [r.getMessage()[:60] for r in caplog.records if "slower than one device" in r.getMessage()] == [
        "m_topo's placement simulates slower than one device (0.135 m"
    ]

def test_etf_waits_for_memory_instead_of_failing():
    # One device of 10 MiB; two independent 6 MiB producers: the original m-ETF asserted here.
    mib = 1 << 20
    b = OpGraphBuilder()
    for x in "ab":
        b.add_op(x, 10, [6 * mib])
        b.add_op("c" + x, 10, [4])
        b.add_edge(x, "c" + x)
    graph = b.build()
    result = run(graph, graphs.cluster(1, 10 * mib), "m_etf")
    assert result.makespan_us == 40


def test_etf_spills_to_the_device_with_room():
    # Two devices of 10 MiB; a 6 MiB op already on GPU:0 leaves no room for another there.
    mib = 1 << 20
    b = OpGraphBuilder()
    b.add_op("a", 1000, [6 * mib], persistent_bytes=0)
    b.add_op("b", 10, [6 * mib])
    b.add_op("j", 10, [4])
    b.add_edge("a", "j")
    b.add_edge("b", "j")
    graph = b.build()
    result = run(graph, graphs.cluster(2, 13 * mib), "m_etf")
    assert result.placement.device_of[0] != result.placement.device_of[1]


def test_unknown_method_and_bad_options():
    graph = graphs.chain()
    with pytest.raises(ConfigError, match="unknown placement method 'm_nope'"):
        place(graph, graphs.cluster(2), PlacementOptions(placement_method="m_nope"))
    with pytest.raises(ConfigError, match=r"^memory_fraction=0 must be in \(0, 1\]$"):
        place(graph, graphs.cluster(2), PlacementOptions(memory_fraction=0))
    # random.Random took both, and -1 as 1: a seed silently gave another seed's placements.
    for seed in (1.5, -1, True):
        with pytest.raises(ConfigError, match=f"seed {seed!r} must be a whole number >= 0"):
            PlacementOptions(seed=seed).validate()
    PlacementOptions(seed=np.int64(7)).validate()


def test_the_engine_option_selects_what_runs_the_list_scheduler(methods):
    from baechi_tf.placer import engine
    from baechi_tf.placer.methods import register_method

    with pytest.raises(ConfigError, match="unknown engine 'gpu'; choose one of native, python"):
        PlacementOptions(engine="gpu").validate()
    seen = []

    def probe(graph, cluster, groups, options):
        seen.append(engine.current())
        return place_m_topo(graph, cluster, groups)

    register_method("probe", probe)
    place(graphs.chain(), graphs.cluster(2), PlacementOptions(placement_method="probe", engine="python"))
    assert seen == ["python"]
    assert engine.current() == ("native" if engine.native_available() else "python")


def test_auto_past_its_time_limit_keeps_the_best_so_far_and_says_so(caplog):
    graph = graphs.random_dag(3, 40, edge_prob=0.2)
    cluster = graphs.cluster(3)
    full = place(graph, cluster, PlacementOptions("auto", refine_seconds=0.2, placement_jobs=1))
    assert full.candidates["m_etf"] is not None and full.refine_stats is not None
    with caplog.at_level("WARNING", logger="baechi_tf.placer.auto"):
        cut = place(graph, cluster, PlacementOptions(
            "auto", refine_seconds=0.2, placement_jobs=1, placement_timeout_s=1e-9
        ))
    # The first placer runs whatever the limit (a placement is needed); no other starts.
    assert cut.placement.method == "auto(single)"
    assert cut.candidates["single"] is not None
    assert all(v is None for k, v in cut.candidates.items() if k != "single")
    assert cut.refine_stats is None
    warned = [r.getMessage() for r in caplog.records if "time limit" in r.getMessage()]
    assert len(warned) == 1 and "not run: packed, m_topo, m_etf" in warned[0], warned
    assert warned[0].rstrip().endswith("drop it for the full search") and "refinement" in warned[0]
    assert cut.makespan_us >= full.makespan_us
    for bad in (0, -1.0, float("inf"), "5", True):
        with pytest.raises(ConfigError, match=f"placement_timeout_s {bad!r} must be a number of seconds > 0"):
            PlacementOptions(placement_timeout_s=bad).validate()


def _capped_m_etf_work(name: str) -> int:
    """m-ETF's work on a fan-out under engine `name`, checked to pass a cap of exactly that
    work and to be stopped by one unit less."""
    from baechi_tf.placer import engine
    from baechi_tf.placer.m_etf import place_m_etf
    from baechi_tf.placer.work import OverWorkCap, metered

    graph = fan_out_graph(300)
    cluster = graphs.cluster(4)
    groups = Groups.singletons(graph)
    with engine.selected(name):
        with metered(float("inf")) as meter:
            whole = place_m_etf(graph, cluster, groups)
        assert meter.used > graph.num_ops  # steps, dry runs and copies
        with metered(meter.used):
            assert place_m_etf(graph, cluster, groups).same_as(whole)
        with pytest.raises(OverWorkCap, match=f"more than {meter.used - 1:,} units of work"):
            with metered(meter.used - 1):
                place_m_etf(graph, cluster, groups)
    return meter.used


def test_a_work_cap_stops_a_run_exactly_when_its_whole_work_passes_it():
    """The engines check the cap at different steps; what they stop, and the work they count,
    must not differ."""
    from baechi_tf.placer import engine

    used = _capped_m_etf_work("python")
    if not engine.native_available():
        pytest.skip("the compiled core is not built (test_engines fails when a compiler is there)")
    assert _capped_m_etf_work("native") == used


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_auto_work_bounds_the_placers_and_keeps_the_placement_the_same(jobs, caplog):
    """Each placer after the first ones gets an equal share of half of --auto_work: one that
    would pass it is stopped, in this process or a worker alike."""
    graph = graphs.random_dag(5, 60, edge_prob=0.2)
    cluster = graphs.cluster(3)
    full = place(graph, cluster, PlacementOptions("auto", refine_seconds=0.2, placement_jobs=jobs))
    assert full.candidates["m_etf"] is not None
    with caplog.at_level("INFO", logger="baechi_tf.placer.auto"):
        small = place(graph, cluster, PlacementOptions(
            "auto", refine_seconds=0.2, placement_jobs=jobs, auto_work=2000
        ))
    # one device and the packing run whatever the cap (a placement is needed); m-ETF could not
    assert small.candidates["single"] is not None and small.candidates["m_etf"] is None
    assert "auto: m_etf stopped: its list-scheduler runs would take more than" in caplog.text
    assert small.makespan_us >= full.makespan_us
    again = place(graph, cluster, PlacementOptions(
        "auto", refine_seconds=0.2, placement_jobs=3 - jobs, auto_work=2000
    ))
    assert again.placement.same_as(small.placement) and again.candidates == small.candidates
    caplog.clear()
    with caplog.at_level("WARNING", logger="baechi_tf.placer.auto"):
        tiny = place(graph, cluster, PlacementOptions("auto", placement_jobs=jobs, auto_work=200))
    assert tiny.refine_stats is None
    assert "refinement skipped: one simulation of 60 ops takes more than the" in caplog.text
    assert "left to it of --auto_work; raise --auto_work to refine" in caplog.text
    for bad in (0, -5, 1.5, True, "100"):
        with pytest.raises(ConfigError, match=f"auto_work {bad!r} must be a whole number of units > 0"):
            PlacementOptions(auto_work=bad).validate()


def test_error_names_the_step():
    b = OpGraphBuilder()
    b.add_op("a", 1, [4], device="/device:GPU:9")
    with pytest.raises(ConfigError, match=r"step 'place' failed \(after validate, group\).*GPU:9"):
        place(b.build(), graphs.cluster(2), PlacementOptions())


# ---------------------------------------------------------------- brute force


def brute_force_best(graph, cluster, groups):
    """Lowest simulated makespan over every assignment of groups to devices that fits."""
    best = float("inf")
    for choice in itertools.product(range(cluster.num_devices), repeat=groups.num_groups):
        device_of = np.asarray(choice)[groups.group_of]
        try:
            s = simulate(graph, cluster, Placement(device_of, "brute"))
        except InfeasiblePlacementError:
            continue
        best = min(best, s.makespan_us)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_brute_force_on_small_random_dags(seed):
    n = 3 + seed % 5  # 3..7 ops
    graph = graphs.random_dag(seed, n, edge_prob=0.35, max_bytes=4 << 20, group_prob=0.15)
    cluster = graphs.cluster(2 + seed % 2, comm=CommCost(0.0001754, 134))
    groups = colocation_groups(graph)
    best = brute_force_best(graph, cluster, groups)
    bound = lower_bound_us(graph, cluster)
    assert best >= bound - 1e-6
    for method in METHODS:
        result = place(graph, cluster, PlacementOptions(placement_method=method, **FAST))
        assert_valid_schedule(graph, cluster, result.groups, result.schedule)
        # No placer beats the best assignment, and none is below the lower bound.
        assert result.makespan_us >= best - 1e-6, method
        assert result.makespan_us >= bound - 1e-6, method


def test_brute_force_finds_etf_optimal_on_fork_join():
    graph = graphs.fork_join(3, branch_us=2000, nbytes=4)
    cluster = graphs.cluster(3)
    best = brute_force_best(graph, cluster, Groups.singletons(graph))
    result = place(graph, cluster, PlacementOptions(placement_method="m_etf"))
    assert result.makespan_us == pytest.approx(best)


def test_auto_runs_the_coarse_group_placers_on_small_graphs_only(monkeypatch):
    from baechi_tf.placer.auto import candidates

    graph = graphs.random_dag(2, 30, edge_prob=0.1)
    cluster = graphs.cluster(3)
    small = place(graph, cluster, PlacementOptions(refine_seconds=0))
    assert {"m_etf+coplace", "heft+coplace"} <= set(small.candidates)
    monkeypatch.setattr(candidates, "_AUTO_COARSE_MAX_OPS", graph.num_ops - 1)
    large = place(graph, cluster, PlacementOptions(refine_seconds=0))
    assert not any("+coplace" in name for name in large.candidates)
    assert "m_etf" in large.candidates


def test_auto_stops_only_placements_that_could_not_be_of_use():
    # The placements of m-ETF, m-TOPO and the others end far later than one device's: auto stops
    # them once their schedules pass what refinement could still use (and m-ETF's quadratic run
    # with them). Each stopped method, run alone, is indeed that slow.
    from baechi_tf.placer.auto.refine import alternative_reach

    graph, cluster = fan_out_graph(302), graphs.cluster(4)  # 100 fans
    result = place(graph, cluster, PlacementOptions(refine_seconds=0.5))
    assert_valid_schedule(graph, cluster, result.groups, result.schedule)
    stopped = {m for m, us in result.candidates.items() if us is None}
    assert {"m_topo", "m_etf", "m_sct"} <= stopped
    best = min(us for us in result.candidates.values() if us is not None)
    assert result.makespan_us <= best <= result.single_device_makespan_us == 5 * 100 + 105
    reach = alternative_reach(graph, 0.5)
    for m in stopped & set(PLACEMENT_METHODS):
        alone = place(graph, cluster, PlacementOptions(placement_method=m))
        assert alone.makespan_us > reach * best, m


@pytest.mark.parametrize("seed", range(6))
def test_auto_is_not_simulated_again_for_the_check(monkeypatch, seed):
    """auto hands its schedule to the check (a simulation of 100k ops takes seconds); the
    result's schedule is exactly the simulator's. m-ETF and one device hand over the schedule
    their run built; other methods are simulated by the check."""
    import baechi_tf.placer.check as check_module

    simulated = []
    real = check_module.simulate

    def counting(graph, cluster, placement):
        simulated.append(placement.method)
        return real(graph, cluster, placement)

    monkeypatch.setattr(check_module, "simulate", counting)
    graph = graphs.random_dag(
        seed, 30, edge_prob=0.2, group_prob=0.2, pin_prob=0.1, num_devices=3, persistent_prob=0.3,
        max_bytes=8 * graphs.MiB,
    )
    cluster = graphs.cluster(3, memory_bytes=96 * graphs.MiB)
    result = place(graph, cluster, PlacementOptions("auto", refine_seconds=0.2))
    assert simulated == []
    again = simulate(graph, cluster, result.placement)
    np.testing.assert_array_equal(again.start_us, result.schedule.start_us)
    np.testing.assert_array_equal(again.end_us, result.schedule.end_us)
    assert again.transfers == result.schedule.transfers
    assert again.peak_memory_bytes == result.schedule.peak_memory_bytes
    etf = place(graph, cluster, PlacementOptions("m_etf"))
    own = schedule_m_etf(graph, cluster, etf.groups)
    np.testing.assert_array_equal(own.start_us, etf.schedule.start_us)
    assert own.transfers == etf.schedule.transfers
    assert own.peak_memory_bytes == etf.schedule.peak_memory_bytes
    single = place(graph, graphs.cluster(3), PlacementOptions("single"))  # it fits 1 GiB
    assert single.single_device_makespan_us == single.makespan_us
    assert simulated == []
    place(graph, cluster, PlacementOptions("m_topo"))
    assert simulated == ["m_topo"]


def test_check_refuses_a_schedule_of_another_placement():
    from baechi_tf.placer import check_placement

    graph = graphs.fork_join(4)
    cluster = graphs.cluster(2)
    groups = colocation_groups(graph)
    spread = Placement(np.arange(graph.num_ops, dtype=np.int32) % 2, "spread")
    other = simulate(graph, cluster, Placement(np.zeros(graph.num_ops, dtype=np.int32), "one"))
    with pytest.raises(ValueError, match="another placement"):
        check_placement(graph, cluster, groups, spread, other)
    mine = simulate(graph, cluster, spread)
    assert check_placement(graph, cluster, groups, spread, mine) is mine


def test_m_topo_nonuniform_fills_each_device_to_its_capacity_in_turn():
    # The original's variant: m-TOPO's uniform cap is an equal share of the graph's memory;
    # without it each device takes topological slices until the next group does not fit.
    b = OpGraphBuilder()
    for i in range(12):
        b.add_op(f"op{i}", 10.0, [100], persistent_bytes=1000)  # weights: held all step
        if i:
            b.add_edge(f"op{i - 1}", f"op{i}")
    g = b.build()
    roomy = graphs.cluster(3, memory_bytes=1 << 30)
    uniform = place(g, roomy, PlacementOptions(placement_method="m_topo")).placement
    assert len(set(uniform.device_of.tolist())) == 3
    filled = place(g, roomy, PlacementOptions(placement_method="m_topo_nonuniform")).placement
    assert filled.method == "m_topo_nonuniform" and set(filled.device_of.tolist()) == {0}
    # 5,000 bytes a device: the weights of four or five ops fill one, the next goes on.
    tight = graphs.cluster(3, memory_bytes=5000)
    device_of = place(g, tight, PlacementOptions(placement_method="m_topo_nonuniform")).placement.device_of
    counts = np.bincount(device_of, minlength=3).tolist()
    assert device_of.tolist() == sorted(device_of.tolist()) and counts[0] >= 4 and counts[2] > 0, counts


@pytest.mark.parametrize("method", ["m_etf_reserve", "m_sct_reserve"])
def test_the_originals_reserve_methods_are_named_as_not_ported(method):
    with pytest.raises(ConfigError, match=f"'{method}' is the original's, not ported: .* Use {method[:5]}"):
        PlacementOptions(placement_method=method).validate()


def test_fusion_path_check_reaches_fusion(caplog):
    import logging

    # u -> v with another successor of u and another predecessor of v (of other groups, never
    # merged), but no second path u ~> v: the conservative rule refuses the merge, the exact check
    # makes it.
    b = OpGraphBuilder()
    for name, group in (("u", "g"), ("v", "g"), ("w", "w"), ("x", "x")):
        b.add_op(name, 10.0, [100], colocation=[group])
    for u, v in (("u", "v"), ("u", "w"), ("x", "v")):
        b.add_edge(u, v)
    g = b.build()
    fused = {}
    for check in ("exact", "conservative"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="baechi_tf.placer.pipeline"):
            place(g, graphs.cluster(2), PlacementOptions("m_etf", placer_type="fusion", fusion_path_check=check))
        fused[check] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fusion")]
    sizes = {}
    for check, messages in fused.items():
        assert len(messages) == 1 and messages[0].startswith(f"fusion ({check} path check): 4 ops into ")
        sizes[check] = int(messages[0].rsplit(" ", 1)[1])
    assert sizes == {"exact": 3, "conservative": 4}
    with pytest.raises(ConfigError, match="unknown fusion path check 'fast'"):
        PlacementOptions(fusion_path_check="fast").validate()


def test_auto_runs_the_models_own_layout_when_it_has_one():
    from baechi_tf.placer.simulator import simulate

    g = graphs.fork_join(4)
    c = graphs.cluster(2)
    layout = {name: c.names[i % 2] for i, name in enumerate(g.names)}
    expert = place(g, c, PlacementOptions("expert", expert=layout))
    assert expert.placement.device_of.tolist() == [i % 2 for i in range(g.num_ops)]
    auto = place(g, c, PlacementOptions("auto", expert=layout, refine_seconds=0))
    assert auto.candidates["expert"] == pytest.approx(simulate(g, c, expert.placement).makespan_us)
    assert "expert" not in place(g, c, PlacementOptions("auto", refine_seconds=0)).candidates
    # Without a layout, the error says how to give one (it said "this graph has none").
    with pytest.raises(ConfigError, match=r"'expert' needs a hand layout and none was given: give "
                       r"PlacementOptions\(expert=\{op name: device name\}\)"):
        place(g, c, PlacementOptions("expert"))


def test_far_more_devices_than_groups_is_a_warning(caplog):
    # m-ETF on 10,000 devices for a 618-op graph ran for minutes without a word: every device is
    # weighed for every op, and at most one per group can be used.
    graph = graphs.independent(8, compute_us=10)
    with caplog.at_level("WARNING", logger="baechi_tf.placer.pipeline"):
        place(graph, graphs.cluster(4), PlacementOptions(placement_method="m_etf"))
        assert not caplog.records  # a small graph on a few devices says nothing
        result = place(graph, graphs.cluster(100), PlacementOptions(placement_method="m_etf"))
    assert [r.getMessage() for r in caplog.records] == [
        "100 devices for 8 groups of ops: a placement uses at most 8 of them, and the tables of the "
        "links between devices grow with the square of their number (slow with thousands); ask for "
        "fewer devices"
    ]
    assert len(set(result.placement.device_of.tolist())) <= 8


@pytest.mark.slow
def test_thousands_of_devices_beyond_the_groups_are_refused_before_any_work():
    # 3,000 devices for a 97-op graph took 11 s and 850 MB to place on one device, 20,000 ran
    # out of memory: the link tables and the placers' weighing grow with the square of the devices.
    graph = graphs.independent(8, compute_us=10)
    many = graphs.cluster(20_000)
    with pytest.raises(
        ConfigError,
        match=r"^20000 devices for 8 groups of ops: a placement uses at most 8 of them, .* ask for "
        r"at most 1024 devices$",
    ):
        place(graph, many, PlacementOptions(placement_method="single"))
    assert "_links" not in vars(many)  # refused before the link tables were made
    result = place(graph, graphs.cluster(1024), PlacementOptions(placement_method="single"))
    assert result.placement.device_of.tolist() == [0] * 8  # up to the limit: placed, with the warning


@pytest.mark.parametrize("placer_type", ["default", "fusion"])
def test_auto_simulates_one_device_once(monkeypatch, placer_type):
    # auto's one-device candidate was simulated by `single` and again by auto, and the same
    # placement a third time for the baseline (1.5 s of `make demo`'s 16 s placement). With
    # fusion the candidate is of the fused graph, so the baseline has its own simulation.
    from baechi_tf.placer import simulator

    graph, cluster = graphs.random_dag(7, 80, edge_prob=0.08), graphs.cluster(3)
    runs = []
    simulate = simulator.simulate

    def counting(g, c, placement, **kwargs):
        runs.append((g.num_ops, placement.method))
        return simulate(g, c, placement, **kwargs)

    monkeypatch.setattr(simulator, "simulate", counting)
    monkeypatch.setattr("baechi_tf.placer.auto.portfolio.simulate", counting)
    result = place(graph, cluster, PlacementOptions(placer_type=placer_type, refine_seconds=0.1))
    one = [r for r in runs if r == (graph.num_ops, "single")]
    fresh = simulator.single_device_schedule(graph, cluster, result.groups).makespan_us
    assert result.single_device_makespan_us == fresh
    if placer_type == "default":
        assert len(one) == 1, runs
        assert result.candidates["single"] == fresh
    else:  # the fused graph's one device, judged on the real graph; one device unfused; the baseline
        assert len(one) >= 3, runs


@pytest.mark.parametrize("method", METHODS)
def test_a_group_no_device_can_hold_is_refused_before_any_placer_runs(method, caplog):
    # It was found only after every placer had failed (auto's portfolio and m-SCT's LP ran
    # first), and `single` said to use a multi-device method, which cannot help.
    b = OpGraphBuilder()
    b.add_op("weights", 10.0, [1 << 20], persistent_bytes=3 << 30)
    for i in range(40):
        b.add_op(f"op{i}", 100.0, [1 << 20])
        b.add_edge("weights" if i == 0 else f"op{i - 1}", f"op{i}")
    caplog.set_level("DEBUG", logger="baechi_tf")
    with pytest.raises(InfeasiblePlacementError) as e:
        place(b.build(), graphs.cluster(4, memory_bytes=2 << 30), PlacementOptions(method, **FAST))
    assert "'weights' cannot run on any device, whatever else goes there" in str(e.value)
    assert "more devices do not help" in str(e.value)
    placers = [r for r in caplog.records if r.name.startswith(("baechi_tf.sct", "baechi_tf.placer."))]
    assert not placers, [r.getMessage() for r in placers]


def test_auto_s_last_resort_passes_over_a_placer_that_gives_up(monkeypatch):
    """When auto, the packing and the fit search all fail, the other placers are tried; in auto
    m-SCT gives up (SolverError) on an LP piece above its limit, which must pass it over, not end
    the placement (GNMT v2 and MobileNetV2 under a tight limit did)."""
    from baechi_tf.errors import SolverError
    from baechi_tf.placer import colocation_groups, ladder, methods

    graph = graphs.random_dag(2, 40, edge_prob=0.2)
    cluster = graphs.cluster(3)
    groups = colocation_groups(graph)
    options = PlacementOptions(placement_method="auto")
    monkeypatch.setattr(methods, "_AUTO_MAX_LP_ARCS", 1)  # every LP piece is above the limit
    with pytest.raises(SolverError):
        methods.current()["m_sct"].place(graph, cluster, groups, options)
    fitting = ladder.others_that_fit(graph, cluster, groups, "auto", options)
    names = [name for _, name, _ in fitting]
    assert "m_sct" not in names and "m_etf" in names
    for makespan, name, placement in fitting:
        assert makespan == pytest.approx(simulate(graph, cluster, placement).makespan_us)


def _two_chains():
    """a1 (10 us, 1 MiB) -> a2 (10 us, 4 B); b1 (10 us, 1 MiB) -> b2 (10 us, 4 B). Ties by op id
    run a1 then b1 when memory allows: both MiB held at once."""
    MiB = graphs.MiB
    b = OpGraphBuilder()
    for name, out in [("a1", MiB), ("b1", MiB), ("a2", 4), ("b2", 4)]:
        b.add_op(name, 10, [out])
    b.add_edge("a1", "a2")
    b.add_edge("b1", "b2")
    return b.build()


def test_a_placement_that_fits_only_because_ops_wait_for_memory_is_warned_of(caplog):
    """On one device of 1.5 MiB the simulator runs a1, then holds b1 back until a2 has freed
    a1's MiB: a peak of 1 MiB and 8 bytes, within the device. TensorFlow does not hold ops back:
    run as soon as they are ready (a1, b1, a2, b2), they peak at 2 MiB and 4 bytes, above it.
    The result keeps that peak, and a warning names the device; on a device that holds the
    whole graph no op can wait, and no second simulation runs."""
    import logging

    MiB = graphs.MiB
    from baechi_tf.cluster import Cluster, Device

    graph = _two_chains()
    tight = Cluster((Device("/device:GPU:0", MiB + MiB // 2),))
    with caplog.at_level(logging.WARNING, logger="baechi_tf.placer.pipeline"):
        result = place(graph, tight, PlacementOptions(placement_method="single"))
    assert result.schedule.peak_memory_bytes == (MiB + 8,)
    assert result.unheld_peak_bytes == (2 * MiB + 4,)
    warned = [r.getMessage() for r in caplog.records if "holds ops back" in r.getMessage()]
    assert len(warned) == 1 and "peaks at 2.00 MiB on /device:GPU:0 (of 1.50 MiB)" in warned[0], warned
    caplog.clear()
    roomy = Cluster((Device("/device:GPU:0", 8 * MiB),))
    with caplog.at_level(logging.WARNING, logger="baechi_tf.placer.pipeline"):
        result = place(graph, roomy, PlacementOptions(placement_method="single"))
    assert result.unheld_peak_bytes is None
    assert not [r for r in caplog.records if "holds ops back" in r.getMessage()]


def test_a_schedule_that_can_hold_no_op_back_gives_its_own_peak_as_run():
    """Six ops of 1 MiB in a chain on one device of 4 MiB: the device does not hold the whole
    graph (6 MiB), but its peak (2 MiB) and the largest allocation of an op (1 MiB) fit, so no op
    can have waited for memory: the peak as run is the schedule's own, which a simulation with
    memory to spare gives too. At 2.5 MiB an op may have waited, and the pipeline simulates."""
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.placer.pipeline import _none_held_back, memory_as_run

    MiB = graphs.MiB
    graph = graphs.chain(6, compute_us=10, nbytes=graphs.MiB)  # 2 MiB held at most
    roomy = Cluster((Device("/device:GPU:0", 8 * MiB),))
    for capacity, held_back_possible in ((4 * MiB, False), (5 * MiB // 2, True)):
        cluster = Cluster((Device("/device:GPU:0", capacity),))
        result = place(graph, cluster, PlacementOptions(placement_method="single"))
        schedule = result.schedule
        assert graph.total_bytes > capacity and schedule.peak_memory_bytes == (2 * MiB,)
        assert _none_held_back(graph, cluster, schedule) is not held_back_possible
        as_run = simulate(graph, roomy, schedule.placement).peak_memory_bytes
        assert memory_as_run(graph, cluster, schedule.placement, schedule) == tuple(as_run)
        assert result.unheld_peak_bytes == tuple(as_run)


def test_an_op_that_reads_from_another_device_may_wait_for_its_copy_too():
    """The chain of six placed on two devices in turn: each op but the first allocates its output
    and the copy of its input, 2 MiB, so a device whose peak leaves 1.5 MiB free may hold one
    back, and one that leaves 2 MiB may not."""
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.placer.pipeline import _none_held_back

    MiB = graphs.MiB
    graph = graphs.chain(6, compute_us=10, nbytes=graphs.MiB)  # 2 MiB held at most
    placement = Placement(np.array([0, 1, 0, 1, 0, 1], dtype=np.int32), "expert")
    roomy = Cluster((Device("/device:GPU:0", 8 * MiB), Device("/device:GPU:1", 8 * MiB)))
    schedule = simulate(graph, roomy, placement)
    peak = max(schedule.peak_memory_bytes)
    for free, held_back_possible in ((3 * MiB // 2, True), (2 * MiB, False)):
        cluster = Cluster(tuple(Device(f"/device:GPU:{d}", peak + free) for d in range(2)))
        assert _none_held_back(graph, cluster, schedule) is not held_back_possible


def test_the_summary_shows_the_peak_with_no_op_held_back_where_it_differs():
    """The two chains of `_two_chains` on a device of 1.5 MiB: 1 MiB (and 8 B) simulated, 2 MiB
    with no op held back, in a column of its own; on 8 MiB the peaks are the same, and the column
    is left out. The chains' heads may run in either order, so the peak with ops out of the
    simulated order (`reordered_peak_bytes`) is 2 MiB as well, beside the simulated one."""
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.report import summary_table

    MiB = graphs.MiB
    graph = _two_chains()
    tight = summary_table(place(graph, Cluster((Device("/device:GPU:0", MiB + MiB // 2),)),
                                PlacementOptions(placement_method="single")))
    header, row = tight.splitlines()[:2]
    assert header.endswith("peak memory  peak, reordered  capacity  peak, no op held back"), header
    assert row.split()[-8:] == ["1.00", "MiB", "2.00", "MiB", "1.50", "MiB", "2.00", "MiB"], row
    roomy = summary_table(place(graph, Cluster((Device("/device:GPU:0", 8 * MiB),)),
                                PlacementOptions(placement_method="single")))
    assert "held back" not in roomy
