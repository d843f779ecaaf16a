"""The placement pipeline: an ordered list of named steps over `OpGraph` and `Cluster`.

validate -> group -> place -> check -> baseline. Each step takes the previous step's values and
returns new ones; a failure names the step that broke and the steps that had run.
"""

from __future__ import annotations

import dataclasses
import logging
import contextlib
import functools
import math
import numbers
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf._steps import Steps
from baechi_tf.errors import ConfigError, InfeasiblePlacementError, SolverError
from baechi_tf.graph import OpGraph
from baechi_tf.placer import engine
from baechi_tf.placer.check import check_placement
from baechi_tf.placer.fit import FitSearch
from baechi_tf.placer.fusion import FusedGraph, FusionOptions, fuse
from baechi_tf.placer.grouping import GROUPERS, Groups, make_groups
from baechi_tf.placer.heft import place_heft
from baechi_tf.placer.layers import find_layers, place_layers
from baechi_tf.placer.m_etf import METFOptions, place_m_etf, schedule_m_etf
from baechi_tf.placer.m_topo import MTopoOptions, place_m_topo
from baechi_tf.placer.pack import place_packed
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.simulator import lower_bound_us, single_device_schedule

ENGINES = engine.ENGINES

__all__ = ["ENGINES", "LP_SOLVERS", "PLACEMENT_METHODS", "HostView", "PlacementOptions", "PlacementResult", "place", "register_method"]

log = logging.getLogger(__name__)

Method = Callable[[OpGraph, Cluster, Groups, "PlacementOptions"], Placement]


def _single(graph: OpGraph, cluster: Cluster, groups: Groups, options: "PlacementOptions") -> Placement:
    return _single_schedule(graph, cluster, groups).placement


def _single_is_baseline(options: "PlacementOptions", host: Optional["HostView"]) -> bool:
    """Whether auto's one-device candidate is the one-device baseline of `place`: simulated on
    the same graph and cluster (no fusion, no host), by `_single`."""
    return options.placer_type == "default" and host is None and _METHODS.get("single") is _single


def _single_schedule(graph: OpGraph, cluster: Cluster, groups: Groups) -> Schedule:
    schedule = single_device_schedule(graph, cluster, groups)
    if schedule is None:
        if cluster.num_devices == 1:
            raise InfeasiblePlacementError(
                f"the graph does not fit on the only device, {cluster.names[0]} "
                f"({cluster.devices[0].memory_bytes / 2**20:,.2f} MiB); use more devices or give it "
                "more memory"
            )
        raise InfeasiblePlacementError(
            "the graph does not fit on one device; use a multi-device method such as m_etf"
        )
    return schedule


def _expert(graph: OpGraph, cluster: Cluster, groups: Groups, options: "PlacementOptions") -> Placement:
    """The model's own layout (op name -> device), completed by TF's rule: an op without one
    goes where its group or its first placed input went, else to the first device."""
    if not options.expert:
        raise ConfigError(
            "placement method 'expert' needs a hand layout and none was given: give "
            "PlacementOptions(expert={op name: device name}) (train.py gives its model's own), or "
            "choose another method"
        )
    device_of = [-1] * graph.num_ops
    for name, device in options.expert.items():
        op = graph.index.get(name)
        if op is not None:
            device_of[op] = cluster.device_index(device)
    group_device: dict[int, int] = {}
    for op in graph.topo_order.tolist():
        g = int(groups.group_of[op])
        if device_of[op] < 0:
            if g in group_device:
                device_of[op] = group_device[g]
            else:
                placed = [device_of[p] for p in graph.predecessors[op] if device_of[p] >= 0]
                device_of[op] = placed[0] if placed else 0
        group_device.setdefault(g, device_of[op])
    for g, members in enumerate(groups.members):  # one device per group: the first member's
        for op in members.tolist():
            device_of[op] = device_of[int(members[0])]
    for op, name in enumerate(graph.pinned_device):
        if name is not None and cluster.find(name) != device_of[op]:
            raise InfeasiblePlacementError(f"the expert layout moves pinned op {graph.names[op]!r}")
    return Placement(device_of, "expert")


@dataclasses.dataclass(frozen=True, eq=False)
class HostView:
    """The graph as it runs when a host that is not one of the cluster's devices runs the ops
    pinned to it (`graph_pass.place_with_host`).

    The placers see those ops as free ops without bytes (an embedding pinned to the host must
    not need room on a device); `lift` then moves every group that holds one to the host.
    auto simulates, compares and refines its candidates lifted, on `graph` (those ops' bytes
    counted) and `cluster` (the placers' devices, then the host), and refinement moves the other
    groups only among the placers' devices.
    """

    graph: OpGraph  # the graph with the host's ops' pins and bytes
    cluster: Cluster  # the placers' devices, then the host (before memory_fraction)
    on_host: np.ndarray  # bool per op: pinned to the host

    @property
    def host_index(self) -> int:
        return self.cluster.num_devices - 1

    def lift(self, placement: Placement, groups: Groups) -> Placement:
        """`placement` with every group that holds an op pinned to the host moved there."""
        hosted = np.zeros(groups.num_groups, dtype=bool)
        hosted[groups.group_of[self.on_host]] = True
        device_of = np.where(hosted[groups.group_of], self.host_index, placement.device_of)
        return Placement(device_of.astype(np.int32), placement.method)


