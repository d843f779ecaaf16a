"""Fit search: a placement whose schedule fits in memory, when every placer failed to find one.

The placers are greedy and never take a decision back. m-ETF puts an op where it can start first,
and the weights or a tensor it leaves on a device may keep a later op from ever fitting there,
while the same choice one device over would have left room: fuzzing found graphs of five and seven
ops whose fitting placements every placer missed. The memory-first packing (`pack`) counts nothing as
freed, so it misses placements that fit only because tensors are freed as the step goes on.

This search looks for any placement of whole groups (pins kept) that the simulator runs to the
end under every device's capacity:

* When a group cannot fit on any device it may go to, even alone, it tries nothing
  (`FitSearch.cannot_fit`).
* When trying every assignment of the unpinned groups costs at most the budget (devices to the
  power of free groups, times a simulation's cost), it tries them all: it finds one whenever one
  exists.
* Otherwise it starts from a worst-fit packing by static memory that lets devices overflow, and
  when a simulation gets stuck it tries moving each of the largest groups on the devices where
  ops wait for memory to each other device, and keeps the move whose simulation schedules the
  most ops (ties: the least static memory over capacity, then the order tried). When no move
  gains, it takes one of them at random (seeded); it never tries a placement twice, and gives up
  after `_PATIENCE` rounds without a new best.

It ignores time: it is a last resort, so that a graph is placed wherever a placement exists,
and `auto` then refines what it finds. Deterministic for a given seed.

Time: at most `budget_steps` units of work, about one scheduling step of the simulator each: a
simulation counts its steps, plus one per `_SETUP_SHARE` ops of the graph and `_RUN_COST` for
its set-up.
"""

from __future__ import annotations

import functools
import itertools
import random
from typing import Optional

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer.buffers import graph_buffers
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import ListScheduler
from baechi_tf.placer.pins import pinned_group_devices
from baechi_tf.placer.policies import FixedPolicy
from baechi_tf.placer.run_scheduler import make_list_scheduler
from baechi_tf.placer.scheduler_state import GraphTables, byte_formatter, format_bytes
from baechi_tf.placer.m_topo import static_group_bytes
from baechi_tf.placer.schedule import Placement
from baechi_tf.progress import Progress

__all__ = ["DEFAULT_BUDGET_STEPS", "FitSearch"]

DEFAULT_BUDGET_STEPS = 200_000  # about 3 s of simulation on a 2-core machine
_SETUP_SHARE = 4  # setting up a simulation costs a step per this many ops
_CANDIDATES = 12  # groups tried per stuck simulation
_PATIENCE = 12  # rounds of moves without a new best score before the local search gives up
_RUN_COST = 48  # setting up and ending a simulation costs about this many steps


