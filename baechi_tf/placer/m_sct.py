"""m-SCT: memory-constrained Small Communication Time scheduling (Baechi, SoCC 2020, section 4.3).

Hanen and Munier's SCT algorithm ("An approximation algorithm for scheduling dependent tasks on m
processors with small communication delays", ETFA 1995; Discrete Applied Mathematics 108(3),
2001) first solves an LP relaxation that decides, for each op, which successor should run right
after it on the same device (its *favourite child*), then list-schedules like ETF except that a
device whose last op has a favourite child waiting is kept for that child. For graphs whose
transfers take no longer than the shortest op, they bound the makespan by ``1 + (1 - 1/m) α``
times the optimum on m processors, α = 2(1 + ρ)/(2 + ρ) <= 4/3 being the LP rounding's ratio on
unboundedly many processors (ρ: longest transfer over shortest op). Our model adds memory limits,
colocation groups and transfers that share a channel per device, so no bound is claimed here;
the tests compare m-SCT with brute force on small graphs.

Steps:

1. The LP (`baechi_tf.sct.lp`), solved exactly in pieces (`baechi_tf.sct.relaxation`) by the back
   end ``--lp_solver`` names (`baechi_tf.sct.solvers`; ``auto`` without MOSEK: HiGHS's dual
   simplex for pieces of at most 5000 arcs, cvxopt's certified interior point for larger ones
   whose normal equations are sparse, HiGHS again for the others).
2. Favourite children: arcs with ``x_ij <= --sct_threshold`` (`baechi_tf.sct.rounding`).
3. The shared memory-aware list scheduler (`baechi_tf.placer.list_scheduler`) with
   `FavouriteChildPolicy`, which holds devices back as in the original's ``SCTDevice``
   (Baechi, SoCC 2020, section 4.3). Device choice, transfers, memory and failures are m-ETF's.

The scheduler runs on the engine `baechi_tf.placer.engine` selects: `FavouriteChildPolicy` here
is the reference, and native/sct_policy.hpp its port to the compiled core, which gives the same
schedules bit for bit (tests/test_engines.py); a subclass of it runs on the Python engine.

Time: the LP pieces, plus O((V + E) * D^2 * log(V * D)) for the scheduler (an op may be priced on
every device when a reserved device considers it); memory O(V * D + E). D counts the devices the
schedule has touched and one of each set of twins it has not (`list_scheduler`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.errors import ConfigError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.headroom import run_with_headroom
from baechi_tf.placer.policies import Policy
from baechi_tf.placer.scheduler_state import SchedulerState
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.sct.relaxation import solve_sct_relaxation
from baechi_tf.sct.rounding import favourite_children
from baechi_tf.sct.solvers import SOLVERS

__all__ = ["FavouriteChildPolicy", "MSCTOptions", "favourite_children_of", "place_m_sct", "schedule_m_sct"]


@dataclasses.dataclass(frozen=True)
class MSCTOptions:
    """Options of m-SCT."""

    threshold: float = 0.1  # an arc whose LP value is at or below this is favourite (--sct_threshold)
    lp_solver: str = "auto"  # 'auto', 'mosek', 'highs' or 'cvxopt' (--lp_solver)
    reduce_lp: bool = True  # solve the LP in exact pieces; False hands one LP to the solver
    max_lp_arcs: Optional[int] = None  # refuse (SolverError) an LP piece of more arcs; None: any
    lp_time_limit_s: Optional[float] = None  # per LP solve; 'auto' then falls back to the next solver
    cutoff_us: float = math.inf  # give up (ScheduleCutOff) once an op would start after this

    def validate(self) -> None:
        if self.lp_solver not in SOLVERS:
            raise ConfigError(f"unknown LP solver {self.lp_solver!r}; choose one of {', '.join(SOLVERS)}")
        if not 0.0 <= self.threshold < 1.0:
            raise ConfigError(f"sct_threshold {self.threshold!r} must be in [0, 1)")


class FavouriteChildPolicy(Policy):
    """m-SCT's device rule on top of the list scheduler (Baechi, SoCC 2020, section 4.3).

    A device is *reserved* for f when f is the favourite child of the device's last op, f is ready
    and not scheduled, and this device is one where f can start earliest (ties count; transient
    memory waits are not counted). While reserved, the device takes f, or an *urgent* op: one that
    could not start any earlier on any device it may go to. Any other op is held until it becomes
    urgent (its latest start over those devices) or the reservation ends, whichever is first.
    When f and an urgent op could start at the same time, the one first in topological order
    goes first (the original left that tie open).

    A reservation ends when f is scheduled, when the device runs another op, or when f's group is
    placed on another device; the ops it held are then offered again, so that no stored heap key
    overstates a start time. The original re-examined the reservation at each event; here it is
    decided once and kept until one of those ends, which keeps holds from ever going down.

    The compiled engine runs its port (native/sct_policy.hpp), which makes the same dry runs in
    the same order: a change here lands there too (tests/test_engines.py compares them). The
    compiled engine reads `child` when its scheduler is made, and no other attribute.
    """

    # Untouched twins (`Cluster.twins`) have run no op, so none is kept for a favourite child,
    # and an op's starts on them agree: one stands for the others.
    twins_alike = True

    def __init__(self, child: Sequence[int], num_devices: int) -> None:
        self.child = [int(c) for c in child]
        self.reserved = [-1] * num_devices  # the favourite child each device is kept for
        self.checked = [-1] * num_devices  # commit count at the last failed reservation check
        self.held: list[set[int]] = [set() for _ in range(num_devices)]
        self._epoch = -1  # commit count the memo below is for
        self._starts: dict[tuple[int, int], float] = {}  # (op, device) -> start, this epoch

    def _allowed(self, op: int, state: SchedulerState) -> list[int]:
        g = state.group_of[op]
        if state.group_device[g] >= 0:
            return [state.group_device[g]]
        need = state.group_persistent[g]
        return [d for d in state.distinct if state.peak[d] + need <= state.persistent_cap[d]]

    def _start(self, op: int, dev: int, state: SchedulerState) -> float:
        """When op's inputs and `dev` are ready (memory aside); memoised until the next commit."""
        if self._epoch != len(state.order):
            self._epoch = len(state.order)
            self._starts.clear()
        key = (op, dev)
        start = self._starts.get(key)
        if start is None:
            start = max(state.ready_time(op, dev)[0], state.device_free[dev])
            self._starts[key] = start
        return start

    def reservation(self, dev: int, state: SchedulerState) -> int:
        """The favourite child `dev` is kept for, or -1."""
        fc = self.reserved[dev]
        if fc >= 0:
            return fc
        epoch = len(state.order)
        if self.checked[dev] == epoch:
            return -1
        self.checked[dev] = epoch
        last = state.last_op[dev]
        fc = self.child[last] if last >= 0 else -1
        if fc < 0 or state.device[fc] >= 0 or state.preds_left[fc] > 0:
            return -1
        allowed = self._allowed(fc, state)
        if dev not in allowed:
            return -1
        here = self._start(fc, dev, state)
        if any(self._start(fc, d, state) < here for d in allowed if d != dev):
            return -1
        self.reserved[dev] = fc
        return fc

    def urgent_time(self, op: int, state: SchedulerState) -> float:
        """The latest of op's earliest starts over the devices its group may still use.

        Memory is left out so that the value never goes down as the schedule grows.
        """
        gdev = state.group_device[state.group_of[op]]
        devices = (gdev,) if gdev >= 0 else state.distinct
        return max(self._start(op, d, state) for d in devices)

    def hold(self, op: int, device: int, start: float, state: SchedulerState) -> float:
        fc = self.reservation(device, state)
        if fc < 0 or fc == op:
            return start
        urgent = self.urgent_time(op, state)
        if urgent <= start:
            return start
        self.held[device].add(op)
        return urgent

    def hold_floor(self, device: int, state: SchedulerState) -> Optional[tuple[float, int]]:
        """While `device` is kept for f: (the last device clock, f). An op other than f whose group
        is on no device is held to its urgent time, a latest start over every device, or starts
        later still; and no device's start is before that device is free."""
        fc = self.reserved[device]
        if fc < 0:
            return None
        return max(state.device_free), fc

    def committed(self, op: int, device: int, state: SchedulerState) -> Optional[Iterable[tuple[int, int]]]:
        released: list[tuple[int, int]] = []
        for d, fc in enumerate(self.reserved):
            if fc < 0:
                continue
            gdev = state.group_device[state.group_of[fc]]
            if d == device or fc == op or (gdev >= 0 and gdev != d):
                self.reserved[d] = -1
                released.extend((w, d) for w in sorted(self.held[d]))
                self.held[d].clear()
        return released


