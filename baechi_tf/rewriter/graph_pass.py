"""The graph pass: GraphDef + profile + cluster -> placed GraphDef and a report.

`place_graph_def` is the ordered list of named steps of the design: import (GraphDef -> `OpGraph`),
place (group, place, check, simulate: `baechi_tf.placer.pipeline.place`) and apply (placement ->
a copy of the GraphDef whose ``device`` fields changed). A failure says which step broke.

Ops that must run on the host CPU (pinned there, or without a kernel for the devices' type) take
part in the simulation there. The host is not a placement target: the other ops are placed on the
cluster's devices, the host's ops (with their TF colocation groups) go to the host, and the whole
placement is checked and simulated on the cluster plus the host, which is then the report's
cluster. The placer's choices for the other ops count the host's ops' time as if they ran on a
cluster device, and none of their bytes; when the placement does not fit once they run on the
host, a packing, a fit search or another placer's placement replaces it (the fallback ladder's
last step, `placer.ladder.host_fallback`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Any, Mapping, Optional, Union

import numpy as np

from baechi_tf.cluster import Cluster, Device
from baechi_tf.cost_model.machine_load import busy_warning
from baechi_tf.cost_model.profile import CostProfile, Coverage, ProfileMismatch, load_profile
from baechi_tf._startup import collector_paused
from baechi_tf._steps import Steps
from baechi_tf.errors import ConfigError, InfeasiblePlacementError, InvalidGraphError
from baechi_tf.graph import OpGraph
from baechi_tf.placer import engine, ladder
from baechi_tf.placer.auto import HostView
from baechi_tf.placer.bounds import lower_bound_us
from baechi_tf.placer.check import check_placement
from baechi_tf.placer.grouping import colocation_groups, make_groups
from baechi_tf.placer.pipeline import PlacementOptions, PlacementResult, memory_reordered, place
from baechi_tf.placer.schedule import Placement
from baechi_tf.placer.simulator import simulate, single_device_placements
from baechi_tf.rewriter.apply import apply_placement
from baechi_tf.rewriter.devices import host_device as default_host_device
from baechi_tf.rewriter.importer import KernelLookup, import_graph_def
from baechi_tf.rewriter.pins import resolve_function_devices

__all__ = ["PlacementReport", "place_graph_def", "place_with_host"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class PlacementReport:
    """What a placement decided and how good the simulator says it is."""

    result: PlacementResult  # graph, cluster (with the host when used), placement, schedule
    coverage: Coverage  # how much of the graph the profile measured
    default_compute_ops: tuple[str, ...]  # unprofiled ops with no same-type estimate: from shapes
    host_ops: tuple[str, ...]  # ops kept on the host CPU for lack of a kernel
    host_device: Optional[str]  # the host CPU when it runs some ops, else None
    mismatch: Optional[ProfileMismatch]  # what did not match, when a mismatch was allowed
    notes: tuple[str, ...]
    step_seconds: Mapping[str, float]  # wall time of import, place, apply

    @functools.cached_property
    def op_to_device(self) -> dict[str, str]:
        """Op name -> device name, for every op of the graph."""
        return self.result.op_to_device()

    @property
    def makespan_us(self) -> float:
        return self.result.makespan_us

    @property
    def lower_bound_us(self) -> float:
        return self.result.lower_bound_us

    @property
    def single_device_makespan_us(self) -> Optional[float]:
        return self.result.single_device_makespan_us

    @property
    def devices_used(self) -> tuple[str, ...]:
        used = np.unique(self.result.placement.device_of)
        return tuple(self.result.cluster.names[int(d)] for d in used)

    def summary(self) -> str:
        from baechi_tf.report import summary_table

        # The importer's note names the ops that ran in no traced step, with the first of them.
        lines = [summary_table(self.result), "", self.coverage.describe(unrun=False)]
        unmatched = self.coverage.unmatched_by_type()
        if unmatched:
            lines.append(f"traced time no op accounts for: {unmatched}")
        if self.default_compute_ops:
            lines.append(
                f"{len(self.default_compute_ops)} unprofiled ops of types never profiled were "
                "estimated from their shapes (bytes, FLOPs)"
            )
        busy = busy_warning(self.coverage.machine_load, "the profile's steps")
        if busy:
            lines.append(busy)
        if self.mismatch is not None:
            lines.append(f"profile mismatch (allowed): {self.mismatch.describe()}")
        lines.extend(self.notes)
        return "\n".join(lines)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _with_host(cluster: Cluster, host: Device) -> Cluster:
    return dataclasses.replace(cluster, devices=cluster.devices + (host,))


def place_with_host(
    graph: OpGraph, cluster: Cluster, host: Optional[Device], options: PlacementOptions
) -> PlacementResult:
    """`place` on `cluster`, with the ops pinned to `host` (not a cluster device) kept there.

    The placer sees the host's ops (with their TF colocation groups) as free ops of no bytes: the
    host holds their weights, scratch and outputs (an embedding pinned to the host CPU must not
    need room on a GPU). Then they move to the host (`HostView.lift`), where the consumers of
    their outputs receive copies the placer did not count. auto judges and refines its
    candidates so moved, with those copies (`place`'s `host`); another method's placement is
    moved once it is made. When the moved placement does not fit, `ladder.host_fallback` replaces
    it. One device (``single``) has nothing to fall back to.
    """
    options.validate()
    with engine.selected(options.engine):  # also for the simulations made here
        return _place_with_host(graph, cluster, host, options)


def _place_with_host(
    graph: OpGraph, cluster: Cluster, host: Optional[Device], options: PlacementOptions
) -> PlacementResult:
    if host is None or cluster.find(host.name) is not None:
        return place(graph, cluster, options)
    full = _with_host(cluster, host)
    # Any spelling of the host's name pins to it ('CPU:0', '/cpu:0', TF's in-process full name),
    # as any spelling of a device's pins to that device.
    host_pinned = [d is not None and full.find(d) == cluster.num_devices for d in graph.pinned_device]
    if not any(host_pinned):
        return place(graph, cluster, options)
    t0 = time.perf_counter()
    tf_groups = colocation_groups(graph)  # raises when a group is pinned to the host and elsewhere
    with_host = np.zeros(tf_groups.num_groups, dtype=bool)
    with_host[tf_groups.group_of[np.flatnonzero(host_pinned)]] = True
    hosted = with_host[tf_groups.group_of]
    # The placer sees the host's ops without their pins and without bytes.
    free = dataclasses.replace(
        graph,
        pinned_device=tuple(None if h else d for h, d in zip(host_pinned, graph.pinned_device)),
        output_bytes=tuple(
            tuple(0 for _ in outs) if h else outs for h, outs in zip(hosted.tolist(), graph.output_bytes)
        ),
        temp_bytes=_read_only(np.where(hosted, 0, graph.temp_bytes)),
        persistent_bytes=_read_only(np.where(hosted, 0, graph.persistent_bytes)),
    )
    view = HostView(graph, full, _read_only(np.asarray(host_pinned, dtype=bool)))
    host_index = view.host_index
    checked = full if options.memory_fraction == 1.0 else full.with_memory_fraction(
        options.memory_fraction
    )
    auto = options.placement_method == "auto"
    inner: Optional[PlacementResult] = None
    try:
        if auto:  # judged with the host's ops on the host
            inner = place(free, cluster, options, host=view)
            placement, schedule = inner.placement, inner.schedule
        else:
            inner = place(free, cluster, options, apart=view.on_host)
            placement = view.lift(inner.placement, inner.groups)
            schedule = check_placement(graph, checked, inner.groups, placement)
    except InfeasiblePlacementError as e:
        if options.placement_method == "single" or (inner is None and not auto):
            raise  # one device has nothing to fall back to; nor has a method that found nothing
        groups = inner.groups if inner is not None else make_groups(free, options.grouper, apart=view.on_host)
        method = inner.placement.method if inner is not None else "auto"
        placement, schedule = ladder.host_fallback(
            graph, free, cluster, checked, groups, method, view, options, e,
            lambda m: place(free, cluster, dataclasses.replace(options, placement_method=m)).placement.device_of,
        )
    if inner is not None:
        groups = inner.groups
    single, single_count = None, 1
    if inner is None or inner.single_device_makespan_us is not None:  # host ops on the host
        for one in single_device_placements(free, cluster, groups):
            lifted = view.lift(Placement(one, "single"), groups)
            try:
                single = simulate(graph, checked, lifted).makespan_us
            except InfeasiblePlacementError:
                continue
            single_count = len(np.unique(one[lifted.device_of != host_index]))
            break
    if auto and inner is not None:  # place() took the bound of `graph` on `full` already
        bound = inner.lower_bound_us
    else:
        bound = lower_bound_us(graph, full, groups=tf_groups)
    if inner is not None and schedule is inner.schedule:  # auto's, judged with the host already
        reordered = inner.reordered_peaks_known
    elif any(d.memory_bytes < graph.total_bytes for d in checked.devices):  # else: on first use
        reordered = memory_reordered(graph, checked, schedule)
    else:
        reordered = None
    seconds = dict(inner.step_seconds) if inner is not None else {}
    seconds["host"] = time.perf_counter() - t0 - sum(seconds.values())  # all but place()'s steps
    return PlacementResult(
        graph=graph,
        cluster=full,
        groups=groups,
        placement=placement,
        schedule=schedule,
        lower_bound_us=bound,
        single_device_makespan_us=single,
        single_device_count=single_count,
        placement_seconds=time.perf_counter() - t0,
        step_seconds=seconds,
        candidates=inner.candidates if inner is not None else None,
        refine_stats=inner.refine_stats if inner is not None else None,
        memory_fraction=options.memory_fraction,
        reordered_peaks_known=reordered,
    )


# The method of a placement that only the graph's device fields made.
_PINNED = "none: every op pinned by the graph"

# What the warning about such a graph says to do, by default.
_UNPIN_HINT = "clear the graph's device fields (baechi place --replace_devices)"


def _nothing_to_place(graph: OpGraph, host_ops: tuple[str, ...]) -> bool:
    """Whether every TF colocation group holds an op pinned to a device, some by the graph's own
    device fields (not only for want of a kernel, `host_ops`): then no placer chooses anything."""
    groups = colocation_groups(graph)
    pinned = np.zeros(groups.num_groups, dtype=bool)
    pinned[groups.group_of[[op for op, d in enumerate(graph.pinned_device) if d is not None]]] = True
    kernel_only = set(host_ops)
    return bool(pinned.all()) and any(
        d is not None and name not in kernel_only for name, d in zip(graph.names, graph.pinned_device)
    )


def place_graph_def(
    graph_def: Any,
    profile: Union[CostProfile, str, os.PathLike],
    cluster: Cluster,
    options: PlacementOptions = PlacementOptions(),
    *,
    allow_profile_mismatch: bool = False,
    host_device: Optional[Device] = None,
    device_aliases: Optional[Mapping[str, str]] = None,
    ignore_user_devices: bool = False,
    kernel_lookup: Optional[KernelLookup] = None,
    unpin_hint: str = _UNPIN_HINT,
) -> tuple[Any, PlacementReport]:
    """Places the ops of `graph_def` on `cluster` and returns (placed GraphDef, report).

    `profile` is a `CostProfile` or the path of a profile file. The placed GraphDef is a new
    message; `graph_def` is not changed. `host_device` defaults to CPU:0 of the cluster's first
    device's task. `unpin_hint` is what the warning about a graph whose every op is pinned says to
    do to have them placed (by default, `baechi place`'s flag). The other keywords are those of
    `baechi_tf.rewriter.importer.import_graph_def`.
    """
    # Arguments of the wrong type raised AttributeError or TypeError that did not name them.
    for name, value, kinds, example in (
        ("profile", profile, (CostProfile, str, os.PathLike), "a CostProfile or the path of a profile file"),
        ("cluster", cluster, (Cluster,), "a Cluster (Cluster([Device('/device:GPU:0', 8 << 30), ...]))"),
        ("options", options, (PlacementOptions,), "a PlacementOptions (PlacementOptions(placement_method='m_etf'))"),
    ):
        if not isinstance(value, kinds):
            raise ConfigError(f"{name}={value!r} is a {type(value).__name__}; give {example}")
    options.validate()
    if not hasattr(graph_def, "node") or not hasattr(graph_def, "SerializeToString"):
        raise InvalidGraphError(
            f"graph_def must be a tf.compat.v1.GraphDef, not {type(graph_def).__name__}; "
            "pass graph.as_graph_def()"
        )
    if not isinstance(profile, CostProfile):
        profile = load_profile(profile)
    if host_device is None:
        host_device = default_host_device(cluster.devices[0].task)
    step = Steps()

    # A large graph's import and placement make millions of objects that live on (`collector_paused`).
    with collector_paused():
        imported = step(
            "import",
            lambda: import_graph_def(
                graph_def,
                profile,
                cluster,
                host_device=host_device,
                device_aliases=device_aliases,
                allow_profile_mismatch=allow_profile_mismatch,
                ignore_user_devices=ignore_user_devices,
                kernel_lookup=kernel_lookup,
            ),
        )
        result = step("place", lambda: place_with_host(imported.graph, cluster, host_device, options))
        if _nothing_to_place(imported.graph, imported.host_ops):
            log.warning(
                "every op is pinned to a device by the graph (%d ops: a graph placed before?), so "
                "placement method %r placed none and the placement is the graph's own; to place them "
                "again, %s",
                imported.graph.num_ops, options.placement_method, unpin_hint,
            )
            result = dataclasses.replace(result, placement=Placement(result.placement.device_of, _PINNED))
        placed = step("apply", lambda: resolve_function_devices(
            apply_placement(graph_def, result.op_to_device()), cluster, host_device=host_device,
            device_aliases=device_aliases, ignore_user_devices=ignore_user_devices,
        ))
    report = PlacementReport(
        result=result,
        coverage=imported.coverage,
        default_compute_ops=imported.default_compute_ops,
        host_ops=imported.host_ops,
        host_device=imported.host_device,
        mismatch=imported.mismatch,
        notes=imported.notes,
        step_seconds=step.seconds,
    )
    log.info(
        "placed %d ops on %d devices: makespan %.0f us, lower bound %.0f us",
        imported.graph.num_ops,
        len(report.devices_used),
        report.makespan_us,
        report.lower_bound_us,
    )
    return placed, report
