"""The compiled scheduling engine gives exactly the Python engine's schedules (`engine`).

Every comparison runs one schedule on each engine: the simulator (`simulate`, FixedPolicy),
m-ETF (`run_with_headroom`, EarliestStartPolicy, twins weighed once) and m-SCT
(`run_with_headroom`, FavouriteChildPolicy, with the LP's favourite children and with children
drawn at random among each op's successors), and asserts the same placement, the same start and
end of every op bit for bit, the same transfers, peak memory and order, and the same units of
work (`work`), or the same error (type and message) when memory runs out or the cutoff is
passed. Graphs: hypothesis's random DAGs (1-60 ops, 1-8 devices, tight and loose memory, pins,
groups, free and dear links, hosts and unequal memories that make sets of twins, devices that
send on their compute thread among devices that do not, links whose latency overlaps (only the
bytes hold the channels), devices that share memory with their task's others among one that does
not, outputs that reuse an input's buffer or view persistent memory), every graph of
tests/graphs.py, the graphs of bench/quality_graphs.py and the queueing graphs of
bench/layered.py.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import math
import os
import random
import shutil
import struct
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphs
from baechi_tf.cluster import Cluster, CommCost, Device, GiB
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import Groups, Placement, colocation_groups, engine, simulate
from baechi_tf.placer import list_scheduler, native_scheduler, scheduler_state, tail_queues
from baechi_tf.placer.headroom import run_with_headroom
from baechi_tf.placer.policies import EarliestStartPolicy, ScheduleCutOff
from baechi_tf.placer.scheduler_state import _close_in
from baechi_tf.placer.twins import UntouchedTwins
from baechi_tf.placer.m_sct import FavouriteChildPolicy, MSCTOptions, favourite_children_of
from baechi_tf.placer.work import metered

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from layered import (  # noqa: E402
    colocated_gathers_graph,
    colocated_updates_graph,
    fan_out_graph,
    layered_graph,
)
from quality_graphs import cases  # noqa: E402

MiB = graphs.MiB

native = pytest.mark.skipif(
    not engine.native_available(),
    reason="the compiled scheduling core is not built (no C++ compiler at install time): only "
    "the Python engine runs; test_a_cpp_compiler_means_the_core_is_built guards the build",
)


# ---------------------------------------------------------------- the engine switch


def test_a_cpp_compiler_means_the_core_is_built():
    """A broken build must not hide behind the skips below: with a C++ compiler on PATH, `pip
    install -e .` builds the core."""
    compilers = [c for c in ("c++", "g++") if shutil.which(c)]
    if not compilers:
        pytest.skip("no C++ compiler on PATH: the Python engine is the one that runs here")
    assert engine.native_available(), (
        f"{compilers[0]} is on PATH but baechi_tf.placer._native is missing or stale: run "
        "`pip install -e . -v` and read why the extension did not build"
    )


def test_native_is_the_default_and_selected_restores_it():
    assert engine.ENGINES == ("native", "python")
    with engine.selected("python"):
        assert engine.current() == "python"
        with engine.selected("native"):
            assert engine.current() == ("native" if engine.native_available() else "python")
        assert engine.current() == "python"
    assert engine.current() == ("native" if engine.native_available() else "python")


def test_an_unknown_engine_names_the_choices():
    with pytest.raises(ConfigError, match="unknown scheduling engine 'rust'.*native, python"):
        with engine.selected("rust"):
            pass


def test_without_the_core_python_runs_and_one_warning_says_how_to_fix_it(monkeypatch, caplog):
    monkeypatch.setattr(engine, "_state", [True, None, False])  # imported, missing, not warned
    with caplog.at_level(logging.WARNING, logger=engine.__name__):
        assert engine.current() == "python"
        assert engine.current() == "python"
        schedule = simulate(graphs.chain(3), graphs.cluster(2), Placement(np.zeros(3, np.int32), "one"))
    assert schedule.makespan_us == 300.0
    lines = [r.getMessage() for r in caplog.records if r.name == engine.__name__]
    assert len(lines) == 1
    assert "compiled scheduling core" in lines[0] and "python engine" in lines[0]
    assert "C++ compiler" in lines[0] and "pip install -e ." in lines[0]
    assert not engine.native_available()


# ---------------------------------------------------------------- comparing engines


def _hex(x: float) -> str:
    return struct.pack("<d", x).hex()  # bit for bit: 0.0 and -0.0 differ


def _outcome(run):
    """What a schedule is, bit for bit, or the error's type and message; and the units of work
    of the runs made (`work.metered`), last."""
    with metered(math.inf) as meter:
        try:
            s = run()
        except (InfeasiblePlacementError, ScheduleCutOff) as e:
            return type(e).__name__, str(e), meter.used
    return (
        s.placement.device_of.tolist(),
        s.placement.method,
        s.start_us.tobytes(),
        s.end_us.tobytes(),
        [(t.tensor, t.src_device, t.dst_device, _hex(t.start_us), _hex(t.end_us),
          tuple(type(v).__name__ for v in vars(t).values())) for t in s.transfers],
        [(type(p).__name__, p) for p in s.peak_memory_bytes],
        s.order.tolist(),
        s.start_us.dtype, s.end_us.dtype, s.order.dtype, s.placement.device_of.dtype,
        meter.used,
    )


@contextlib.contextmanager
def _counting_native():
    """Counts the compiled schedulers made meanwhile."""
    calls = []
    init = native_scheduler.NativeListScheduler.__init__

    def counted(self, *args, **kwargs):
        calls.append(1)
        init(self, *args, **kwargs)

    native_scheduler.NativeListScheduler.__init__ = counted
    try:
        yield calls
    finally:
        native_scheduler.NativeListScheduler.__init__ = init


def _same(run, *, compiled: bool = True):
    """Runs `run` on both engines and asserts the same outcome; returns it. `compiled`: the
    native run must have gone through the compiled core (not a fallback)."""
    with engine.selected("python"):
        python = _outcome(run)
    with _counting_native() as calls:
        with engine.selected("native"):
            compiled_out = _outcome(run)
    assert compiled_out == python
    if compiled:
        assert calls, "the compiled core did not run"
    return python


def _m_etf(graph, cluster, groups=None, *, cutoff_us=float("inf")):
    groups = groups if groups is not None else colocation_groups(graph)
    return lambda: run_with_headroom(
        graph, cluster, groups, EarliestStartPolicy, method="m_etf", cutoff_us=cutoff_us
    )


def _m_sct(graph, cluster, child, groups=None, *, cutoff_us=float("inf")):
    groups = groups if groups is not None else colocation_groups(graph)
    return lambda: run_with_headroom(
        graph, cluster, groups, lambda: FavouriteChildPolicy(child, cluster.num_devices),
        method="m_sct", cutoff_us=cutoff_us,
    )


def _children(graph, cluster, seed):
    """The favourite children m-SCT's LP gives (HiGHS); children drawn among each op's
    successors (four in five ops have one), which reserve devices far more often; and children
    drawn among all ops, as the policy allows, with which an op held in a device's pool can
    become the child the device is kept for (`_queue_bound`'s exempt member)."""
    lp = favourite_children_of(graph, cluster, MSCTOptions(lp_solver="highs")).tolist()
    rng = random.Random(seed)
    drawn = [rng.choice(s) if s and rng.random() < 0.8 else -1 for s in graph.successors]
    n = graph.num_ops
    anyone = [rng.randrange(n) if rng.random() < 0.8 else -1 for _ in range(n)]
    return lp, drawn, anyone


def _simulate(graph, cluster, device_of, *, cutoff_us=float("inf")):
    placement = Placement(np.asarray(device_of, dtype=np.int32), "given")
    return lambda: simulate(graph, cluster, placement, cutoff_us=cutoff_us)


def _spread(graph, cluster, seed):
    """A random placement that keeps pins where pinned (the simulator runs it as given)."""
    rng = random.Random(seed)
    out = [rng.randrange(cluster.num_devices) for _ in range(graph.num_ops)]
    for op, name in enumerate(graph.pinned_device):
        dev = cluster.find(name) if name is not None else None
        if dev is not None:
            out[op] = dev
    return out


def _compare_all(graph, cluster, seed=0, *, cutoffs=True):
    """m-ETF, m-SCT (`_children`), the simulation of m-ETF's placement and of a random one, and
    all with cutoffs."""
    for child in _children(graph, cluster, seed):
        msct = _same(_m_sct(graph, cluster, child))
        if cutoffs and isinstance(msct[0], list) and graph.num_ops:
            end = float(np.frombuffer(msct[3]).max())
            _same(_m_sct(graph, cluster, child, cutoff_us=end * 0.6))
    metf = _same(_m_etf(graph, cluster))
    runs = [_spread(graph, cluster, seed)]
    if isinstance(metf[0], list):
        runs.append(metf[0])
    for device_of in runs:
        out = _same(_simulate(graph, cluster, device_of))
        if cutoffs and not isinstance(out[0], str) and graph.num_ops:
            end = float(np.frombuffer(out[3]).max())
            _same(_simulate(graph, cluster, device_of, cutoff_us=end / 2))
    if cutoffs and isinstance(metf[0], list) and graph.num_ops:
        end = float(np.frombuffer(metf[3]).max())
        _same(_m_etf(graph, cluster, cutoff_us=end * 0.6))
    return metf


# ---------------------------------------------------------------- random DAGs


def _senders(nd: int, memory_bytes: int, comm: CommCost = CommCost()) -> Cluster:
    """nd devices of one task each, devices 0, 2, ... sending on their compute thread (as CPU
    worker tasks do); GPU names, so that tests/graphs.py's pins find them."""
    return Cluster(tuple(
        Device(f"/job:worker/replica:0/task:{i}/device:GPU:{i}", memory_bytes,
               sends_on_compute=i % 2 == 0) for i in range(nd)
    ), comm)


def _cluster(kind: str, nd: int, memory_bytes: int, comm: CommCost) -> Cluster:
    if kind == "hosts" and nd >= 2:  # two hosts: twins per host, copies between them dearer
        half = nd // 2
        devices = [
            Device(f"/job:worker/replica:0/task:{0 if i < half else 1}/device:GPU:{i}", memory_bytes)
            for i in range(nd)
        ]
        # As between TF worker tasks, only the link between the hosts may overlap fixed costs.
        return Cluster(tuple(devices), dataclasses.replace(comm, copies_in_flight=1), CommCost(
            comm.slope_us_per_byte * 10, comm.intercept_us * 3 + 1, copies_in_flight=comm.copies_in_flight
        ))
    if kind == "senders" and nd >= 2:  # devices 0, 2, ... send on their compute thread
        return _senders(nd, memory_bytes, comm)
    if kind == "shared" and nd >= 2:  # two tasks whose devices share memory, but device 1's
        return Cluster(tuple(
            Device(f"/job:worker/replica:0/task:{i % 2}/device:GPU:{i}", memory_bytes, shared_memory=i != 1)
            for i in range(nd)
        ), comm)
    if kind == "unequal" and nd >= 2:  # every third device has a quarter of the memory
        return Cluster(tuple(
            Device(f"/device:GPU:{i}", memory_bytes // 4 if i % 3 == 2 else memory_bytes) for i in range(nd)
        ))
    return graphs.cluster(nd, memory_bytes=memory_bytes, comm=comm)


@st.composite
def _cases(draw):
    n = draw(st.integers(1, 60))
    nd = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    integer_times = draw(st.booleans())  # starts coincide and ties decide
    group_prob = draw(st.sampled_from([0.0, 0.1, 0.3]))
    pin_prob = draw(st.sampled_from([0.0, 0.05, 0.2]))
    persistent_prob = draw(st.sampled_from([0.0, 0.1, 0.3]))
    edge_prob = draw(st.sampled_from([0.05, 0.15, 0.4]))
    sizes = draw(st.sampled_from([[4], [4096], [4, 4096, MiB], [MiB, 4 * MiB]]))
    b = OpGraphBuilder()
    outputs = [rng.randint(1, 2) for _ in range(n)]
    root, pin = [], {}  # ops colocated share their group's pin, if any
    for i in range(n):
        colocation = ()
        if i and rng.random() < group_prob:
            colocation = (f"op{rng.randrange(i)}",)
            root.append(root[int(colocation[0][2:])])
        else:
            root.append(i)
            pin[i] = f"/device:GPU:{rng.randrange(nd)}" if rng.random() < pin_prob else None
        device = pin[root[i]]
        compute = float(rng.choice([0, 1, 2, 5, 100])) if integer_times else round(rng.uniform(0, 1000), 3)
        b.add_op(
            f"op{i}", compute, [rng.choice(sizes) for _ in range(outputs[i])],
            temp_bytes=rng.choice([0, 0, 4096, MiB]),
            persistent_bytes=rng.choice([4096, MiB, 4 * MiB]) if rng.random() < persistent_prob else 0,
            device=device, colocation=colocation,
        )
    for j in range(n):
        for i in range(j):
            if rng.random() < edge_prob:
                if rng.random() < 0.15:
                    b.add_control_edge(f"op{i}", f"op{j}")
                else:
                    b.add_edge(f"op{i}", f"op{j}", rng.randrange(outputs[i]))
    graph = graphs.with_aliases(b.build(), random.Random(seed + 1), draw(st.sampled_from([0.0, 0.3, 0.8])))
    comm = draw(st.sampled_from([
        CommCost(), CommCost(0.0, 0.0), CommCost(0.0, 134.0), CommCost(1e-9, 0.0), CommCost(1.0, 1e6),
    ]))
    comm = dataclasses.replace(comm, copies_in_flight=draw(st.sampled_from([1, 2, 3.5, math.inf])))
    needs = int(graph.output_total_bytes.sum() + graph.temp_bytes.sum() + graph.persistent_bytes.sum())
    memory = draw(st.sampled_from(["loose", "tight", "tighter"]))
    memory_bytes = 64 * GiB if memory == "loose" else max(
        4096, int(needs / nd * (0.8 if memory == "tight" else 0.3))
    )
    kind = draw(st.sampled_from(["homogeneous", "hosts", "unequal", "senders", "shared"]))
    return graph, _cluster(kind, nd, memory_bytes, comm), seed


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_cases())
@native
def test_random_dags_give_the_same_schedules(case):
    graph, cluster, seed = case
    try:
        _compare_all(graph, cluster, seed)
    except ValueError:  # a placement that cannot be (a pin to a device the cluster lacks)
        pass


# ---------------------------------------------------------------- the test graphs


def _catalogue():
    yield "chain", graphs.chain(6), graphs.cluster(2)
    # Ops of the same inputs share their dry runs (`GraphTables.memo_of`).
    yield "control_scope", graphs.control_scope(), graphs.cluster(4)
    yield "diamond", graphs.diamond(), graphs.cluster(2)
    yield "fork_join", graphs.fork_join(6), graphs.cluster(3)
    yield "independent", graphs.independent(6), graphs.cluster(4)
    yield "group_cycle", graphs.group_cycle(), graphs.cluster(2)
    g, c = graphs.too_big_for_one()
    yield "too_big_for_one", g, c
    yield "too_big_for_one on one", g, graphs.cluster(1, 100 * MiB)
    yield "colocated_pair", graphs.colocated_pair(), graphs.cluster(2)
    for seed in range(6):
        yield f"random_dag {seed}", graphs.random_dag(
            seed, 40, edge_prob=0.12, group_prob=0.15, pin_prob=0.05, num_devices=4, persistent_prob=0.2
        ), graphs.cluster(4, memory_bytes=8 * MiB if seed % 2 else GiB)
    for seed in range(4):
        yield f"random_dag {seed}, senders", graphs.random_dag(
            seed, 40, edge_prob=0.12, group_prob=0.15, pin_prob=0.05, num_devices=4, persistent_prob=0.2
        ), _senders(4, 8 * MiB if seed % 2 else GiB)
        yield f"random_dag {seed}, senders, {2 + seed % 2} copies in flight", graphs.random_dag(
            seed, 40, edge_prob=0.12, group_prob=0.15, pin_prob=0.05, num_devices=4, persistent_prob=0.2
        ), _senders(4, 8 * MiB if seed % 2 else GiB, CommCost(copies_in_flight=2 + seed % 2))
    seeds = []
    for seed in range(400):
        try:
            seeds.append(graphs.integer_dag_case(seed))
        except ValueError:
            continue
        if len(seeds) == 12:
            break
    for k, (g, c, _, _) in enumerate(seeds):
        yield f"integer_dag_case {k}", g, c


@pytest.mark.slow
@pytest.mark.parametrize("name, graph, cluster", list(_catalogue()), ids=lambda x: x if isinstance(x, str) else "")
@native
def test_the_test_graphs_give_the_same_schedules(name, graph, cluster):
    _compare_all(graph, cluster)


@pytest.mark.slow
@pytest.mark.parametrize("name, graph, cluster", cases(), ids=lambda x: x if isinstance(x, str) else "")
@native
def test_the_quality_graphs_give_the_same_schedules(name, graph, cluster):
    _compare_all(graph, cluster, cutoffs=False)


_QUEUEING = {
    "fan-out": lambda: fan_out_graph(900),
    "updates of one variable": lambda: colocated_updates_graph(401),
    "chained updates": lambda: colocated_updates_graph(401, chained=True),
    "gathers of one embedding": lambda: colocated_gathers_graph(401),
    "layered": lambda: layered_graph(1500, seed=2),
}


_TAIL_CLUSTERS = {
    "plain": lambda: graphs.cluster(4),
    "senders": lambda: _senders(4, GiB),
    "senders, 3 copies in flight": lambda: _senders(4, GiB, CommCost(copies_in_flight=3)),
    "senders, unbounded copies in flight": lambda: _senders(4, GiB, CommCost(copies_in_flight=math.inf)),
}


@pytest.mark.slow
@pytest.mark.parametrize("links", sorted(_TAIL_CLUSTERS))
@pytest.mark.parametrize("shape", sorted(_QUEUEING))
@native
def test_tail_queues_give_the_same_schedules(shape, links):
    """Thousands of ready ops wait on one channel: tail queues fill and empty; with `senders`,
    half the devices send on their compute thread; with `latency overlaps`, copies hold the
    channels for their bytes alone."""
    _compare_all(_QUEUEING[shape](), _TAIL_CLUSTERS[links](), cutoffs=False)


@pytest.mark.slow
@pytest.mark.parametrize("skip", [True, False])
@native
def test_twins_handed_over_give_the_same_schedules(skip, monkeypatch):
    """64 devices, of which m-ETF touches a few: each touch hands the twin's heaps and queues
    over (`_hand_over`); with `UntouchedTwins.skip` off, every device is weighed."""
    monkeypatch.setattr(UntouchedTwins, "skip", skip)
    graph = layered_graph(300, seed=3)
    for cluster in (graphs.cluster(64, memory_bytes=256 * MiB), _cluster("hosts", 16, 64 * MiB, CommCost())):
        _same(_m_etf(graph, cluster))
        for child in _children(graph, cluster, 3):
            _same(_m_sct(graph, cluster, child))
    updates, sixteen = colocated_updates_graph(201), graphs.cluster(16)
    _same(_m_etf(updates, sixteen))
    for child in _children(updates, sixteen, 4):
        _same(_m_sct(updates, sixteen, child))


@native
def test_the_scheduler_switches_give_the_same_schedules(monkeypatch):
    """`ListScheduler.queue_tails` and `once_in_now` off, as tests/test_list_scheduler.py sets
    them, reach the compiled core too."""
    graph = colocated_gathers_graph(301)
    chained = colocated_updates_graph(301, chained=True)
    children = _children(chained, graphs.cluster(4), 5)
    for queue, once in ((False, True), (True, False)):
        monkeypatch.setattr(list_scheduler.ListScheduler, "queue_tails", queue)
        monkeypatch.setattr(list_scheduler.ListScheduler, "once_in_now", once)
        _same(_m_etf(graph, graphs.cluster(4)))
        for child in children:
            _same(_m_sct(chained, graphs.cluster(4), child))


@native
def test_a_stuck_run_gives_the_same_message():
    graph, cluster = graphs.too_big_for_one(memory_bytes=70 * MiB)
    out = _same(_m_etf(graph, graphs.cluster(1, 70 * MiB)))
    assert out[0] == "InfeasiblePlacementError"
    for child in _children(graph, cluster, 0):
        out = _same(_m_sct(graph, graphs.cluster(2, 30 * MiB), child))
        assert out[0] == "InfeasiblePlacementError" and "needs" in out[1]
    out = _same(_simulate(graph, cluster, [0, 0, 0, 0]))
    assert out[0] == "InfeasiblePlacementError" and "needs" in out[1]


@native
@pytest.mark.parametrize("base", [EarliestStartPolicy, FavouriteChildPolicy])
def test_other_policies_keep_the_python_engine(base):
    """A subclass may change what the compiled core has ported: it runs on the Python engine."""

    class Subclass(base):
        def __init__(self):
            if base is FavouriteChildPolicy:
                super().__init__([1, 2, 3, -1], 2)

    graph, cluster = graphs.chain(4), graphs.cluster(2)
    _same(lambda: run_with_headroom(graph, cluster, Groups.singletons(graph), Subclass, method="x"),
          compiled=False)
    with _counting_native() as calls:
        run_with_headroom(graph, cluster, Groups.singletons(graph), Subclass, method="x")
    assert not calls


def _weights_then_scratch():
    """Four ops with 20 MiB of persistent memory each in a chain, then z, pinned to GPU:0, with
    50 MiB of scratch, on two devices of 100 MiB:

        w0 -> w1 -> w2 -> w3 ..> z (GPU:0)

    The chain stays on one device while it may, so that with no headroom GPU:0 holds 80 MiB of
    weights and z does not fit; with a quarter kept free, 60 MiB; with half, 40 MiB and z fits."""
    b = OpGraphBuilder()
    for i in range(4):
        b.add_op(f"w{i}", 10.0, [4], persistent_bytes=20 * MiB)
        if i:
            b.add_edge(f"w{i - 1}", f"w{i}")
    b.add_op("z", 10.0, [4], temp_bytes=50 * MiB, device="/device:GPU:0")
    b.add_control_edge("w3", "z")
    return b.build(), graphs.cluster(2, memory_bytes=100 * MiB)


@native
def test_headroom_retries_give_the_same_schedules():
    """A run out of memory is retried with headroom (`run_with_headroom`): the third run fits,
    on both engines, under m-ETF and m-SCT."""
    graph, cluster = _weights_then_scratch()
    for child in _children(graph, cluster, 0):
        made = []

        def make():
            made.append(1)
            return FavouriteChildPolicy(child, cluster.num_devices)

        groups = colocation_groups(graph)
        out = _same(lambda: run_with_headroom(graph, cluster, groups, make, method="m_sct"))
        assert len(made) == 6  # three runs on each engine
        assert out[0] == [0, 0, 1, 1, 0]
    made.clear()
    out = _same(lambda: run_with_headroom(graph, cluster, colocation_groups(graph), make, method="m_etf"))
    assert len(made) == 6


@native
def test_m_sct_pools_give_the_same_schedules(monkeypatch):
    """Ops held back from a device kept for a favourite child wait in the device's pool (a
    `TailQueue` without sources), which chained updates of one variable and fan-outs fill: the
    Python engine made pools here, and the engines agree."""
    pools = []
    init = tail_queues.TailQueue.__init__

    def counted(self, device, sources, widths, since):
        pools.append(sources is None)
        init(self, device, sources, widths, since)

    monkeypatch.setattr(tail_queues.TailQueue, "__init__", counted)
    for graph in (colocated_updates_graph(301, chained=True), fan_out_graph(300), layered_graph(400, seed=7)):
        for child in _children(graph, graphs.cluster(4), 6):
            _same(_m_sct(graph, graphs.cluster(4), child))
    assert sum(pools) > 10


@pytest.mark.slow
@native
@pytest.mark.parametrize("method", ["m_sct", "auto"])
def test_the_pipeline_places_alike_on_both_engines(method):
    """`placer.pipeline.place` with m-SCT (LP and all) and with auto, whose portfolio runs m-SCT:
    the same placement and schedule, whichever engine is selected."""
    from baechi_tf.placer.pipeline import PlacementOptions, place

    graph = layered_graph(300, seed=11)
    cluster = graphs.cluster(4, memory_bytes=64 * MiB)
    out = []
    for name in ("python", "native"):
        options = PlacementOptions(placement_method=method, engine=name, refine_seconds=0.2)
        with _counting_native() as calls:
            result = place(graph, cluster, options)
        out.append((result.placement.device_of.tolist(), result.schedule.start_us.tobytes(),
                    result.schedule.end_us.tobytes(), result.schedule.order.tolist()))
        assert bool(calls) == (name == "native")
    assert out[0] == out[1]


# ---------------------------------------------------------------- refinement and the fit search


def _refined(graph, cluster, seconds):
    from baechi_tf.placer.m_etf import place_m_etf
    from baechi_tf.placer.auto.refine import RefineOptions, refine

    groups = colocation_groups(graph)
    start = place_m_etf(graph, cluster, groups)
    placement, schedule, stats = refine(graph, cluster, groups, start, options=RefineOptions(seconds=seconds))
    return (
        placement.device_of.tolist(), schedule.start_us.tobytes(), schedule.end_us.tobytes(),
        [(t.tensor, t.src_device, t.dst_device, _hex(t.start_us), _hex(t.end_us)) for t in schedule.transfers],
        schedule.peak_memory_bytes, schedule.order.tolist(), stats.work, stats.moves_tried,
        stats.moves_accepted, stats.windows_tried, stats.windows_accepted, stats.final_makespan_us,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name, graph, cluster", [
    ("fork_join", graphs.fork_join(8), graphs.cluster(3)),
    ("random_dag tight", graphs.random_dag(5, 60, edge_prob=0.1, group_prob=0.2, persistent_prob=0.2,
                                            num_devices=4), graphs.cluster(4, memory_bytes=12 * MiB)),
    ("updates of one variable", colocated_updates_graph(201), graphs.cluster(4)),
    ("layered on 16", layered_graph(400, seed=5), graphs.cluster(16, memory_bytes=256 * MiB)),
], ids=lambda x: x if isinstance(x, str) else "")
@native
def test_refinement_gives_the_same_placement_for_the_same_work(name, graph, cluster):
    """The refiner's moves resume the compiled core from patched snapshots; its budget counts
    work (dry runs, copies, gap searches), which both engines count alike."""
    with engine.selected("python"):
        python = _refined(graph, cluster, 0.3)
    with _counting_native() as calls, engine.selected("native"):
        compiled = _refined(graph, cluster, 0.3)
    assert calls
    assert compiled == python
    assert python[7] > 3  # moves were tried


