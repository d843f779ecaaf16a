"""What the kept steps of a `bench/fidelity_memory.py --save DIR` run held that the model's byte
rules do not: the buffers behind a device's measured peak that the rules miss even at the
measured times.

`--save` keeps the graph that ran and every traced step of each placement where the byte rules,
replayed at each op's measured start and end (`replay_bytes`), give some device less than
`fidelity_memory.SHORT` of its measured peak (``<graph>.<method>.<limit>.steps``). For each such
file in DIR this places the saved layout again under the current model (as
bench/fidelity_memory_resim.py does), replays the rules at the times of each kept step, and for
each device still short in that step prints its measured peak, the rules' peak, and the nodes
whose records held more bytes at the measured peak than the rules held for them then (largest
first). No TensorFlow session runs.

`--save` also keeps the steps of a placement where some device's simulated peak lies outside the
target [1.0, 1.25] of its measured one. ``--peaks`` prints, instead, for each device of a kept
placement outside the target, the step memory held at the simulated peak and at the measured one
(the kept step that measured the highest), side by side by type of the allocating op, largest
difference first: what the simulated order holds that TF's did not, or the other way round. On a
device of a shared pool of threads (stand-ins of ``--shared_memory``) the simulated peak is that
of the emulated step of TF's executor that reaches it (`executor_order.emulated_peak_steps`), and
its order stands for the simulated one here and below.
``--held`` prints, for the same devices, the ops whose blocks the simulated peak holds beyond what
TF's records held of them at the measured peak, and why the simulation holds each then: the
allowance for ops out of order, or the op that frees it waiting for its device, for a copy on a
busy channel, or for a late input; with that op's start in TF's step.

A folder of `bench/fidelity_memory_tasks.py --save DIR` is read the same way with ``--peaks`` or
``--held``: each device is a task, named as the run's rows name it (``task:1``), and measured from
its own records plus what it received and was fed (the run saves the fed values' bytes).

    .venv/bin/python bench/fidelity_memory_steps.py DIR [--top 8] [--below 0.99] [--peaks | --held]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
from typing import Any, Callable, Mapping, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)

__all__ = ["held_longer", "main", "peak_contents", "short_devices"]


def short_devices(result: Any, ran_def: Any, stats: Sequence[Any], below: float, top: int) -> list[tuple]:
    """Per kept step (index k) and device d of `result` whose byte rules at that step's measured
    times peak below `below` times the device's measured peak: (k, device name, measured peak
    bytes, the rules' peak bytes, [(bytes more than the rules held, node, its type), at most
    `top`, largest first]), the nodes compared at the measured peak's time."""
    import numpy as np

    import fidelity_memory as fm

    from baechi_tf.placer.block_timeline import blocks_held_at
    from baechi_tf.placer.memory_timeline import blocks_timeline

    types = {n.name: n.op for n in ran_def.node}
    names = result.graph.names
    out = []
    for k, step in enumerate(stats):
        measured, _ = fm._measured(ran_def, [step])
        blocks = fm._variant_blocks(fm._replayed(result, step), step)[-1]
        timelines = blocks_timeline(blocks, result.cluster.num_devices)
        t0 = min(ns.all_start_micros for dev in step.dev_stats for ns in dev.node_stats)
        for d, dev in enumerate(result.cluster.devices):
            m = measured.get(fm._local(dev.name))
            if m is None or timelines[d].peak_bytes >= below * m.peak_bytes:
                continue
            at = m.peak_us - t0
            live = blocks_held_at(blocks, d, at)  # as the timeline counts them, not every candidate
            held: collections.Counter = collections.Counter()
            for i in np.flatnonzero(live).tolist():
                held[names[blocks.op[i]]] += int(blocks.nbytes[i])
            more = sorted(((b - held.get(n, 0), n, types.get(n, "")) for n, b in m.live_at_peak.items()
                           if b > held.get(n, 0)), reverse=True)
            out.append((k, fm._local(dev.name), m.peak_bytes, timelines[d].peak_bytes, more[:top]))
    return out


