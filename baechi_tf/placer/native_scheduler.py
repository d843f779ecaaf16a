"""The compiled engine's side of the list scheduler: `NativeListScheduler`, the same steps,
snapshots, errors and counters of work as `list_scheduler.ListScheduler`, run by the C++ port in
`native/scheduler.cpp` (`engine`), for the policies it has (`POLICIES`: the simulator's, m-ETF's
and m-SCT's, whose `FavouriteChildPolicy` is ported in `native/sct_policy.hpp`).
`run_scheduler.make_list_scheduler` picks it when `native_for` says the compiled engine runs the
schedule; tests/test_engines.py holds the two engines to bit-identical schedules.
"""

from __future__ import annotations

import functools
import math
import sys
import weakref
from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer import engine
from baechi_tf.placer.buffers import free_at_end_bytes, graph_buffers
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.list_scheduler import ListScheduler
from baechi_tf.placer.pins import place_pinned
from baechi_tf.placer.policies import EarliestStartPolicy, FixedPolicy, Policy, ScheduleCutOff
from baechi_tf.placer.scheduler_state import _ro, _stuck
from baechi_tf.placer.twins import UntouchedTwins
from baechi_tf.placer.schedule import Placement, Schedule, Transfer
from baechi_tf.placer.work import WorkMeter, scheduler_work
from baechi_tf.progress import Progress

__all__ = ["NativeListScheduler", "NativeSnapshot", "POLICIES", "native_for"]

# Steps, and dry runs, the compiled engine makes between returns to Python, where the progress
# bar is updated and Ctrl-C is seen: a few milliseconds of work.
_NATIVE_STEPS = 4096
_NATIVE_EVALUATIONS = 65536
# Bytes the compiled engine counts in int64: graphs and clusters whose sums could come near its
# range run on the Python engine (whose ints do not overflow).
_NATIVE_BYTES_LIMIT = 1 << 61
# The compiled engine's copies of a graph's tables and of a cluster's links, made once each.
_native_graphs: "weakref.WeakKeyDictionary[OpGraph, tuple]" = weakref.WeakKeyDictionary()
_native_links: "weakref.WeakKeyDictionary[Cluster, object]" = weakref.WeakKeyDictionary()


POLICIES = ("FixedPolicy", "EarliestStartPolicy", "FavouriteChildPolicy")
"""The policies the compiled engine runs, numbered as `PolicyKind` in native/scheduler.cpp;
their subclasses run on the Python engine."""


def _policy_kind(policy: Policy) -> Optional[int]:
    """policy's index in `POLICIES`, or None. m_sct is looked up, not imported: it loads the LP's
    modules, and a FavouriteChildPolicy exists only once it is loaded."""
    cls = type(policy)
    if cls is FixedPolicy:
        return 0
    if cls is EarliestStartPolicy:
        return 1
    m_sct = sys.modules.get("baechi_tf.placer.m_sct")
    if m_sct is not None and cls is m_sct.FavouriteChildPolicy:
        return 2
    return None


def native_for(graph: OpGraph, cluster: Cluster, policy: Policy):
    """The compiled engine's module when it runs this schedule: the engine selected is native
    and it is built (`engine.current`), the policy is one whose behaviour it has (`POLICIES`,
    not a subclass), and the bytes fit its int64; else None, and the Python `ListScheduler`
    runs."""
    if _policy_kind(policy) is None or engine.current() != "native":
        return None
    tables = _native_tables(graph, engine.native_module())
    capacity = max(d.memory_bytes for d in cluster.devices)
    if tables[1] * (cluster.num_devices + 1) + capacity >= _NATIVE_BYTES_LIMIT:
        return None
    return engine.native_module()


def _native_tables(graph: OpGraph, module) -> tuple:
    """(the compiled engine's `GraphTables`, a bound on the bytes a device holds, alloc list)."""
    cached = _native_graphs.get(graph)
    if cached is not None:
        return cached
    n = graph.num_ops
    i64 = np.int64
    edge_tensor = graph.edge_tensor.astype(i64)
    src = graph.edge_src.astype(i64)
    dst = graph.edge_dst.astype(i64)
    tensor_bytes = graph.tensor_bytes.astype(i64)
    by_dst = np.argsort(dst, kind="stable")  # GraphTables.inputs: per op, in edge order
    in_ptr = np.zeros(n + 1, dtype=i64)
    np.cumsum(np.bincount(dst, minlength=n), out=in_ptr[1:])
    by_tensor = np.argsort(edge_tensor, kind="stable")  # GraphTables.readers
    rd_ptr = np.zeros(graph.num_tensors + 1, dtype=i64)
    np.cumsum(np.bincount(edge_tensor, minlength=graph.num_tensors), out=rd_ptr[1:])
    succ_ptr, succ_flat = graph.successor_rows
    num_preds = np.asarray([len(p) for p in graph.predecessors], dtype=i64)
    buffers = graph_buffers(graph)
    own, tensor_alias = buffers.own, buffers.alias
    alloc = (own + graph.temp_bytes).astype(i64)
    free_at_end = np.asarray(free_at_end_bytes(graph), dtype=i64)
    reusing = np.flatnonzero(tensor_alias >= 0)  # GraphTables.aliased, by producer
    reusing = reusing[np.argsort(graph.tensor_src[reusing], kind="stable")]
    al_ptr = np.zeros(n + 1, dtype=i64)
    np.cumsum(np.bincount(graph.tensor_src[reusing], minlength=n), out=al_ptr[1:])
    bytes_bound = int(
        np.abs(alloc).sum() + np.abs(graph.persistent_bytes).sum() + np.abs(tensor_bytes).sum()
        + np.abs(free_at_end).sum()
    )
    tables = module.Tables(
        n, graph.num_tensors, graph.compute_us.astype(np.float64), graph.topo_index.astype(i64),
        graph.topo_order.astype(i64), in_ptr, src[by_dst], edge_tensor[by_dst],
        tensor_bytes[edge_tensor[by_dst]], np.bincount(edge_tensor, minlength=graph.num_tensors),
        rd_ptr, dst[by_tensor], succ_ptr, succ_flat, num_preds, alloc, free_at_end,
        tensor_alias.astype(i64), graph.tensor_src.astype(i64), tensor_bytes, al_ptr,
        reusing.astype(i64), buffers.constant.astype(i64), buffers.always_reused.astype(i64),
        buffers.fallback.astype(i64),
    )
    cached = _native_graphs[graph] = (tables, bytes_bound, alloc.tolist())
    return cached