def favourite_children_of(
    graph: OpGraph, cluster: Cluster, options: MSCTOptions = MSCTOptions()
) -> np.ndarray:
    """int32 [num_ops]: the favourite child of each op, -1 for none (steps 1 and 2)."""
    options.validate()
    if cluster.num_devices == 1 or graph.num_edges == 0:
        return np.full(graph.num_ops, -1, dtype=np.int32)  # nothing to transfer: no LP needed
    relaxation = solve_sct_relaxation(
        graph, cluster, solver=options.lp_solver, reduce=options.reduce_lp,
        max_lp_arcs=options.max_lp_arcs, time_limit_s=options.lp_time_limit_s,
    )
    child, _ = favourite_children(
        relaxation.arc_src, relaxation.arc_dst, relaxation.x, graph.num_ops, options.threshold
    )
    return child


def schedule_m_sct(
    graph: OpGraph, cluster: Cluster, groups: Groups, *, options: MSCTOptions = MSCTOptions()
) -> Schedule:
    """The schedule m-SCT builds. Like m-ETF, a run that runs out of memory is retried with part
    of each device kept free of persistent memory; `InfeasiblePlacementError` (the first run's)
    when every run does."""
    child = favourite_children_of(graph, cluster, options).tolist()
    return run_with_headroom(
        graph, cluster, groups, lambda: FavouriteChildPolicy(child, cluster.num_devices),
        method="m_sct", cutoff_us=options.cutoff_us,
    )


def place_m_sct(
    graph: OpGraph, cluster: Cluster, groups: Groups, *, options: MSCTOptions = MSCTOptions()
) -> Placement:
    """Places `graph` on `cluster` by m-SCT (see the module docstring)."""
    return schedule_m_sct(graph, cluster, groups, options=options).placement
