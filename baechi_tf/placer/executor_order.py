"""TensorFlow's executor on a pool of threads, emulated: the times at which it may run the ops of
CPU devices that share their process's inter-op pool, and the peaks of memory those times hold.

The simulator runs each device's ops one at a time, in the order its list scheduler commits
them. TensorFlow runs the ops of all the CPU devices of one process on that process's inter-op
pool (a thread per CPU by default), in an order of its own, two ops of one device at once where
two threads are free. That order follows from how the executor hands ops to the pool, which this
module emulates (TF 2.x, `common_runtime/executor.cc` and Eigen's non-blocking thread pool):

* The pool has one queue per thread. A thread takes the front of its own queue; with its own
  queue empty, it takes the back of another thread's (steals). A task that a thread of the pool
  schedules goes to the front of that thread's own queue; one scheduled from outside the pool
  (the step's start) to the back of a queue chosen at random.
* At the step's start, each op without inputs is scheduled as a task of its own.
* A task runs its op and then, on the same thread, the ops its ops make ready, as long as there
  are any (`Process`): of the ops an op makes ready on its own device, the inexpensive ones
  (`INLINE_OP_TYPES`: kernels that tell the executor they are cheap) run next on this thread, in
  the order they were made ready; of the others, the last runs next on this thread where no
  inexpensive op is waiting, and each other one is scheduled as a task of its own.
* An op made ready by an op of another device (its input handed over, or received) is scheduled as
  a task of its own.

Each kernel starts out expensive to the executor, and only some hundred steps of a few
microseconds each make it cheap (a decaying average of its cycles against a threshold), so
every kernel but those that say they are cheap stays expensive over the steps a profile traces.

The emulation takes each op's duration from the schedule, times a random factor (lognormal, of
median 1) where `jitter` is above 0, and threads of other pools (a GPU, a worker task) as
`memory_timeline.running_at_once` counts them, a copy between pools taking no time. Durations and
the random choices move the order; `emulated_peaks` takes, per device of a shared pool, the
highest peak over `EMULATED_STEPS` emulated steps, each of its own durations and choices, and one
of the schedule's own durations. The memory rules are the model's (`memory_blocks`), applied to
the emulated times in place of the simulated ones, with each op up to `EMULATED_WINDOW` places out
of its emulated order (`memory_timeline.reordered_blocks`): what the emulation leaves out (the
order a partition's executor schedules its first ops in, the moment a thread takes to wake) moves
an op by a place or two.

On a device of a shared pool, the emulated peak is the peak the model expects TF to reach
(`expected_peaks`); the simulated order with its window (`memory_timeline.reordered_peaks`) is
the expectation where a device's pool is its own. Chosen on the measured peaks of
`bench/fidelity_memory.py` (docs/fidelity.md, "TF's executor, emulated").

Time O(S (V + E) log V) for S emulated steps of V ops and E edges, and S passes over the
memory's blocks; memory O(V + E).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import weakref
from typing import Optional, Sequence

import numpy as np

from baechi_tf.cluster import Cluster
from baechi_tf.graph import OpGraph
from baechi_tf.placer import engine
from baechi_tf.placer.block_timeline import MemoryBlocks
from baechi_tf.placer.schedule import Schedule

__all__ = [
    "EMULATED_STEPS", "EMULATED_WINDOW", "INLINE_OP_TYPES", "JITTER", "SEED", "emulated_peak_steps", "emulated_peaks",
    "emulated_step_peaks", "emulated_times", "expected_peaks",
]

INLINE_OP_TYPES = frozenset({
    "Const", "HostConst", "Identity", "IdentityN", "StopGradient", "Snapshot", "NoOp", "Shape", "ShapeN",
    "Size", "Rank", "Reshape", "Squeeze", "ExpandDims", "Placeholder", "PlaceholderWithDefault", "VarHandleOp",
    "StridedSliceGrad",
})
"""Op types whose CPU kernels tell TF's executor they are inexpensive (`OpKernel::IsExpensive`),
so that it runs them on the thread that made them ready rather than as a task of the pool."""

EMULATED_STEPS = 32
"""How many emulated steps, each of its own jittered durations and random choices, `emulated_peaks`
takes the highest peak of (besides one of the schedule's own durations). Chosen with `JITTER` and
`EMULATED_WINDOW` on the measured peaks of `bench/fidelity_memory.py` (docs/fidelity.md, "TF's
executor, emulated")."""

JITTER = 1.0
"""The spread (standard deviation of its logarithm) of the random factor each op's duration is
multiplied by in an emulated step: a traced op's time varies from step to step, and with it the
order the pool takes."""

EMULATED_WINDOW = 2
"""How many places out of its emulated order each op may run, in the memory an emulated step holds
(`memory_timeline.reordered_blocks`)."""

SEED = 0
"""The seed of `emulated_peaks`' random choices: the same placement gives the same peaks."""


def emulated_times(
    graph: OpGraph,
    device_of: np.ndarray,
    duration: np.ndarray,
    pools: Sequence[int],
    threads: Sequence[int],
    draws: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The start and end of each op in one emulated step (the module docstring's rules): op v runs
    on device ``device_of[v]`` for ``duration[v]`` us; device d's ops on the pool ``pools[d]``,
    which has ``threads[d]`` threads (devices of one pool give the same). Every op runs once; an op
    starts no earlier than each op it depends on ends, and events of one time happen in the order
    they were made (ties by a sequence number).

    The pool's random choices take `draws` (uniform in [0, 1)) in turn, one per choice among m > 1
    (the ``int(u * m)``-th, in ascending order): the queue a task from outside the pool goes to,
    and the thread an idle one steals from, of those with tasks; at most two per op. The selected
    engine runs it (`engine.current`), both alike (`tests/test_engines.py`). O((V + E) log V)."""
    n = graph.num_ops
    device_of = np.asarray(device_of, dtype=np.int64)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    pool_of_device = np.asarray(pools, dtype=np.int64)
    pool_count = int(pool_of_device.max()) + 1
    size = [1] * pool_count
    for d, p in enumerate(pool_of_device.tolist()):
        size[p] = max(1, int(threads[d]))
    draws = np.asarray(draws, dtype=np.float64)
    if max(size) > 1 and draws.size < 2 * n:
        raise ValueError(f"draws has {draws.size} numbers; a pool of more than one thread needs 2 per op, {2 * n}")
    inline = _inline_ops(graph)
    succ_ptr, succ = graph.successor_rows
    pool_of = pool_of_device[device_of]
    took = np.asarray(duration, dtype=np.float64)
    module = engine.native_module() if engine.current() == "native" else None
    if module is not None and hasattr(module, "emulated_times"):
        start, end = module.emulated_times(succ_ptr, succ, device_of, pool_of, inline, took,
                                           np.asarray(size, dtype=np.int64), draws)
        return np.asarray(start), np.asarray(end)
    return _emulated_times(graph, device_of.tolist(), pool_of.tolist(), inline.tolist(), took.tolist(), size,
                           draws.tolist())


_inline: "weakref.WeakKeyDictionary[OpGraph, np.ndarray]" = weakref.WeakKeyDictionary()


def _inline_ops(graph: OpGraph) -> np.ndarray:
    """int64 per op: 1 for an op of `INLINE_OP_TYPES`, else 0; once per graph."""
    cached = _inline.get(graph)
    if cached is None:
        types, n = graph.op_types, graph.num_ops
        cached = _inline[graph] = np.fromiter((bool(types) and types[v] in INLINE_OP_TYPES for v in range(n)),
                                              dtype=np.int64, count=n)
    return cached


def _emulated_times(graph: OpGraph, dev: list, pool_of: list, inline: list, took: list, size: list,
                    draws: list) -> tuple[np.ndarray, np.ndarray]:
    """`emulated_times` in Python."""
    n = graph.num_ops
    pool_count = len(size)
    succs = graph.successors
    pending = [len(p) for p in graph.predecessors]
    # Threads are numbered pool by pool: pool p's are first[p] .. first[p] + size[p] - 1.
    first = [0] * (pool_count + 1)
    for p in range(pool_count):
        first[p + 1] = first[p] + size[p]
    threads = first[-1]
    queues = [collections.deque() for _ in range(threads)]
    ahead = [collections.deque() for _ in range(threads)]  # a thread's Process: its ops to run next
    running = [-1] * threads
    idle: list[list[int]] = [[] for _ in range(pool_count)]
    wake = [False] * pool_count
    start = [0.0] * n
    end = [0.0] * n
    used = 0

    def choose(m: int) -> int:
        nonlocal used
        if m == 1:
            return 0
        used += 1
        return int(draws[used - 1] * m)

    def outside(v: int) -> None:
        """Schedules v from outside v's pool: the back of a queue chosen at random."""
        p = pool_of[v]
        queues[first[p] + choose(size[p])].append(v)
        wake[p] = True

    for v in range(n):
        if pending[v] == 0:
            outside(v)
    events = [(0.0, t, t) for t in range(threads)]  # (time, sequence, thread)
    sequence = threads
    pool_of_thread = [p for p in range(pool_count) for _ in range(size[p])]
    while events:
        now, _, t = heapq.heappop(events)
        p = pool_of_thread[t]
        queue, next_up = queues[t], ahead[t]
        v = running[t]
        if v >= 0:  # v ended now: the ops it makes ready
            running[t] = -1
            expensive = []
            for w in succs[v]:
                pending[w] -= 1
                if pending[w]:
                    continue
                if dev[w] != dev[v]:
                    if pool_of[w] == p:
                        queue.appendleft(w)
                    else:
                        outside(w)
                elif inline[w]:
                    next_up.append(w)
                else:
                    expensive.append(w)
            if expensive:
                for w in expensive[:-1]:
                    queue.appendleft(w)
                if next_up:
                    queue.appendleft(expensive[-1])
                else:
                    next_up.append(expensive[-1])
            if queue:
                wake[p] = True
        nxt = -1
        if next_up:
            nxt = next_up.popleft()
        elif queue:
            nxt = queue.popleft()
        else:
            victims = [o for o in range(first[p], first[p + 1]) if queues[o]]
            if victims:
                nxt = queues[victims[choose(len(victims))]].pop()
        if nxt < 0:
            idle[p].append(t)
        else:
            start[nxt] = now
            end[nxt] = now + took[nxt]
            running[t] = nxt
            heapq.heappush(events, (end[nxt], sequence, t))
            sequence += 1
        for q in range(pool_count):
            if wake[q]:
                wake[q] = False
                if idle[q] and any(queues[o] for o in range(first[q], first[q + 1])):
                    for s in idle[q]:
                        heapq.heappush(events, (now, sequence, s))
                        sequence += 1
                    idle[q] = []
    if any(pending) or any(r >= 0 for r in running):  # the graph's checks rule out a cycle
        raise AssertionError("the emulated step left ops unrun")
    return np.asarray(start), np.asarray(end)


def emulated_peaks(
    graph: OpGraph,
    cluster: Cluster,
    schedule: Schedule,
    steps: int = EMULATED_STEPS,
    jitter: float = JITTER,
    seed: int = SEED,
    threads: Optional[Sequence[int]] = None,
    window: int = EMULATED_WINDOW,
) -> tuple[int, ...]:
    """Per device of `cluster`, the highest peak of memory over `steps` emulated steps of
    `schedule`'s placement (each op's duration `schedule`'s, times a lognormal factor of spread
    `jitter`) and one of its own durations, by the model's memory rules at the emulated times with
    each op up to `window` places out of its emulated order; 0 on a device whose pool of threads
    runs no other device's ops (a GPU, a worker task), where the emulation is not the executor's
    order. `threads`, per device, the threads of its pool (None: `memory_timeline.running_at_once`,
    the CPUs this process may run on for a shared pool). The same arguments give the same peaks
    (`seed`)."""
    peaks = emulated_step_peaks(graph, cluster, schedule, steps, jitter, seed, threads, (window,))[0]
    return tuple(int(p) for p in peaks.max(axis=0))


def emulated_peak_steps(
    graph: OpGraph,
    cluster: Cluster,
    schedule: Schedule,
    steps: int = EMULATED_STEPS,
    jitter: float = JITTER,
    seed: int = SEED,
    threads: Optional[Sequence[int]] = None,
    window: int = EMULATED_WINDOW,
) -> list[tuple[int, Optional[Schedule], Optional[MemoryBlocks]]]:
    """Per device of `cluster`, as `emulated_peaks` with the same arguments: (its peak, the
    emulated step that reaches it first as a `Schedule`, that step's memory blocks as
    `reordered_blocks` holds them), or (0, None, None) on a device of a pool of its own. What
    the peak holds, for a look at a device the model misses (bench/fidelity_memory_steps.py)."""
    from baechi_tf.placer.memory_timeline import blocks_timeline, reordered_blocks

    found: list = [(0, None, None)] * cluster.num_devices
    for shared, pools, emulated, in_order in _emulated_steps(graph, cluster, schedule, steps, jitter, seed, threads,
                                                            (window,)):
        blocks = reordered_blocks(graph, emulated, in_order, window, pools)
        for d, line in enumerate(blocks_timeline(blocks, cluster.num_devices)):
            if shared[d] and (found[d][1] is None or int(line.peak_bytes) > found[d][0]):
                found[d] = (int(line.peak_bytes), emulated, blocks)
    return found


def emulated_step_peaks(
    graph: OpGraph,
    cluster: Cluster,
    schedule: Schedule,
    steps: int = EMULATED_STEPS,
    jitter: float = JITTER,
    seed: int = SEED,
    threads: Optional[Sequence[int]] = None,
    windows: Sequence[int] = (EMULATED_WINDOW,),
) -> np.ndarray:
    """int64 [len(windows), steps + 1, devices]: the peak of each emulated step of `emulated_peaks`
    (the first of the schedule's own durations, then the jittered ones in the order drawn), on
    each device, with each op up to each of `windows` places out of its emulated order; 0 on a
    device of a pool of its own. The highest over the steps at ``windows[i]`` is `emulated_peaks`
    with ``window=windows[i]``, and the first k + 1 steps are those of ``steps=k``: the steps'
    random draws do not depend on how many follow. For choosing `EMULATED_STEPS`, `JITTER` and
    `EMULATED_WINDOW` on measured peaks (bench/emulation_grid.py): one emulation of each step
    serves every window. O(S (V + E) log V + S W k) for W windows and k blocks."""
    from baechi_tf.placer.memory_timeline import blocks_timeline, reordered_blocks

    windows = [int(w) for w in windows]
    peaks = np.zeros((len(windows), steps + 1, cluster.num_devices), dtype=np.int64)
    for k, (shared, pools, emulated, in_order) in enumerate(
            _emulated_steps(graph, cluster, schedule, steps, jitter, seed, threads, windows)):
        for i, window in enumerate(windows):
            lines = blocks_timeline(reordered_blocks(graph, emulated, in_order, window, pools), cluster.num_devices)
            peaks[i, k] = [int(line.peak_bytes) if shared[d] else 0 for d, line in enumerate(lines)]
    return peaks


def _emulated_steps(graph: OpGraph, cluster: Cluster, schedule: Schedule, steps: int, jitter: float, seed: int,
                    threads: Optional[Sequence[int]], windows: Sequence[int]):
    """Yields, per emulated step of `emulated_peak_steps` in turn (none where no device shares its
    pool of threads): (per device, whether its pool is shared; the cluster's `thread_pools`; the
    step as a `Schedule`; its `memory_blocks`). Checks the arguments first."""
    from baechi_tf.placer.memory_timeline import in_shared_pool, memory_blocks, running_at_once, thread_pools

    if steps < 0 or jitter < 0 or min(windows, default=0) < 0:
        raise ValueError(f"steps, jitter and window must be at least 0, not {steps}, {jitter} and {min(windows)}")
    pools = thread_pools(cluster)
    shared = in_shared_pool(pools)
    if not any(shared) or graph.num_ops == 0:
        return
    threads = running_at_once(pools) if threads is None else tuple(threads)
    if len(threads) < cluster.num_devices or min(threads) < 1:
        raise ValueError(f"threads must give each of the {cluster.num_devices} devices at least 1, not {list(threads)}")
    took = np.maximum(schedule.end_us - schedule.start_us, 0.0)
    rng = np.random.default_rng(seed)
    device_of = schedule.placement.device_of
    for k in range(steps + 1):
        factor = 1.0 if k == 0 else np.exp(rng.normal(0.0, jitter, graph.num_ops))
        start, end = emulated_times(graph, device_of, took * factor, pools, threads, rng.random(2 * graph.num_ops))
        emulated = _as_schedule(schedule, start, end)
        yield shared, pools, emulated, memory_blocks(graph, emulated, cluster)


def expected_peaks(graph: OpGraph, cluster: Cluster, schedule: Schedule) -> tuple[int, ...]:
    """Per device of `cluster`, the peak the model expects TF to reach with `schedule`'s
    placement: on a device of a shared pool of threads, the highest of the emulated steps'
    (`emulated_peaks`), the orders that pool takes, which may run an op far from its simulated
    place, or two ops of one device at once; on a device with a pool of its own, the peak with
    each op up to its window of places out of the simulated order
    (`memory_timeline.reordered_peaks`). Each is computed only where some device needs it."""
    from baechi_tf.placer.memory_timeline import in_shared_pool, reordered_peaks, thread_pools

    shared = in_shared_pool(thread_pools(cluster))
    emulated = emulated_peaks(graph, cluster, schedule) if any(shared) else None
    windowed = reordered_peaks(graph, cluster, schedule) if not all(shared) else None
    return tuple(emulated[d] if shared[d] else windowed[d] for d in range(cluster.num_devices))


def _as_schedule(schedule: Schedule, start: np.ndarray, end: np.ndarray) -> Schedule:
    """`schedule` with each op at `start` and `end`, committed in the order they start (ends
    breaking ties), and no copies: devices of a shared pool hand their buffers over."""
    order = np.lexsort((end, start)).astype(np.int32)
    return dataclasses.replace(schedule, start_us=start, end_us=end, order=order, transfers=())
