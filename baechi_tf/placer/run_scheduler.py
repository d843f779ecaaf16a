"""Running the list scheduler: `make_list_scheduler` makes one on the engine that runs its policy
(`engine.current()`: the compiled `native_scheduler.NativeListScheduler` or the Python reference
`list_scheduler.ListScheduler`), and `run_list_scheduler` runs one to the end and returns its
schedule, with a progress bar and the work it did counted against `work.metered`'s cap.

This is the entry point of m-ETF, m-SCT, `layers`, the simulator, refinement and the fit search;
time and memory are the scheduler's (`baechi_tf.placer.list_scheduler`).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer import native_scheduler
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import ListScheduler
from baechi_tf.placer.policies import FixedPolicy, Policy
from baechi_tf.placer.schedule import Schedule
from baechi_tf.placer.scheduler_state import GraphTables
from baechi_tf.placer.work import current_meter, scheduler_work
from baechi_tf.progress import Progress

__all__ = ["make_list_scheduler", "run_list_scheduler"]


def run_list_scheduler(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    policy: Policy,
    *,
    method: str,
    initial_group_device: Optional[Sequence[int]] = None,
    persistent_headroom: float = 0.0,
    cutoff_us: float = math.inf,
) -> Schedule:
    """Schedules every op under `policy`; raises `InfeasiblePlacementError` when stuck.

    `initial_group_device` places groups up front (the simulator places all of them): their
    persistent memory is then held from the start. `persistent_headroom` is the share of each
    device that placing a group's persistent memory must leave free. `ScheduleCutOff` when an op
    would start after `cutoff_us`; `OverWorkCap` when the run takes the work of a `work.metered`
    body past its cap.
    """
    scheduler = make_list_scheduler(
        graph, cluster, groups, policy, initial_group_device, persistent_headroom, cutoff_us=cutoff_us
    )
    label = f"simulating {method}" if isinstance(policy, FixedPolicy) else f"{method}: scheduling"
    meter = current_meter()
    try:
        with Progress(label, graph.num_ops, unit="ops") as bar:
            scheduler.run(bar, meter)
    finally:
        if meter is not None:  # a run stopped for the cap counts as the cap (`place_auto`)
            meter.used += scheduler.scheduled + scheduler_work(scheduler)
    if meter is not None:
        meter.check(0)  # stopped exactly when its whole work passes the cap, whatever the engine
    return scheduler.schedule(method)


def make_list_scheduler(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    policy: Policy,
    initial_group_device: Optional[Sequence[int]] = None,
    persistent_headroom: float = 0.0,
    tables: Optional[GraphTables] = None,
    cutoff_us: float = math.inf,
):
    """A `ListScheduler`, or a `native_scheduler.NativeListScheduler` when the compiled engine
    runs this policy (`native_scheduler.native_for`): the same steps and schedules either way."""
    native = native_scheduler.native_for(graph, cluster, policy)
    if native is not None:
        return native_scheduler.NativeListScheduler(
            native, graph, cluster, groups, policy, initial_group_device, persistent_headroom, cutoff_us
        )
    return ListScheduler(
        graph, cluster, groups, policy, initial_group_device, persistent_headroom, tables, cutoff_us
    )
