"""The memory fallback ladder: what happens, in order, when a placement runs out of memory.

A greedy placer never takes a decision back, so it can fill devices with weights early and leave
no room for a tensor later. `LADDER` is the ordered list of steps, as data: each `Step` names
what it tries, when it runs, the method name a placement it gives carries, and the code that runs
it. docs/methods.md renders it as one table (`ladder_table`, docs/hooks/tables.py). Each step runs
only when the one before found no placement that fits.

A method alone climbs the steps whose `run` is here, in order (`fall_back`): packing, fit
search, other placers, error. The steps around them run where their inputs are: the refusal
(`refuse`) before any placer, the headroom inside the list scheduler
(`headroom.run_with_headroom`), the TF groups around the whole placement (`regrouped`), the
host ops after it (`host_fallback`). auto runs the same steps as candidates instead
(`auto_fallbacks`; see `auto.portfolio.place_auto`'s `fallbacks`).

Time: the packing O(V + E); the fit search its own budget (`fit.FitSearch`, about 3 s); the
other placers each their own time plus a simulation.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Callable, Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError, SolverError
from baechi_tf.graph import OpGraph
from baechi_tf.placer import methods
from baechi_tf.placer.check import check_placement
from baechi_tf.placer.fit import FitSearch
from baechi_tf.placer.fusion import FusedGraph
from baechi_tf.placer.grouping import Groups, make_groups
from baechi_tf.placer.pins import pinned_group_devices
from baechi_tf.placer.pack import place_packed
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = [
    "HOST_FALLBACK_METHODS", "LADDER", "Step", "auto_fallbacks", "checked", "fall_back", "fit_thunk",
    "host_fallback", "ladder_table", "others_that_fit", "refuse", "regrouped",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Attempt:
    """A method alone that ran out of memory (`error`), climbing the ladder."""

    graph: OpGraph
    cluster: Cluster
    groups: Groups
    method: str
    error: InfeasiblePlacementError
    seed: int
    options: Optional[object]  # PlacementOptions: the other placers run with them; None: not tried
    made_search: Optional[FitSearch] = None

    def search(self) -> FitSearch:
        """The fit search of `graph`, made once."""
        if self.made_search is None:
            self.made_search = FitSearch(self.graph, self.cluster, self.groups, seed=self.seed)
        return self.made_search


def _packing(a: _Attempt) -> Optional[Placement]:
    if a.method == "packed":
        return None
    try:
        packed = place_packed(a.graph, a.cluster, a.groups)
    except InfeasiblePlacementError:
        return None
    log.warning("%s ran out of memory (%s); using a memory-first packing instead", a.method, a.error)
    return Placement(packed.device_of, f"{a.method}+packed")


def _fit_search(a: _Attempt) -> Optional[Placement]:
    search = a.search()
    found = search.run()
    if found is None and search.tried == 0:  # no placement can fit: the reason, not the method's
        raise InfeasiblePlacementError(search.refusal or str(a.error)) from None
    if found is None:
        return None
    log.warning(
        "%s ran out of memory (%s); using a placement that a search found to fit instead, after "
        "%d %s", a.method, a.error, search.tried, "try" if search.tried == 1 else "tries",
    )
    return Placement(found.device_of, f"{a.method}+fit")


def _other_placers(a: _Attempt) -> Optional[Placement]:
    # The search is a heuristic: it can miss a placement that a greedy placer finds.
    if a.options is None:
        return None
    fitting = others_that_fit(a.graph, a.cluster, a.groups, a.method, a.options)
    if not fitting:
        return None
    _, other, placement = min(fitting, key=lambda f: f[0])  # ties: the portfolio's order
    log.warning(
        "%s ran out of memory (%s), and neither a memory-first packing nor a search for a "
        "placement that fits found one (%d tried); using %s's placement, the fastest of "
        "the %d other placers' that fit", a.method, a.error, a.search().tried, other, len(fitting),
    )
    return Placement(placement.device_of, f"{a.method}+{other}")


def _give_up(a: _Attempt) -> Optional[Placement]:
    search = a.search()
    raise InfeasiblePlacementError(
        f"{a.error}; nor did any of the {search.tried} placements a search for one that fits "
        f"tried{' (all there are)' if search.exhaustive else ''}"
    ) from None


@dataclasses.dataclass(frozen=True)
class Step:
    """One rung of the ladder."""

    name: str
    tries: str  # what it tries
    when: str  # when it runs
    method: str  # the method name of a placement it gives
    code: str  # where it runs
    run: Optional[Callable[[_Attempt], Optional[Placement]]] = None  # a method alone's step here


LADDER: tuple[Step, ...] = (
    Step(
        "refusal", "refuses a group that fits no device even alone, with its size and the devices'",
        "before any placer runs", "(error)", "`ladder.refuse`, `fit.FitSearch.refusal`",
    ),
    Step(
        "headroom", "runs m-ETF, m-SCT and `layers` again with 25%, then 50%, then 75% of each device "
        "kept free of weights (persistent bytes)", "their greedy run ran out of memory", "`<method>`",
        "`headroom.run_with_headroom`, `HEADROOMS`",
    ),
    Step(
        "packing", "a memory-first packing of whole groups, which fits whenever it packs",
        "the method's placement does not fit (not for `packed` itself; `single` has nothing to fall "
        "back to)", "`<method>+packed`", "`ladder.fall_back`, `pack.place_packed`", _packing,
    ),
    Step(
        "fit search", "a search in the simulator for any placement that fits: every placement of the "
        "unpinned groups when that costs at most its budget (about 3 s), else moves of groups off the "
        "devices where ops wait for memory", "the packing does not fit", "`<method>+fit`",
        "`ladder.fall_back`, `fit.FitSearch`", _fit_search,
    ),
    Step(
        "other placers", "the fastest of the other placers' placements that fit (m-TOPO, m-ETF, "
        "m-SCT, HEFT, `m_topo_nonuniform`)", "the search found none", "`<method>+<other>`",
        "`ladder.fall_back`, `ladder.others_that_fit`", _other_placers,
    ),
    Step(
        "error", "`InfeasiblePlacementError` saying how many placements the search tried, and \"(all "
        "there are)\" when that was every one", "none of the above fits", "(error)", "`ladder.fall_back`",
        _give_up,
    ),
    Step(
        "TF groups", "steps 0-5 again with TF's colocation groups alone, with a warning "
        "(coplace may join a large weight to an op pinned to a small device)",
        "`--grouper coplace` and nothing fits", "as above", "`ladder.regrouped`",
    ),
    Step(
        "host ops", "a packing of the other ops, then the fit search of the graph as it runs, then "
        "the fastest of one device and the other placers'", "ops pinned to the host CPU, and the "
        "placement no longer fits once their outputs are copied from the host",
        "`<method>+packed`, `+fit`, `+<other>`", "`ladder.host_fallback`",
    ),
)


def fall_back(
    graph: OpGraph, cluster: Cluster, groups: Groups, method: str, error: InfeasiblePlacementError,
    seed: int = 0, options=None, *, start: str = "packing", search: Optional[FitSearch] = None,
) -> Placement:
    """The placement that the ladder's steps from `start` give when `method`'s placement ran out
    of memory (`error`): a packing, a placement the fit search finds (`search`, if made already:
    it runs once), with `options` the fastest of the other placers' that fit; else an
    `InfeasiblePlacementError` that says what was tried. One device (`single`) has nothing to
    fall back to: `error`."""
    if method == "single":
        raise error
    attempt = _Attempt(graph, cluster, groups, method, error, seed, options, search)
    steps = [s for s in LADDER if s.run is not None]
    for step in steps[[s.name for s in steps].index(start):]:
        found = step.run(attempt)
        if found is not None:
            return found
    raise AssertionError("the ladder's last step raises")


def refuse(graph: OpGraph, cluster: Cluster, groups: Groups) -> None:
    """Step 0: raises when a group fits no device, seen in O(V + E) without simulating, before
    any placer runs (it was seen only once every placer had failed)."""
    refusal = FitSearch(graph, cluster, groups).refusal
    if refusal is not None:
        raise InfeasiblePlacementError(refusal)


def others_that_fit(
    graph: OpGraph, cluster: Cluster, groups: Groups, method: str, options
) -> list[tuple[float, str, Placement]]:
    """(simulated makespan, placer, placement) of each placer of the portfolio but `method`
    whose placement fits, in the portfolio's order. A placer that runs out of memory, or gives
    up (`SolverError`: in auto, m-SCT on an LP piece above its limit), is passed over."""
    registry = methods.current()
    fitting: list[tuple[float, str, Placement]] = []
    for other in registry.in_portfolio():
        if other in (method, "single", "packed"):
            continue
        try:
            placement = registry[other].place(graph, cluster, groups, options)
            schedule = check_placement(graph, cluster, groups, placement)
        except (InfeasiblePlacementError, SolverError):
            continue
        fitting.append((schedule.makespan_us, other, placement))
    return fitting


def checked(
    graph: OpGraph, cluster: Cluster, groups: Groups, placement: Placement, method: str,
    schedule: Optional[Schedule] = None, seed: int = 0, options=None,
) -> tuple[Placement, Schedule]:
    """(placement, schedule) after `check_placement`; when it does not fit, the ladder's
    (`fall_back`) instead. `schedule`, when given, is the simulator's schedule of `placement`
    (auto's, which simulated it already: on 100k ops a simulation takes some 5 s)."""
    try:
        return placement, check_placement(graph, cluster, groups, placement, schedule)
    except InfeasiblePlacementError as e:
        placement = fall_back(graph, cluster, groups, method, e, seed, options)
        return placement, check_placement(graph, cluster, groups, placement)


def regrouped(graph: OpGraph, grouper: str, groups: Groups, place_and_check: Callable[[Groups, str], tuple]):
    """(groups, place_and_check(groups, suffix)): with the `coplace` grouper, when nothing fits,
    again with TF's colocation groups alone (suffix ' (tf groups)'). coplace joins ops to their
    consumer's group whatever memory that group then needs (a large weight to the group of an op
    pinned to a small device): the graph may fit with TF's groups, all that must stay together."""
    try:
        return groups, place_and_check(groups, "")
    except InfeasiblePlacementError as e:
        if grouper != "coplace":
            raise
        log.warning(
            "nothing fits with the coplace groups (%s); placing with TF's colocation groups alone",
            e.__cause__ or e,  # the error, without the step that `Steps` named
        )
        groups = make_groups(graph, "tf")
        return groups, place_and_check(groups, " (tf groups)")


def fit_thunk(make_search: Callable[[], FitSearch], fused: Optional[FusedGraph] = None) -> Callable[[float], Placement]:
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


def auto_fallbacks(
    graph: OpGraph, cluster: Cluster, groups: Groups, seed: int, real: Callable[[], FitSearch],
    fused: Optional[FusedGraph] = None, host=None,
) -> list[tuple[str, str, Callable[[float], Placement]]]:
    """The fit searches that a method alone falls back to, as auto's fallback candidates
    (name, the candidate that must have failed first, thunk; `place_auto`'s `fallbacks`).
    `real`: the search of `graph`, made once (the last resort takes its result).

    Without them auto ended with a slower placement than such a method (fuzzing: 3.64 s where
    HEFT, through the search, gave 3.15 s), or failed where it placed. With fusion, the fused
    graph's search and the real graph's (when the expanded placement does not fit there). With
    the host's ops on the host (`host`, a `HostView`), the search of the graph the placers see
    (the placement moved to the host after) and the search of the graph as it runs
    (`host_fallback`)."""
    if host is not None:
        runs = functools.cache(lambda: FitSearch(
            host.graph, host.cluster, groups, seed=seed, free_devices=cluster.num_devices
        ))
        seen_fit = fit_thunk(real)  # the search of the graph the placers see
        return [
            ("fit", "packed", lambda cutoff: host.lift(seen_fit(cutoff), groups)),
            ("fit+host", "packed+host", fit_thunk(runs)),
        ]
    if fused is not None:
        return [
            ("fit", "packed", fit_thunk(lambda: FitSearch(fused.graph, cluster, fused.groups, seed=seed), fused)),
            ("fit+unfused", "packed+unfused", fit_thunk(real)),
        ]
    return [("fit", "packed", fit_thunk(real))]


# The placers whose placements one that no longer fits once the host runs its ops falls back to.
HOST_FALLBACK_METHODS = ("m_topo", "m_etf", "m_sct", "heft")


def host_fallback(
    graph: OpGraph,
    free: OpGraph,
    cluster: Cluster,
    on: Cluster,
    groups: Groups,
    method: str,
    view,
    options,
    error: InfeasiblePlacementError,
    place_free: Callable[[str], np.ndarray],
) -> tuple[Placement, Schedule]:
    """Step 7: (placement, schedule) of `graph` on `on` (the cluster and the host, last) when
    `method`'s placement of `free` (auto's: every one it judged) does not fit once the host's
    ops run there (`error`). `view` is the `HostView`; `place_free(m)` is method `m`'s placement
    of `free` on `cluster` (device per op).

    The candidates: a memory-first packing of the other ops on the cluster's devices (it counts
    every input as received, so it fits whenever it packs), then a placement the fit search finds,
    then the other placers' placements (and one device, each in turn), the fastest that fits.
    auto judged that packing (`packed+host`) and the placers' already, but not what a placer
    that runs out of memory alone falls back to, a search of `free` (its placement moved to the
    host after): it takes the fastest that fits of one device (each in turn), that search's and
    the search's of `graph`, so that it is never slower than another method.
    """
    host_index = on.num_devices - 1
    name = options.placement_method
    auto = name == "auto"

    def fitting(device_of: np.ndarray, label: str):
        # Named after the method asked for: a fallback of `method`'s own (m_etf+fit) is gone.
        placed = Placement(device_of, f"{name}({label})" if auto else f"{name}+{label}")
        try:
            return placed, check_placement(graph, on, groups, placed)
        except InfeasiblePlacementError:
            return None

    def packed():
        try:
            return fitting(place_packed(graph, on, groups, free_devices=cluster.num_devices).device_of, "packed")
        except InfeasiblePlacementError:
            return None

    def others():
        """One device each and the other placers' placements of `free` (auto judged theirs
        already), host ops on the host."""
        pinned = pinned_group_devices(free, cluster, groups)
        for d in range(cluster.num_devices):
            one = np.where(pinned >= 0, pinned, d)[groups.group_of]
            yield fitting(view.lift(Placement(one, "single"), groups).device_of, "single")
        for m in () if auto else HOST_FALLBACK_METHODS:
            if name == m:
                continue
            try:
                device_of = place_free(m)
            except InfeasiblePlacementError:
                continue
            yield fitting(view.lift(Placement(device_of, m), groups).device_of, m)

    def fastest(candidates):
        found = [c for c in candidates if c is not None]
        return min(found, key=lambda c: c[1].makespan_us) if found else None

    def free_searched():
        """What a placer that ran out of memory on `free` alone took (`fall_back`), the host's
        ops moved to the host."""
        fraction = options.memory_fraction
        placer_cluster = cluster if fraction == 1.0 else cluster.with_memory_fraction(fraction)
        found = FitSearch(free, placer_cluster, groups, seed=options.seed).run()
        return None if found is None else fitting(view.lift(found, groups).device_of, "fit")

    def searched():
        found = search.run()
        return None if found is None else fitting(found.device_of, "fit")

    search = FitSearch(graph, on, groups, seed=options.seed, free_devices=cluster.num_devices)
    if search.refusal is not None:  # no placement can fit: the reason, not the method's
        raise InfeasiblePlacementError(search.refusal) from None
    if auto:
        # The search ignores time: of two that fit, either may be the faster.
        steps: Sequence[Callable] = (lambda: fastest([*others(), free_searched(), searched()]),)
    else:
        steps = (packed, searched, lambda: fastest(others()))
    for step in steps:
        found = step()
        if found is not None:
            log.warning(
                "%s's placement does not fit once the host's ops run on %s (%s); using %s's "
                "placement instead", method, on.names[host_index], error, found[0].method,
            )
            return found
    raise InfeasiblePlacementError(
        f"{error}; nor did a memory-first packing fit, nor any of the {search.tried} placements a "
        "search for one that fits tried, nor the other placers' placements"
    ) from None


def ladder_table() -> str:
    """The docs' table of `LADDER` (docs/methods.md), one row per step, numbered from 0."""
    rows = ["| # | step | what it tries | when | method name | code |", "|---|---|---|---|---|---|"]
    for i, s in enumerate(LADDER):
        rows.append(f"| {i} | {s.name} | {s.tries} | {s.when} | {s.method} | {s.code} |")
    return "\n".join(rows)