def _native_cluster(cluster: Cluster, module):
    """The compiled engine's copy of `Cluster.link_tables`, made once per cluster."""
    cached = _native_links.get(cluster)
    if cached is None:
        cached = _native_links[cluster] = module.Links(
            *(np.asarray(t, dtype=np.float64).ravel() for t in cluster.channel_tables()),
            list(cluster.sends_on_compute()), [x for row in cluster.shares_memory() for x in row],
        )
    return cached


class _Placements:
    """Where `place_pinned` and the given groups put groups before the first step, recorded for
    the compiled engine, which places them in that order."""

    def __init__(self, groups: Groups, group_persistent: list[int], capacity: list[int]) -> None:
        self.group_of = groups.group_of.tolist()
        self.group_persistent = group_persistent
        self.capacity = capacity
        self.group_device = [-1] * groups.num_groups
        self.placed: list[tuple[int, int]] = []

    def place_group(self, group: int, dev: int) -> None:
        self.group_device[group] = dev
        self.placed.append((group, dev))


class _NativeState:
    """What callers read of a `SchedulerState` (`_stuck`, the refiner, the fitter), from a
    `NativeListScheduler` as it is when made; lists are made on first use."""

    def __init__(self, scheduler: "NativeListScheduler") -> None:
        self._scheduler = scheduler
        self._run = scheduler._run

    @functools.cached_property
    def device(self) -> list[int]:
        return self._run.device().tolist()

    @functools.cached_property
    def preds_left(self) -> list[int]:
        return self._run.preds_left().tolist()

    @functools.cached_property
    def group_device(self) -> list[int]:
        return self._run.group_device().tolist()

    @functools.cached_property
    def topo(self) -> list[int]:
        return self._scheduler.graph.topo_index.tolist()

    @functools.cached_property
    def group_of(self) -> list[int]:
        return self._scheduler.groups.group_of.tolist()

    @property
    def group_persistent(self) -> list[int]:
        return self._scheduler._group_persistent

    @property
    def alloc(self) -> list[int]:
        return self._scheduler._alloc

    @property
    def capacity(self) -> list[int]:
        return self._scheduler._capacity

    @property
    def copy_slots(self) -> int:
        return self._run.copy_slots

    def ready_time(self, op: int, dev: int) -> tuple[float, int]:
        return math.nan, self._run.ready_bytes(op, dev)  # `_stuck` reads the bytes alone

    def free_bytes(self, dev: int) -> int:
        return self._run.free_bytes(dev)