def _outside(result: Any, ran_def: Any, stats: Sequence[Any], low: float, high: float,
             key: Optional[Callable[[str], str]] = None, fed: Optional[Mapping[str, int]] = None):
    """The devices `peak_contents` and `held_longer` report, each as (device index, device name,
    simulated peak bytes, measured peak bytes, index of the step that measured it, that step's
    `MeasuredDevice`, mask of the step-memory blocks held at the simulated peak, the simulated
    peak's time in us, those blocks, the same blocks as the order they come from holds them
    (no op moved), and that order's schedule). The order is, on a device of a shared pool of
    threads, the emulated step of TF's executor that reaches the device's peak
    (`executor_order.emulated_peak_steps`), else the simulated one, each op up to its window
    of places out of it. `key` names a device as the run's rows do and `fed` gives the bytes
    fed to a step (`fidelity_memory._measured`; `run_kind`)."""
    import numpy as np

    import fidelity_memory as fm

    from baechi_tf.placer.block_timeline import blocks_held_at
    from baechi_tf.placer.executor_order import emulated_peak_steps
    from baechi_tf.placer.memory_timeline import blocks_timeline, memory_blocks, reordered_blocks, thread_pools

    graph, schedule, cluster = result.graph, result.schedule, result.cluster
    in_order = memory_blocks(graph, schedule, cluster)
    simulated_blocks = reordered_blocks(graph, schedule, in_order, None, thread_pools(cluster))
    emulated = None
    # Per order's blocks (id): what devices peaking in the same step share, computed once.
    done: dict[int, tuple] = {}
    key = fm._local if key is None else key
    per_step = [fm._measured(ran_def, [step], key, fed)[0] for step in stats]
    found = []
    for d, dev in enumerate(cluster.devices):
        name = key(dev.name)
        steps = [(step[name].peak_bytes, k) for k, step in enumerate(per_step) if name in step]
        if not steps:
            continue
        measured_bytes, k = max(steps)
        simulated = int(result.reordered_peak_bytes[d])
        if measured_bytes and low * measured_bytes <= simulated <= high * measured_bytes:
            continue
        if emulated is None:
            emulated = emulated_peak_steps(graph, cluster, schedule)
        _, order, blocks = emulated[d]
        if order is None:
            order, blocks = schedule, simulated_blocks
        if id(blocks) not in done:
            done[id(blocks)] = (in_order if order is schedule else memory_blocks(graph, order, cluster),
                                np.asarray([kind != "persistent" for kind in blocks.kind], dtype=bool),
                                blocks_timeline(blocks, cluster.num_devices))
        order_blocks, step_memory, timelines = done[id(blocks)]
        tl = timelines[d]
        at = tl.times_us[int(np.argmax(tl.bytes))] if tl.bytes.size else 0.0
        live = blocks_held_at(blocks, d, at) & step_memory
        found.append((d, name, simulated, measured_bytes, k, per_step[k][name], live, at, blocks, order_blocks,
                      order))
    return found


def peak_contents(result: Any, ran_def: Any, stats: Sequence[Any], low: float = 1.0, high: float = 1.25,
                  key: Optional[Callable[[str], str]] = None, fed: Optional[Mapping[str, int]] = None) -> list[tuple]:
    """Per device of `result` whose simulated peak (`PlacementResult.reordered_peak_bytes`) lies
    outside [`low`, `high`] times its measured peak (the highest of the kept steps): (device name,
    simulated peak bytes, measured peak bytes, index of the step that measured it, [(simulated
    bytes, measured bytes, op type), largest difference first, then most bytes]).

    Both sides count step memory by the type of the op that allocated it: on the simulated side
    the blocks held at the simulated peak (outputs, temporaries, received copies; the ops out of
    order as the peak has them), on the measured side the bytes of each node's allocation records
    held at the measured peak. Variables' and constants' bytes are left out of both (they are the
    same on both sides). `key` and `fed` as for a run on worker tasks (`run_kind`). One pass over
    the schedule's blocks and over each kept step's records."""
    import numpy as np

    graph = result.graph
    found = _outside(result, ran_def, stats, low, high, key, fed)
    types = {n.name: n.op for n in ran_def.node}
    out = []
    for _, device, simulated, measured_bytes, k, measured, live, _, blocks, _, _ in found:
        sim: collections.Counter = collections.Counter()
        for i in np.flatnonzero(live).tolist():
            sim[graph.op_types[blocks.op[i]] if graph.op_types else ""] += int(blocks.nbytes[i])
        meas: collections.Counter = collections.Counter()
        for node, nbytes in measured.live_at_peak.items():
            meas[types.get(node, "")] += nbytes
        rows = sorted(((sim[t], meas[t], t) for t in set(sim) | set(meas)),
                      key=lambda r: (-abs(r[0] - r[1]), -max(r[0], r[1]), r[2]))
        out.append((device, simulated, measured_bytes, k, rows))
    return out