@native
def test_the_fit_search_finds_the_same_placement():
    from baechi_tf.placer.fit import FitSearch

    graph = graphs.random_dag(7, 40, edge_prob=0.1, persistent_prob=0.3, num_devices=3)
    needs = int(graph.output_total_bytes.sum() + graph.persistent_bytes.sum())
    for memory_bytes in (needs // 3, needs // 5, needs // 8):
        cluster = graphs.cluster(3, memory_bytes=memory_bytes)
        groups = colocation_groups(graph)
        found = []
        for name in ("python", "native"):
            with engine.selected(name):
                search = FitSearch(graph, cluster, groups, seed=1, budget_steps=20_000)
                placement = search.run()
                found.append((None if placement is None else placement.device_of.tolist(),
                              search.tried, search.steps, search.exhaustive))
        assert found[0] == found[1]


@native
def test_native_snapshots_restore_into_a_new_scheduler():
    """As tests/test_list_scheduler.py does for the Python engine: a snapshot taken while tail
    queues are open, restored into the same scheduler and into a new one, ends as a run
    without snapshots does."""
    from baechi_tf.placer.policies import FixedPolicy
    from baechi_tf.placer.run_scheduler import make_list_scheduler
    from baechi_tf.placer.native_scheduler import NativeListScheduler

    graph = colocated_updates_graph(301)
    groups = colocation_groups(graph)
    cluster = graphs.cluster(4)
    device_of = [op % 4 for op in range(graph.num_ops)]
    for op in groups.members[int(groups.group_of[0])].tolist():
        device_of[op] = 0

    def make():
        return make_list_scheduler(graph, cluster, Groups.singletons(graph), FixedPolicy(device_of), device_of)

    whole = make()
    assert isinstance(whole, NativeListScheduler)
    whole.run()
    expected = _outcome(lambda: whole.schedule("x"))
    scheduler = make()
    snaps = []
    while scheduler.step() is not None:
        if scheduler.scheduled % 50 == 0:
            snaps.append(scheduler.snapshot())
    assert _outcome(lambda: scheduler.schedule("x")) == expected
    for snap in snaps:
        for target in (scheduler, make()):
            target.restore(snap)
            assert snap == snap.patched([])  # restoring left the snapshot as it was
            while target.step() is not None:
                pass
            assert _outcome(lambda: target.schedule("x")) == expected


@native
@pytest.mark.parametrize("limit", ["steps", "evaluations"])
def test_a_compiled_run_comes_back_to_python_in_chunks(limit, monkeypatch):
    """The progress bar is told, and Ctrl-C (a KeyboardInterrupt between chunks) stops the run."""
    from baechi_tf.placer.run_scheduler import make_list_scheduler
    from baechi_tf.placer.native_scheduler import NativeListScheduler

    monkeypatch.setattr(native_scheduler, "_NATIVE_STEPS" if limit == "steps" else "_NATIVE_EVALUATIONS", 50)
    graph = fan_out_graph(600)

    class Bar:
        def __init__(self, stop_at=None):
            self.seen, self.stop_at = [], stop_at

        def update(self, done):
            self.seen.append(done)
            if self.stop_at is not None and len(self.seen) == self.stop_at:
                raise KeyboardInterrupt

    def make():
        out = make_list_scheduler(graph, graphs.cluster(4), Groups.singletons(graph), EarliestStartPolicy())
        assert isinstance(out, NativeListScheduler)
        return out

    bar = Bar()
    make().run(bar)
    assert len(bar.seen) > 4 and bar.seen == sorted(bar.seen) and bar.seen[-1] == graph.num_ops
    scheduler = make()
    with pytest.raises(KeyboardInterrupt):
        scheduler.run(Bar(stop_at=2))
    assert 0 < scheduler.scheduled < graph.num_ops


# ---------------------------------------------------------------- the channels' tree

_times = st.one_of(
    st.integers(0, 2000).map(lambda k: k / 4),  # ties and touching bookings abound
    st.floats(0, 1e4, allow_nan=False, allow_infinity=False),
    st.floats(1e9, 1e9 + 1e4, allow_nan=False, allow_infinity=False),  # late in a long step
)


def _scan(starts, ends, t, w):
    """`SchedulerState._slot`'s scan of one list."""
    if ends and ends[-1] > t:
        i = bisect.bisect_right(ends, t)
        while i < len(ends) and starts[i] < t + w:
            t = ends[i]
            i += 1
    return t


@pytest.mark.slow
@pytest.mark.skipif(not engine.native_available(), reason="the compiled core is not built")
@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(_times, st.floats(1e-3, 500, allow_nan=False)), max_size=60),
    st.lists(st.tuples(_times, st.floats(1e-3, 600, allow_nan=False)), min_size=1, max_size=20),
    st.sampled_from([0.0, 0.25, 1.5, 134.0]),
)
def test_the_tree_of_gaps_answers_as_the_sorted_lists(bookings, queries, gap):
    """The compiled engine keeps a pair's bookings in a tree of gap widths, whose searches skip
    subtrees by widths computed by subtraction: its bookings and its answers must be the lists'
    to the last bit, also where rounding makes a gap as wide as a copy, or not."""
    tree = engine.native_module().GapTreap()
    starts, ends = [], []
    for s, length in bookings:
        e = s + length
        if not e > s:
            continue
        _close_in(starts, ends, s, e, gap)
        tree.close_in(s, e, gap)
        assert tree.lists() == (starts, ends)
        for t, w in queries:
            assert tree.fit(t, w) == _scan(starts, ends, t, w), (t, w)
        for i in range(len(starts) - 1):  # copies as wide as a gap, and a hair wider or narrower
            width = starts[i + 1] - ends[i]
            for w in (width, math.nextafter(width, 0), math.nextafter(width, math.inf)):
                if w > 0:
                    t = starts[0]
                    assert tree.fit(t, w) == _scan(starts, ends, t, w), (t, w)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(_times, st.floats(0, 500, allow_nan=False)), max_size=60),
    st.lists(st.tuples(_times, st.floats(0, 600, allow_nan=False)), min_size=1, max_size=20),
    st.sampled_from([0.25, 1.5, 134.0]),
)
def test_a_dry_runs_merged_bookings_answer_as_its_copies_one_by_one(copies, queries, gap):
    """`_tentative` merges a dry run's copies closer than the shortest transfer (`gap`), so that
    hundreds of copies into one op are one booking: every slot of a copy at least `gap` long
    must be the one the copies, kept one by one, give. Each copy is slotted as `_slot` slots it:
    at the first fit from its producer's end."""
    raw_starts, raw_ends = [], []
    extra = {}
    for t, extra_width in copies:
        w = gap + extra_width
        s = _scan(raw_starts, raw_ends, t, w)
        assert _scan(*extra.get(0, ([], [])), t, w) == s
        e = s + w
        if e > s:
            i = bisect.bisect_left(raw_starts, s)
            raw_starts.insert(i, s)
            raw_ends.insert(i, e)
        scheduler_state._tentative(extra, (0, 1), s, e, gap)
        for q, q_extra in queries:
            assert _scan(*extra[0], q, gap + q_extra) == _scan(raw_starts, raw_ends, q, gap + q_extra)
    if raw_starts:
        assert extra[0] == extra[1] and len(extra[0][0]) <= len(raw_starts)


