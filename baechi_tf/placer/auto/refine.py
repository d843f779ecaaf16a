"""Refinement: local search that moves or swaps whole groups while the simulated step time drops.

Starting from a placement, `refine` first runs window balancing (`windows.balance_windows`: a
surrogate search that cuts transfers while keeping every device and channel busy over time) in a
few settings, coarse windows first on the start placement and fine ones first on runners-up that
start close enough to catch up, each result simulated and kept only when the makespan drops; this
phase gets at most half the budget. Then it tries moves that target the critical path of the
current schedule first (put an op next to the predecessor whose transfer it waits for, take a
group off the busiest device, swap two groups), then seeded random moves. A move is kept only
when the simulated makespan drops; a move that breaks a memory limit cannot finish its simulation
and is dropped. Groups move whole and pinned groups never move, so every intermediate placement
passes `check_placement`.

Each move is evaluated by incremental re-simulation: the schedule is snapshotted as it is built,
and a move is re-simulated from the last snapshot taken before any moved op could start (the
prefix is provably the same: decisions are made in time order, and memory is checked on both
devices). The re-simulation stops as soon as an op's start plus the longest compute chain after
it reaches the current makespan, which rejects most bad moves early.

The budget is counted in units of work, not wall time, so the result is deterministic for a
given seed: ``seconds`` is converted at `WORK_PER_SECOND` (measured on a 2-core machine). A unit
is a scheduling step or a dry run of an op on a device (each takes some microseconds; the dry runs
per step range from 2 to 8 with the graph, so steps alone would not track time); restarting the
scheduler for a move costs `1 / _RESTART_SHARE` of a unit per op, window balancing
`1 / _MOVES_PER_UNIT` per op move, and a copy given a slot on the channels (booked, or tried in a
dry run) `work.UNITS_PER_COPY`. A move whose re-simulation would take the work past the budget is dropped where it stands,
not finished (on the 25,841 ops of `make demo` a move costs a fifth of a 3 s budget, and finishing
the last one made it 5.2 s); the result of window balancing, a large step, is simulated to its
end. A wall-clock stop at ten times the budget (plus 5 s) guards against much slower machines
(only then can the result depend on timing).

Time per move: O(V + E) to start a scheduler and copy its snapshot, then O(k log k) for the k
ops after the snapshot; memory: O(S * (V + E)) for S snapshots.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import random
import time
from typing import Callable, Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer.auto.windows import balance_windows
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import ListScheduler
from baechi_tf.placer.pins import pinned_group_devices
from baechi_tf.placer.policies import FixedPolicy
from baechi_tf.placer.run_scheduler import make_list_scheduler
from baechi_tf.placer.scheduler_state import GraphTables
from baechi_tf.placer.native_scheduler import NativeSnapshot
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.work import scheduler_work
from baechi_tf.progress import Progress

__all__ = [
    "MAX_ALTERNATIVES", "RefineOptions", "RefineStats", "WORK_PER_SECOND", "alternative_reach", "refine",
    "simulation_work", "work_budget",
]

log = logging.getLogger(__name__)

WORK_PER_SECOND = 130_000  # units of work per second on this 2-core machine (measured: 139k-285k)
_RESTART_SHARE = 8  # restarting the scheduler for a move costs a unit per this many ops
_WORK_PER_OP = 4  # a full simulation's units per op, to foresee its cost (measured: 3 to 9)
_SNAPSHOTS = 24  # snapshots per simulated schedule
_DEVICES_PER_UNIT = 2  # a snapshot costs a unit of work per this many devices (measured on 200)
# Window balancing: op moves evaluated per unit of work (measured: 250k-450k op moves per second),
# and the settings (overlap, number of windows) tried, best first on bench/quality.py.
_MOVES_PER_UNIT = 3
_WINDOW_SETTINGS = ((False, 128), (False, 32), (True, 8), (False, 4), (True, 64), (False, 16))
# The start placement is the best of the portfolio and already even over fine windows: with a 30 s
# budget, which tries every setting, (True, 8) lowered its makespan on layered-2000 and gnmt_v2,
# (False, 128) on Transformer and (False, 32) on none, while runners-up gained most from
# (False, 128) and (False, 32). At 3 s the start gets through two or three settings, so it tries
# coarse windows first (bench/quality.py at 3 s: gnmt_v2 -3.1%, layered-2000 -2.0%, Transformer
# -1.6%).
_START_WINDOW_SETTINGS = ((True, 8), (False, 128), (False, 32), (False, 4), (True, 64), (False, 16))
_WINDOW_ROUNDS = 3  # re-balances on the new schedule's windows per setting
# An alternative is balanced only when it starts at most this share slower than the start
# placement per round of balancing that its share of the budget buys (a round, balancing and
# simulating its result, costs about three simulations). On bench graphs a round gained a few
# percent on a runner-up; at 3 s, runners-up 8-50% behind got one or two rounds and never caught up,
# and the start placement makes better use of their share (bench/quality.py at 3 s:
# layered-2000 -1.4%, the others the same), while at 30 s a runner-up 8% behind won on
# layered-2000 after ten rounds.
_GAP_PER_ROUND = 0.03
MAX_ALTERNATIVES = 2  # runners-up that window balancing may also start from


@dataclasses.dataclass(frozen=True)
class RefineOptions:
    seconds: float = 3.0  # budget, converted to units of work; 0 turns refinement off
    seed: int = 0  # seeds the order of random moves


@dataclasses.dataclass(frozen=True)
class RefineStats:
    initial_makespan_us: float
    final_makespan_us: float
    moves_tried: int
    moves_accepted: int
    windows_tried: int  # window-balancing results simulated
    windows_accepted: int  # ... of which lowered the makespan
    work: int  # units of work spent (see the module docstring)
    seconds: float


def work_budget(seconds: float) -> int:
    """The units of work `seconds` of refinement buys."""
    return int(seconds * WORK_PER_SECOND)


def simulation_work(graph: OpGraph) -> int:
    """About the units of work one simulation of `graph` takes."""
    return _WORK_PER_OP * graph.num_ops


def _alternatives_share(graph: OpGraph, seconds: float) -> tuple[int, int, float]:
    """(share, k, reach): window balancing splits `share`, a quarter of the budget, among up to k
    alternatives (as many as get about three simulations each, at most MAX_ALTERNATIVES) and
    balances those within reach times the start placement's makespan: 1 + _GAP_PER_ROUND per
    round each gets (a round costs about three simulations). None of it depends on the
    alternatives given, so that a runner-up beyond reach, or its absence, changes nothing."""
    half = work_budget(seconds) // 2 // 2
    three = 3 * max(1, simulation_work(graph))
    k = min(MAX_ALTERNATIVES, half // three)
    rounds = half // k / three if k else 0
    return half, k, 1 + _GAP_PER_ROUND * rounds


def alternative_reach(graph: OpGraph, seconds: float) -> float:
    """How many times the best makespan a runner-up may take and still be of use to `refine`
    within `seconds` (`place_auto` stops placers and simulations that pass it)."""
    return _alternatives_share(graph, seconds)[2]


Move = tuple[tuple[int, int, int], ...]  # (group, from device, to device) per moved group


class _Simulation:
    """The current placement, its schedule and snapshots, and trial moves against them."""

    def __init__(self, graph: OpGraph, cluster: Cluster, groups: Groups, device_of: np.ndarray):
        self.graph, self.cluster, self.groups = graph, cluster, groups
        self.singletons = Groups.singletons(graph)
        self.tables = GraphTables(graph)  # shared by the scheduler of every move
        self.device_of = [int(d) for d in device_of]
        self.group_persistent = groups.byte_sums(graph.persistent_bytes).tolist()
        self.capacity = [d.memory_bytes for d in cluster.devices]
        self.tail = _tails(graph)
        self.topo = graph.topo_index.tolist()
        self.work = 0
        self.snapshots: list[dict] = []
        self.schedule: Schedule = self._full()

    def _scheduler(self, device_of: list[int]) -> ListScheduler:
        self.work += (self.graph.num_ops + self.cluster.num_devices) // _RESTART_SHARE
        return make_list_scheduler(
            self.graph, self.cluster, self.singletons, FixedPolicy(device_of), device_of,
            tables=self.tables,
        )

    def _full(self) -> Schedule:
        scheduler = self._scheduler(self.device_of)
        schedule = self._finish(scheduler, float("inf"), self.snapshots)
        assert schedule is not None  # the starting placement was simulated before
        return schedule

    def _finish(
        self, scheduler: ListScheduler, bound: float, snaps: list[dict], limit: float = math.inf
    ) -> Optional[Schedule]:
        """Runs `scheduler` to the end, taking snapshots into `snaps`; None when the makespan
        cannot beat `bound`, the placement does not fit, or the work would pass `limit` (units of
        work in all, this simulation's with the work done before it)."""
        n = self.graph.num_ops
        every = max(1, n // _SNAPSHOTS)
        tail = self.tail
        room = limit - self.work  # work this run may do; the budget is looked at only when finite
        bounded = room < math.inf
        steps = 0
        try:
            while True:
                if scheduler.scheduled % every == 0 and scheduler.scheduled < n and (
                    not snaps or snaps[-1]["scheduled"] != scheduler.scheduled
                ):
                    snaps.append(scheduler.snapshot())
                    steps += self.cluster.num_devices // _DEVICES_PER_UNIT  # it copies lists per device
                step = scheduler.step()
                if step is None:
                    break
                steps += 1
                op, _, t = step
                if t + tail[op] >= bound - 1e-9 or (bounded and steps + _run_work(scheduler) > room):
                    return None
        finally:
            self.work += steps + _run_work(scheduler)
        if not scheduler.done:
            return None
        return scheduler.schedule("refined")

    def try_move(
        self, move: Move, bound: float, limit: float = math.inf
    ) -> Optional[tuple[Schedule, list[dict], list[int]]]:
        """Re-simulates with `move` applied; the new schedule if its makespan is below `bound`
        and the work done stays within `limit` (a move the budget cannot finish is not kept)."""
        members = self.groups.members
        ops = np.concatenate([members[g] for g, _, _ in move]).tolist()
        end = self.schedule.end_us
        preds = self.graph.predecessors
        earliest = min(max((end[p] for p in preds[o]), default=0.0) for o in ops)
        extra = {}
        for g, d_from, d_to in move:
            extra[d_to] = extra.get(d_to, 0) + self.group_persistent[g]
            extra[d_from] = extra.get(d_from, 0) - self.group_persistent[g]
        base = None
        for i in range(len(self.snapshots) - 1, -1, -1):
            snap = self.snapshots[i]
            if snap["scheduled"] == 0:
                break
            if snap["last_time"] < earliest and all(
                not snap["waited"][d] and snap["peak"][d] + max(x, 0) <= self.capacity[d]
                for d, x in extra.items()
            ):
                base = i
                break
        device_of = list(self.device_of)
        for g, _, d_to in move:
            for o in members[g].tolist():
                device_of[o] = d_to
        if base is None:
            kept: list[dict] = []
            scheduler = self._scheduler(device_of)
        else:
            kept = [
                _patched(s, move, members, self.group_persistent, self.topo)
                for s in self.snapshots[: base + 1]
            ]
            scheduler = self._scheduler(device_of)
            scheduler.restore(kept[-1])
        schedule = self._finish(scheduler, bound, kept, limit)
        if schedule is None:
            return None
        return schedule, kept, device_of

    def accept(self, result: tuple[Schedule, list[dict], list[int]]) -> None:
        self.schedule, self.snapshots, self.device_of = result

    def move_to(self, device_of: np.ndarray) -> Move:
        """The move (one entry per group that changes device) from here to `device_of`."""
        out = []
        for g, m in enumerate(self.groups.members):
            a, b = self.device_of[int(m[0])], int(device_of[m[0]])
            if a != b:
                out.append((g, a, b))
        return tuple(out)


def _run_work(scheduler: ListScheduler) -> int:
    """The units of work of `scheduler`'s dry runs and copies so far: the same whichever engine
    runs it, so that a budget gives the same placement with either."""
    return scheduler_work(scheduler)


def _patched(snap: dict, move: Move, members, group_persistent, topo: list[int]) -> dict:
    """A snapshot as if the moved groups had been on their new devices from the start."""
    if isinstance(snap, NativeSnapshot):  # the compiled engine's makes the same edits
        return snap.patched([(group_persistent[g], a, b, members[g].tolist()) for g, a, b in move])
    out = dict(snap)
    group_device = list(snap["group_device"])
    usage, peak = list(snap["usage"]), list(snap["peak"])
    later = list(snap["later"])  # the heaps are the snapshot's until one is pushed to: copied then
    copied: set[int] = set()
    dead = set(snap["dead"])
    for g, d_from, d_to in move:
        p = group_persistent[g]
        usage[d_from] -= p
        peak[d_from] -= p
        usage[d_to] += p
        peak[d_to] += p
        for o in members[g].tolist():
            group_device[o] = d_to  # the simulator's groups are single ops
            dead.discard((o, d_to))
            if snap["device"][o] < 0 and snap["preds_left"][o] == 0:
                if d_to not in copied:
                    later[d_to] = list(later[d_to])
                    copied.add(d_to)
                heapq.heappush(later[d_to], (snap["last_time"], topo[o], o))
    out.update(group_device=group_device, usage=usage, peak=peak, later=later, dead=dead)
    return out


def _tails(graph: OpGraph) -> list[float]:
    """Longest chain of compute times starting at each op (inclusive)."""
    tail = graph.compute_us.tolist()
    compute = graph.compute_us.tolist()
    succ = graph.successors
    for op in reversed(graph.topo_order.tolist()):
        s = succ[op]
        if s:
            tail[op] = compute[op] + max(tail[x] for x in s)
    return tail


def _candidates(sim: _Simulation, pinned: Sequence[bool], targets: int) -> list[Move]:
    """Moves worth trying first, from the critical path of the current schedule; none moves a
    `pinned` group, or a group to a device past the first `targets`."""
    graph, cluster, groups = sim.graph, sim.cluster, sim.groups
    schedule = sim.schedule
    device_of = sim.device_of
    group_of = groups.group_of
    load = [0.0] * cluster.num_devices
    for op, d in enumerate(device_of):
        load[d] += graph.compute_us[op]
    by_load = sorted(range(targets), key=lambda d: (load[d], d))
    path = schedule.critical_path(graph, cluster)
    moves: list[Move] = []
    seen: set[Move] = set()

    def add(move: Move) -> None:
        if move not in seen and all(not pinned[g] and a != b and b < targets for g, a, b in move):
            seen.add(move)
            moves.append(move)

    def run_of(i: int, step: int) -> list[int]:
        """Groups of the critical-path ops from i on (step 1) or back (step -1) on one device."""
        d, out = device_of[path[i]], []
        while 0 <= i < len(path) and device_of[path[i]] == d:
            out.append(int(group_of[path[i]]))
            i += step
        return list(dict.fromkeys(out))

    for i in range(len(path) - 1, 0, -1):
        op, prev = path[i], path[i - 1]
        g, gp = int(group_of[op]), int(group_of[prev])
        d, dp = device_of[op], device_of[prev]
        if d != dp:
            # The op waits for a transfer: bring it (or its producer) next to the other, alone
            # or with the run of critical ops it belongs to.
            add(((g, d, dp),))
            add(((gp, dp, d),))
            add(tuple((h, d, dp) for h in run_of(i, 1)))
            add(tuple((h, dp, d) for h in run_of(i - 1, -1)))
    for op in reversed(path):
        g = int(group_of[op])
        for d in by_load:
            add(((g, device_of[op], d),))
    # Swaps between the busiest and the idlest device.
    busy, idle = by_load[-1], by_load[0]
    on_busy = [int(group_of[o]) for o in path if device_of[o] == busy]
    on_idle = sorted({int(group_of[o]) for o in range(graph.num_ops) if device_of[o] == idle})
    for g in dict.fromkeys(on_busy):
        for h in on_idle[:4]:
            add(((g, busy, idle), (h, idle, busy)))
    return moves


def _random_move(sim: _Simulation, rng: random.Random, free: Sequence[int], targets: int) -> Optional[Move]:
    """A seeded random move of one of the `free` (unpinned) groups to another of the first
    `targets` devices."""
    if not free or targets < 2:
        return None
    g = rng.choice(free)
    d_from = sim.device_of[int(sim.groups.members[g][0])]
    d_to = rng.choice([d for d in range(targets) if d != d_from])
    return ((g, d_from, d_to),)


def _balance(
    sim: _Simulation,
    budget: int,
    deadline: float,
    pinned: list[bool],
    seed: int,
    settings: Sequence[tuple[bool, int]],
    shown: Callable[[_Simulation], None] = lambda sim: None,
    free_devices: Optional[int] = None,
) -> tuple[int, int]:
    """Window balancing on `sim` with `settings` in order while its work stays under `budget`:
    (results tried, kept). `shown(sim)` is called before each round (a progress bar)."""
    tried = kept = 0
    for overlap, num_windows in settings:
        for _ in range(_WINDOW_ROUNDS):
            shown(sim)
            if sim.work >= budget or time.perf_counter() >= deadline:
                return tried, kept
            device_of, moved = balance_windows(
                sim.graph, sim.cluster, sim.groups, sim.schedule, num_windows,
                pinned=pinned, overlap=overlap, seed=seed,
                max_moves=(budget - sim.work) * _MOVES_PER_UNIT, free_devices=free_devices,
            )
            sim.work += moved // _MOVES_PER_UNIT
            move = sim.move_to(device_of)
            if not move:
                break
            tried += 1
            result = sim.try_move(move, sim.schedule.makespan_us)
            if result is None:
                break
            sim.accept(result)
            kept += 1
    return tried, kept


def refine(
    graph: OpGraph,
    cluster: Cluster,
    groups: Groups,
    placement: Placement,
    *,
    options: RefineOptions = RefineOptions(),
    alternatives: Sequence[Schedule] = (),
    free_devices: Optional[int] = None,
    deadline: float = math.inf,
    work: float = math.inf,
) -> tuple[Placement, Schedule, RefineStats]:
    """Improves `placement` by moving groups; never returns a worse one.

    `alternatives` (the simulated schedules of other placers' placements, best first, none
    better than `placement`) are further starting points of window balancing when the budget
    allows. Unpinned groups move only among the first `free_devices` devices (all by default;
    a host that runs only the ops pinned to it comes last). `deadline` (a `time.perf_counter`
    time) stops it earlier than its own wall-clock stop; the placement then depends on timing.
    `work` caps its budget in units below what `options.seconds` buys.
    """
    t0 = time.perf_counter()
    sim = _Simulation(graph, cluster, groups, placement.device_of)
    initial = sim.schedule.makespan_us
    budget = int(min(work_budget(options.seconds), work))
    deadline = min(deadline, t0 + 10 * options.seconds + 5)
    rng = random.Random(options.seed)
    is_pinned = pinned_group_devices(graph, cluster, groups) >= 0
    pinned = is_pinned.tolist()
    targets = cluster.num_devices if free_devices is None else free_devices
    tried = accepted = 0
    failed: set[Move] = set()  # moves that did not help since the last accepted one
    misses = 0  # random draws in a row that were already in `failed`

    def attempt(move: Move) -> bool:
        nonlocal tried, accepted
        tried += 1
        result = sim.try_move(move, sim.schedule.makespan_us, budget)
        if result is None:
            failed.add(move)
            return False
        sim.accept(result)
        accepted += 1
        failed.clear()
        return True

    bar = Progress("refine", budget, counts=False)  # of the work budget; the best makespan yet
    best_shown = [initial]  # window balancing's other starts may be behind the start placement

    def show(current: _Simulation, done: int) -> None:
        best_shown[0] = makespan = min(best_shown[0], current.schedule.makespan_us)
        change = f" ({100 * (makespan / initial - 1):+.1f}%)" if initial else ""
        bar.update(done, note=f"best {makespan:,.1f} us{change}")

    def out_of_budget() -> bool:
        show(sim, sim.work)
        return sim.work >= budget or time.perf_counter() >= deadline

    with bar:
        windows_tried = windows_accepted = 0
        if targets > 1 and budget > 0:
            # Window balancing from the start placement (half of this phase's budget) and, from the
            # other half, from as many alternatives as get about three simulations each and start
            # close enough to catch up; the best result goes on. When no alternative qualifies,
            # the start placement gets the whole phase.
            window_budget = budget // 2
            half, k, reach = _alternatives_share(graph, options.seconds)
            close = [
                _Simulation(graph, cluster, groups, a.placement.device_of)
                for a in alternatives[:k]
                if a.makespan_us <= reach * initial
            ]
            starts = [sim] + close
            k = len(close)
            shares = [window_budget - half] + [half // k] * k if k else [window_budget]
            done = 0  # work of the starts balanced before this one
            for start, share in zip(starts, shares):
                settings = _START_WINDOW_SETTINGS if start is sim else _WINDOW_SETTINGS
                t, a = _balance(
                    start, share, deadline, pinned, options.seed, settings,
                    shown=lambda current: show(current, done + current.work), free_devices=targets,
                )
                done += start.work
                windows_tried += t
                windows_accepted += a
            work = sum(s.work for s in starts)
            sim = min(starts, key=lambda s: s.schedule.makespan_us)  # the first of equals
            sim.work = work
            log.info(
                "refinement: window balancing from %d start(s) kept %d of %d",
                len(starts), windows_accepted, windows_tried,
            )

        # The candidate moves of the current schedule, and how many of them were tried: until a move
        # is accepted the list stays the same and `failed` only grows, so none is tried twice.
        candidates: Optional[list[Move]] = None
        tried_candidates = 0
        free = np.flatnonzero(~is_pinned).tolist()  # what random moves draw from
        while not out_of_budget() and targets > 1:
            if candidates is None:
                candidates, tried_candidates = _candidates(sim, pinned, targets), 0
            improved = False
            while tried_candidates < len(candidates):
                if out_of_budget():
                    break
                move = candidates[tried_candidates]
                tried_candidates += 1
                if move not in failed and attempt(move):
                    improved = True
                    break
            if improved:
                candidates = None
                continue
            move = _random_move(sim, rng, free, targets)
            if move is None:
                break
            if move in failed:
                misses += 1
                if misses > 4 * groups.num_groups * (targets - 1) + 20:
                    break  # random draws keep finding moves that were tried: a local optimum
                continue
            misses = 0
            if attempt(move):
                candidates = None
    final = Placement(np.asarray(sim.device_of, dtype=np.int32), placement.method)
    schedule = dataclasses.replace(sim.schedule, placement=final)
    stats = RefineStats(
        initial, schedule.makespan_us, tried, accepted, windows_tried, windows_accepted,
        sim.work, time.perf_counter() - t0,
    )
    log.info(
        "refinement: %.1f -> %.1f us, %d of %d moves kept, %d units of work, %.2f s",
        initial, schedule.makespan_us, accepted, tried, sim.work, stats.seconds,
    )
    return final, schedule, stats
