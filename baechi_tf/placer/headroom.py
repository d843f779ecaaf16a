"""The headroom step of the memory fallback ladder (`ladder.LADDER`): a greedy list-scheduler run
that ran out of memory is run again with more of each device kept free of persistent memory.

A greedy placer (m-ETF, m-SCT, `layers`) can fill devices with weights early and leave no room for
a tensor later. `run_with_headroom` runs it with each share of `HEADROOMS` in turn, a fresh policy
each time, until a run fits. It sits beside `ladder.py`, not in it: the placers that call it are
below the ladder (the ladder imports the registry of methods, which imports them).

Time: at most len(headrooms) runs of the list scheduler.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.policies import Policy
from baechi_tf.placer.run_scheduler import run_list_scheduler
from baechi_tf.placer.schedule import Schedule

__all__ = ["HEADROOMS", "run_with_headroom"]


HEADROOMS = (0.0, 0.25, 0.5, 0.75)
"""Shares of each device that placing groups' persistent memory must leave free, tried in turn
when a greedy run runs out of memory (it can fill devices with weights early)."""


def run_with_headroom(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    make_policy: Callable[[], Policy],
    *,
    method: str,
    headrooms: Sequence[float] = HEADROOMS,
    initial_group_device: Optional[Sequence[int]] = None,
    cutoff_us: float = math.inf,
) -> Schedule:
    """`run_list_scheduler` with a fresh policy per headroom in `headrooms` until one run fits;
    the first run's `InfeasiblePlacementError` when none does (`ScheduleCutOff` ends at once)."""
    first_error: Optional[InfeasiblePlacementError] = None
    for headroom in headrooms:
        try:
            return run_list_scheduler(
                graph, cluster, groups, make_policy(), method=method,
                initial_group_device=initial_group_device, persistent_headroom=headroom,
                cutoff_us=cutoff_us,
            )
        except InfeasiblePlacementError as e:
            first_error = first_error or e
    assert first_error is not None
    raise first_error