# ---------------------------------------------------------------- window balancing


def _windows_outcomes(graph, cluster, device_of, seed):
    """`balance_windows` from the simulation of `device_of`, under several settings: windows,
    overlap, pinned groups, a move limit, the host left out; (placement, moves) of each."""
    from baechi_tf.placer.auto.windows import balance_windows

    groups = colocation_groups(graph)
    schedule = simulate(graph, cluster, Placement(np.asarray(device_of, dtype=np.int32), "given"))
    rng = random.Random(seed)
    pinned = [rng.random() < 0.2 for _ in range(groups.num_groups)]
    out = []
    for num_windows, overlap, max_moves, free in (
        (1, False, None, None), (5, True, None, None), (16, False, 40, None), (2, False, -3, None),
        (3, False, None, max(1, cluster.num_devices - 1)),
    ):
        placed, moves = balance_windows(
            graph, cluster, groups, schedule, num_windows, pinned=pinned, overlap=overlap,
            seed=seed, max_moves=max_moves, free_devices=free,
        )
        out.append((placed.tolist(), placed.dtype, moves))
    return out


def _same_windows(graph, cluster, device_of, seed):
    with engine.selected("python"):
        python = _windows_outcomes(graph, cluster, device_of, seed)
    with engine.selected("native"):
        compiled = _windows_outcomes(graph, cluster, device_of, seed)
    assert compiled == python


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(_cases())
@native
def test_window_balancing_makes_the_same_moves(case):
    graph, cluster, seed = case
    try:
        device_of = _spread(graph, cluster, seed)
        simulate(graph, cluster, Placement(np.asarray(device_of, dtype=np.int32), "given"))
    except (ValueError, InfeasiblePlacementError):  # not a placement the simulator runs
        return
    _same_windows(graph, cluster, device_of, seed)