def auto_candidates(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    options: "PlacementOptions",
    fused: Optional[FusedGraph] = None,
    host: Optional[HostView] = None,
) -> list[tuple[str, Callable[[float], Union[Placement, Schedule]]]]:
    """auto's candidates on `graph` (`_run_auto`), as (name, thunk) in the order that breaks ties.
    A worker process (`workers`) builds the same list from the same arguments."""
    from baechi_tf.placer.grouping import coplace

    if cluster.num_devices == 1 and host is None:
        # Every placement is the same one: the portfolio would cost its time (8x `single`'s on a
        # 7k-op GNMT) to say so, and name whichever placer came first.
        return [("single", lambda cutoff: _single_schedule(graph, cluster, groups))]
    # The graph and groups the placers see, and the way back to `graph`'s ops.
    pgraph, pgroups = (fused.graph, fused.groups) if fused is not None else (graph, groups)

    def lifted(place: Callable[[Groups, float], Placement]) -> Callable[[float], Placement]:
        """A thunk of auto's: a cutoff in, `place(pgroups, cutoff)` expanded to `graph`'s ops.
        On the fused graph, whose times differ from the real graph's, nothing is cut off."""
        if fused is None:
            return lambda cutoff: place(pgroups, cutoff)
        return lambda cutoff: fused.expand(place(pgroups, math.inf))

    def method(m: str) -> Callable[[Groups, float], Placement]:
        if m in _CUT_OFF:
            return lambda g, cutoff: _METHODS[m](pgraph, cluster, g, options, cutoff)
        return lambda g, cutoff: _METHODS[m](pgraph, cluster, g, options)

    names = [m for m in _PORTFOLIO if m in _METHODS]
    thunks = [(m, lifted(method(m))) for m in names]
    if _single_is_baseline(options, host):  # one device's schedule is simulated once
        thunks[names.index("single")] = ("single", lambda cutoff: _single_schedule(graph, cluster, groups))
    stems = find_layers(pgraph, cluster.num_devices)  # found once, not again inside the placer
    if stems:
        thunks.append(("layers", lifted(lambda g, cutoff: place_layers(pgraph, cluster, g, stems=stems))))
    if options.expert:
        thunks.append(("expert", lifted(lambda g, cutoff: _expert(pgraph, cluster, g, options))))
    if fused is not None:
        # One device and the memory-first packing, also on the real graph, where their memory
        # is exact: a packing of the fused graph may not fit the real one, and a placer that
        # does not fit falls back to this packing when it runs alone (`_checked`), so auto
        # must have it too to be never worse than any method.
        for m in ("single", "packed"):
            thunks.append((f"{m}+unfused", lambda cutoff, m=m: _METHODS[m](graph, cluster, groups, options)))
    # The same placers on coarser groups (single-consumer ops joined to their consumer): fewer,
    # larger moves, meant for graphs of many short ops where transfers dominate (on
    # bench/quality.py they decide nothing, hence the size limit).
    coarse: list[Groups] = []

    def coarse_groups() -> Groups:
        if not coarse:
            coarse.append(coplace(pgraph, pgroups))
        return coarse[0]

    if options.grouper != "coplace" and pgraph.num_ops <= _AUTO_COARSE_MAX_OPS:
        for m in ("m_etf", "m_sct", "heft"):
            if m in _METHODS:
                place_coarse = method(m)
                thunks.append(
                    (f"{m}+coplace", lifted(lambda g, cutoff, p=place_coarse: p(coarse_groups(), cutoff)))
                )
    if host is not None:
        # Also the packing of the graph as it runs (the host's ops there, their copies counted),
        # which the other methods fall back to when their placement no longer fits so.
        thunks = [(name, lambda cutoff, t=t: host.lift(t(math.inf), groups)) for name, t in thunks]
        thunks.append((
            "packed+host",
            lambda cutoff: place_packed(host.graph, host.cluster, groups, free_devices=cluster.num_devices),
        ))
    return thunks


def _in_worker(name: str) -> bool:
    """Whether a worker process (`workers`), which knows only the built-in methods, builds auto's
    candidate `name` as this process does: not when it uses a method registered here."""
    if name in ("layers", "expert", "packed+host"):
        return True
    method = name.split("+")[0]
    return (
        method in _BUILTIN_METHODS
        and _METHODS.get(method) is _BUILTIN_METHODS[method]
        and (method in _CUT_OFF) == (method in _BUILTIN_CUT_OFF)
    )


