"""``auto``: a portfolio of placers, the best simulated placement kept, then refined.

The package follows auto's data path, each module below the one before it:

- `candidates`: the placers of the portfolio as thunks (`auto_candidates`), what a worker can
  build (`in_worker`) and the work each may spend (`auto_work_caps`);
- `portfolio`: runs the candidates, judges each in the simulator and keeps the best
  (`place_auto`);
- `refine`: the local search that improves the best one, starting with `windows`' balancing;
- `workers`: the worker processes that place candidates side by side.

`run_auto` ties them together for `pipeline.place`; the memory fallbacks it judges beside the
candidates come from `ladder`. Nothing here imports `pipeline`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Optional

from baechi_tf.cluster import Cluster
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer import ladder
from baechi_tf.placer.auto.candidates import (
    HostView,
    auto_candidates,
    auto_work_caps,
    candidate_workers,
)
from baechi_tf.placer.auto.portfolio import RUN_FIRST, AutoOptions, AutoResult, judge_candidate, place_auto
from baechi_tf.placer.auto.refine import RefineOptions
from baechi_tf.placer.fit import FitSearch
from baechi_tf.placer.fusion import FusedGraph
from baechi_tf.placer.grouping import Groups

__all__ = [
    "RUN_FIRST", "AutoOptions", "AutoResult", "HostView", "auto_candidates", "judge_candidate", "place_auto",
    "run_auto",
]


def run_auto(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    options,
    fused: Optional[FusedGraph] = None,
    host: Optional[HostView] = None,
) -> AutoResult:
    """auto's portfolio on `graph` with `options` (a `PlacementOptions`). With `fused`
    (``--placer_type=fusion``) the placers run on the fused graph, which is smaller, and each
    placement is expanded to `graph`'s ops before auto simulates, compares and refines it: the
    fused graph understates memory and times its ops differently (see `fusion`), so judging
    placements there kept ones slower than another candidate on the real graph, or ones that did
    not fit at all (and auto then failed where every other method, falling back to a packing,
    placed the graph). With `host` (its cluster with memory_fraction applied), each placement is
    lifted before it is judged, on the host view's graph and cluster, for the same reason; the
    placers' own runs then get no cutoff (their times, the host's ops on a device, are not the
    judge's), and when no candidate fits the error is raised for the caller's fallback. On large
    graphs (or with `placement_jobs`) the candidates after the first run side by side in worker
    processes (`workers`)."""
    thunks = auto_candidates(graph, cluster, groups, options, fused, host)
    candidate_work, refine_work = auto_work_caps(host.graph if host is not None else graph, options, len(thunks))
    auto_options = AutoOptions(
        RefineOptions(options.refine_seconds, options.seed), options.placement_timeout_s, candidate_work,
        refine_work,
    )
    # The searches are made when first needed, and run once: when every candidate fails, the real
    # graph's has run, and the last resort below takes its result.
    real = functools.cache(lambda: FitSearch(graph, cluster, groups, seed=options.seed))
    fallbacks = ladder.auto_fallbacks(graph, cluster, groups, options.seed, real, fused, host)
    remote = candidate_workers(options, graph.num_ops, [name for name, _ in thunks], RUN_FIRST)
    with remote if remote is not None else contextlib.nullcontext():
        if remote is not None:
            remote.start((graph, cluster, groups, options, fused, host))
        if host is not None:
            return place_auto(
                host.graph, host.cluster, groups, thunks, options=auto_options, run_first=RUN_FIRST,
                free_devices=cluster.num_devices, remote=remote, fallbacks=fallbacks,
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
            found = ladder.fall_back(
                graph, cluster, groups, "auto", e, options.seed, options, start="fit search", search=real()
            )
    name = found.method.removeprefix("auto+")  # 'fit', or the other placer whose placement fits
    return place_auto(graph, cluster, groups, [(name, lambda cutoff: found)], options=auto_options)