@pytest.mark.parametrize("name, graph, cluster", cases(), ids=lambda x: x if isinstance(x, str) else "")
@native
def test_window_balancing_of_the_quality_graphs_makes_the_same_moves(name, graph, cluster):
    metf = run_with_headroom(graph, cluster, colocation_groups(graph), EarliestStartPolicy, method="m_etf")
    _same_windows(graph, cluster, metf.placement.device_of.tolist(), 7)


@native
def test_window_balancing_runs_compiled_when_native_is_selected(monkeypatch):
    """The compiled search is the one that runs (not a silent fallback), and a byte count beyond
    its int64 sends the search back to Python, with the same answer."""
    from baechi_tf.placer.auto import windows

    graph, cluster = graphs.random_dag(3, 40, edge_prob=0.15), graphs.cluster(4)
    device_of = _spread(graph, cluster, 3)
    calls = []
    real = windows._native_balance
    monkeypatch.setattr(windows, "_native_balance", lambda *a: calls.append(1) or real(*a))
    with engine.selected("native"):
        expected = _windows_outcomes(graph, cluster, device_of, 3)
    assert len(calls) == 5
    monkeypatch.setattr(windows, "_INT64_LIMIT", 1)
    with engine.selected("native"):
        assert _windows_outcomes(graph, cluster, device_of, 3) == expected
    assert len(calls) == 5