def held_longer(result: Any, ran_def: Any, stats: Sequence[Any], low: float = 1.0, high: float = 1.25,
                key: Optional[Callable[[str], str]] = None, fed: Optional[Mapping[str, int]] = None) -> list[tuple]:
    """Per device `peak_contents` reports: (device name, simulated peak bytes, measured peak bytes,
    index of the step that measured it, time of the simulated peak in us, rows), a row per op
    whose blocks the simulated peak holds beyond what that op's allocation records held at the
    measured peak, most bytes first: (bytes beyond, op name, the op whose end frees the largest
    such block, with its device, or "", why the simulation holds that block then).

    Why, from the schedule of the peak's order (the simulated one, or the emulated step's): the
    allowance for ops out of order (that order had not allocated the block yet, or had freed it);
    the block's own op running; or the op that frees it waiting for its device (it starts after
    its inputs are all there, by more than any copy into it waited), for the channel (a copy into
    it booked later than its tensor was done), or for its last input. With that op's start in
    TF's step, from the step's first start, where it ran. One pass over the blocks, the schedule's copies and the step's nodes."""
    import numpy as np

    import fidelity_memory as fm

    key = fm._local if key is None else key
    graph, cluster = result.graph, result.cluster
    found = _outside(result, ran_def, stats, low, high, key, fed)
    device_of = result.schedule.placement.device_of
    out = []
    starts: dict[int, dict[str, float]] = {}  # kept step -> its nodes' starts, read once per step
    for d, device, simulated, measured_bytes, k, measured, live, at, blocks, in_order, schedule in found:
        copies = {(t.tensor, t.dst_device): t for t in schedule.transfers}
        if k not in starts:
            starts[k] = _step_starts(stats[k])
        tf_start = starts[k]
        held: dict[int, list[int]] = {}  # op -> its blocks held at the simulated peak
        for i in np.flatnonzero(live).tolist():
            held.setdefault(int(blocks.op[i]), []).append(i)
        rows = []
        for op, idx in held.items():
            name = graph.names[op]
            beyond = sum(int(blocks.nbytes[i]) for i in idx) - measured.live_at_peak.get(name, 0)
            if beyond <= 0:
                continue
            i = max(idx, key=lambda j: (int(blocks.nbytes[j]), -j))
            rows.append((beyond, name, *_why(graph, schedule, in_order, i, at, copies, device_of, cluster, tf_start,
                                             key)))
        rows.sort(key=lambda r: (-r[0], r[1]))
        out.append((device, simulated, measured_bytes, k, float(at), rows))
    return out


def _step_starts(step: Any) -> dict[str, float]:
    """Each node's start in a traced step, us from the step's first start."""
    starts = {ns.node_name: float(ns.all_start_micros) for dev in step.dev_stats for ns in dev.node_stats}
    first = min(starts.values(), default=0.0)
    return {name: t - first for name, t in starts.items()}


