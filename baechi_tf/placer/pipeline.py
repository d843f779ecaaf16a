"""The placement pipeline: an ordered list of named steps over `OpGraph` and `Cluster`.

validate -> group -> place -> check -> baseline. Each step takes the previous step's values and
returns new ones; a failure names the step that broke and the steps that had run. The methods
come from the registry (`methods`), auto from `auto`, and what happens when memory runs out from
the fallback ladder (`ladder`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import time
from typing import Any, Collection, Mapping, Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf._steps import Steps
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.ranges import SHARE_OF_MEMORY, check_range
from baechi_tf.placer import engine, ladder, methods
from baechi_tf.placer.auto import HostView, run_auto
from baechi_tf.placer.auto.candidates import single_is_baseline
from baechi_tf.placer.bounds import lower_bound_us
from baechi_tf.placer.check import check_placement
from baechi_tf.placer.fusion import FusionOptions, fuse
from baechi_tf.placer.grouping import GROUPERS, Groups, make_groups
from baechi_tf.placer.executor_order import expected_peaks
from baechi_tf.placer.memory_timeline import in_shared_pool, order_windows, thread_pools
from baechi_tf.placer.methods import PLACEMENT_METHODS
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.scheduler_state import format_bytes
from baechi_tf.placer.simulator import simulate, single_device_schedule

ENGINES = engine.ENGINES

__all__ = ["ENGINES", "LP_SOLVERS", "PLACEMENT_METHODS", "HostView", "PlacementOptions", "PlacementResult", "place"]

log = logging.getLogger(__name__)

# More devices than groups is worth a warning only beyond this many devices (a small graph on a
# few devices is common and quick).
_FEW_DEVICES = 64
# More devices than groups is refused beyond this many devices: the link tables grow with the
# square of the devices, O(D^2) time and memory, all for devices that no placement can use.
_MANY_DEVICES = 1024
# A chosen method's placement this much slower than one device is worth a warning.
_SLOWER_THAN_ONE_DEVICE = 1.1
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
        why = methods.not_ported(self.placement_method)
        if why is not None:
            raise ConfigError(f"placement method {self.placement_method!r} is the original's, not ported: {why}")
        if self.placement_method not in methods.current():
            raise ConfigError(
                f"unknown placement method {self.placement_method!r}; choose one of "
                f"{', '.join(sorted(methods.current()))}"
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
        check_range("memory_fraction", self.memory_fraction, SHARE_OF_MEMORY)
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
    # Per device, the simulated peak with no op held back for memory (`memory_as_run`); None
    # when no op can have been held back (every device could hold the whole graph).
    unheld_peak_bytes: Optional[tuple[int, ...]] = None
    # `reordered_peak_bytes` where placing computed it already (memory was tight enough for its
    # warning, `memory_reordered`); None: computed on first use.
    reordered_peaks_known: Optional[tuple[int, ...]] = dataclasses.field(default=None, repr=False)

    @property
    def makespan_us(self) -> float:
        return self.schedule.makespan_us

    @functools.cached_property
    def reordered_peak_bytes(self) -> tuple[int, ...]:
        """Per device, the peak the model expects TF to reach, above or below the schedule's own
        (`executor_order.expected_peaks`): on CPU devices that share their process's pool of
        threads, the highest peak of steps of TF's executor emulated on that pool
        (`executor_order.emulated_peaks`); on the others, the peak where TF runs each device's ops
        up to its `memory_timeline.order_windows` places out of the simulated order and makes its
        copies as it does, a received one from the earliest its producer may end, a sent tensor
        freed once copied (`memory_timeline.reordered_peaks`). On first use, where placing did
        not need it."""
        if self.reordered_peaks_known is not None:
            return self.reordered_peaks_known
        return expected_peaks(self.graph, self.cluster, self.schedule)

    def op_to_device(self) -> dict[str, str]:
        return self.placement.op_to_device(self.graph, self.cluster)


def _fuse_and_place(
    graph: OpGraph, cluster: Cluster, groups: Groups, options: PlacementOptions, host: Optional[HostView] = None
):
    """(placement, schedule, auto): the placement; its schedule when placing made one (auto's
    simulation, or the method's own run, `methods.Method.own_schedule`), else None; and the
    portfolio's result when the method is ``auto``, else None."""
    # A group that fits no device is refused before any placer runs (the ladder's step 0): it was
    # seen only once every placer had failed (auto's whole portfolio, m-SCT's LP), and `single`
    # said to use a multi-device method.
    ladder.refuse(graph, cluster, groups)
    method = methods.current()[options.placement_method]

    def run(g: OpGraph, gr: Groups) -> Placement:
        try:
            return method.place(g, cluster, gr, options)
        except InfeasiblePlacementError as e:
            return ladder.fall_back(g, cluster, gr, method.name, e, options.seed, options)

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
        auto = run_auto(graph, cluster, groups, options, fused, host)
        return auto.placement, auto.schedule, auto
    if fused is not None:
        return fused.expand(run(fused.graph, fused.groups)), None, None
    if method.own_schedule is not None:
        try:
            schedule = method.own_schedule(graph, cluster, groups, options)
            return schedule.placement, schedule, None
        except InfeasiblePlacementError as e:
            return ladder.fall_back(graph, cluster, groups, method.name, e, options.seed, options), None, None
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
                lambda: ladder.checked(
                    graph, placer_cluster, groups, placement, options.placement_method, simulated,
                    options.seed, options,
                ),
            )
        return placement, auto, schedule

    groups, (placement, auto, schedule) = ladder.regrouped(graph, options.grouper, groups, place_and_check)
    if auto is not None and "single" in auto.judged and single_is_baseline(options, host):
        baseline = auto.judged["single"]
    elif placement.method == "single" and single_is_baseline(options, host):
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
    checked_on = placer_cluster if judge is None else judge.cluster
    # The schedule is of (graph, placer_cluster), which memory_as_run sees only without a judge.
    own = schedule if judge is None and host is None else None
    unheld = step("memory", lambda: memory_as_run(seen, checked_on, placement, own))
    warned = {d for d, p in enumerate(unheld or ()) if p > checked_on.devices[d].memory_bytes}
    # A device that holds the whole graph cannot run out in any order (`memory_as_run`).
    reordered = None if unheld is None else step(
        "memory out of order", lambda: memory_reordered(seen, checked_on, schedule, warned))
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
        unheld_peak_bytes=unheld,
        reordered_peaks_known=reordered,
    )