# ---------------------------------------------------------------- the memory out of order


@native
@pytest.mark.parametrize("seed", range(12))
def test_both_engines_bound_the_order_alike(seed):
    """`order_bounds.chained_bounds`, compiled and on numpy: the same earliest and latest
    places for random DAGs, placements and windows (one for all groups, or one per group),
    devices or pools as groups; the compiled one is the one that runs under ``native``."""
    from baechi_tf.placer import order_bounds

    rng = np.random.default_rng(seed)
    graph = graphs.random_dag(seed, 60, edge_prob=0.08 + 0.02 * (seed % 4))
    groups = 1 + seed % 4
    group_of = rng.integers(0, groups, graph.num_ops)
    place = np.empty(graph.num_ops, dtype=np.int64)
    for g in range(groups):  # places by topological position within each group
        ops = graph.topo_order[group_of[graph.topo_order] == g]
        place[ops] = np.arange(ops.size)
    count = np.bincount(group_of, minlength=groups)[group_of]
    last = np.minimum(place + rng.integers(0, 6, graph.num_ops), count - 1)
    by_group = rng.integers(0, 9, groups)  # a window of each group's own
    for window in [np.full(graph.num_ops, w) for w in (0, 1, 3, 8, 100)] + [by_group[group_of]]:
        with engine.selected("python"):
            expected = order_bounds.chained_bounds(graph, group_of, place, window, last)
        with engine.selected("native"):
            got = order_bounds.chained_bounds(graph, group_of, place, window, last)
        assert [x.tolist() for x in got] == [x.tolist() for x in expected], (seed, window)
        lo, hi = expected
        assert (lo <= place).all() and (hi >= place).all()
        assert (place - lo <= window).all() and (hi - place <= window).all()
        if (window == window[0]).all():
            moved = (lo < place).sum() + (hi > place).sum()
            assert (moved > 0) == (window[0] > 0 and graph.num_ops > groups), (seed, window)