def _candidate_workers(options: "PlacementOptions", num_ops: int, names: Sequence[str]):
    """Worker processes for auto's candidates `names` (`workers.CandidateWorkers`), or None to
    run them all in this process."""
    from baechi_tf.placer.auto import RUN_FIRST
    from baechi_tf.placer import workers

    side_by_side = [n for n in names if n not in RUN_FIRST and _in_worker(n)]
    if options.placement_jobs:
        count = options.placement_jobs
    elif num_ops >= _AUTO_JOBS_MIN_OPS:
        count = workers.usable_cores()
    else:
        count = 1
    count = min(count, len(side_by_side))
    return workers.CandidateWorkers(count, _in_worker) if count > 1 else None


def _run_auto(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    options: "PlacementOptions",
    fused: Optional[FusedGraph] = None,
    host: Optional[HostView] = None,
):
    """auto's portfolio on `graph`. With `fused` (``--placer_type=fusion``) the placers run on
    the fused graph, which is smaller, and each placement is expanded to `graph`'s ops before
    auto simulates, compares and refines it: the fused graph understates memory and times its
    ops differently (see `fusion`), so judging placements there kept ones slower than another
    candidate on the real graph, or ones that did not fit at all (and auto then failed where
    every other method, falling back to a packing, placed the graph). With `host` (its cluster
    with memory_fraction applied), each placement is lifted before it is judged, on the host
    view's graph and cluster, for the same reason; the placers' own runs then get no cutoff (their
    times, the host's ops on a device, are not the judge's), and when no candidate fits the
    error is raised for the caller's fallback. On large graphs (or with `placement_jobs`) the
    candidates after the first run side by side in worker processes (`workers`)."""
    from baechi_tf.placer.auto import RUN_FIRST, AutoOptions, place_auto
    from baechi_tf.placer.refine import RefineOptions

    thunks = auto_candidates(graph, cluster, groups, options, fused, host)
    candidate_work, refine_work = auto_work_caps(host.graph if host is not None else graph, options, len(thunks))
    auto_options = AutoOptions(
        RefineOptions(options.refine_seconds, options.seed), options.placement_timeout_s, candidate_work,
        refine_work,
    )
    # What a method alone falls back to when its placement and the packing do not fit: the fit
    # search, on the graph it placed (with fusion, the fused graph's, and the real graph's when the
    # expanded placement does not fit there). auto, without them, ended with a slower placement
    # than such a method (fuzzing: 3.64 s where HEFT, through the search, gave 3.15 s), or failed
    # where it placed. The searches are made when first needed, and run once: when every
    # candidate fails, the real graph's has run, and the last resort below takes its result.
    real = functools.cache(lambda: FitSearch(graph, cluster, groups, seed=options.seed))
    fallbacks = [("fit", "packed", _fit_thunk(real))]
    if fused is not None:
        fallbacks = [
            ("fit", "packed", _fit_thunk(
                lambda: FitSearch(fused.graph, cluster, fused.groups, seed=options.seed), fused
            )),
            ("fit+unfused", "packed+unfused", _fit_thunk(real)),
        ]
    remote = _candidate_workers(options, graph.num_ops, [name for name, _ in thunks])
    with remote if remote is not None else contextlib.nullcontext():
        if remote is not None:
            remote.start((graph, cluster, groups, options, fused, host))
        if host is not None:
            # With the host's ops on the host, a method alone falls back, when its placement runs
            # out of memory, to the packing and then the search of the graph the placers see
            # (the placement moved to the host after), and when the moved placement does not fit,
            # to the packing and then the search of the graph as it runs
            # (`graph_pass._host_fallback`): auto judges both searches, as it judges the first
            # without a host.
            runs = functools.cache(lambda: FitSearch(
                host.graph, host.cluster, groups, seed=options.seed, free_devices=cluster.num_devices
            ))
            seen_fit = _fit_thunk(real)  # the search of the graph the placers see
            return place_auto(
                host.graph, host.cluster, groups, thunks, options=auto_options, run_first=RUN_FIRST,
                free_devices=cluster.num_devices, remote=remote,
                fallbacks=[
                    ("fit", "packed", lambda cutoff: host.lift(seen_fit(cutoff), groups)),
                    ("fit+host", "packed+host", _fit_thunk(runs)),
                ],
            )
        try:
            return place_auto(
                graph, cluster, groups, thunks, options=auto_options, run_first=RUN_FIRST, remote=remote,
                fallbacks=fallbacks,
            )
        except InfeasiblePlacementError as e:
            if cluster.num_devices == 1:
                raise  # one device's schedule was the one placement there is
            # As a method alone does: the search, then the other placers on the real graph (with
            # fusion, auto's ran on the fused graph, where none may fit).
            found = _fit_instead(graph, cluster, groups, "auto", e, options.seed, options, real())
    name = found.method.removeprefix("auto+")  # 'fit', or the other placer whose placement fits
    return place_auto(graph, cluster, groups, [(name, lambda cutoff: found)], options=auto_options)


