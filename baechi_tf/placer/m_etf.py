"""m-ETF: memory-constrained Earliest Task First (Baechi, SoCC 2020, section 4.2).

ETF (Hwang, Chow, Anger and Lee, SIAM J. Comput. 18(2), 1989) repeatedly schedules the ready op
and device pair that can start earliest, counting the time to bring the op's inputs to that
device. Without memory limits its makespan is at most (2 - 1/m) times the optimum plus the
longest chain of communication. m-ETF only considers devices where the op (and, for the first op
of a colocation group, the whole group's persistent memory) fits; an op waits for memory to be
freed when none has room yet. Greedy placement can fill devices with weights early and leave no
room for tensors later; m-ETF then runs again with part of each device kept free of persistent
memory (25%, 50%, 75%) before it gives up. It runs on the shared list scheduler, so the schedule
m-ETF built is a schedule of its placement under the simulator's model (`schedule_m_etf` returns
it, and the pipeline checks it instead of simulating the placement again). It is not always the
one `simulate` finds: m-ETF weighs every device at each step, so an op may start before ops of
its device that the simulator, which weighs only each op's own device, would run first.

Time: O((V + E) * D * log(V * D)) for V ops, E edges, D devices, plus the re-evaluations of the
list scheduler's stale keys (see `list_scheduler`: up to quadratic on wide graphs whose ready ops
all wait for copies over busy channels); memory O(V * D + E). D counts the devices the schedule
has touched and one of each set of twins it has not (`list_scheduler`), so D stays near the
devices used on a large cluster.
"""

from __future__ import annotations

import dataclasses
import math

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.headroom import HEADROOMS, run_with_headroom
from baechi_tf.placer.policies import EarliestStartPolicy
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = ["METFOptions", "place_m_etf", "schedule_m_etf"]


@dataclasses.dataclass(frozen=True)
class METFOptions:
    # Shares of each device that placing groups' persistent memory must leave free, tried in
    # turn when a run runs out of memory (greedy placement can fill devices with weights early).
    headrooms: tuple[float, ...] = HEADROOMS
    cutoff_us: float = math.inf  # give up (ScheduleCutOff) once an op would start after this


def place_m_etf(
    graph: OpGraph, cluster: Cluster, groups: Groups, *, options: METFOptions = METFOptions()
) -> Placement:
    """Places `graph` on `cluster` by m-ETF; `InfeasiblePlacementError` if every run runs out
    of memory (the first run's error is raised)."""
    return schedule_m_etf(graph, cluster, groups, options=options).placement


def schedule_m_etf(
    graph: OpGraph, cluster: Cluster, groups: Groups, *, options: METFOptions = METFOptions()
) -> Schedule:
    """`place_m_etf`'s placement with the schedule m-ETF built for it."""
    return run_with_headroom(
        graph, cluster, groups, EarliestStartPolicy, method="m_etf", headrooms=options.headrooms,
        cutoff_us=options.cutoff_us,
    )