def _why(graph, schedule, in_order, i, at, copies, device_of, cluster, tf_start, key) -> tuple[str, str]:
    """(the op whose end frees block `i` in the simulated order, with its device named by `key`,
    or "" where none does; why the block is held at time `at`): `held_longer`'s rule."""
    import numpy as np

    if in_order.alloc_us[i] > at:
        return "", "allocated early by the allowance for ops out of order"
    reader = int(schedule.order[in_order.free_rank[i]]) if in_order.free_rank[i] >= 0 else -1
    if reader < 0 or not np.isfinite(in_order.free_us[i]):
        return "", "held past the step"
    name = graph.names[reader]
    where = key(cluster.devices[device_of[reader]].name)
    if reader == int(in_order.op[i]):
        return f"{name} ({where})", "its own op runs then"
    if in_order.free_us[i] <= at:
        return f"{name} ({where})", (f"freed late by the allowance for ops out of order (freed at "
                                     f"{in_order.free_us[i] / 1e3:.2f} ms in the simulated order)")
    there, last, copy_wait = 0.0, "", (0.0, 0.0, 0.0)
    for e in graph.in_edges(reader).tolist():
        src = int(graph.edge_src[e])
        done = float(schedule.end_us[src])
        arrives = done
        if device_of[src] != device_of[reader]:
            copy = copies.get((int(graph.edge_tensor[e]), int(device_of[reader])))
            if copy is not None:
                arrives = copy.end_us  # a Transfer ends when the copy arrives
                if copy.start_us - done > copy_wait[0]:
                    copy_wait = (copy.start_us - done, done, copy.start_us)
        if arrives >= there:
            there, last = arrives, graph.names[src]
    starts = float(schedule.start_us[reader])
    if starts - there >= copy_wait[0] and starts - there > 0:
        why = (f"its reader waits {(starts - there) / 1e3:.2f} ms for its device (inputs there at "
               f"{there / 1e3:.2f} ms)")
    elif copy_wait[0] > 0:
        why = (f"the copies into its reader wait up to {copy_wait[0] / 1e3:.2f} ms for the channel (that one "
               f"done at {copy_wait[1] / 1e3:.2f} ms, sent at {copy_wait[2] / 1e3:.2f} ms)")
    else:
        why = f"its reader waits for {last} (there at {there / 1e3:.2f} ms)"
    ran = tf_start.get(name)
    why += f"; the reader starts at {starts / 1e3:.2f} ms" + (
        f", in TF's step at {ran / 1e3:.2f} ms" if ran is not None else ", and did not run in TF's step")
    return f"{name} ({where})", why


def run_kind(doc: Mapping[str, Any]) -> tuple[bool, Callable[[str], str], Optional[dict[str, int]]]:
    """Of a saved run's ``<graph>.json``: (whether its devices were worker tasks of
    bench/fidelity_memory_tasks.py, how its rows name a device, the bytes of each value fed to a
    step, or None where the run saved none). A task's records miss what it was fed
    (`measured_memory`); stand-ins of one process hold the caller's arrays, which no row counts."""
    from fidelity_memory_resim import row_device

    if not doc.get("tasks"):
        return False, row_device(doc), {}
    fed = doc.get("fed")
    return True, row_device(doc), None if fed is None else {t: int(b) for t, b in fed.items()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="a folder written by bench/fidelity_memory.py --save")
    parser.add_argument("--top", type=int, default=8,
                        help="nodes to show per short device, op types with --peaks, ops with --held "
                        "(default 8)")
    parser.add_argument("--below", type=float, default=None,
                        help="call a device short below this share of its measured peak (default: "
                        "fidelity_memory.SHORT, the share --save kept the steps by)")
    parser.add_argument("--peaks", action="store_true",
                        help="instead, per device whose simulated peak is outside [1.0, 1.25] of the kept "
                        "steps' measured peak: step memory by op type at the simulated peak and at the "
                        "measured one, side by side")
    parser.add_argument("--held", action="store_true",
                        help="instead, per device whose simulated peak is outside [1.0, 1.25] of the kept "
                        "steps' measured peak: the ops whose blocks the simulated peak holds beyond what TF "
                        "held of them at its own, and why the simulation holds them then")
    args = parser.parse_args(argv)
    if args.peaks and args.held:
        parser.error("--peaks and --held print different tables; give one of them")
    if args.top < 1:
        parser.error(f"--top {args.top}: give at least 1")
    files = sorted(glob.glob(os.path.join(args.dir, "*.steps")))
    if not files:
        parser.error(f"{args.dir}: no <graph>.<method>.<limit>.steps here; bench/fidelity_memory.py --save DIR "
                     "keeps them for placements whose bytes the rules miss at the measured times")

    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import logging

    logging.getLogger("baechi_tf").setLevel(logging.ERROR)
    import fidelity_memory as fm
    from fidelity_memory_resim import placed_again

    below = fm.SHORT if args.below is None else args.below
    wanted: dict[str, dict[tuple[str, str], str]] = {}  # graph -> (method, limit) -> steps file
    for path in files:
        parts = os.path.basename(path)[: -len(".steps")].split(".", 2)
        if len(parts) != 3:
            parser.error(f"{path}: not a <graph>.<method>.<limit>.steps file of bench/fidelity_memory.py --save")
        graph, method, limit = parts
        wanted.setdefault(graph, {})[(method, limit)] = path
    for graph, kept in sorted(wanted.items()):
        json_path = os.path.join(args.dir, graph + ".json")
        if not os.path.exists(json_path):
            parser.error(f"{args.dir}: steps of {graph} but no {graph}.json; keep the folder --save wrote whole")
        with open(json_path) as f:
            tasks, key, fed = run_kind(json.load(f))
        if tasks and not (args.peaks or args.held):
            print(f"{graph}: a run on worker tasks, whose copies the replay of the byte rules (for stand-ins, "
                  "which hand buffers over) does not hold: give --peaks or --held", file=sys.stderr)
            continue
        if fed is None:
            fed = {}
            print(f"{graph}: the run saved no fed values (a run before they were saved): the measured peaks "
                  "here leave them out, the run's own rows count them", file=sys.stderr)
        for p, result, _ in placed_again(json_path, only=set(kept)):
            path = kept.pop((p["method"], p["limit"]), None)
            if path is None:
                continue
            ran_def, stats = fm.load_steps(path)
            if args.peaks:
                _print_peaks(graph, p, peak_contents(result, ran_def, stats, key=key, fed=fed), args.top)
                continue
            if args.held:
                _print_held(graph, p, held_longer(result, ran_def, stats, key=key, fed=fed), args.top)
                continue
            found = short_devices(result, ran_def, stats, below, args.top)
            print(f"{graph} {p['method']} {p['limit']}: {len(stats)} kept steps, "
                  f"{len(found)} short device-steps (rules below {below} of the measured peak)")
            for k, device, measured, rules, more in found:
                print(f"  step {k} {device}: measured {measured / fm.MiB:.2f} MiB, "
                      f"rules at the measured times {rules / fm.MiB:.2f} MiB")
                for nbytes, node, op_type in more:
                    print(f"    +{nbytes / 1024:9.1f} KiB  {node} ({op_type})")
        for (method, limit), path in sorted(kept.items()):
            print(f"{graph} {method} {limit}: {os.path.basename(path)} names no saved placement", file=sys.stderr)
    return 0