@native
@pytest.mark.parametrize("seed", range(6))
def test_both_engines_carry_timed_bounds_alike(seed):
    """`order_bounds.timed_bounds`, compiled and in Python: the same earliest start and latest end
    of every op for random DAGs (control edges among them), bounds and
    durations; with a schedule's own times as the bounds, those times."""
    from baechi_tf.placer import order_bounds

    rng = np.random.default_rng(seed)
    graph = graphs.random_dag(seed, 90, edge_prob=0.04 + 0.03 * (seed % 3))
    n = graph.num_ops
    earliest = np.round(rng.uniform(0, 500, n), 1)
    latest = earliest + np.round(rng.uniform(0, 2000, n), 1)
    took = np.round(rng.uniform(0, 80, n), 1) * (rng.random(n) > 0.2)
    with engine.selected("python"):
        expected = order_bounds.timed_bounds(graph, earliest, latest, took)
    with engine.selected("native"):
        got = order_bounds.timed_bounds(graph, earliest, latest, took)
    assert [x.tolist() for x in got] == [x.tolist() for x in expected], seed
    starts, ends = expected
    assert (starts >= earliest).all() and (ends <= latest).all()
    for u, v in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
        assert starts[v] >= starts[u] + took[u] and ends[u] <= ends[v] - took[v]
    schedule = simulate(graph, graphs.cluster(2), Placement(np.arange(n, dtype=np.int32) % 2, "hand"))
    with engine.selected("native"):
        own = order_bounds.timed_bounds(graph, schedule.start_us, schedule.end_us,
                                        schedule.end_us - schedule.start_us)
    assert own[0].tolist() == schedule.start_us.tolist() and own[1].tolist() == schedule.end_us.tolist()