class NativeListScheduler:
    """`ListScheduler` on the compiled engine, for the policies of `POLICIES`: the same steps,
    snapshots, errors and counters of work (`evaluations`, `state.copy_slots`). Its snapshots
    are opaque but for the keys the refiner reads ("scheduled", "last_time", "waited", "peak"),
    and `patched` stands for `refine._patched`. A restore keeps the scheduler's own policy state
    (m-SCT's reservations), as the Python engine's policy object does. The policy object given
    is read when the scheduler is made and not after. Made by `make_list_scheduler`."""

    def __init__(
        self, module, graph: OpGraph, cluster: Cluster, groups: Groups, policy: Policy,
        initial_group_device: Optional[Sequence[int]] = None, persistent_headroom: float = 0.0,
        cutoff_us: float = math.inf,
    ) -> None:
        self.graph, self.cluster, self.groups, self.policy = graph, cluster, groups, policy
        self.cutoff_us = cutoff_us
        tables, _, self._alloc = _native_tables(graph, module)
        twins = UntouchedTwins(cluster, policy.twins_alike)
        self._capacity = capacity = [d.memory_bytes for d in cluster.devices]
        self._group_persistent = group_persistent = groups.byte_sums(graph.persistent_bytes).tolist()
        placed = _Placements(groups, group_persistent, capacity)
        place_pinned(graph, cluster, groups, placed, initial_group_device)  # type: ignore[arg-type]
        # then the groups given, where no pin put them yet: placed by the compiled engine
        given = np.asarray([] if initial_group_device is None else initial_group_device, dtype=np.int64)
        kind = _policy_kind(policy)
        fixed = kind == 0
        members = np.argsort(groups.group_of, kind="stable")  # Groups.members, one after another
        member_ptr = np.searchsorted(groups.group_of[members], np.arange(groups.num_groups + 1))
        self._run = module.Scheduler(
            tables, cluster.num_devices, groups.group_of.astype(np.int64),
            np.asarray(group_persistent, dtype=np.int64), member_ptr.astype(np.int64),
            members.astype(np.int64), np.asarray(capacity, dtype=np.int64),
            np.asarray([int(c * (1 - persistent_headroom)) for c in capacity], dtype=np.int64),
            _native_cluster(cluster, module), float(cluster.min_hold_us()), kind,
            np.asarray(policy.device_of if fixed else [], dtype=np.int64),
            np.asarray(policy.child if kind == 2 else [], dtype=np.int64),
            np.asarray(twins.set_of, dtype=np.int64), twins.untouched, list(twins.distinct),
            placed.placed, given, float(cutoff_us), bool(ListScheduler.queue_tails),
            bool(ListScheduler.once_in_now),
        )

    @property
    def scheduled(self) -> int:
        return self._run.scheduled

    @property
    def evaluations(self) -> int:
        return self._run.evaluations

    @property
    def last_time(self) -> float:
        return self._run.last_time

    @property
    def done(self) -> bool:
        return self._run.scheduled == self.graph.num_ops

    @property
    def state(self) -> "_NativeState":
        """What callers read of a `SchedulerState`, as of now."""
        return _NativeState(self)

    def step(self) -> Optional[tuple[int, int, float]]:
        """Commits the next (op, device, start), or returns None when nothing can run."""
        out = self._run.step()
        if out is not None and len(out) == 1:
            raise ScheduleCutOff(out[0], self.cutoff_us)
        return out

    def run(self, bar: Optional[Progress] = None, meter: Optional[WorkMeter] = None) -> None:
        """Runs to the end; raises `InfeasiblePlacementError` when ops are left unscheduled, and
        `OverWorkCap` when `meter` sees its work pass the cap. Returns to Python every
        `_NATIVE_STEPS` steps or `_NATIVE_EVALUATIONS` dry runs (`bar`, `meter`, Ctrl-C)."""
        while True:
            status, _ = self._run.run(_NATIVE_STEPS, _NATIVE_EVALUATIONS)
            if status == 2:
                raise ScheduleCutOff(self._run.cutoff_start, self.cutoff_us)
            if bar is not None:
                bar.update(self._run.scheduled)  # also at the end: a run may take a single chunk
            if meter is not None and status != 1:
                meter.check(self._run.scheduled + scheduler_work(self))
            if status == 1:
                break
        if not self.done:
            raise _stuck(self.graph, self.cluster, self.groups, self.state)  # type: ignore[arg-type]

    def schedule(self, method: str) -> Schedule:
        run = self._run
        return Schedule(
            placement=Placement(run.device().astype(np.int32), method),
            start_us=_ro(run.start()),
            end_us=_ro(run.end()),
            transfers=run.transfers(Transfer),
            peak_memory_bytes=tuple(run.peak()),
            order=_ro(run.order().astype(np.int32)),
        )

    def snapshot(self) -> "NativeSnapshot":
        return NativeSnapshot(self._run.snapshot())

    def restore(self, snap: "NativeSnapshot") -> None:
        """Returns to `snap` (which stays usable for later restores)."""
        self._run.restore(snap.run)


class NativeSnapshot:
    """A snapshot of a `NativeListScheduler`: opaque, but for the keys the refiner reads."""

    __slots__ = ("run",)

    def __init__(self, run) -> None:
        self.run = run

    def __getitem__(self, key: str):
        run = self.run
        if key == "scheduled":
            return run.scheduled
        if key == "last_time":
            return run.last_time
        if key == "waited":
            return run.waited()
        if key == "peak":
            return run.peak()
        raise KeyError(key)

    def __deepcopy__(self, memo: dict) -> "NativeSnapshot":
        return NativeSnapshot(self.run.snapshot())

    def __eq__(self, other: object) -> bool:
        """Whether the two continue alike: the same state a step changes."""
        if not isinstance(other, NativeSnapshot):
            return NotImplemented
        return self.run.fingerprint() == other.run.fingerprint()

    __hash__ = None  # type: ignore[assignment]

    def patched(self, moves: Sequence[tuple[int, int, int, Sequence[int]]]) -> "NativeSnapshot":
        """A copy as if groups had been on other devices from the start (`refine._patched`):
        per group (persistent bytes, from, to, its ops), for the simulator's one-op groups."""
        return NativeSnapshot(self.run.patched([(int(p), a, b, list(ops)) for p, a, b, ops in moves]))