def auto_work_caps(graph: OpGraph, options: "PlacementOptions", count: int) -> tuple[float, float]:
    """(units for each of auto's `count` candidates, units for its refinement): with
    `options.auto_work`, half of it shared equally by the candidates and the rest, at most what
    refine_seconds buys, for refinement; else 40 units per op and edge of `graph` plus 400,000
    per candidate (m-ETF and its simulation on a 16k-op DenseNet121 of 320k edges: about 4.5
    million), refinement its own budget. A worker process (`workers`) finds the same."""
    if options.auto_work is None:
        return float(_WORK_PER_OP_AND_EDGE * (graph.num_ops + graph.num_edges) + _WORK_PER_CANDIDATE), math.inf
    share = options.auto_work // (2 * max(1, count))
    return float(share), float(options.auto_work - share * count)


# auto's default work cap of a candidate, per op and edge and in all (`auto_work_caps`).
_WORK_PER_OP_AND_EDGE = 40
_WORK_PER_CANDIDATE = 400_000


def _fit_thunk(
    make_search: Callable[[], FitSearch], fused: Optional[FusedGraph] = None
) -> Callable[[float], Placement]:
    """auto's fallback candidate: the placement that the search `make_search` makes finds (of the
    fused graph, expanded, with `fused`)."""

    def run(cutoff: float) -> Placement:
        search = make_search()
        found = search.run()
        if found is None:
            raise InfeasiblePlacementError(
                search.refusal or f"the fit search found no placement that fits in {search.tried} tries"
            )
        return fused.expand(found) if fused is not None else found

    return run


def _m_etf(
    graph: OpGraph, cluster: Cluster, groups: Groups, options: "PlacementOptions", cutoff_us: float = math.inf
) -> Placement:
    return place_m_etf(graph, cluster, groups, options=METFOptions(cutoff_us=cutoff_us))


def _m_etf_schedule(graph: OpGraph, cluster: Cluster, groups: Groups, options: "PlacementOptions") -> Schedule:
    return schedule_m_etf(graph, cluster, groups)


def _m_sct(
    graph: OpGraph, cluster: Cluster, groups: Groups, options: "PlacementOptions", cutoff_us: float = math.inf
) -> Placement:
    from baechi_tf.placer.m_sct import MSCTOptions, place_m_sct  # scipy loads when m-SCT runs

    # In auto's portfolio m-SCT gives up (SolverError, skipped) on an LP piece of more than
    # _AUTO_MAX_LP_ARCS arcs: graphs with thousands of crossing edges and no op that cuts them,
    # where even interior point takes tens of seconds (auto on a 10k-op layered graph: 9 s
    # without it, 44 s with it, the same placement).
    limit = _AUTO_MAX_LP_ARCS if options.placement_method == "auto" else None
    sct = MSCTOptions(
        threshold=options.sct_threshold, lp_solver=options.lp_solver, max_lp_arcs=limit,
        lp_time_limit_s=options.lp_time_limit, cutoff_us=cutoff_us,
    )
    return place_m_sct(graph, cluster, groups, options=sct)


def _m_topo_nonuniform(graph: OpGraph, cluster: Cluster, groups: Groups) -> Placement:
    """The original's variant of m-TOPO: each device filled to its capacity in turn, not to an
    equal share of the graph's memory."""
    placement = place_m_topo(graph, cluster, groups, options=MTopoOptions(uniform=False))
    return Placement(placement.device_of, "m_topo_nonuniform")


# More devices than groups is worth a warning only beyond this many devices (a small graph on a
# few devices is common and quick).
_FEW_DEVICES = 64
# More devices than groups is refused beyond this many devices: the link tables grow with the
# square of the devices (3,000 devices for a 97-op graph took 11 s and 850 MB to place on one
# device, before the placers weighed one of each set of untouched twins; 20,000 ran out of
# memory), all for devices that no placement can use.
_MANY_DEVICES = 1024
_AUTO_MAX_LP_ARCS = 5000
# A chosen method's placement this much slower than one device is worth a warning.
_SLOWER_THAN_ONE_DEVICE = 1.1
# Above this size auto skips the coplace-group runs: on bench/quality.py they never decide the
# result (the same table without them), and on 100k ops they took some 28 of 69 s.
_AUTO_COARSE_MAX_OPS = 20_000


_PORTFOLIO = ("m_topo", "m_etf", "m_sct", "heft", "single", "packed", "m_topo_nonuniform")

