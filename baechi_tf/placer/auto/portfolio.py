"""auto's portfolio: every candidate placed and simulated, the best kept, then refined.

Runs every placer it is given (`candidates.auto_candidates` gives m-TOPO and the original's variant
of it, m-ETF, m-SCT, HEFT, ``layers`` when op names have numbered scopes, ``single``, ``packed``,
``expert`` when the model brought its own layout, and m-ETF, m-SCT and HEFT on coarser groups; with
ops pinned to a host outside the cluster, also a packing that counts the copies from it; after them,
the fit search when a method alone would fall back to it), simulates each placement, keeps the one
with the lowest makespan (ties: the order above), and improves it with `refine` (which may also
start its window balancing from the two best distinct runners-up) unless one simulation alone takes
more than the refinement budget (then it warns and skips refinement). A placer that fails (no room,
a solver error) is logged and skipped; when every placer failed, the first failure is raised. A
`ConfigError` (say, a pin to a missing device) is raised at once. One device and the packing run
first; a placement that is sure to end too late to win or to be balanced is stopped as soon as its
schedule shows it (`place_auto`).

Time: the sum of the placers' times plus the refinement budget.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Optional, Protocol, Sequence, Union

from baechi_tf.cluster import Cluster
from baechi_tf.errors import BaechiError, ConfigError, InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.auto.refine import (
    MAX_ALTERNATIVES,
    RefineOptions,
    RefineStats,
    alternative_reach,
    refine,
    simulation_work,
    work_budget,
)
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.policies import ScheduleCutOff
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.simulator import simulate
from baechi_tf.placer.work import OverWorkCap, metered
from baechi_tf.progress import Progress

__all__ = ["RUN_FIRST", "AutoOptions", "AutoResult", "Outcome", "judge_candidate", "place_auto"]

log = logging.getLogger(__name__)

# A placer's own list-scheduler run stops at twice the cutoff its simulation gets: m-ETF's run is
# a schedule of its placement, seldom far from its simulation, m-SCT's holds devices for
# favourite children that the simulation does not, so its simulation may end sooner than its run.
_PLACER_SLACK = 2.0

# The candidates that run first, one after another: cheap ones, whose best makespan
# then bounds the rest.
RUN_FIRST = ("single", "packed", "single+unfused", "packed+unfused", "packed+host")
# Side by side, the candidates that take longest go first, so that the others fill the time
# beside them: `layers` runs m-ETF once per layout and once per scope it makes whole.
LONGEST_FIRST = ("layers",)

# What became of a candidate: its simulated schedule, or the error that stopped it (a
# `ScheduleCutOff` or `OverWorkCap`, or a `BaechiError` when it failed).
Outcome = Union[Schedule, Exception]
Thunk = Callable[[float], Union[Placement, Schedule]]


def judge_candidate(
    graph: OpGraph, cluster: Cluster, thunk: Thunk, cutoff: float, work_cap: float = math.inf
) -> Outcome:
    """The placement `thunk` makes (given `_PLACER_SLACK` times `cutoff`), simulated on `graph`
    and `cluster` up to `cutoff`; the `ScheduleCutOff`, `OverWorkCap` (its list-scheduler runs,
    the simulation's included, would take more than `work_cap` units) or `BaechiError` it raised
    instead."""
    try:
        with metered(work_cap):
            made_by = thunk(_PLACER_SLACK * cutoff)
            if isinstance(made_by, Schedule):
                late = float(made_by.start_us.max(initial=0.0))
                if late > cutoff:  # where `simulate` would have stopped
                    raise ScheduleCutOff(late, cutoff)
                return made_by
            return simulate(graph, cluster, made_by, cutoff_us=cutoff)
    except (ScheduleCutOff, OverWorkCap, BaechiError) as e:
        return e


class Remote(Protocol):
    """Runs candidates elsewhere, side by side (`workers.CandidateWorkers`)."""

    def accepts(self, name: str) -> bool:
        """Whether it can run the candidate `name`."""

    def run(
        self, tasks: Sequence[tuple[int, str]], cutoff: float, local: Callable[[int], Outcome],
        done: Callable[[int], None],
    ) -> dict[int, Outcome]:
        """The outcome of each (index, name) in `tasks`, judged up to `cutoff`; `local(index)`
        runs one here (one it does not accept, or one whose worker failed). Calls `done(index)`
        as each ends."""


@dataclasses.dataclass(frozen=True)
class AutoOptions:
    refine: RefineOptions = RefineOptions()
    # Wall-clock seconds from the start of auto after which no placer starts and refinement
    # stops; the best placement found so far is returned, with a warning. None: no limit.
    timeout_s: Optional[float] = None
    # Units of work (`work`) each placer after the first ones (`run_first`) may spend on its
    # list-scheduler runs and its placement's simulation; one that would pass it is stopped.
    candidate_work: float = math.inf
    # Units of work refinement may spend at most (besides `refine.seconds`' own budget).
    refine_work: float = math.inf


@dataclasses.dataclass(frozen=True)
class AutoResult:
    placement: Placement  # method: 'auto(<winner>)'
    schedule: Schedule
    # method -> simulated makespan; None when it failed or was stopped (`place_auto`)
    candidates: dict[str, Optional[float]]
    refine_stats: Optional[RefineStats]
    judged: dict[str, Schedule]  # method -> its simulated schedule, for each that was not None


def place_auto(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    placers: Sequence[tuple[str, Thunk]],
    *,
    options: AutoOptions = AutoOptions(),
    run_first: Sequence[str] = (),
    free_devices: Optional[int] = None,
    remote: Optional[Remote] = None,
    fallbacks: Sequence[tuple[str, str, Thunk]] = (),
) -> AutoResult:
    """Runs `placers` (name, thunk), keeps the best simulated one (ties: the first in `placers`),
    refines it. A thunk returns a `Placement`, or a `Schedule` that `simulate` made of it on
    `graph` and `cluster` (one device's: simulated once, not again).

    The placers named in `run_first` run first (cheap ones, whose makespan then bounds the
    rest). Each thunk gets a cutoff for its own list-scheduler runs (twice the simulation's, see
    `_PLACER_SLACK`; it may ignore it); a placement whose simulation passes `cutoff` times the
    best makespan so far is stopped (`ScheduleCutOff`) and recorded as None: it could neither win
    nor be a runner-up that refinement balances (`refine.alternative_reach`). On wide graphs
    whose ready ops wait for copies over busy channels, a hopeless m-ETF run otherwise costs
    time quadratic in the graph (`list_scheduler`).

    With `remote`, when it accepts two or more of the placers that do not run first, those run
    side by side there, the others here meanwhile, and all of them get the cutoff of the best
    placer that ran first: each one's outcome then does not depend on which of the others ends
    first, so the result is the same from run to run. One after another, each gets the best so
    far, a tighter cutoff; a candidate stopped by either cutoff ends too late to be kept, so the
    result is the same as theirs too (unless m-SCT's own run is stopped at `_PLACER_SLACK` times
    a cutoff that its simulation would have beaten, which these cutoffs assume it never is).

    Refinement moves unpinned groups only among the first `free_devices` devices (all by
    default): a host that runs only the ops pinned to it comes last.

    With `options.timeout_s`, a placer that would start after that many seconds of wall-clock
    time does not run (but for the first, when none has made a placement yet), refinement stops
    then, and a warning names what did not run; the placement then depends on the machine.

    `fallbacks` (name, after, thunk) are what a method run alone falls back to when its
    placement does not fit and neither does the placement of the candidate `after` (the
    packing), which it tries first: the fit search. Each is judged, after the others and here,
    when some candidate ran out of memory and `after` did too; otherwise it could not be the
    result of any method alone, and it is not run (nor listed in `candidates`).
    """
    deadline = math.inf if options.timeout_s is None else time.perf_counter() + options.timeout_s
    late: list[str] = []  # candidates not run for the time limit
    refine_units = min(work_budget(options.refine.seconds), options.refine_work)
    refines = (
        options.refine.seconds > 0
        and (cluster.num_devices if free_devices is None else free_devices) > 1
        and simulation_work(graph) <= refine_units
    )
    reach = alternative_reach(graph, options.refine.seconds) if refines else 1.0
    placers = list(placers)  # and the fallbacks judged
    best: Optional[tuple[int, Schedule]] = None  # (index in placers, its simulated schedule)
    made: list[tuple[int, Schedule]] = []  # every success
    candidates: dict[str, Optional[float]] = {name: None for name, _ in placers}
    errors: dict[int, BaechiError] = {}  # failures by index in placers
    over_cap: list[int] = []  # stopped for the work cap, by index in placers
    first = [i for i, (name, _) in enumerate(placers) if name in run_first]
    rest = [i for i, (name, _) in enumerate(placers) if name not in run_first]

    def cutoff_now() -> float:
        return reach * best[1].makespan_us if best is not None else math.inf

    def record(i: int, outcome: Outcome) -> None:
        nonlocal best
        name = placers[i][0]
        if isinstance(outcome, ConfigError):
            raise outcome  # the input is wrong for every placer alike
        if isinstance(outcome, ScheduleCutOff):
            log.info("auto: %s stopped: %s (the best so far ends at %.1f us)", name, outcome, best[1].makespan_us)
            return
        if isinstance(outcome, OverWorkCap):
            log.info("auto: %s stopped: %s, its share of auto's budget (--auto_work)", name, outcome)
            over_cap.append(i)
            return
        if isinstance(outcome, BaechiError):
            log.info("auto: %s failed: %s", name, outcome)
            errors[i] = outcome
            return
        candidates[name] = outcome.makespan_us
        made.append((i, outcome))
        log.info("auto: %s simulates at %.1f us", name, outcome.makespan_us)
        if best is None or (outcome.makespan_us, i) < (best[1].makespan_us, best[0]):
            best = (i, outcome)

    with Progress("auto: placers", len(placers), tick=True) as bar:

        def here(i: int, cutoff: float) -> Outcome:
            bar.update(note=placers[i][0] + (f" (best {best[1].makespan_us:,.1f} us)" if best is not None else ""))
            capped = i in rest  # the first ones and the fallbacks make a placement whatever it costs
            cap = options.candidate_work if capped else math.inf
            return judge_candidate(graph, cluster, placers[i][1], cutoff, cap)

        def one_by_one(indices: list[int]) -> None:
            for i in indices:
                try:
                    if best is not None and time.perf_counter() >= deadline:
                        late.append(placers[i][0])
                        continue
                    record(i, here(i, cutoff_now()))
                finally:
                    bar.update(advance=1)

        one_by_one(first)
        if best is not None and time.perf_counter() >= deadline:
            one_by_one(rest)  # none runs: each is listed as late
        elif remote is not None and sum(remote.accepts(placers[i][0]) for i in rest) > 1:
            cutoff = cutoff_now()
            log.info(
                "auto: %d candidates side by side%s", len(rest),
                f", each stopped past {cutoff:,.1f} us" if cutoff < math.inf else "",
            )
            bar.update(note=f"{len(rest)} side by side")
            longest_first = sorted(rest, key=lambda i: placers[i][0] not in LONGEST_FIRST)
            outcomes = remote.run(
                [(i, placers[i][0]) for i in longest_first], cutoff, lambda i: here(i, cutoff),
                lambda i: bar.update(advance=1),
            )
            for i in rest:
                record(i, outcomes[i])
        else:
            one_by_one(rest)
        failed = {placers[i][0] for i, e in errors.items() if isinstance(e, InfeasiblePlacementError)}
        for name, after, thunk in fallbacks:
            if failed and after in failed and best is not None and time.perf_counter() >= deadline:
                late.append(name)
            elif failed and after in failed:
                candidates[name] = None
                placers.append((name, thunk))
                record(len(placers) - 1, here(len(placers) - 1, cutoff_now()))
    if best is None and over_cap:  # a placement is needed: the first stopped one, whatever it costs
        i = over_cap[0]
        log.warning(
            "auto: no placer made a placement within its share of the work budget; %s's is "
            "made without one (raise --auto_work)", placers[i][0],
        )
        record(i, judge_candidate(graph, cluster, placers[i][1], math.inf))
    if best is None:
        raise errors[min(errors)]  # the first placer's, whatever ran first
    winner, schedule = placers[best[0]][0], best[1]
    placement = schedule.placement
    stats = None
    if options.refine.seconds > 0 and simulation_work(graph) > options.refine_work:
        log.warning(
            "refinement skipped: one simulation of %d ops takes more than the %d units of work "
            "left to it of --auto_work; raise --auto_work to refine", graph.num_ops, int(options.refine_work),
        )
    elif options.refine.seconds > 0 and simulation_work(graph) > refine_units:
        # Refinement starts with a full simulation; one that alone overruns the budget would
        # cost its time and change nothing.
        ops_per_second = graph.num_ops * work_budget(1.0) / simulation_work(graph)
        log.warning(
            "refinement skipped: one simulation of %d ops takes longer than the %g s budget "
            "(about %d ops per second); raise refine_seconds (--refine_seconds) to at least %.0f to refine",
            graph.num_ops, options.refine.seconds, ops_per_second,
            math.ceil(2 * graph.num_ops / ops_per_second),
        )
    elif options.refine.seconds > 0:
        others: list[Schedule] = []  # distinct runners-up, best first
        for _, m in sorted(made, key=lambda m: (m[1].makespan_us, m[0])):  # ties: placers' order
            p = m.placement
            if not p.same_as(placement) and not any(p.same_as(q.placement) for q in others):
                others.append(m)
        if time.perf_counter() >= deadline:
            late.append("refinement")
        else:
            placement, schedule, stats = refine(
                graph, cluster, groups, placement, options=options.refine,
                alternatives=others[:MAX_ALTERNATIVES], free_devices=free_devices, deadline=deadline,
                work=options.refine_work,
            )
            if time.perf_counter() >= deadline and stats.work < refine_units:
                late.append("the rest of refinement")
    if late:
        log.warning(
            "auto: the time limit of %g s (--placement_timeout_s) was reached; not run: %s. The "
            "placement is the best found so far (%s); raise the limit or drop it for the full search",
            options.timeout_s, ", ".join(late), winner,
        )
    final = Placement(placement.device_of, f"auto({winner})")
    judged = {placers[i][0]: s for i, s in made}
    return AutoResult(final, dataclasses.replace(schedule, placement=final), candidates, stats, judged)
