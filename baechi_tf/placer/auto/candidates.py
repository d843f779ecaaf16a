"""auto's candidates: the placers of the portfolio as thunks, and what runs where.

`auto_candidates` builds the list of (name, thunk) that `portfolio.place_auto` judges, in the order
that breaks ties: the registry's portfolio (`methods.Registry.portfolio`), `layers` when op names
have numbered scopes, `expert` when the model brought its own layout, the placers on coarser
groups on graphs of up to `_AUTO_COARSE_MAX_OPS` ops, and with fusion or a host the candidates
that judge the graph as it runs. A worker process (`workers`) builds the same list from the same
arguments; `in_worker` says which candidates it can build, `auto_work_caps` the work each may
spend. Building the list is O(V + E) (`layers.find_layers`); the thunks place when called.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence, Union

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer import methods
from baechi_tf.placer.fusion import FusedGraph
from baechi_tf.placer.grouping import Groups, coplace
from baechi_tf.placer.layers import find_layers, place_layers
from baechi_tf.placer.pack import place_packed
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = ["HostView", "auto_candidates", "auto_work_caps", "candidate_workers", "in_worker", "single_is_baseline"]

Thunk = Callable[[float], Union[Placement, Schedule]]

# Above this size auto skips the coplace-group runs: on bench/quality.py they never decide the
# result (the same table without them), and on 100k ops they took some 28 of 69 s.
_AUTO_COARSE_MAX_OPS = 20_000
# auto places its candidates side by side, one worker process per core, from this size on (or as
# `placement_jobs` says): a worker costs some 0.5 s of a core to start.
_AUTO_JOBS_MIN_OPS = 4000
# auto's default work cap of a candidate, per op and edge and in all (`auto_work_caps`).
_WORK_PER_OP_AND_EDGE = 40
_WORK_PER_CANDIDATE = 400_000


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


def single_is_baseline(options, host: Optional[HostView]) -> bool:
    """Whether auto's one-device candidate is the one-device baseline of `pipeline.place`:
    simulated on the same graph and cluster (no fusion, no host), by the built-in `single`."""
    return (
        options.placer_type == "default" and host is None
        and methods.current().get("single") is methods.BUILTIN["single"]
    )


def auto_candidates(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    options,
    fused: Optional[FusedGraph] = None,
    host: Optional[HostView] = None,
) -> list[tuple[str, Thunk]]:
    """auto's candidates on `graph` (`run_auto`), as (name, thunk) in the order that breaks ties.
    A worker process (`workers`) builds the same list from the same arguments."""
    if cluster.num_devices == 1 and host is None:
        # Every placement is the same one: the portfolio would cost its time (8x `single`'s on a
        # 7k-op GNMT) to say so, and name whichever placer came first.
        return [("single", lambda cutoff: methods.single_schedule(graph, cluster, groups))]
    registry = methods.current()
    # The graph and groups the placers see, and the way back to `graph`'s ops.
    pgraph, pgroups = (fused.graph, fused.groups) if fused is not None else (graph, groups)

    def lifted(place: Callable[[Groups, float], Placement]) -> Callable[[float], Placement]:
        """A thunk of auto's: a cutoff in, `place(pgroups, cutoff)` expanded to `graph`'s ops.
        On the fused graph, whose times differ from the real graph's, nothing is cut off."""
        if fused is None:
            return lambda cutoff: place(pgroups, cutoff)
        return lambda cutoff: fused.expand(place(pgroups, math.inf))

    def method(m: str) -> Callable[[Groups, float], Placement]:
        run = registry[m]
        if run.cutoff:
            return lambda g, cutoff: run.place(pgraph, cluster, g, options, cutoff)
        return lambda g, cutoff: run.place(pgraph, cluster, g, options)

    names = registry.in_portfolio()
    thunks = [(m, lifted(method(m))) for m in names]
    if single_is_baseline(options, host):  # one device's schedule is simulated once
        thunks[names.index("single")] = ("single", lambda cutoff: methods.single_schedule(graph, cluster, groups))
    stems = find_layers(pgraph, cluster.num_devices)  # found once, not again inside the placer
    if stems:
        thunks.append(("layers", lifted(lambda g, cutoff: place_layers(pgraph, cluster, g, stems=stems))))
    if options.expert:
        thunks.append(("expert", lifted(lambda g, cutoff: methods.expert(pgraph, cluster, g, options))))
    if fused is not None:
        # One device and the memory-first packing, also on the real graph, where their memory
        # is exact: a packing of the fused graph may not fit the real one, and a placer that
        # does not fit falls back to this packing when it runs alone (`ladder.fall_back`), so auto
        # must have it too to be never worse than any method.
        for m in ("single", "packed"):
            thunks.append((f"{m}+unfused", lambda cutoff, m=m: registry[m].place(graph, cluster, groups, options)))
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
            if m in registry:
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


def in_worker(name: str) -> bool:
    """Whether a worker process (`workers`), which knows only the built-in methods, builds auto's
    candidate `name` as this process does: not when it uses a method registered here."""
    if name in ("layers", "expert", "packed+host"):
        return True
    method = name.split("+")[0]
    return method in methods.BUILTIN and methods.current().get(method) is methods.BUILTIN[method]


def candidate_workers(options, num_ops: int, names: Sequence[str], run_first: Sequence[str]):
    """Worker processes for auto's candidates `names` (`workers.CandidateWorkers`), or None to
    run them all in this process."""
    from baechi_tf.placer.auto import workers

    side_by_side = [n for n in names if n not in run_first and in_worker(n)]
    if options.placement_jobs:
        count = options.placement_jobs
    elif num_ops >= _AUTO_JOBS_MIN_OPS:
        count = workers.usable_cores()
    else:
        count = 1
    count = min(count, len(side_by_side))
    return workers.CandidateWorkers(count, in_worker) if count > 1 else None


def auto_work_caps(graph: OpGraph, options, count: int) -> tuple[float, float]:
    """(units for each of auto's `count` candidates, units for its refinement): with
    `options.auto_work`, half of it shared equally by the candidates and the rest, at most what
    refine_seconds buys, for refinement; else 40 units per op and edge of `graph` plus 400,000
    per candidate (m-ETF and its simulation on a 16k-op DenseNet121 of 320k edges: about 4.5
    million), refinement its own budget. A worker process (`workers`) finds the same."""
    if options.auto_work is None:
        return float(_WORK_PER_OP_AND_EDGE * (graph.num_ops + graph.num_edges) + _WORK_PER_CANDIDATE), math.inf
    share = options.auto_work // (2 * max(1, count))
    return float(share), float(options.auto_work - share * count)
