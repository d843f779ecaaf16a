"""``auto``: a portfolio of placers, the best simulated placement kept, then refined.

Runs every placer it is given (the pipeline gives m-TOPO, m-ETF, m-SCT, HEFT, ``layers`` when op
names have numbered scopes, ``single``, ``packed``, ``expert`` when the model brought its own
layout, and m-ETF, m-SCT and HEFT on coarser groups), simulates each placement, keeps the
one with the lowest makespan (ties: the order above), and improves it with `refine` (which may
also start its window balancing from the two best distinct runners-up) unless one simulation
alone takes more than the refinement budget (then it warns and skips refinement). A placer that
fails (no room, a solver error) is logged and skipped; when every placer failed, the first
failure is raised. A `ConfigError` (say, a pin to a missing device) is raised at once.

Time: the sum of the placers' times plus the refinement budget.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable, Optional, Sequence

from baechi_tf.cluster import Cluster
from baechi_tf.errors import BaechiError, ConfigError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.refine import RefineOptions, RefineStats, refine, simulation_work, work_budget
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.simulator import simulate

__all__ = ["AutoOptions", "AutoResult", "place_auto"]

log = logging.getLogger(__name__)

_ALTERNATIVES = 2  # runners-up that refinement may also start from


@dataclasses.dataclass(frozen=True)
class AutoOptions:
    refine: RefineOptions = RefineOptions()


@dataclasses.dataclass(frozen=True)
class AutoResult:
    placement: Placement  # method: 'auto(<winner>)'
    schedule: Schedule
    candidates: dict[str, Optional[float]]  # method -> simulated makespan, None when it failed
    refine_stats: Optional[RefineStats]


def place_auto(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    placers: Sequence[tuple[str, Callable[[], Placement]]],
    *,
    options: AutoOptions = AutoOptions(),
) -> AutoResult:
    """Runs `placers` (name, thunk) in order, keeps the best simulated one, refines it."""
    best: Optional[tuple[str, Schedule]] = None  # (placer, its simulated schedule)
    made: list[Schedule] = []  # every success, in the placers' order
    candidates: dict[str, Optional[float]] = {}
    first_error: Optional[BaechiError] = None
    for name, thunk in placers:
        try:
            placement = thunk()
            schedule = simulate(graph, cluster, placement)
        except ConfigError:
            raise  # the input is wrong for every placer alike
        except BaechiError as e:
            log.info("auto: %s failed: %s", name, e)
            candidates[name] = None
            first_error = first_error or e
            continue
        candidates[name] = schedule.makespan_us
        made.append(schedule)
        log.info("auto: %s simulates at %.1f us", name, schedule.makespan_us)
        if best is None or schedule.makespan_us < best[1].makespan_us:
            best = (name, schedule)
    if best is None:
        assert first_error is not None
        raise first_error
    winner, schedule = best
    placement = schedule.placement
    stats = None
    if options.refine.seconds > 0 and simulation_work(graph) > work_budget(options.refine.seconds):
        # Refinement starts with a full simulation; one that alone overruns the budget would
        # cost its time and change nothing.
        ops_per_second = graph.num_ops * work_budget(1.0) / simulation_work(graph)
        log.warning(
            "refinement skipped: one simulation of %d ops takes longer than the %g s budget "
            "(about %d ops per second); raise --refine_seconds to at least %.0f to refine",
            graph.num_ops, options.refine.seconds, ops_per_second,
            math.ceil(2 * graph.num_ops / ops_per_second),
        )
    elif options.refine.seconds > 0:
        others: list[Schedule] = []  # distinct runners-up, best first
        for s in sorted(made, key=lambda m: m.makespan_us):  # stable: ties in the placers' order
            p = s.placement
            if not p.same_as(placement) and not any(p.same_as(q.placement) for q in others):
                others.append(s)
        placement, schedule, stats = refine(
            graph, cluster, groups, placement, options=options.refine, alternatives=others[:_ALTERNATIVES]
        )
    final = Placement(placement.device_of, f"auto({winner})")
    return AutoResult(final, dataclasses.replace(schedule, placement=final), candidates, stats)