def memory_as_run(
    graph: OpGraph, cluster: Cluster, placement: Placement, schedule: Optional[Schedule] = None
) -> Optional[tuple[int, ...]]:
    """Per device, the peak of `placement` simulated with no op held back for memory; None when
    the simulator can have held none back: every device of `cluster` holds the whole graph (a
    device never holds more than every tensor once, as its own or a copy, and every op's scratch
    and persistent bytes). `schedule`, when given, is a schedule of `placement` on `graph` and
    `cluster`: where it can have held no op back (`_none_held_back`), its own peaks are returned,
    with no simulation.

    The simulator starts an op only once its memory fits, so a placement whose schedule fits
    `cluster` may fit only because ops waited. TensorFlow's executor does not order ops by
    memory: it runs each as soon as its inputs are there, and an allocation that does not fit
    waits at most a while for other ops to free memory (the GPU allocator's retry; on a CPU
    device not at all) before it fails the step. Where that peak is above a device's memory, a
    warning names the devices. Costs one more simulation, only when memory is that tight."""
    whole = graph.total_bytes
    if all(d.memory_bytes >= whole for d in cluster.devices):
        return None
    if schedule is not None and _none_held_back(graph, cluster, schedule):
        return schedule.peak_memory_bytes
    roomy = dataclasses.replace(cluster, devices=tuple(
        dataclasses.replace(d, memory_bytes=max(d.memory_bytes, whole)) for d in cluster.devices))
    peaks = simulate(graph, roomy, placement).peak_memory_bytes
    over = [(d, p) for d, p in enumerate(peaks) if p > cluster.devices[d].memory_bytes]
    if over:
        log.warning(
            "%s's placement fits the devices' memory in the simulation only because it holds ops "
            "back until their memory is free, and TensorFlow runs each op as soon as its inputs are "
            "there: run so, it peaks at %s; a device of that size may run out of memory "
            "(place with more memory per device, or with --placer_memory_fraction below 1 to keep "
            "room)",
            placement.method, _peaks_over(cluster, over),
        )
    return peaks


