"""Layer placement: each numbered layer of the model on one device, the other ops beside them.

Models name their layers: ``encoder/layer_0/...``, ``decoder/layer_3/...``, ``l2/t5/cell``.
Hand layouts put a whole layer on one device, so that the layers form a pipeline and only the
tensors between layers cross devices: GNMT's round-robin of layers over GPUs (Wu et al., 2016),
the expert placement Baechi (SoCC 2020) compares against. Greedy placers, which choose op by op,
rarely find that layout on deep recurrent models; this placer starts from it.

`find_layers` looks at the scope components of every op name (all but the last, after a leading
``gradients/`` scope) for numbered components (letters then digits: ``layer_3``, ``l2``,
``block7``). Their *stems* with at least two numbers (and at most four per device: more are
levels or time steps, which run one after another) whose ops hold at least a fifth of the
compute are candidates, the two heaviest kept; each op takes the number of its first component
with that stem. A group (ops that must share a device) takes the number of its member with the
most compute that has one.

`place_layers` sends layer k of K (k counted over the numbers present) to device ``k mod D``
(round robin) or, with more layers than devices, ``k * D // K`` (blocks), and holds those groups
there. The other groups are placed either by m-ETF around them or beside the assigned groups
they exchange the most bytes with (sweeps in topological order, forward then backward, until
none moves, at most eight; m-ETF places what no sweep reaches). Every (stem, layout, rest)
combination is scheduled (once each when two are the same) and the shortest kept; above 20,000
ops only the heaviest stem is tried. Last, the six heaviest name scopes (two levels, say
``decoder/attention``) of unnumbered groups that the sweeps split over devices are each tried
whole on the device that holds most of their compute, and kept so when the schedule gets
shorter. Pinned groups stay where they are pinned.

Time: up to eight m-ETF runs (two stems, two layouts, two ways for the rest) and six
simulations, each O((V + E) * D * log(V * D)); the sweeps O(S * (V + E)) for S sweeps; reading names O(V * L) for L
scope components.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.headroom import run_with_headroom
from baechi_tf.placer.pins import pinned_group_devices
from baechi_tf.placer.policies import EarliestStartPolicy, ScheduleCutOff
from baechi_tf.placer.scheduler_state import format_bytes
from baechi_tf.placer.schedule import Placement, Schedule

__all__ = ["find_layers", "place_layers"]

log = logging.getLogger(__name__)

_GRADIENTS = re.compile(r"^gradients(?:_\d+)?/")
_NUMBERED = re.compile(r"^([A-Za-z]+)_?(\d+)$")
_MIN_SHARE = 0.2  # share of the compute a stem's ops must hold
_MAX_STEMS = 2  # stems tried, heaviest first
# More numbers than this per device are levels or time steps, which run one after the other, not
# layers that can form a pipeline (and would cost an m-ETF run each for nothing).
_MAX_PER_DEVICE = 4
_SWEEPS = 8  # forward and backward sweeps that put unnumbered groups beside numbered ones
_UNITS = 6  # scopes of unnumbered groups that may be made whole afterwards, heaviest first
_LARGE_OPS = 20_000  # above this, only the heaviest stem is tried (each try is an m-ETF run)


def find_layers(graph: OpGraph, num_devices: int) -> list[tuple[str, np.ndarray]]:
    """Up to `_MAX_STEMS` (stem, layer number per op or -1) pairs, heaviest stem first: stems
    with 2 to `_MAX_PER_DEVICE` * `num_devices` numbers whose ops hold at least `_MIN_SHARE` of
    the compute."""
    compute = graph.compute_us.tolist()
    found: list[dict[str, int]] = []  # per op: stem -> number of its first component with it
    weight: dict[str, float] = defaultdict(float)
    numbers: dict[str, set[int]] = defaultdict(set)
    for op, name in enumerate(graph.names):
        first: dict[str, int] = {}
        for part in _scopes(name):
            m = _NUMBERED.match(part)
            if m and m.group(1) not in first:
                first[m.group(1)] = int(m.group(2))
        for stem, number in first.items():
            weight[stem] += compute[op]
            numbers[stem].add(number)
        found.append(first)
    total = sum(compute)
    stems = sorted(
        (
            s for s in weight
            if 2 <= len(numbers[s]) <= _MAX_PER_DEVICE * num_devices and weight[s] >= _MIN_SHARE * total
        ),
        key=lambda s: (-weight[s], s),
    )[:_MAX_STEMS]
    return [(s, np.asarray([f.get(s, -1) for f in found], dtype=np.int64)) for s in stems]


def place_layers(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    *,
    stems: Optional[list[tuple[str, np.ndarray]]] = None,
) -> Placement:
    """Places `graph` layer by layer (module docstring), by `stems` when the caller already ran
    `find_layers`. `ConfigError` when the graph has no layers; `InfeasiblePlacementError` when
    no layout fits in memory."""
    if stems is None:
        stems = find_layers(graph, cluster.num_devices)
    if not stems:
        raise ConfigError(
            "placement method 'layers' needs numbered layer scopes in the op names (layer_0/, "
            f"layer_1/, ... or l0/, l1/, ...; 2 to {_MAX_PER_DEVICE * cluster.num_devices} of "
            "them); this graph has none: use auto or m_etf"
        )
    persistent = groups.byte_sums(graph.persistent_bytes)
    pinned = pinned_group_devices(graph, cluster, groups)
    if graph.num_ops > _LARGE_OPS:
        stems = stems[:1]
    best, best_free, first_error = None, None, None
    tried: list[np.ndarray] = []
    for stem, number in stems:
        assignments, free = _assignments(graph, cluster, groups, number, pinned)
        for how, group_device in assignments.items():
            if any(np.array_equal(group_device, t) for t in tried):
                continue  # every group already had a layer number: nothing was left to place
            tried.append(group_device)
            cutoff = best.makespan_us if best is not None else math.inf
            try:
                schedule = _run(graph, cluster, groups, persistent, group_device, f"{stem}: {how}", cutoff)
            except InfeasiblePlacementError as e:
                first_error = first_error or e
                continue
            except ScheduleCutOff as e:  # it would end after the best layout so far
                log.info("layers by %r, %s: stopped, %s", stem, how, e)
                continue
            log.info("layers by %r, %s: %.1f us", stem, how, schedule.makespan_us)
            if best is None or schedule.makespan_us < best.makespan_us:
                best, best_free = schedule, free
    if best is None:
        assert first_error is not None
        raise first_error
    return Placement(
        _consolidate(graph, cluster, groups, persistent, best, best_free & (pinned < 0)), "layers"
    )


def _scopes(name: str) -> list[str]:
    """The name scopes of an op name, outermost first, without a leading gradients/ scope."""
    return _GRADIENTS.sub("", name).split("/")[:-1]


def _consolidate(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    persistent: np.ndarray,
    schedule: Schedule,
    free: np.ndarray,
) -> np.ndarray:
    """The device per op of `schedule`, with each of the `_UNITS` heaviest scopes of the `free`
    groups (unnumbered, unpinned) that ended up split over devices moved whole to the device
    holding most of its compute, when the schedule gets shorter."""
    device_of = np.asarray(schedule.placement.device_of)
    first = np.asarray([int(m[0]) for m in groups.members])
    group_device = device_of[first]
    work = groups.sums(graph.compute_us)
    units: dict[str, list[int]] = defaultdict(list)
    for g in np.flatnonzero(free).tolist():
        op = int(groups.members[g][np.argmax(graph.compute_us[groups.members[g]])])
        units["/".join(_scopes(graph.names[op])[:2])].append(g)
    ranked = sorted(units.values(), key=lambda u: -float(work[u].sum()))
    best = schedule.makespan_us
    for unit in ranked[:_UNITS]:
        share = np.bincount(group_device[unit], weights=work[unit], minlength=cluster.num_devices)
        if np.count_nonzero(share) < 2:
            continue
        trial = group_device.copy()
        trial[unit] = int(np.argmax(share))
        try:
            makespan = _run(graph, cluster, groups, persistent, trial, "whole scopes", best).makespan_us
        except (InfeasiblePlacementError, ScheduleCutOff):
            continue
        if makespan < best:
            best, group_device = makespan, trial
            log.info("layers: scope of %d groups kept whole: %.1f us", len(unit), makespan)
    return group_device[groups.group_of]


def _assignments(
    graph: OpGraph, cluster: Cluster, groups: Groups, number: np.ndarray, pinned: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Device per group (-1: left to m-ETF) of each way of laying out the numbered layers, and
    which groups have no layer number; `pinned` groups (device per group, -1: none) stay on
    their devices."""
    group_number = np.full(groups.num_groups, -1, dtype=np.int64)
    for g, members in enumerate(groups.members):
        numbered = [int(op) for op in members.tolist() if number[op] >= 0]
        if numbered:
            heaviest = max(numbered, key=lambda op: (graph.compute_us[op], -op))
            group_number[g] = number[heaviest]
    has = group_number >= 0
    values = np.unique(group_number[has])
    rank = np.full(groups.num_groups, -1, dtype=np.int64)
    rank[has] = np.searchsorted(values, group_number[has])
    k, nd = len(values), cluster.num_devices
    out = {"round robin": np.where(has, rank % nd, -1)}
    if k > nd:
        out["blocks"] = np.where(has, rank * nd // k, -1)
    for group_device in out.values():
        np.copyto(group_device, pinned, where=pinned >= 0)
    for how, group_device in list(out.items()):
        out[how + ", the rest beside"] = _follow(graph, groups, group_device)
    return out, ~has


def _run(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    persistent: np.ndarray,
    group_device: np.ndarray,
    how: str,
    cutoff_us: float = math.inf,
) -> Schedule:
    """m-ETF around the groups `group_device` places (`persistent`: bytes per group);
    `ScheduleCutOff` once an op would start after `cutoff_us` (the run cannot end before it)."""
    for d, device in enumerate(cluster.devices):
        held = float(persistent[group_device == d].sum())
        if held > device.memory_bytes:
            raise InfeasiblePlacementError(
                f"layers ({how}): the layers on {device.name!r} hold {format_bytes(held)} of "
                f"persistent memory, more than its {format_bytes(device.memory_bytes)}: use more "
                "devices, or a placer that is free to split layers (auto, m_etf)"
            )
    return run_with_headroom(
        graph, cluster, groups, EarliestStartPolicy, method="layers",
        initial_group_device=group_device.tolist(), cutoff_us=cutoff_us,
    )


def _follow(graph: OpGraph, groups: Groups, group_device: np.ndarray) -> np.ndarray:
    """`group_device` with each unassigned group put where most of the bytes it exchanges with
    assigned groups are, sweeping forward then backward in topological order until none moves
    (at most `_SWEEPS` times; m-ETF places what is left)."""
    out = group_device.copy()
    group_of = groups.group_of
    src, dst, nbytes = graph.edge_src, graph.edge_dst, graph.edge_bytes
    order = graph.topo_order.tolist()
    for _ in range(_SWEEPS):
        changed = False
        for sweep in (order, order[::-1]):
            for op in sweep:
                g = int(group_of[op])
                if out[g] >= 0:
                    continue
                votes: dict[int, float] = defaultdict(float)
                for e in graph.in_edges(op).tolist() + graph.out_edges(op).tolist():
                    other = int(group_of[src[e]]) if dst[e] == op else int(group_of[dst[e]])
                    if out[other] >= 0:
                        votes[int(out[other])] += float(nbytes[e]) + 1.0
                if votes:
                    out[g] = max(votes, key=lambda d: (votes[d], -d))
                    changed = True
        if not changed:
            break
    return out