_METHODS: dict[str, Method] = {
    "m_topo": lambda g, c, gr, o: place_m_topo(g, c, gr),
    "m_topo_nonuniform": lambda g, c, gr, o: _m_topo_nonuniform(g, c, gr),
    "m_etf": _m_etf,
    "m_sct": _m_sct,
    "heft": lambda g, c, gr, o: place_heft(g, c, gr),
    "packed": lambda g, c, gr, o: place_packed(g, c, gr),
    "single": _single,
    "expert": _expert,
    "layers": lambda g, c, gr, o: place_layers(g, c, gr),
    "auto": lambda g, c, gr, o: _run_auto(g, c, gr, o).placement,
}
_BUILTIN_METHODS = dict(_METHODS)  # what a worker process has (`_in_worker`)
# Built-in methods whose placement comes with a schedule of it under the simulator's model, their
# own list-scheduler run: run alone, the pipeline checks and reports that schedule instead of
# simulating the placement again (m-ETF on a 16k-op DenseNet: half of the time to place it).
# Not m-SCT's: its run holds devices for favourite children, which the simulation does not.
_OWN_SCHEDULES: dict[str, Callable[[OpGraph, Cluster, Groups, "PlacementOptions"], Schedule]] = {
    "m_etf": _m_etf_schedule,
    "single": lambda g, c, gr, o: _single_schedule(g, c, gr),
}
PLACEMENT_METHODS = _METHODS  # read-only view for --help and validation
# The original's placement methods that are not here, and what to use instead.
_RESERVE = (
    "it reserved memory for each group when the group was first placed; here {0} places a group "
    "only while its weights leave room for tensors, and retries with more room when memory runs "
    "out. Use {0}"
)
_NOT_PORTED = {"m_etf_reserve": _RESERVE.format("m_etf"), "m_sct_reserve": _RESERVE.format("m_sct")}
# The methods that also take a cutoff_us, after the options, which auto passes to stop them early.
_CUT_OFF = {"m_etf", "m_sct"}
_BUILTIN_CUT_OFF = frozenset(_CUT_OFF)
# auto places its candidates side by side, one worker process per core, from this size on (or as
# `placement_jobs` says): a worker costs some 0.5 s of a core to start.
_AUTO_JOBS_MIN_OPS = 4000


def register_method(name: str, method: Method) -> None:
    """Adds a placement method, or replaces one (auto then runs it without a cutoff)."""
    _METHODS[name] = method
    _CUT_OFF.discard(name)


# m-SCT's LP solvers (`baechi_tf.sct.solvers.SOLVERS`, named here without loading scipy).
LP_SOLVERS = ("auto", "mosek", "highs", "cvxopt")


@dataclasses.dataclass(frozen=True)
class PlacementOptions:
    """Options of the placement pipeline; each field mirrors a command-line flag."""

    placement_method: str = "auto"  # one of PLACEMENT_METHODS
    grouper: str = "tf"  # 'tf': TF colocation only; 'coplace': also single-consumer merging
    placer_type: str = "default"  # 'default' or 'fusion' (place a fused graph)
    fusion_path_check: str = "auto"  # fusion's cycle check: 'auto', 'exact' or 'conservative'
    sct_threshold: float = 0.1  # m-SCT: LP edge values <= this make a favourite child
    lp_solver: str = "auto"  # m-SCT: 'auto', 'mosek', 'highs' or 'cvxopt'
    lp_time_limit: Optional[float] = None  # m-SCT: seconds per LP solve; 'auto' then tries the next solver
    memory_fraction: float = 1.0  # share of each device's memory the placer may fill
    refine_seconds: float = 3.0  # auto: budget of the refinement local search; 0 turns it off
    seed: int = 0  # auto: seeds the refinement's random moves
    expert: Optional[Mapping[str, str]] = None  # the model's own layout: op name -> device
    # auto: worker processes that place its candidates side by side; 0 chooses (one per core on
    # graphs of 4,000 ops or more, else none), 1 places them all in this process
    placement_jobs: int = 0
    # auto: wall-clock seconds after which no placer starts and refinement stops, the best
    # placement so far kept (with a warning); None: no limit, the placement the same on any machine
    placement_timeout_s: Optional[float] = None
    # auto: units of scheduling work (`work`) for all of it, half for its placers, each an equal
    # share, the rest for refinement (at most what refine_seconds buys); the same placement on
    # any machine. None: each placer 40 units per op and edge plus 400,000, and refinement its own
    auto_work: Optional[int] = None
    # what runs the list scheduler: 'native' (the compiled core; the python engine, with one
    # warning, when it is not built) or 'python' (the reference); the placements are the same
    engine: str = "native"

    def validate(self) -> None:
        if self.placement_method in _NOT_PORTED:
            raise ConfigError(
                f"placement method {self.placement_method!r} is the original's, not ported: "
                f"{_NOT_PORTED[self.placement_method]}"
            )
        if self.placement_method not in _METHODS:
            raise ConfigError(
                f"unknown placement method {self.placement_method!r}; choose one of "
                f"{', '.join(sorted(_METHODS))}"
            )
        if self.grouper not in GROUPERS:
            raise ConfigError(
                f"unknown grouper {self.grouper!r}; choose one of {', '.join(GROUPERS)}"
            )
        if self.placer_type not in ("default", "fusion"):
            raise ConfigError(
                f"unknown placer type {self.placer_type!r}; choose 'default' or 'fusion'"
            )
        # It was found only when m-SCT ran: for a BaechiSession, once the first run had profiled.
        if self.lp_solver not in LP_SOLVERS:
            raise ConfigError(
                f"unknown LP solver {self.lp_solver!r}; choose one of {', '.join(LP_SOLVERS)}"
            )
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if self.fusion_path_check not in ("auto", "exact", "conservative"):
            raise ConfigError(
                f"unknown fusion path check {self.fusion_path_check!r}; choose 'auto', 'exact' or "
                "'conservative'"
            )
        # The comparisons below raise TypeError on a string ('0.5' from a config file).
        for field in ("memory_fraction", "lp_time_limit", "refine_seconds", "sct_threshold"):
            value = getattr(self, field)
            if field == "lp_time_limit" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ConfigError(f"{field} {value!r} is not a number")
        if self.expert is not None and not (isinstance(self.expert, Mapping) and all(
            isinstance(op, str) and isinstance(device, str) for op, device in self.expert.items()
        )):
            raise ConfigError("the expert layout must map op names to device names (strings)")
        if not (0 < self.memory_fraction <= 1):
            raise ConfigError(
                f"memory fraction {self.memory_fraction!r} must be in (0, 1]"
            )
        timeout = self.placement_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < timeout < math.inf
        ):
            raise ConfigError(f"placement_timeout_s {timeout!r} must be a number of seconds > 0")
        if self.lp_time_limit is not None and not (self.lp_time_limit > 0):
            raise ConfigError(f"lp_time_limit {self.lp_time_limit!r} must be > 0 seconds")
        # Finite: the refinement's budget is counted in whole units of work (int(seconds * rate)).
        if not (0 <= self.refine_seconds < math.inf):
            raise ConfigError(f"refine_seconds {self.refine_seconds!r} must be a finite number >= 0")
        if not (0 <= self.sct_threshold < 1):
            raise ConfigError(f"sct_threshold {self.sct_threshold!r} must be in [0, 1)")
        if self.auto_work is not None and not (_whole(self.auto_work) and self.auto_work > 0):
            raise ConfigError(f"auto_work {self.auto_work!r} must be a whole number of units > 0")
        jobs = self.placement_jobs
        if not _whole(jobs):
            raise ConfigError(
                f"placement_jobs {jobs!r} must be a whole number >= 0 (0 chooses, 1 places in this process)"
            )
        # random.Random takes 1.5 and takes -1 as 1: one seed would give another's placements.
        if not _whole(self.seed):
            raise ConfigError(f"seed {self.seed!r} must be a whole number >= 0")