def _none_held_back(graph: OpGraph, cluster: Cluster, schedule: Schedule) -> bool:
    """Whether `schedule` can have held no op back for memory: on every device, its peak plus the
    most bytes an op of it may allocate when it starts (scratch, outputs, and the tensors it reads
    from other devices) fits. An op waits only where the memory in use, at most the peak, and its
    allocation exceed the device. O(V + E)."""
    device_of = schedule.placement.device_of.astype(np.int64)
    start_bytes = graph.temp_bytes.astype(np.int64) + graph.output_total_bytes.astype(np.int64)
    data = graph.edge_src_output >= 0
    src, dst = graph.edge_src[data], graph.edge_dst[data]
    crossing = device_of[src] != device_of[dst]
    np.add.at(start_bytes, dst[crossing], graph.tensor_bytes[graph.edge_tensor[data][crossing]].astype(np.int64))
    largest = np.zeros(cluster.num_devices, dtype=np.int64)
    np.maximum.at(largest, device_of, start_bytes)
    return all(int(peak) + int(most) <= d.memory_bytes
               for peak, most, d in zip(schedule.peak_memory_bytes, largest.tolist(), cluster.devices))


def memory_reordered(
    graph: OpGraph, cluster: Cluster, schedule: Schedule, warned: Collection[int] = ()
) -> tuple[int, ...]:
    """Per device, the peak of `schedule` that TF's executor may reach, running each device's ops
    up to its `memory_timeline.order_windows` places out of the simulated order or, on CPU devices
    of a shared pool of threads, as that pool takes them (`executor_order.expected_peaks`).

    TensorFlow's executor runs a device's ready ops in an order of its own, so the step's peak
    lies around the simulated one, above it as often as below. Where this peak is above a
    device's memory (but on the devices in `warned`, named already), a warning names the
    devices; none can be where the device holds the whole graph (`OpGraph.total_bytes`: a
    device never holds more than every tensor once and every op's scratch and persistent bytes,
    in any order). A pass over the schedule's memory, and one for each emulated step."""
    peaks = expected_peaks(graph, cluster, schedule)
    over = [(d, p) for d, p in enumerate(peaks) if p > cluster.devices[d].memory_bytes and d not in warned]
    if over:
        pools = thread_pools(cluster)
        shared = in_shared_pool(pools)
        device_windows = order_windows(pools)
        windows = sorted({device_windows[d] for d, _ in over if not shared[d]})
        ways = ([f"with each op up to {' or '.join(map(str, windows))} places away from its simulated place"]
                if windows else []) + (["as a shared pool of threads takes them"]
                                       if any(shared[d] for d, _ in over) else [])
        log.warning(
            "%s's placement fits the devices' memory in the simulated order of its ops, but "
            "TensorFlow runs a device's ready ops in an order of its own: %s, it peaks at %s; a "
            "device of that size may run out of memory (place with --placer_memory_fraction below "
            "1 to keep room)",
            schedule.placement.method, ", or ".join(ways), _peaks_over(cluster, over),
        )
    return peaks


def _peaks_over(cluster: Cluster, over: list[tuple[int, int]]) -> str:
    """'X on D (of M), ...' for the (device, peak) pairs `over` of the memory warnings."""
    return ", ".join(
        f"{format_bytes(p)} on {cluster.names[d]} (of {format_bytes(cluster.devices[d].memory_bytes)})" for d, p in over
    )