class FitSearch:
    """The search of the module docstring; `run` returns a fitting placement or None."""

    def __init__(self, graph: OpGraph, cluster: Cluster, groups: Groups, *, seed: int = 0,
                 budget_steps: int = DEFAULT_BUDGET_STEPS, free_devices: Optional[int] = None) -> None:
        """`free_devices`: the groups that no pin holds go to the first this many devices of
        `cluster` only (all when None); the others (a host CPU) take the groups pinned there."""
        self.graph, self.cluster, self.groups = graph, cluster, groups
        self.targets = cluster.num_devices if free_devices is None else free_devices
        self.pinned = pinned_group_devices(graph, cluster, groups)  # ConfigError on a bad pin
        self.free = [g for g in range(groups.num_groups) if self.pinned[g] < 0]
        self.need = static_group_bytes(graph, groups).tolist()
        self.capacity = [d.memory_bytes for d in cluster.devices]
        self.budget_steps = budget_steps
        self.steps = 0  # units of work spent (see the module docstring)
        self.tried = 0  # placements simulated
        # Whether `run` tries every placement (then None means that none fits).
        nd = self.targets
        per_run = graph.num_ops + graph.num_ops // _SETUP_SHARE + _RUN_COST
        self.exhaustive = nd ** len(self.free) * per_run <= budget_steps
        self.rng = random.Random(seed)
        self._bar: Optional[Progress] = None
        self._ran = False
        self._found: Optional[Placement] = None

    @functools.cached_property
    def _tables(self) -> GraphTables:  # made on the first simulation: `cannot_fit` needs none
        return GraphTables(self.graph)

    @functools.cached_property
    def _singletons(self) -> Groups:
        return Groups.singletons(self.graph)

    def cannot_fit(self) -> bool:
        """Whether no placement can fit, for a reason seen without simulating (`refusal`)."""
        return self.refusal is not None

    @functools.cached_property
    def refusal(self) -> Optional[str]:
        """Why no placement can fit, seen without simulating, or None: a group whose persistent
        memory plus what one of its ops holds while it runs (its outputs, its scratch and its
        inputs, which are all on its device then) exceeds every device it may go to, or more
        persistent memory than all devices hold."""
        graph, groups = self.graph, self.groups
        persistent = groups.byte_sums(graph.persistent_bytes)
        holds = graph_buffers(graph).own + graph.temp_bytes  # outputs that reuse a buffer hold none
        inputs = np.zeros(graph.num_ops, dtype=np.int64)
        np.add.at(inputs, graph.edge_dst, graph.edge_bytes)  # an op's edges carry distinct tensors
        largest = np.zeros(groups.num_groups, dtype=np.int64)
        np.maximum.at(largest, groups.group_of, holds + inputs)
        floor = (persistent + largest).tolist()
        roomiest = max(self.capacity[: self.targets])
        for g, d in enumerate(self.pinned.tolist()):
            room = self.capacity[d] if d >= 0 else roomiest
            if floor[g] > room:
                members = groups.members[g]
                op = int(members[np.argmax((holds + inputs)[members])])
                where = f"'{self.cluster.names[d]}', where it is pinned" if d >= 0 else "any device"
                if d >= 0 and graph.pinned_device[op] is None:
                    # Its group is: say by which op ("where it is pinned" sent users to its pin).
                    pin = next(int(m) for m in members if graph.pinned_device[int(m)] is not None)
                    where = f"'{self.cluster.names[d]}', where its group is pinned (by {graph.names[pin]!r})"
                fmt = byte_formatter(floor[g], room)
                return (
                    f"op {graph.names[op]!r} cannot run on {where}, whatever else goes there: its "
                    f"group {groups.names[g]!r} holds {fmt(persistent[g])} of weights and the "
                    f"op {fmt(largest[g])} of outputs, scratch and inputs while it runs, "
                    f"{fmt(floor[g])} in all, over the {fmt(room)} of "
                    + (
                        f"that device; give it more memory, or pin the "
                        f"{'op' if graph.pinned_device[op] is not None else 'group'} elsewhere"
                        if d >= 0
                        else "the largest device; give the devices more memory (more devices do not help)"
                    )
                    + (", or split the group" if len(members) > 1 else "")
                )
        if int(persistent.sum()) > sum(self.capacity):
            return (
                f"the graph's weights (persistent memory), {format_bytes(int(persistent.sum()))}, "
                f"exceed the memory of all devices together, {format_bytes(sum(self.capacity))}; "
                "use more devices or more memory per device"
            )
        return None

    def run(self) -> Optional[Placement]:
        """A placement of whole groups whose simulation fits every device's memory, or None when
        none can (`cannot_fit`, then `tried` stays 0) or the search found none in its budget.
        It searches once: a second call returns the first one's result."""
        if self._ran:
            return self._found
        self._ran = True
        self._found = self._run()
        return self._found

    def _run(self) -> Optional[Placement]:
        if self.refusal is not None:
            return None
        with Progress("fit search", self.budget_steps, unit="steps", counts=False) as self._bar:
            if self.exhaustive:
                found = self._exhaustive()
            else:
                found = self._local()
        if found is None:
            return None
        return Placement(found[self.groups.group_of].astype(np.int32), "fit")

    # ------------------------------------------------------------------ searches

    def _exhaustive(self) -> Optional[np.ndarray]:
        group_device = self.pinned.copy()
        for combo in itertools.product(range(self.targets), repeat=len(self.free)):
            group_device[self.free] = combo
            if self._simulate(group_device).done:
                return group_device
        return None

    def _local(self) -> Optional[np.ndarray]:
        current = self._overflowing_packing()
        seen = {current.tobytes()}
        run = self._simulate(current)
        score = (run.scheduled, -self._overflow(current))
        record, stale = score, 0  # the best score yet, and the rounds since it last rose
        while not run.done:
            moves = self._moves(current, run)
            best: Optional[tuple[tuple[int, int], np.ndarray, ListScheduler]] = None
            tried: list[tuple[tuple[int, int], np.ndarray, ListScheduler]] = []
            for g, d in moves:
                if self.steps >= self.budget_steps:
                    return None
                moved = current.copy()
                moved[g] = d
                if moved.tobytes() in seen:
                    continue
                seen.add(moved.tobytes())
                trial = self._simulate(moved)
                if trial.done:
                    return moved
                tried.append(((trial.scheduled, -self._overflow(moved)), moved, trial))
                if best is None or tried[-1][0] > best[0]:
                    best = tried[-1]
            if best is None:
                return None  # every neighbour was tried before: nowhere left to go
            # The best move when it gains, else one at random (a plateau).
            score, current, run = best if best[0] > score else self.rng.choice(tried)
            if score > record:
                record, stale = score, 0
            else:
                stale += 1
                if stale == _PATIENCE:
                    return None
        return current

    # ------------------------------------------------------------------ helpers

    def _simulate(self, group_device: np.ndarray) -> ListScheduler:
        device_of = group_device[self.groups.group_of].tolist()
        run = make_list_scheduler(self.graph, self.cluster, self._singletons, FixedPolicy(device_of),
                                  initial_group_device=device_of, tables=self._tables)
        while run.step() is not None:
            pass
        self.steps += run.scheduled + self.graph.num_ops // _SETUP_SHARE + _RUN_COST
        self.tried += 1
        if self._bar is not None:
            self._bar.update(min(self.steps, self.budget_steps), note=f"{self.tried} placements")
        return run

    def _overflowing_packing(self) -> np.ndarray:
        """Worst-fit by static memory (largest groups first), devices allowed to overflow."""
        group_device = self.pinned.copy()
        room = list(self.capacity)
        for g in range(self.groups.num_groups):
            if group_device[g] >= 0:
                room[group_device[g]] -= self.need[g]
        for g in sorted(self.free, key=lambda g: (-self.need[g], g)):
            d = max(range(self.targets), key=lambda d: (room[d], -d))
            group_device[g] = d
            room[d] -= self.need[g]
        return group_device

    def _overflow(self, group_device: np.ndarray) -> int:
        used = [0] * self.cluster.num_devices
        for g, d in enumerate(group_device.tolist()):
            used[d] += self.need[g]
        return sum(max(0, u - c) for u, c in zip(used, self.capacity))

    def _moves(self, group_device: np.ndarray, run: ListScheduler) -> list[tuple[int, int]]:
        """(group, device) moves off the devices where the stuck simulation's ops wait: the
        groups of the waiting ops first, then the largest groups there."""
        state = run.state
        stuck_ops = [
            op for op in range(self.graph.num_ops) if state.device[op] < 0 and state.preds_left[op] == 0
        ]
        group_of = self.groups.group_of
        stuck_devices = {int(group_device[group_of[op]]) for op in stuck_ops}
        first = [int(group_of[op]) for op in stuck_ops]
        there = [g for g in self.free if int(group_device[g]) in stuck_devices]
        order: list[int] = []
        for g in first + sorted(there, key=lambda g: (-self.need[g], g)):
            if self.pinned[g] < 0 and g not in order:
                order.append(g)
        return [(g, d) for g in order[:_CANDIDATES] for d in range(self.targets) if d != group_device[g]]

