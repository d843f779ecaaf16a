"""Simulated against measured peak memory per device, each device a worker task of its own.

The CPU stand-ins of bench/fidelity_memory.py share one process: one allocator, one pool of
threads for all of them, and a tensor read on another stand-in is the sender's buffer handed over.
The GPUs that placements are for have none of that. Here each device is a ``tf.distribute.Server``
task on loopback (`start_local_workers`), so each has what a GPU has of its own:

* **its own memory**: the task's allocator serves that device alone, and a tensor another device
  reads is copied into the reader's task over gRPC, as the model copies by default
  (`Device.shared_memory` off, the cluster a user's GPUs make);
* **its own executor, one op at a time**: task i is held to core i modulo the cores this process
  may use, with inter-op and intra-op pools of one thread (as bench/fidelity_time.py's tasks), and
  the placement targets are each task's CPU:0, its only device; a copy out of a task waits until
  it runs no op (`Device.sends_on_compute`).

With ``--tasks`` at most the cores, every task has a core, and the simulated timing is that of
bench/fidelity_time.py's two tasks, checked against TF's there.

For each graph of bench/fidelity_graphs.py: profiles the step whole on task 0's CPU:0
(`profile_fetch`, Grappler off, 1 warm-up and 3 traced steps), places it with each method at
8 GiB per device and with the methods of ``--tight_methods`` under a tight limit (``--tight``
times the one-device simulated peak over the tasks, raised by `fidelity_memory.TIGHT_STEPS` until
the method places), and runs each placement in ``--sessions`` sessions of its own (Grappler off):
initialized, ``--warmup_steps`` untraced steps, ``--traced_steps`` with ``FULL_TRACE``. A device's
measured peak is the largest over the traced steps of `measured_memory` (the allocation records,
the copies received from other tasks and the fed values it held, plus its variables and
constants); the simulated peak is the placement report's (`PlacementResult.reordered_peak_bytes`).

It prints one line per placement and device (`fidelity_memory`'s columns; the breakdown columns,
which are for stand-ins, are '-'), then `fidelity_memory`'s summary: devices in the target
[1.0, 1.25], at least measured, within 1.25x, the worst under- and over-prediction, how far the
traced steps and repeated placements lie apart, and the same figures for the simulated order
alone (`Schedule.peak_memory_bytes`). ``--json`` writes the rows (`fidelity_memory.Row`) for
``--summary_of`` and ``--plot``; ``--save DIR`` keeps what bench/fidelity_memory_resim.py needs
to simulate the same placements again under another model, and the traced steps of each
placement with a device outside the target (``<graph>.<method>.<limit>.steps``,
`fidelity_memory.load_steps`).

    TF_USE_LEGACY_KERAS=1 .venv/bin/python bench/fidelity_memory_tasks.py [--tasks 2]
        [--models rnn,transformer] [--methods m_etf,auto] [--quick] [--json out.json]

Needs tf_keras for ResNet50 and MobileNetV2 (``pip install --no-deps tf-keras==2.21.0``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import fidelity_graphs  # noqa: E402  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
import fidelity_memory as fm  # noqa: E402
import flags  # noqa: E402

from baechi_tf._startup import import_tensorflow_quietly  # noqa: E402

__all__ = ["TASK_DEVICE", "Tasks", "measure_graph", "short_name", "start_tasks", "task_cluster"]

LOOSE_BYTES = 8 << 30
TASK_DEVICE = "/job:worker/replica:0/task:{}/device:CPU:0"  # task i's one device


@dataclasses.dataclass(frozen=True, eq=False)
class Tasks:
    """Worker tasks, one device each, and the names of their devices in task order."""

    workers: Any  # LocalWorkers
    target: str  # 'grpc://...' of task 0, the master
    devices: tuple[str, ...]  # '/job:worker/replica:0/task:i/device:CPU:0'


def start_tasks(count: int) -> Tasks:
    """Starts `count` workers, task i held to the i-th core this process may use (modulo their
    number) with inter-op and intra-op pools of one thread; stop with ``.workers.stop()`` (also
    done at interpreter exit)."""
    from baechi_tf.rewriter.distributed import start_local_workers

    cores = sorted(os.sched_getaffinity(0))
    workers = start_local_workers(count, 0, cpu_cores=[cores[i % len(cores)] for i in range(count)],
                                  inter_op_threads=1, intra_op_threads=1)
    devices = tuple(f"{t.name}/device:CPU:0" for t in workers.spec.tasks)
    assert devices == tuple(TASK_DEVICE.format(i) for i in range(count)), devices  # saved runs name them so
    return Tasks(workers, workers.target, devices)


def task_cluster(devices: Sequence[str], memory_bytes: int) -> Any:
    """The cluster of the tasks' `devices`, `memory_bytes` each: separate memories that copy
    (`Device.shared_memory` off), a copy out of a task waiting until it runs no op."""
    from baechi_tf.cluster import Cluster, Device

    return Cluster(tuple(Device(name, memory_bytes, "CPU", sends_on_compute=True) for name in devices))


def _config() -> Any:
    """Grappler and the classic graph optimizer off (the graph runs as placed), state isolated."""
    from baechi_tf.cost_model.profiler import profiling_config
    from baechi_tf.rewriter.distributed import remote_session_config

    return remote_session_config(profiling_config())


def _profile(case: Any, tasks: Tasks) -> Any:
    """The CostProfile of `case` run whole on task 0's device (1 warm-up, 3 traced steps)."""
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profile_fetch
    from baechi_tf.rewriter.apply import apply_placement

    placed = apply_placement(case.graph_def, {n.name: tasks.devices[0] for n in case.graph_def.node})
    run = fidelity_graphs.runnable(case, placed)
    with tf.compat.v1.Session(tasks.target, graph=run.graph, config=_config()) as sess:
        sess.run(run.init)
        return profile_fetch(sess, run.target, run.feeds, warmup_steps=1, traced_steps=3,
                             graph_def=case.graph_def)