def _whole(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= 0


@dataclasses.dataclass(frozen=True, eq=False)
class PlacementResult:
    """A placement with its simulated schedule and the figures users compare it by."""

    graph: OpGraph
    cluster: Cluster  # as given (before memory_fraction)
    groups: Groups
    placement: Placement
    schedule: Schedule
    lower_bound_us: float
    single_device_makespan_us: Optional[float]  # None when the graph does not fit one device
    single_device_count: int  # devices the one-device baseline uses (more than 1: pins)
    placement_seconds: float  # wall time of the whole pipeline
    step_seconds: dict[str, float]
    candidates: Optional[dict[str, Optional[float]]] = None  # auto: makespan of each placer
    refine_stats: Optional[object] = None  # auto: RefineStats
    memory_fraction: float = 1.0  # of each device's memory the placer could fill

    @property
    def makespan_us(self) -> float:
        return self.schedule.makespan_us

    def op_to_device(self) -> dict[str, str]:
        return self.placement.op_to_device(self.graph, self.cluster)


def _packed_instead(
    graph: OpGraph, cluster: Cluster, groups: Groups, method: str, error: InfeasiblePlacementError,
    seed: int = 0, options: Optional["PlacementOptions"] = None,
) -> Placement:
    """A memory-first packing when `method`'s placement ran out of memory, else a placement the
    fit search found (`fit`), else (with `options`) the fastest of the other placers' that fit;
    else `error`. One device (`single`) has nothing to fall back to."""
    if method == "single":
        raise error
    if method != "packed":
        try:
            packed = place_packed(graph, cluster, groups)
        except InfeasiblePlacementError:
            pass
        else:
            log.warning("%s ran out of memory (%s); using a memory-first packing instead", method, error)
            return Placement(packed.device_of, f"{method}+packed")
    return _fit_instead(graph, cluster, groups, method, error, seed, options)


def _fit_instead(
    graph: OpGraph, cluster: Cluster, groups: Groups, method: str, error: InfeasiblePlacementError,
    seed: int, options: Optional["PlacementOptions"] = None, search: Optional[FitSearch] = None,
) -> Placement:
    """The placement `fit.FitSearch` finds when `method` (and the packing) ran out of memory,
    else (with `options`) the fastest of the other placers' that fit (the search is a heuristic:
    it can miss a placement that a greedy placer finds); `error`, with what was searched, when
    none fits. `search`: that search of `graph`, if made already (it runs once)."""
    search = search if search is not None else FitSearch(graph, cluster, groups, seed=seed)
    found = search.run()
    if found is None and search.tried == 0:  # no placement can fit: the reason, not the method's
        raise InfeasiblePlacementError(search.refusal or str(error)) from None
    if found is None and options is not None:
        fitting = _others_that_fit(graph, cluster, groups, method, options)
        if fitting:
            _, other, placement = min(fitting, key=lambda f: f[0])  # ties: the portfolio's order
            log.warning(
                "%s ran out of memory (%s), and neither a memory-first packing nor a search for a "
                "placement that fits found one (%d tried); using %s's placement, the fastest of "
                "the %d other placers' that fit", method, error, search.tried, other, len(fitting),
            )
            return Placement(placement.device_of, f"{method}+{other}")
    if found is None:
        raise InfeasiblePlacementError(
            f"{error}; nor did any of the {search.tried} placements a search for one that fits "
            f"tried{' (all there are)' if search.exhaustive else ''}"
        ) from None
    log.warning(
        "%s ran out of memory (%s); using a placement that a search found to fit instead, after "
        "%d %s", method, error, search.tried, "try" if search.tried == 1 else "tries",
    )
    return Placement(found.device_of, f"{method}+fit")


def _others_that_fit(
    graph: OpGraph, cluster: Cluster, groups: Groups, method: str, options: "PlacementOptions"
) -> list[tuple[float, str, Placement]]:
    """(simulated makespan, placer, placement) of each placer of the portfolio but `method`
    whose placement fits, in the portfolio's order. A placer that runs out of memory, or gives
    up (`SolverError`: in auto, m-SCT on an LP piece above its limit), is passed over."""
    fitting: list[tuple[float, str, Placement]] = []
    for other in _PORTFOLIO:
        if other in (method, "single", "packed") or other not in _METHODS:
            continue
        try:
            placement = _METHODS[other](graph, cluster, groups, options)
            schedule = check_placement(graph, cluster, groups, placement)
        except (InfeasiblePlacementError, SolverError):
            continue
        fitting.append((schedule.makespan_us, other, placement))
    return fitting


def _checked(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    placement: Placement,
    method: str,
    schedule: Optional[Schedule] = None,
    seed: int = 0,
    options: Optional["PlacementOptions"] = None,
):
    """(placement, schedule) after `check_placement`, packed (or searched for, `_packed_instead`)
    instead when it does not fit.

    `schedule`, when given, is the simulator's schedule of `placement` (auto's, which simulated
    it already: on 100k ops a simulation takes some 5 s).
    """
    try:
        return placement, check_placement(graph, cluster, groups, placement, schedule)
    except InfeasiblePlacementError as e:
        placement = _packed_instead(graph, cluster, groups, method, e, seed, options)
        return placement, check_placement(graph, cluster, groups, placement)


def _fuse_and_place(
    graph: OpGraph, cluster: Cluster, groups: Groups, options: PlacementOptions, host: Optional[HostView] = None
):
    """(placement, schedule, auto): the placement; its schedule when placing made one (auto's
    simulation, or the method's own run, `_OWN_SCHEDULES`), else None; and the portfolio's
    result when the method is ``auto``, else None."""
    # A group that fits no device, seen in O(V + E) without simulating, before any placer runs:
    # it was seen only once every placer had failed (auto's whole portfolio, m-SCT's LP), and
    # `single` said to use a multi-device method.
    refusal = FitSearch(graph, cluster, groups).refusal
    if refusal is not None:
        raise InfeasiblePlacementError(refusal)

    def run(g: OpGraph, gr: Groups) -> Placement:
        try:
            return _METHODS[options.placement_method](g, cluster, gr, options)
        except InfeasiblePlacementError as e:
            return _packed_instead(g, cluster, gr, options.placement_method, e, options.seed, options)

    fused = None
    # Everything on one device is one placement whatever is fused; on the fused graph, whose ops
    # hold their outputs longer, `single` refused graphs that fit (auto has 'single+unfused').
    if options.placer_type == "fusion" and options.placement_method != "single":
        fused = fuse(graph, groups, options=FusionOptions(path_check=options.fusion_path_check))
        log.info(
            "fusion (%s path check): %d ops into %d", options.fusion_path_check, graph.num_ops,
            fused.graph.num_ops,
        )
    if options.placement_method == "auto":
        # auto judges its candidates on the real graph even when they were placed fused.
        auto = _run_auto(graph, cluster, groups, options, fused, host)
        return auto.placement, auto.schedule, auto
    if fused is not None:
        return fused.expand(run(fused.graph, fused.groups)), None, None
    method = options.placement_method
    own = _OWN_SCHEDULES.get(method)
    if own is not None and _METHODS[method] is _BUILTIN_METHODS[method]:
        try:
            schedule = own(graph, cluster, groups, options)
            return schedule.placement, schedule, None
        except InfeasiblePlacementError as e:
            return _packed_instead(graph, cluster, groups, method, e, options.seed, options), None, None
    return run(graph, groups), None, None


def place(
    graph: OpGraph,
    cluster: Cluster,
    options: PlacementOptions = PlacementOptions(),
    *,
    host: Optional[HostView] = None,
    apart: Optional[np.ndarray] = None,
) -> PlacementResult:
    """Runs the pipeline: validate, group, place, check, baseline.

    With `host` (auto only), auto judges its candidates on the host view, and the result's
    placement and schedule are of `host.graph` on `host.cluster`; a placement that does not fit
    there raises `InfeasiblePlacementError` instead of falling back (`graph_pass.place_with_host`
    falls back). The baseline stays `graph`'s on `cluster`. `apart` (bool per op; with `host`,
    its `on_host`): the ops that will run on a host outside `cluster`, whose groups the
    ``coplace`` grouper joins to no other op's (`grouping.coplace`).
    """
    options.validate()
    if host is not None and options.placement_method != "auto":
        raise ValueError(f"a host view is for auto, not {options.placement_method!r}")
    with engine.selected(options.engine):
        return _place(graph, cluster, options, host, apart)


def _place(
    graph: OpGraph, cluster: Cluster, options: PlacementOptions, host: Optional[HostView],
    apart: Optional[np.ndarray],
) -> PlacementResult:
    fraction = options.memory_fraction

    def budgeted(c: Cluster) -> Cluster:
        return c if fraction == 1.0 else c.with_memory_fraction(fraction)

    placer_cluster = budgeted(cluster)
    judge = None if host is None else dataclasses.replace(host, cluster=budgeted(host.cluster))
    t_all = time.perf_counter()
    step = Steps()

    step("validate", graph.validate)
    if apart is None and host is not None:
        apart = host.on_host
    groups: Groups = step("group", lambda: make_groups(graph, options.grouper, apart=apart))
    if cluster.num_devices > max(groups.num_groups, _MANY_DEVICES):
        raise ConfigError(
            f"{cluster.num_devices} devices for {groups.num_groups} groups of ops: a placement uses "
            f"at most {groups.num_groups} of them, and the tables of the links between devices grow "
            f"with the square of their number, as the time and memory of placing do; ask for at most "
            f"{max(groups.num_groups, _MANY_DEVICES)} devices"
        )
    if cluster.num_devices > max(groups.num_groups, _FEW_DEVICES):
        log.warning(
            "%d devices for %d groups of ops: a placement uses at most %d of them, and the tables of "
            "the links between devices grow with the square of their number (slow with thousands); "
            "ask for fewer devices",
            cluster.num_devices, groups.num_groups, groups.num_groups,
        )

    def place_and_check(groups: Groups, suffix: str = ""):
        # auto simulated its placement already (on the real graph, also with fusion); m-ETF and
        # one device come with their own schedule.
        placement, simulated, auto = step(
            "place" + suffix, lambda: _fuse_and_place(graph, placer_cluster, groups, options, judge)
        )
        if judge is not None:
            schedule = step(
                "check" + suffix, lambda: check_placement(judge.graph, judge.cluster, groups, placement, simulated)
            )
        else:
            placement, schedule = step(
                "check" + suffix,
                lambda: _checked(
                    graph, placer_cluster, groups, placement, options.placement_method, simulated,
                    options.seed, options,
                ),
            )
        return placement, auto, schedule

    try:
        placement, auto, schedule = place_and_check(groups)
    except InfeasiblePlacementError as e:
        # coplace joins ops to their consumer's group whatever memory that group then needs (a
        # large weight to the group of an op pinned to a small device): the graph may fit with
        # TF's colocation groups alone, which are all that must stay together.
        if options.grouper != "coplace":
            raise
        log.warning(
            "nothing fits with the coplace groups (%s); placing with TF's colocation groups alone",
            e.__cause__ or e,  # the error, without the step that `step` named
        )
        groups = make_groups(graph, "tf")
        placement, auto, schedule = place_and_check(groups, " (tf groups)")
    if auto is not None and "single" in auto.judged and _single_is_baseline(options, host):
        baseline = auto.judged["single"]
    elif placement.method == "single" and _single_is_baseline(options, host):
        baseline = schedule  # the one-device schedule, checked above
    else:
        baseline = step("baseline", lambda: single_device_schedule(graph, placer_cluster, groups))
    if (
        baseline is not None
        and options.placement_method not in ("auto", "single")
        and schedule.makespan_us > _SLOWER_THAN_ONE_DEVICE * baseline.makespan_us
    ):
        times = (
            f"{schedule.makespan_us / baseline.makespan_us:.2f} times slower" if baseline.makespan_us > 0
            else "slower"  # ops of no time, and transfers
        )
        log.warning(
            "%s's placement simulates %s than one device (%.3f ms against %.3f ms: its transfers "
            "cost more than the parallel work gains); --placement_method auto keeps one device "
            "when that is faster",
            placement.method, times, schedule.makespan_us / 1e3, baseline.makespan_us / 1e3,
        )
    seen, on = (graph, cluster) if host is None else (host.graph, host.cluster)
    bound = lower_bound_us(seen, on, groups=groups if options.grouper == "tf" else make_groups(seen, "tf"))
    return PlacementResult(
        graph=seen,
        cluster=on,
        groups=groups,
        placement=placement,
        schedule=schedule,
        lower_bound_us=bound,
        single_device_makespan_us=None if baseline is None else baseline.makespan_us,
        single_device_count=1 if baseline is None else len(np.unique(baseline.placement.device_of)),
        placement_seconds=time.perf_counter() - t_all,
        step_seconds=step.seconds,
        candidates=auto.candidates if auto else None,
        refine_stats=auto.refine_stats if auto else None,
        memory_fraction=fraction,
    )
