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
difference first: what the simulated order holds that TF's did not, or the other way round.

    .venv/bin/python bench/fidelity_memory_steps.py DIR [--top 8] [--below 0.99] [--peaks]
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
from typing import Any, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)

__all__ = ["main", "peak_contents", "short_devices"]


def short_devices(result: Any, ran_def: Any, stats: Sequence[Any], below: float, top: int) -> list[tuple]:
    """Per kept step (index k) and device d of `result` whose byte rules at that step's measured
    times peak below `below` times the device's measured peak: (k, device name, measured peak
    bytes, the rules' peak bytes, [(bytes more than the rules held, node, its type), at most
    `top`, largest first]), the nodes compared at the measured peak's time."""
    import numpy as np

    import fidelity_memory as fm

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
            live = (blocks.device == d) & (blocks.alloc_us <= at) & (blocks.free_us > at)
            held: collections.Counter = collections.Counter()
            for i in np.flatnonzero(live).tolist():
                held[names[blocks.op[i]]] += int(blocks.nbytes[i])
            more = sorted(((b - held.get(n, 0), n, types.get(n, "")) for n, b in m.live_at_peak.items()
                           if b > held.get(n, 0)), reverse=True)
            out.append((k, fm._local(dev.name), m.peak_bytes, timelines[d].peak_bytes, more[:top]))
    return out


def peak_contents(result: Any, ran_def: Any, stats: Sequence[Any], low: float = 1.0, high: float = 1.25) -> list[tuple]:
    """Per device of `result` whose simulated peak (`PlacementResult.reordered_peak_bytes`) lies
    outside [`low`, `high`] times its measured peak (the highest of the kept steps): (device name,
    simulated peak bytes, measured peak bytes, index of the step that measured it, [(simulated
    bytes, measured bytes, op type), largest difference first, then most bytes]).

    Both sides count step memory by the type of the op that allocated it: on the simulated side
    the blocks held at the simulated peak (outputs, temporaries, received copies; the ops out of
    order as the peak has them), on the measured side the bytes of each node's allocation records
    held at the measured peak. Variables' and constants' bytes are left out of both (they are the
    same on both sides). One pass over the schedule's blocks and over each kept step's records."""
    import numpy as np

    import fidelity_memory as fm

    from baechi_tf.placer.memory_timeline import (
        ORDER_WINDOW, blocks_timeline, memory_blocks, reordered_blocks, thread_pools,
    )

    graph, schedule, cluster = result.graph, result.schedule, result.cluster
    blocks = reordered_blocks(graph, schedule, memory_blocks(graph, schedule, cluster), ORDER_WINDOW,
                              thread_pools(cluster))
    timelines = blocks_timeline(blocks, cluster.num_devices)
    per_step = [fm._measured(ran_def, [step])[0] for step in stats]
    types = {n.name: n.op for n in ran_def.node}
    step_memory = np.asarray([kind != "persistent" for kind in blocks.kind], dtype=bool)
    out = []
    for d, dev in enumerate(cluster.devices):
        key = fm._local(dev.name)
        steps = [(found[key].peak_bytes, k) for k, found in enumerate(per_step) if key in found]
        if not steps:
            continue
        measured_bytes, k = max(steps)
        simulated = int(result.reordered_peak_bytes[d])
        if measured_bytes and low * measured_bytes <= simulated <= high * measured_bytes:
            continue
        tl = timelines[d]
        at = tl.times_us[int(np.argmax(tl.bytes))] if tl.bytes.size else 0.0
        live = (blocks.device == d) & (blocks.alloc_us <= at) & (blocks.free_us > at) & step_memory
        sim: collections.Counter = collections.Counter()
        for i in np.flatnonzero(live).tolist():
            sim[graph.op_types[blocks.op[i]] if graph.op_types else ""] += int(blocks.nbytes[i])
        meas: collections.Counter = collections.Counter()
        for node, nbytes in per_step[k][key].live_at_peak.items():
            meas[types.get(node, "")] += nbytes
        rows = sorted(((sim[t], meas[t], t) for t in set(sim) | set(meas)),
                      key=lambda r: (-abs(r[0] - r[1]), -max(r[0], r[1]), r[2]))
        out.append((key, simulated, measured_bytes, k, rows))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="a folder written by bench/fidelity_memory.py --save")
    parser.add_argument("--top", type=int, default=8,
                        help="nodes to show per short device, op types with --peaks (default 8)")
    parser.add_argument("--below", type=float, default=None,
                        help="call a device short below this share of its measured peak (default: "
                        "fidelity_memory.SHORT, the share --save kept the steps by)")
    parser.add_argument("--peaks", action="store_true",
                        help="instead, per device whose simulated peak is outside [1.0, 1.25] of the kept "
                        "steps' measured peak: step memory by op type at the simulated peak and at the "
                        "measured one, side by side")
    args = parser.parse_args(argv)
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
        for p, result, _ in placed_again(json_path, only=set(kept)):
            path = kept.pop((p["method"], p["limit"]), None)
            if path is None:
                continue
            ran_def, stats = fm.load_steps(path)
            if args.peaks:
                _print_peaks(graph, p, peak_contents(result, ran_def, stats), args.top)
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


if __name__ == "__main__":
    sys.exit(main())