@native
def test_the_compiled_order_bounds_run_under_native(monkeypatch):
    from baechi_tf.placer import memory_timeline, order_bounds

    graph, cluster = graphs.random_dag(5, 40, edge_prob=0.15), graphs.cluster(3)
    schedule = simulate(graph, cluster, Placement(np.arange(40, dtype=np.int32) % 3, "hand"))
    calls = []
    real = order_bounds._chained_bounds_by_level
    monkeypatch.setattr(order_bounds, "_chained_bounds_by_level", lambda *a: calls.append(1) or real(*a))
    with engine.selected("native"):
        compiled = memory_timeline.reordered_peaks(graph, cluster, schedule)
    assert calls == []
    with engine.selected("python"):
        assert memory_timeline.reordered_peaks(graph, cluster, schedule) == compiled
    assert calls == [1]


# ---------------------------------------------------------------- TF's executor, emulated


@native
@pytest.mark.parametrize("seed", range(10))
def test_both_engines_emulate_the_executor_alike(seed):
    """`executor_order.emulated_times`, compiled and in Python: the same start and end of every op
    for random DAGs, placements, op types (inexpensive or not), pools and threads, with the same
    draws; under ``native`` the compiled one runs."""
    from baechi_tf.placer import executor_order

    rng = np.random.default_rng(seed)
    graph = graphs.random_dag(seed, 80, edge_prob=0.05 + 0.02 * (seed % 5))
    types = [("Identity", "MatMul", "NoOp", "Conv2D")[k] for k in rng.integers(0, 4, graph.num_ops)]
    graph = dataclasses.replace(graph, op_types=tuple(types))
    devices = 1 + seed % 4
    device_of = rng.integers(0, devices, graph.num_ops)
    pools = [0] * devices if seed % 2 == 0 else list(range(devices))
    threads = [1 + seed % 3] * devices
    duration = np.round(rng.uniform(0, 50, graph.num_ops), 1) * (rng.random(graph.num_ops) > 0.1)
    draws = rng.random(2 * graph.num_ops)
    with engine.selected("python"):
        expected = executor_order.emulated_times(graph, device_of, duration, pools, threads, draws)
    with engine.selected("native"):
        got = executor_order.emulated_times(graph, device_of, duration, pools, threads, draws)
    assert [x.tolist() for x in got] == [x.tolist() for x in expected], seed
    start, end = expected
    for u, v in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
        assert start[v] >= end[u]


@native
def test_the_compiled_emulation_runs_under_native(monkeypatch):
    from baechi_tf.placer import executor_order

    graph = graphs.random_dag(7, 50, edge_prob=0.1)
    cluster = Cluster(tuple(Device(f"/job:w/replica:0/task:0/device:CPU:{i}", GiB, "CPU", shared_memory=True)
                            for i in range(3)), CommCost())
    schedule = simulate(graph, cluster, Placement(np.arange(50, dtype=np.int32) % 3, "hand"))
    calls = []
    real = executor_order._emulated_times
    monkeypatch.setattr(executor_order, "_emulated_times", lambda *a: calls.append(1) or real(*a))
    with engine.selected("native"):
        compiled = executor_order.emulated_peaks(graph, cluster, schedule, threads=[2, 2, 2])
    assert calls == []
    with engine.selected("python"):
        assert executor_order.emulated_peaks(graph, cluster, schedule, threads=[2, 2, 2]) == compiled
    assert calls == [1] * (executor_order.EMULATED_STEPS + 1)