def short_name(device: str) -> str:
    """'task:1' of '/job:worker/replica:0/task:1/device:CPU:0'."""
    return next((part for part in device.split("/") if part.startswith("task:")), device)


def measure_graph(
    name: str,
    tasks: Tasks,
    methods: Sequence[str],
    tight_methods: Sequence[str],
    *,
    tight: float = 1.5,
    warmup_steps: int = 2,
    traced_steps: int = 2,
    sessions: int = 1,
    save: Optional[str] = None,
    out=sys.stdout,
) -> list[fm.Row]:
    """Builds, profiles, places (each method, loose and tight) and runs graph `name` on `tasks`;
    one `fidelity_memory.Row` per device of each placement that ran (its device 'task:i').
    Placements refused as infeasible are printed, not returned. With `save`, a folder, it keeps
    what re-simulating the rows needs there (`fidelity_memory.save_run`), and the traced steps
    of each placement with a device outside the target (`fidelity_memory.save_steps`)."""
    from baechi_tf.cost_model.measured_memory import measured_memory
    from baechi_tf.errors import BaechiError
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.graph_pass import place_graph_def

    case = fidelity_graphs.build(name)
    fed = {tensor: int(np.asarray(value).nbytes) for tensor, value in case.feeds.items()}
    n = len(tasks.devices)
    t0 = time.perf_counter()
    profile = _profile(case, tasks)
    print(f"# {name}: {len(case.graph_def.node)} ops, profiled {len(profile.ops)} "
          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    loose = task_cluster(tasks.devices, LOOSE_BYTES)
    try:  # the model's own layout, where it has one for this many devices
        layout = case.expert(loose.names) if case.expert else None
    except BaechiError as e:
        print(f"# {name}: no expert layout on {n} devices ({e})", file=sys.stderr, flush=True)
        layout = None

    def place(method: str, cluster: Any):
        expert = layout if method in ("expert", "auto") else None
        return place_graph_def(case.graph_def, profile, cluster, PlacementOptions(placement_method=method, expert=expert))

    _, single = place("single", loose)
    one_device = max(single.result.schedule.peak_memory_bytes)
    limits = {"loose": [("loose", loose)],
              "tight": [(f"{tight * f:.1f}x", task_cluster(tasks.devices, int(tight * f * one_device / n)))
                        for f in fm.TIGHT_STEPS]}
    runs = [(m, "loose") for m in methods if m != "expert" or layout is not None]
    runs += [(m, "tight") for m in tight_methods]
    rows: list[fm.Row] = []
    saved: list[dict] = []  # per placement that ran, what `save_run` keeps
    for method, kind in runs:
        t1 = time.perf_counter()
        placed_def, report, limit, refusal = fm.first_fit(method, limits[kind], place)
        if placed_def is None:
            print(f"{name:<12} {method:<7} {limit:<5} refused: {refusal}", file=out, flush=True)
            continue
        t2 = time.perf_counter()
        stats: list = []
        for _ in range(sessions):
            ran_def, traced = fm._run(case, placed_def, _config(), warmup_steps, traced_steps, tasks.target)
            stats += traced
        per_step = [measured_memory(step, ran_def, fed) for step in stats]
        result = report.result
        device_of = result.placement.device_of
        fingerprint = fm.placement_fingerprint(device_of)
        for d, dev in enumerate(result.cluster.devices):
            peaks = [step[dev.name].peak_bytes if dev.name in step else 0 for step in per_step]
            ops = int((device_of == d).sum())
            if ops == 0 and not any(peaks):
                continue  # a task given no op that held nothing: nothing to compare
            top = int(np.argmax(peaks))
            m = per_step[top].get(dev.name)
            rows.append(fm.Row(
                model=name, method=method, chosen=result.placement.method, limit=limit,
                capacity_bytes=dev.memory_bytes, device=short_name(dev.name), ops=ops,
                simulated_bytes=int(result.reordered_peak_bytes[d]), measured_bytes=peaks[top],
                measured_persistent_bytes=m.persistent_bytes if m else 0,
                measured_step_bytes=m.step_peak_bytes if m else 0, replaced_bytes=m.replaced_bytes if m else 0,
                sim_ran_bytes=None, sim_alias_bytes=None, sim_standin_bytes=None, replay_bytes=None,
                placement=fingerprint,
                sim_unheld_bytes=int((result.unheld_peak_bytes or result.schedule.peak_memory_bytes)[d]),
                measured_peaks=peaks, sim_schedule_bytes=int(result.schedule.peak_memory_bytes[d]),
            ))
            print(fm._line(rows[-1]), file=out, flush=True)
        if save and any(not fm.LOW * r.measured_bytes <= r.simulated_bytes <= fm.HIGH * r.measured_bytes
                        for r in rows if r.method == method and r.limit == limit and r.measured_bytes):
            fm.save_steps(save, case.name, method, limit, ran_def, stats)  # read with fm.load_steps
        saved.append({"method": method, "limit": limit, "placement": fingerprint,
                      "op_to_device": report.op_to_device})
        print(f"#   {method} {limit}: placed in {t2 - t1:.1f} s, ran in {time.perf_counter() - t2:.1f} s",
              file=sys.stderr, flush=True)
    if save:
        fm.save_run(save, case.name, case.graph_def, profile, False, saved, rows, tasks=n, fed=fed)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=flags.at_least(2), default=2,
                        help="worker tasks, one device each (default: %(default)s; more than the "
                        "cores share them, and the simulated timing no longer holds)")
    fm.add_arguments(parser, "the tasks", sessions=2)
    parser.add_argument("--save", metavar="DIR",
                        help="keep each graph, its profile, its placements and their measured peaks "
                        "in DIR, for bench/fidelity_memory_resim.py to simulate again under another model, "
                        "and the traced steps of each placement with a device outside [1.0, 1.25] times "
                        "its measured peak (NAME.METHOD.LIMIT.steps)")
    args = parser.parse_args(argv)
    names, methods, tight_methods = fm.chosen_runs(parser, args)
    if args.summary_of:
        rows = fm.read_rows(args.summary_of)
        fm._print_summary(rows, grappler=True)
        fm._plot_if_asked(rows, args)
        return 0
    import_tensorflow_quietly()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    logging.getLogger("baechi_tf").setLevel(logging.ERROR)
    tasks = start_tasks(args.tasks)
    try:
        print(f"{args.tasks} worker tasks, one device each (8 GiB; tight: {args.tight} x one-device "
              f"simulated peak / {args.tasks}); measured = variables + constants + peak of the "
              f"allocation records, copies received and values fed; the largest of "
              f"{args.traced_steps} traced steps in each of {args.sessions} session(s)")
        print(fm.machine_line())
        print(fm.HEADER)
        print("-" * len(fm.HEADER))
        rows: list[fm.Row] = []
        for name in names:
            rows += measure_graph(name, tasks, methods, tight_methods, tight=args.tight,
                                  warmup_steps=args.warmup_steps, traced_steps=args.traced_steps,
                                  sessions=args.sessions, save=args.save)
    finally:
        tasks.workers.stop()
    fm._print_summary(rows, grappler=True)
    if args.json:
        fm.write_rows(rows, args.json)
    fm._plot_if_asked(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