def _print_peaks(graph: str, p: dict, found: list[tuple], top: int) -> None:
    import fidelity_memory as fm

    print(f"{graph} {p['method']} {p['limit']}: {len(found)} devices outside [1.0, 1.25] of the kept steps' peak")
    for device, simulated, measured, k, rows in found:
        ratio = simulated / measured if measured else float("inf")
        print(f"  {device}: simulated {simulated / fm.MiB:.2f} MiB, measured {measured / fm.MiB:.2f} MiB "
              f"(step {k}), {ratio:.3f}; step memory at each peak, MiB, by op type:")
        print(f"    {'simulated':>10} {'measured':>10} {'sim - meas (KiB)':>17}  op type")
        for sim, meas, op_type in rows[:top]:
            print(f"    {sim / fm.MiB:10.2f} {meas / fm.MiB:10.2f} {(sim - meas) / 1024:17.1f}  {op_type or '?'}")


def _print_held(graph: str, p: dict, found: list[tuple], top: int) -> None:
    import fidelity_memory as fm

    print(f"{graph} {p['method']} {p['limit']}: {len(found)} devices outside [1.0, 1.25] of the kept steps' peak")
    for device, simulated, measured, k, at, rows in found:
        ratio = simulated / measured if measured else float("inf")
        print(f"  {device}: simulated {simulated / fm.MiB:.2f} MiB at {at / 1e3:.2f} ms, measured "
              f"{measured / fm.MiB:.2f} MiB (step {k}), {ratio:.3f}; held at the simulated peak beyond TF's at "
              "its own, most first:")
        for beyond, name, reader, why in rows[:top]:
            print(f"    +{beyond / 1024:9.1f} KiB  {name}" + (f", freed by {reader}" if reader else "") + f": {why}")


if __name__ == "__main__":
    sys.exit(main())
