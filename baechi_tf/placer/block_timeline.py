"""Blocks of memory and the memory in use they make over a step.

`memory_timeline` derives a schedule's blocks (`MemoryBlocks`: where, how big, from when to when)
and moves them as TensorFlow's executor may (`memory_timeline.reordered_blocks`); this module holds
the two data types and turns any set of blocks into each device's memory over time as a step
function (`blocks_timeline`), and names the blocks it counts at a time (`blocks_held_at`). Events
of one instant happen in the schedule's commit order. Time O(k log k) for k blocks, with a Python
step per op for the blocks counted only for the ops of most bytes (`MemoryBlocks.at_once`,
`MemoryBlocks.alternative`).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Optional

import numpy as np

__all__ = ["DeviceMemory", "MemoryBlocks", "blocks_held_at", "blocks_timeline", "subset_blocks"]


@dataclasses.dataclass(frozen=True, eq=False)
class DeviceMemory:
    """A step function: `bytes[i]` are in use from `times_us[i]` until `times_us[i + 1]`.

    A time appears twice when memory rose above both the values before and after it within that
    instant (a 0 us op, or a free made known after an allocation of the same instant): first the
    highest value, then what stays.
    """

    times_us: np.ndarray  # float64 [k], non-decreasing, times_us[0] == 0
    bytes: np.ndarray  # int64 [k], memory in use from that time on

    @property
    def peak_bytes(self) -> int:
        return int(self.bytes.max()) if self.bytes.size else 0


@dataclasses.dataclass(frozen=True, eq=False)
class MemoryBlocks:
    """Every block of memory of a schedule: where, how big, and when it is held."""

    device: np.ndarray  # int32 [k]
    nbytes: np.ndarray  # int64 [k]
    alloc_us: np.ndarray  # float64 [k]
    free_us: np.ndarray  # float64 [k], >= alloc_us; inf (`memory_timeline.KEPT`): held past the step
    alloc_rank: np.ndarray  # int64 [k], position in Schedule.order of the allocating op; -1: from the start
    free_rank: np.ndarray  # int64 [k], position in Schedule.order of the op that made the free known
    kind: tuple[str, ...]  # 'persistent', 'temp', 'output' or 'received'
    op: np.ndarray  # int32 [k], the op the block belongs to (the producer for tensors)
    slot: np.ndarray  # int32 [k], the output slot of a tensor's block; -1 for the others
    # free_us and free_rank as TF frees the block (`memory_timeline.memory_blocks`,
    # `reordered_blocks`); None: the same as free_us and free_rank.
    sent_free_us: Optional[np.ndarray] = None  # float64 [k], alloc_us <= sent_free_us <= free_us
    sent_free_rank: Optional[np.ndarray] = None  # int64 [k]
    # Per block, 0: held from alloc_us to free_us. n > 0: held only while its op runs, which is at
    # some time within [alloc_us, free_us], and at most n ops of its device run at once
    # (`reordered_blocks`); the timeline counts, at each time, the n largest such ops' bytes among
    # those whose span covers it. None: 0 for every block.
    at_once: Optional[np.ndarray] = None  # int64 [k]
    # Per block, True: held only in the steps where TF does not do what the rules give, held from
    # alloc_us to free_us then (`memory_timeline.memory_blocks`: a buffer of its own for an output
    # written into a handed-over buffer), and at most one such at a time on a device: the timeline
    # counts, at each time, the largest of its device's that is held then. None: False for every
    # block.
    alternative: Optional[np.ndarray] = None  # bool [k]


def blocks_timeline(blocks: MemoryBlocks, num_devices: int) -> tuple[DeviceMemory, ...]:
    """Per device ``0..num_devices-1``, memory in use over the step of any set of blocks (those of
    `memory_timeline.memory_blocks`, or others of the same form), events of one instant in commit
    order."""
    return tuple(_sweep(blocks, d) for d in range(num_devices))


def blocks_held_at(blocks: MemoryBlocks, device: int, at_us: float) -> np.ndarray:
    """bool [k]: the blocks of `device` that `blocks_timeline` counts as held from `at_us` on: those
    allocated at or before it and freed after it, but, of the blocks held only while their op
    runs (`MemoryBlocks.at_once`), those of the `at_once` ops of most bytes among them, and of
    the `MemoryBlocks.alternative` ones, those of the op of most bytes (ties to the op listed
    first). O(k log k) for k blocks."""
    mask = (blocks.device == device) & (blocks.alloc_us <= at_us) & (blocks.free_us > at_us)
    groups = []
    if blocks.alternative is not None:
        groups.append((mask & blocks.alternative, 1))
        mask &= ~blocks.alternative
    if blocks.at_once is not None:
        running = mask & (blocks.at_once > 0)
        if running.any():
            groups.append((running, int(blocks.at_once[running].max())))
            mask &= ~running
    for group, largest in groups:
        if not group.any():
            continue
        ops, which = np.unique(blocks.op[group], return_inverse=True)
        sizes = np.zeros(ops.size, dtype=np.int64)
        np.add.at(sizes, which, blocks.nbytes[group])
        mask |= group & np.isin(blocks.op, ops[np.argsort(-sizes, kind="stable")[:largest]])
    return mask


def subset_blocks(blocks: MemoryBlocks, keep: np.ndarray) -> MemoryBlocks:
    """The blocks of `blocks` where `keep` (bool [k]) is True."""
    columns = {}
    for field in dataclasses.fields(blocks):
        value = getattr(blocks, field.name)
        if field.name == "kind":
            columns["kind"] = tuple(k for k, x in zip(value, keep.tolist()) if x)
        elif value is not None:
            columns[field.name] = value[keep]
    if columns.get("alternative") is not None and not columns["alternative"].any():
        columns["alternative"] = None
    return MemoryBlocks(**columns)


def _sweep(blocks: MemoryBlocks, d: int) -> DeviceMemory:
    mask = blocks.device == d
    alternative = None
    if blocks.alternative is not None:
        alternative = mask & blocks.alternative
        mask &= ~blocks.alternative
    held = None
    if blocks.at_once is not None:
        running = mask & (blocks.at_once > 0)
        if running.any():
            held = _with_running(_sweep_held(blocks, mask & ~running), blocks, running,
                                 int(blocks.at_once[running].max()))
    if held is None:
        held = _sweep_held(blocks, mask)
    if alternative is not None and alternative.any():
        held = _with_running(held, blocks, alternative, 1)
    return held


def _sweep_held(blocks: MemoryBlocks, mask: np.ndarray) -> DeviceMemory:
    """The step function of the blocks in `mask`, each held from its allocation to its free."""
    freed = mask & np.isfinite(blocks.free_us)
    # Events sorted by (time, commit rank, phase): at one commit, allocation (phase 0) before
    # the frees that commit makes known (phase 1); frees known earlier come first.
    time = np.concatenate(([0.0], blocks.alloc_us[mask], blocks.free_us[freed]))
    rank = np.concatenate(([-2], blocks.alloc_rank[mask], blocks.free_rank[freed]))
    phase = np.concatenate(([0], np.zeros(mask.sum(), np.int64), np.ones(freed.sum(), np.int64)))
    delta = np.concatenate(([0], blocks.nbytes[mask], -blocks.nbytes[freed]))
    order = np.lexsort((phase, rank, time))
    time, level = time[order], np.cumsum(delta[order])
    # One or two points per instant: the highest level within it when above both the level
    # before it and the level that stays (memory allocated, then freed, at that instant), then
    # the level that stays.
    last = np.flatnonzero(np.append(time[1:] != time[:-1], True))
    first = np.concatenate(([0], last[:-1] + 1))
    high = np.maximum.reduceat(level, first)
    before = np.concatenate(([0], level[last[:-1]]))
    spike = high > np.maximum(before, level[last])
    times = np.repeat(time[last], np.where(spike, 2, 1))
    values = np.empty(times.size, dtype=np.int64)
    pos = np.cumsum(np.where(spike, 2, 1)) - 1
    values[pos] = level[last]
    values[pos[spike] - 1] = high[spike]
    times.setflags(write=False)
    values.setflags(write=False)
    return DeviceMemory(times, values)


def _with_running(held: DeviceMemory, blocks: MemoryBlocks, running: np.ndarray, largest: int) -> DeviceMemory:
    """`held` plus, at each time, the bytes of the `largest` ops of most bytes among those whose
    blocks in `running` (all of one device: blocks held while their op runs,
    `MemoryBlocks.at_once`, or `MemoryBlocks.alternative` ones) may be held then: an op's blocks
    together, from their earliest allocation up to their latest free (at that instant alone where
    the two are one). The sum of two step functions, each instant's highest value and the value
    that stays added apart, is at least the memory of any order in which each op runs within its
    span. O(k log k) for k blocks, with a Python step per op."""
    ops, which = np.unique(blocks.op[running], return_inverse=True)
    nbytes = np.zeros(ops.size, dtype=np.int64)
    np.add.at(nbytes, which, blocks.nbytes[running])
    first = np.full(ops.size, np.inf)
    np.minimum.at(first, which, blocks.alloc_us[running])
    last = np.full(ops.size, -np.inf)
    np.maximum.at(last, which, blocks.free_us[running])
    # Events by time; at an instant, the spans that end then go first, then those that start,
    # then those of no length, which count at that instant alone.
    time = np.concatenate((first, last))
    ends = np.concatenate((np.where(first == last, 2, 1), np.where(first == last, 3, 0)))
    size = np.concatenate((nbytes, nbytes))
    order = np.lexsort((ends, time))
    time, ends, size = time[order].tolist(), ends[order].tolist(), size[order].tolist()
    active: list[int] = []  # the sizes of the ops that may run now, ascending
    times, at, after = [], [], []
    i, n = 0, len(time)
    while i < n:
        t = time[i]
        while i < n and time[i] == t and ends[i] < 3:
            if ends[i] == 0:
                del active[bisect.bisect_left(active, size[i])]
            else:
                bisect.insort(active, size[i])
            i += 1
        times.append(t)
        at.append(sum(active[-largest:]))
        while i < n and time[i] == t:  # the spans of no length leave
            del active[bisect.bisect_left(active, size[i])]
            i += 1
        after.append(sum(active[-largest:]))
    return _added(held, np.asarray(times), np.asarray(at, dtype=np.int64), np.asarray(after, dtype=np.int64))


def _added(held: DeviceMemory, times: np.ndarray, at: np.ndarray, after: np.ndarray) -> DeviceMemory:
    """`held` plus the step function that is `at[i]` at the instant `times[i]` (ascending, distinct)
    and `after[i]` from then until the next (0 before the first), as a `DeviceMemory`."""
    # `held` as distinct times, each with its instant's highest value and the value that stays.
    h_times, h_bytes = held.times_us, held.bytes
    h_last = np.flatnonzero(np.append(h_times[1:] != h_times[:-1], True))
    h_first = np.concatenate(([0], h_last[:-1] + 1))
    h_at, h_after, h_times = np.maximum.reduceat(h_bytes, h_first), h_bytes[h_last], h_times[h_last]
    union = np.union1d(h_times, times)

    def values(ts: np.ndarray, instant: np.ndarray, stays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        j = np.searchsorted(ts, union, side="right") - 1  # the last event at or before each time
        known = j >= 0
        here = known & (ts[np.maximum(j, 0)] == union)
        stay = np.where(known, stays[np.maximum(j, 0)], 0)
        return np.where(here, instant[np.maximum(j, 0)], stay), stay

    a1, s1 = values(h_times, h_at, h_after)
    a2, s2 = values(times, at, after)
    high, stays = a1 + a2, s1 + s2
    before = np.concatenate(([0], stays[:-1]))
    spike = high > np.maximum(before, stays)
    out_times = np.repeat(union, np.where(spike, 2, 1))
    out = np.empty(out_times.size, dtype=np.int64)
    pos = np.cumsum(np.where(spike, 2, 1)) - 1
    out[pos] = stays
    out[pos[spike] - 1] = high[spike]
    out_times.setflags(write=False)
    out.setflags(write=False)
    return DeviceMemory(out_times, out)
