"""Step time: the simulator against TensorFlow, on 2 worker tasks that each are one device.

The step-time half of bench/fidelity.py (issue 38): `run(graphs, methods, options)` does it all
and prints; it also runs on its own (`main`). The graphs come from `time_graphs` (GNMT v2,
Inception-v3 and Transformer of baechi_tf.models at small sizes, and an unrolled LSTM); any
`TimedGraph` will do.

Devices. Two ``tf.distribute.Server`` tasks on loopback (`start_local_workers`), task i held to
core i (every thread of its process: TF's pools, gRPC's) with inter-op and intra-op pools of one
thread. A task runs one op at a time, the two tasks run side by side, and a tensor between them
goes through gRPC. The placement targets are each task's CPU:0, the only device such a task has:
the task is then one device with one executor, the ops TF keeps on a host CPU (pinned to
``/cpu:0``) are on a placement target rather than on a third device sharing a core, and no copy
inside a task (CPU:0 to a stand-in CPU:1) hides in a step.

Steps:

1. **Link**, once. Tensors of 2^0 .. 2^(k-1) float32 elements go from each task to the other
   (`utils/communication_benchmark.measure_transfer_us`: end of the producer to start of the
   consumer, one FULL_TRACE run each; the two tasks share this machine's clock), and also half
   round trips started on task 1; a line ``a * bytes + b`` is fitted to each
   (`comm_fit.fit_comm_cost`) and ``--link`` says which one the placements use. Then 1 .. 32
   one-element tensors sent together each way (`comm_bench.measure_in_flight_us`) give the
   link's copies in flight (`comm_fit.fit_copies_in_flight`: gRPC overlaps the copies' fixed
   costs, `CommCost.copies_in_flight`).
2. **Profile** each graph on one task: the whole graph on task 0's CPU:0, FULL_TRACE
   (`profile_fetch`), so an op's time is that of a single-core device.
3. **Place** on the 2 devices with each method, and with fixed layouts of other shapes so that
   the ranking has spread: ``expert`` (the model's own layout), ``halves`` (first half of the
   topological order on one device, the rest on the other), ``blocks`` (16 contiguous runs of
   the topological order, each on a seeded random device), ``alternate`` (op by op in turn).
   The simulated step is the placement's makespan under our model.
4. **Run** each placement in its own session (state isolated, Grappler off as when profiled),
   warm it up, then time ``--rounds`` rounds of ``--steps`` steps, the placements in a new
   seeded order each round; the measured step is the median. How much of the cores other
   processes took meanwhile is printed (`machine_load.LoadMeter`): on a shared machine it is
   the noise.

Printed per placement: simulated and measured step, the relative error (simulated over measured,
minus 1) and the spread of the measured steps; per graph Spearman's rank correlation of the two
and auto's measured step over the fastest placement's; over all placements the median absolute
relative error. Targets (issue 38): median |error| <= 15%, Spearman >= 0.9 on every graph, auto
the fastest or within 5% of it on every graph.

``--diagnose`` adds two probes (`step_overhead_us`: what a step without work costs;
`busy_sender_probe`: a copy from a task that stays busy after the producer) and, per placement,
traced steps read against the model (`diagnose_placement`). ``--save DIR`` keeps each graph, its
profile and its measured steps (`save_run`), so that another model can be simulated against the
same measurements.

    .venv/bin/python bench/fidelity_time.py [--models gnmt_v2,rnn] [--methods single,m_etf,auto]
        [--quick] [--diagnose] [--save DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import random
import re
import statistics
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flags  # noqa: E402  (bench/flags.py: no TensorFlow)
from baechi_tf.cost_model.machine_load import LoadMeter  # noqa: E402  (no TensorFlow)

__all__ = [
    "FIXED_LAYOUTS",
    "METHODS",
    "MODELS",
    "Measured",
    "TimeOptions",
    "TimedGraph",
    "TwoTasks",
    "busy_sender_probe",
    "diagnose_placement",
    "fit_link",
    "fixed_layout",
    "main",
    "measure_graph",
    "print_diagnosis",
    "print_graph",
    "print_summary",
    "profile_on_one_task",
    "read_trace",
    "run",
    "save_run",
    "spearman",
    "start_two_tasks",
    "step_overhead_us",
    "time_graphs",
]

MODELS = ("gnmt_v2", "inception_v3", "transformer", "rnn")
PLACERS = ("single", "m_topo", "m_etf", "m_sct", "auto")
FIXED_LAYOUTS = ("expert", "halves", "blocks", "alternate")
METHODS = PLACERS + FIXED_LAYOUTS
NUM_DEVICES = 2
MEMORY_BYTES = 4 << 30  # per device: far above what these graphs need
WITHIN = 0.05  # auto's choice may run this much slower than the fastest placement
TARGET_ERROR, TARGET_SPEARMAN = 0.15, 0.9


# ---------------------------------------------------------------------------- graphs


@dataclasses.dataclass(frozen=True, eq=False)
class TimedGraph:
    """One training step to place and time.

    `graph_def` has no device fields; one step runs `fetches` (op names) fed with `feeds`
    (tensor name -> array), after the ops of `init` have run once. `layout(devices)` is the
    model's own layout over the device names (op name -> device), None when it has none.
    """

    name: str
    graph_def: Any
    fetches: tuple[str, ...]
    init: tuple[str, ...]
    feeds: Mapping[str, Any]
    layout: Optional[Callable[[Sequence[str]], Mapping[str, str]]] = None


def _model_graph(name: str, quick: bool) -> TimedGraph:
    """A baechi_tf.models training step at a size that runs in tens of ms on one core."""
    import tensorflow as tf

    from baechi_tf.models import GNMTHParams, InceptionV3HParams, TransformerHParams, build_model

    tf1 = tf.compat.v1
    hparams, optimizer = {
        "gnmt_v2": (GNMTHParams(batch_size=16 if quick else 32, vocab_size=2000,
                                max_seq_length=4 if quick else 8, rnn_units=128,
                                num_layers=2 if quick else 4, num_gpus=NUM_DEVICES),
                    tf1.train.AdamOptimizer),
        "inception_v3": (InceptionV3HParams(batch_size=4 if quick else 8, image_size=107 if quick else 139,
                                            num_classes=100, depth_multiplier=0.25),
                         tf1.train.GradientDescentOptimizer),
        "transformer": (TransformerHParams(batch_size=8 if quick else 16, vocab_size=2000,
                                           max_seq_length=16, num_layers=1 if quick else 2,
                                           num_heads=4, d_model=128, d_ff=512,
                                           num_gpus=NUM_DEVICES), tf1.train.AdamOptimizer),
    }[name]
    spec = build_model(name, hparams)
    with spec.graph.as_default():  # train.py's step: gradients colocated with their ops
        train_op = optimizer(0.001).minimize(spec.loss, colocate_gradients_with_ops=True,
                                             global_step=tf1.train.create_global_step())
        init = tuple(v.initializer.name for v in tf1.global_variables())
    graph_def = spec.graph.as_graph_def()
    return TimedGraph(
        name=name,
        graph_def=graph_def,
        fetches=(train_op.name,),
        init=init,
        feeds=dict(spec.feeds),
        layout=lambda devices: spec.expert_placement(list(devices), graph_def),
    )


def _rnn_graph(quick: bool) -> TimedGraph:
    """An unrolled multi-layer LSTM of plain ops (`baechi_tf.models`' LSTM step), one Adam step,
    gradients colocated with their ops; its layout puts layer k on device k * D // L."""
    import numpy as np
    import tensorflow as tf

    from baechi_tf.models._layers import lstm_step, weight

    tf1 = tf.compat.v1
    batch, steps, inputs_dim, hidden, layers = (16, 6, 64, 128, 2) if quick else (32, 10, 128, 256, 4)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        x = tf1.placeholder(tf.float32, [batch, steps, inputs_dim], name="inputs")
        y = tf1.placeholder(tf.float32, [batch, hidden], name="targets")
        layer = tf.unstack(x, axis=1)
        for k in range(layers):
            with tf1.variable_scope(f"lstm{k}"):
                kernel = weight("kernel", [int(layer[0].shape[1]) + hidden, 4 * hidden])
                bias = weight("bias", [4 * hidden], tf1.zeros_initializer())
                state = (tf.zeros([batch, hidden]), tf.zeros([batch, hidden]))
                outputs = []
                for t, xt in enumerate(layer):
                    with tf.name_scope(f"t{t}"):
                        h, state = lstm_step(xt, state, kernel, bias, forget_bias=1.0)
                    outputs.append(h)
            layer = outputs
        loss = tf.reduce_mean(tf.square(layer[-1] - y), name="loss")
        train_op = tf1.train.AdamOptimizer(0.001).minimize(loss, colocate_gradients_with_ops=True,
                                                           name="train")
        init = tuple(v.initializer.name for v in tf1.global_variables())
    rng = np.random.RandomState(0)
    feeds = {"inputs:0": rng.standard_normal((batch, steps, inputs_dim)).astype(np.float32),
             "targets:0": rng.standard_normal((batch, hidden)).astype(np.float32)}
    graph_def = graph.as_graph_def()

    def layout(devices: Sequence[str]) -> dict[str, str]:
        out = {}
        for node in graph_def.node:
            scope = node.name.split("/", 1)[0]
            for part in node.name.split("/"):  # gradients and slots name their layer too
                if part.startswith("lstm") and part[4:].isdigit():
                    scope = part
                    break
            if scope.startswith("lstm") and scope[4:].isdigit():
                out[node.name] = devices[int(scope[4:]) * len(devices) // layers]
        return out

    return TimedGraph("rnn", graph_def, (train_op.name,), init, feeds, layout)


def time_graphs(names: Sequence[str], quick: bool = False) -> list[TimedGraph]:
    """The graphs of `names` (of MODELS), smaller with `quick`."""
    return [_rnn_graph(quick) if n == "rnn" else _model_graph(n, quick) for n in names]


# ---------------------------------------------------------------------------- devices and link


@dataclasses.dataclass(frozen=True, eq=False)
class TwoTasks:
    """Two single-core worker tasks and the cluster of their CPU:0 devices."""

    workers: Any  # LocalWorkers
    target: str  # 'grpc://...' of task 0, the master
    cluster: Any  # baechi_tf.Cluster of the two devices, with the fitted link once known


def start_two_tasks(cores: Sequence[int] = (0, 1), inter_op_threads: int = 1) -> TwoTasks:
    """Starts 2 workers, task i on core cores[i] with an intra-op pool of one thread and an
    inter-op pool of `inter_op_threads`; stop with ``.workers.stop()`` (also done at
    interpreter exit)."""
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.rewriter.distributed import start_local_workers

    workers = start_local_workers(NUM_DEVICES, 0, cpu_cores=list(cores),
                                  inter_op_threads=inter_op_threads, intra_op_threads=1)
    devices = tuple(Device(f"{t.name}/device:CPU:0", MEMORY_BYTES, "CPU", sends_on_compute=True)
                    for t in workers.spec.tasks)
    return TwoTasks(workers, workers.target, Cluster(devices))


def _session_config() -> Any:
    """Grappler and the classic graph optimizer off (the graph runs as placed), state isolated."""
    from baechi_tf.cost_model.profiler import profiling_config
    from baechi_tf.rewriter.distributed import remote_session_config

    return remote_session_config(profiling_config())


def fit_link(tasks: TwoTasks, exponent: int = 22, runs: int = 5, warmup: int = 2) -> tuple[dict, list]:
    """(fits, rows): lines fitted to copies between the tasks of 2^0 .. 2^(exponent-1) float32
    elements (`utils/communication_benchmark.measure_transfer_us`, `comm_fit.fit_comm_cost`):
    ``fits['one_way']`` to single copies both ways (end of the producer to start of the
    consumer), ``fits['round_trip']`` to half round trips that start on task 1, each line's
    `CommCost.copies_in_flight` fitted to `comm_bench.IN_FLIGHT_COUNTS` copies sent together
    both ways (`comm_fit.fit_copies_in_flight`, 2 * `runs` runs each) and its `InFlightFit`
    under ``fits['in_flight_' + kind]``; and per size (bytes, median us 0 -> 1, 1 -> 0, half
    round trip)."""
    from baechi_tf.cost_model.comm_bench import IN_FLIGHT_COUNTS, measure_in_flight_us
    from baechi_tf.cost_model.comm_fit import fit_comm_cost, fit_copies_in_flight
    from baechi_tf.rewriter.distributed import remote_session_config
    from utils.communication_benchmark import _config, measure_transfer_us

    config = remote_session_config(_config("GPU", 0))
    a, b = tasks.cluster.names
    data: dict[str, tuple[list, list]] = {"one_way": ([], []), "round_trip": ([], [])}
    rows = []
    for e in range(exponent):
        n = 1 << e
        medians = []
        for src, dst, kind in ((a, b, "one_way"), (b, a, "one_way"), (b, a, "round_trip")):
            got = [t for t in measure_transfer_us(n, src, dst, config, num_warmup=warmup,
                                                  num_runs=runs, target=tasks.target,
                                                  round_trip=kind == "round_trip") if t > 0]
            data[kind][0].extend([4.0 * n] * len(got))
            data[kind][1].extend(got)
            medians.append(statistics.median(got) if got else float("nan"))
        rows.append((4 * n, *medians))
    counts: list[float] = []
    together: list[float] = []
    for n in IN_FLIGHT_COUNTS:
        for src, dst in ((a, b), (b, a)):
            got = [t for t in measure_in_flight_us(n, src, dst, config, num_warmup=warmup,
                                                   num_runs=2 * runs, target=tasks.target) if t > 0]
            counts += [float(n)] * len(got)
            together += got
    fits: dict = {}
    for kind, (x, y) in data.items():
        line = fit_comm_cost(x, y)
        in_flight = fits["in_flight_" + kind] = fit_copies_in_flight(counts, together, line.comm, 4.0)
        fits[kind] = dataclasses.replace(line, comm=in_flight.comm)
    return fits, rows


# ---------------------------------------------------------------------------- placements


def _topo_names(graph_def: Any) -> list[str]:
    """The node names of `graph_def` in a topological order (Kahn's, by name order among the
    ready; control inputs count). O(V log V + E)."""
    import heapq

    inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in graph_def.node}
    users: dict[str, list[str]] = {name: [] for name in inputs}
    waiting = {}
    for name, ins in inputs.items():
        known = [i for i in ins if i in inputs]
        waiting[name] = len(known)
        for i in known:
            users[i].append(name)
    ready = [name for name, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for u in users[name]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, u)
    return order


def fixed_layout(kind: str, graph: TimedGraph, devices: Sequence[str]) -> Optional[dict[str, str]]:
    """Op name -> device of the fixed layout `kind` (FIXED_LAYOUTS); None when `graph` has no
    such layout. Colocation groups follow their first member when placed ('expert' method)."""
    if kind == "expert":
        return dict(graph.layout(devices)) if graph.layout is not None else None
    order = _topo_names(graph.graph_def)
    n = len(order)
    if kind == "halves":
        return {name: devices[int(i >= n // 2)] for i, name in enumerate(order)}
    if kind == "alternate":
        return {name: devices[i % len(devices)] for i, name in enumerate(order)}
    if kind == "blocks":
        seed = int(hashlib.sha256(graph.name.encode()).hexdigest()[:8], 16)
        rng = random.Random(seed)
        blocks = 16
        choice = [rng.randrange(len(devices)) for _ in range(blocks)]
        return {name: devices[choice[i * blocks // n]] for i, name in enumerate(order)}
    raise ValueError(f"unknown layout {kind!r}")


@dataclasses.dataclass(eq=False)
class Measured:
    """One placement of one graph: what the simulator says and what ran."""

    graph: str
    method: str
    chosen: str  # the placement's label (auto: the candidate it kept)
    sim_ms: float  # the simulator's makespan of the placement
    report: Any = None  # the PlacementReport
    times_s: list = dataclasses.field(default_factory=list)  # measured steps
    same_as: str = ""  # an earlier method of this graph with the same placement
    diagnosis: Optional[dict] = None  # `diagnose_placement`'s figures, when asked for

    @property
    def measured_ms(self) -> float:
        """Median measured step."""
        return statistics.median(self.times_s) * 1e3 if self.times_s else float("nan")

    @property
    def error(self) -> float:
        """Simulated over measured, minus 1."""
        return self.sim_ms / self.measured_ms - 1.0


def _place(graph: TimedGraph, profile: Any, cluster: Any, method: str, refine_seconds: float):
    """(placed GraphDef, report) of `method` (a placer or a FIXED_LAYOUTS name), or None."""
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.graph_pass import place_graph_def

    if method in FIXED_LAYOUTS:
        layout = fixed_layout(method, graph, cluster.names)
        if layout is None:
            return None
        options = PlacementOptions(placement_method="expert", expert=layout)
    else:
        options = PlacementOptions(placement_method=method, refine_seconds=refine_seconds)
    return place_graph_def(graph.graph_def, profile, cluster, options)


def _import(graph_def: Any):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    return g


def profile_on_one_task(graph: TimedGraph, tasks: TwoTasks, warmup: int = 3, traced: int = 10) -> Any:
    """The CostProfile of `graph` run whole on task 0's CPU:0: `warmup` untraced steps, then
    `traced` FULL_TRACE ones (`profile_fetch`: per op the median over them)."""
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profile_fetch
    from baechi_tf.rewriter.apply import apply_placement

    device = tasks.cluster.names[0]
    placed = apply_placement(graph.graph_def, {n.name: device for n in graph.graph_def.node})
    g = _import(placed)
    with tf.compat.v1.Session(tasks.target, graph=g, config=_session_config()) as sess:
        sess.run(list(graph.init))
        return profile_fetch(sess, list(graph.fetches), dict(graph.feeds), warmup_steps=warmup,
                             traced_steps=traced, graph_def=graph.graph_def)


def measure_graph(
    graph: TimedGraph,
    tasks: TwoTasks,
    methods: Sequence[str],
    *,
    rounds: int = 7,
    steps: int = 5,
    warmup: int = 3,
    seed: int = 0,
    refine_seconds: float = 3.0,
    profile: Any = None,
    diagnose: bool = False,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[list[Measured], float]:
    """(rows, others' CPU share): profiles `graph` on one task (unless `profile` is given),
    places it with each of `methods` on `tasks.cluster`, and times every placement: `warmup`
    untimed steps, then `rounds` rounds of `steps` steps each, the placements in a new order
    (seeded by `seed`) every round. The share is `MachineLoad.share` over the rounds (nan where
    not measured)."""
    import tensorflow as tf

    if profile is None:
        profile = profile_on_one_task(graph, tasks)
    rows: list[Measured] = []
    sessions = {}
    feeds, fetches = dict(graph.feeds), list(graph.fetches)
    try:
        for method in methods:
            placed = _place(graph, profile, tasks.cluster, method, refine_seconds)
            if placed is None:
                log(f"  {graph.name} {method}: the graph has no such layout; left out")
                continue
            placed_def, report = placed
            row = Measured(graph.name, method, report.result.placement.method,
                           report.makespan_us / 1e3, report)
            same = report.result.placement.device_of
            row.same_as = next((r.method for r in rows
                                if (r.report.result.placement.device_of == same).all()), "")
            rows.append(row)
            sess = tf.compat.v1.Session(tasks.target, graph=_import(placed_def), config=_session_config())
            sessions[method] = sess
            sess.run(list(graph.init))
            for _ in range(warmup):
                sess.run(fetches, feed_dict=feeds)
            used = len(report.devices_used)
            log(f"  {graph.name} {method}: {used} device{'s' * (used != 1)}, simulated "
                f"{row.sim_ms:.2f} ms")
        order = random.Random(seed)
        meter = LoadMeter().start()  # the worker tasks are this process's children: its own work
        for r in range(rounds):
            turn = list(rows)
            order.shuffle(turn)
            for row in turn:
                sess = sessions[row.method]
                for _ in range(steps):
                    t0 = time.perf_counter()
                    sess.run(fetches, feed_dict=feeds)
                    row.times_s.append(time.perf_counter() - t0)
            log(f"  {graph.name}: round {r + 1}/{rounds}")
        load = meter.stop()
        others = load.share if load is not None else float("nan")
        if diagnose:
            for row in rows:
                row.diagnosis = diagnose_placement(graph, sessions[row.method], row)
    finally:
        for sess in sessions.values():
            sess.close()
    return rows, others


# ---------------------------------------------------------------------------- figures


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan for fewer than 2 points or a
    constant side."""
    from scipy.stats import spearmanr

    if len(xs) < 2:
        return float("nan")
    return float(spearmanr(xs, ys).statistic)


def print_graph(rows: Sequence[Measured], out=sys.stdout) -> dict:
    """Prints one graph's rows (IQR: interquartile range of its measured steps over their
    median) and its two figures; returns them: spearman, auto_ok (None without auto) and
    auto_ratio (auto's measured step over the fastest placement's, the steps of rows with the
    same placement pooled)."""
    import numpy as np

    header = (f"{'graph':<13} {'method':<9} {'chosen':<18} {'sim ms':>9} {'measured ms':>11} "
              f"{'error':>7} {'IQR':>5}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        q1, q3 = np.percentile(r.times_s, [25, 75]) if r.times_s else (0.0, 0.0)
        same = f"  (= {r.same_as})" if r.same_as else ""
        print(f"{r.graph:<13} {r.method:<9} {r.chosen[:18]:<18} {r.sim_ms:>9.2f} "
              f"{r.measured_ms:>11.2f} {100 * r.error:>+6.1f}% {100e3 * (q3 - q1) / r.measured_ms:>4.0f}%"
              f"{same}", file=out)
    rho = spearman([r.sim_ms for r in rows], [r.measured_ms for r in rows])
    # Rows of one placement (auto's choice is often another method's) are one candidate: their
    # steps are pooled, so that the noise between two runs of it does not count against auto.
    pooled: dict[str, list[float]] = {}
    for r in rows:
        pooled.setdefault(r.same_as or r.method, []).extend(r.times_s)
    step_ms = {m: statistics.median(t) * 1e3 for m, t in pooled.items() if t}
    best = min(step_ms, key=step_ms.get)
    auto = next((r for r in rows if r.method == "auto"), None)
    ratio = step_ms[auto.same_as or auto.method] / step_ms[best] if auto else float("nan")
    ok = None if auto is None else bool(ratio <= 1 + WITHIN)
    line = f"{rows[0].graph}: Spearman {rho:.3f} over {len(rows)} placements"
    if auto is not None:
        key = auto.same_as or auto.method
        line += (f"; auto ({auto.chosen}{', = ' + key if key != 'auto' else ''}) "
                 f"{step_ms[key]:.2f} ms, fastest {best} {step_ms[best]:.2f} ms: x{ratio:.3f} "
                 f"{'ok' if ok else 'NOT within 5%'}")
    print(line, file=out, flush=True)
    return {"spearman": rho, "auto_ok": ok, "auto_ratio": ratio}


def print_summary(all_rows: Sequence[Measured], per_graph: Mapping[str, dict], out=sys.stdout) -> bool:
    """Prints the closing figures against the targets; True when all are met."""
    errors = [abs(r.error) for r in all_rows]
    med = statistics.median(errors) if errors else float("nan")
    rhos = {g: f["spearman"] for g, f in per_graph.items()}
    autos = {g: f["auto_ok"] for g, f in per_graph.items() if f["auto_ok"] is not None}
    met_error = med <= TARGET_ERROR
    met_rho = all(r >= TARGET_SPEARMAN for r in rhos.values())
    met_auto = all(autos.values())
    print(f"step time over {len(all_rows)} placements of {len(per_graph)} graphs:", file=out)
    print(f"  median |simulated / measured - 1|: {100 * med:.1f}% (target <= "
          f"{100 * TARGET_ERROR:.0f}%) {'met' if met_error else 'NOT met'}", file=out)
    print(f"  Spearman per graph: {', '.join(f'{g} {r:.3f}' for g, r in rhos.items())} "
          f"(target >= {TARGET_SPEARMAN}) {'met' if met_rho else 'NOT met'}", file=out)
    said = ", ".join(f"{g} x{per_graph[g]['auto_ratio']:.3f} {'yes' if a else 'no'}" for g, a in autos.items())
    print(f"  auto's measured step over the fastest, within 5%: {said} {'met' if met_auto else 'NOT met'}", file=out, flush=True)
    return met_error and met_rho and met_auto


# ---------------------------------------------------------------------------- diagnosis


_EDGE = re.compile(r"\bedge_\d+_(\S+) from (\S+) to (\S+)")
_BYTES = re.compile(r"^\[(\d+)B\]")


def _span_us(ns: Any) -> tuple[float, float]:
    """(start, end) of a traced node in us of the machine's clock."""
    if ns.all_start_nanos:
        start = ns.all_start_nanos / 1e3
        return start, start + ns.all_end_rel_nanos / 1e3
    return float(ns.all_start_micros), float(ns.all_start_micros + ns.all_end_rel_micros)


def _op_us(ns: Any) -> float:
    return ns.op_end_rel_nanos / 1e3 if ns.op_end_rel_nanos > 0 else float(max(ns.op_end_rel_micros, 0))


def _union_us(windows: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end) windows. O(n log n)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(windows):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def read_trace(step_stats: Any, names: Mapping[str, int]) -> dict:
    """What one traced step ran: per device (full name) its graph ops' (start, end, op us) by
    name, and the copies between tasks as (producer, src, dst, bytes, rpc start, rpc end).
    `names` are the graph's op names (others, TF's own nodes, are left out)."""
    ops: dict[str, dict[str, tuple[float, float, float]]] = {}
    copies = []
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name == "RecvTensor":
                m, b = _EDGE.search(ns.timeline_label), _BYTES.match(ns.timeline_label)
                if m is None:
                    continue
                producer = m.group(1)
                while producer not in names and ":" in producer:
                    producer = producer.rsplit(":", 1)[0]
                start, end = _span_us(ns)
                copies.append((producer, m.group(2), m.group(3), int(b.group(1)) if b else 0, start, end))
            elif ns.node_name in names:
                start, end = _span_us(ns)
                ops.setdefault(dev.device, {})[ns.node_name] = (start, end, _op_us(ns))
    return {"ops": ops, "copies": copies}


def diagnose_placement(graph: TimedGraph, sess: Any, row: Measured, traced: int = 3) -> dict:
    """Reads `traced` FULL_TRACE steps of a placed session against the simulator's model and
    returns, from the step whose traced time is the median:

    - per device: ops run, their profiled compute (what the simulator charges), their op time
      as run placed, the span from the first op's start to the last op's end, and the gaps
      within it (span minus op time: executor overhead and waits);
    - copies between tasks: how many ran (RecvTensor records) and how many the simulator booked
      (with their channel time); of the data copies of graph ops, the measured latency (end of
      the producer to the end of its RPC on the receiver: median and 90th percentile) against the
      modelled cost (a * bytes + b, median), and the union of their windows over their sum
      (below 1: copies overlapped each other), and the link's copies in flight that their
      arrivals show (`comm_fit.copies_in_flight_in_trace`, against the modelled line);
    - the traced step's wall time, and the untraced median of the timing rounds.
    """
    import numpy as np
    import tensorflow as tf

    from baechi_tf.cost_model.comm_fit import copies_in_flight_in_trace

    tf1 = tf.compat.v1
    result = row.report.result
    opgraph, cluster = result.graph, result.cluster
    index = opgraph.index
    steps = []
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    for _ in range(traced):
        metadata = tf1.RunMetadata()
        t0 = time.perf_counter()
        sess.run(list(graph.fetches), feed_dict=dict(graph.feeds), options=options, run_metadata=metadata)
        steps.append((time.perf_counter() - t0, metadata.step_stats))
    steps.sort(key=lambda s: s[0])
    wall_s, step_stats = steps[len(steps) // 2]
    trace = read_trace(step_stats, index)
    compute = opgraph.compute_us
    out: dict = {"traced_ms": wall_s * 1e3, "measured_ms": row.measured_ms, "devices": []}
    for d, name in enumerate(cluster.names):
        ran = trace["ops"].get(name, {})
        if not ran:
            out["devices"].append(None)
            continue
        starts = [v[0] for v in ran.values()]
        ends = [v[1] for v in ran.values()]
        run_us = sum(v[2] for v in ran.values())
        span = max(ends) - min(starts)
        out["devices"].append({
            "ops": len(ran),
            "profiled_ms": float(sum(compute[index[n]] for n in ran)) / 1e3,
            "run_ms": run_us / 1e3,
            "span_ms": span / 1e3,
            "gap_us_per_op": (span - run_us) / len(ran),
        })
    end_of = {n: v[1] for per in trace["ops"].values() for n, v in per.items()}
    latency, modelled = [], []
    windows, sizes = [], []
    for producer, src, dst, nbytes, start, end in trace["copies"]:  # data copies of graph ops
        s, t = cluster.find(src), cluster.find(dst)
        if producer not in end_of or s is None or t is None:
            continue
        latency.append(end - end_of[producer])
        modelled.append(cluster.transfer_us(s, t, nbytes))
        windows.append((end_of[producer], end))
        sizes.append(nbytes)
    link = cluster.link(0, 1) if cluster.num_devices > 1 else None
    in_flight = (copies_in_flight_in_trace([w[0] for w in windows], [w[1] for w in windows], sizes, link)
                 if windows and link is not None else (math.nan, math.nan, 0))
    sim_copies = result.schedule.transfers
    out["copies"] = {
        "simulated": len(sim_copies),
        "simulated_busy_ms": sum(c.end_us - c.start_us for c in sim_copies) / 1e3,
        "measured": len(trace["copies"]),  # control messages and copies of TF's own nodes too
        "timed": len(latency),
        "latency_us": (float(np.median(latency)), float(np.percentile(latency, 90))) if latency else None,
        "modelled_us": float(np.median(modelled)) if modelled else None,
        "overlap": _union_us(windows) / sum(b - a for a, b in windows) if windows else None,
        "in_flight": in_flight,  # (K, arrivals' spacing us, pairs of copies back to back)
    }
    return out


def print_diagnosis(rows: Sequence[Measured], out=sys.stdout) -> None:
    """The `diagnose_placement` figures of each row, a few lines per placement."""
    for r in rows:
        d = getattr(r, "diagnosis", None)
        if not d:
            continue
        print(f"  {r.graph} {r.method}: traced step {d['traced_ms']:.2f} ms, untraced median "
              f"{d['measured_ms']:.2f} ms, simulated {r.sim_ms:.2f} ms", file=out)
        for i, dev in enumerate(d["devices"]):
            if dev is None:
                continue
            print(f"    task {i}: {dev['ops']} ops, profiled {dev['profiled_ms']:.2f} ms, run "
                  f"{dev['run_ms']:.2f} ms (x{dev['run_ms'] / max(dev['profiled_ms'], 1e-9):.2f}), "
                  f"span {dev['span_ms']:.2f} ms, gaps {dev['gap_us_per_op']:.1f} us/op", file=out)
        c = d["copies"]
        if c["measured"] or c["simulated"]:
            line = (f"    copies: {c['measured']} ran, {c['simulated']} simulated "
                    f"({c['simulated_busy_ms']:.2f} ms of channel time)")
            if c["timed"]:
                lat = c["latency_us"]
                line += (f"; {c['timed']} data copies timed: latency median {lat[0]:.0f} us, p90 "
                         f"{lat[1]:.0f} us, modelled median {c['modelled_us']:.0f} us; union/sum "
                         f"of their windows {c['overlap']:.2f}")
                k, spacing, pairs = c.get("in_flight") or (math.nan, math.nan, 0)
                if pairs:
                    line += (f"; {pairs} back to back, in {spacing:.0f} us apart (median): "
                             f"{k:.2f} copies in flight")
            print(line, file=out)
    out.flush()


# ---------------------------------------------------------------------------- the machine


def step_overhead_us(tasks: TwoTasks, steps: int = 50) -> dict:
    """Median wall time of a step that runs one scalar add on task 0, on task 1, and on both:
    what a step costs beyond its ops (client to master, RunGraph to each task, feed and fetch);
    and under 'skew', how much later task 1 starts its part of a step than task 0 (median of
    traced steps of the one on both)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    out = {}
    for label, devices in (("task 0", tasks.cluster.names[:1]), ("task 1", tasks.cluster.names[1:]),
                           ("both", tasks.cluster.names)):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [], name="x")
            outs = []
            for d in devices:
                with tf.device(d):
                    outs.append(x + 1.0)
            y = tf.add_n(outs) if len(outs) > 1 else outs[0]
        with tf1.Session(tasks.target, graph=g, config=_session_config()) as sess:
            for _ in range(5):
                sess.run(y, {x: 1.0})
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                sess.run(y, {x: 1.0})
                times.append(time.perf_counter() - t0)
            out[label] = statistics.median(times) * 1e6
            if len(devices) > 1:
                skews = []
                for _ in range(10):
                    metadata = tf1.RunMetadata()
                    sess.run(y, {x: 1.0}, options=options, run_metadata=metadata)
                    first = {}
                    for dev in metadata.step_stats.dev_stats:
                        for ns in dev.node_stats:
                            if ns.node_name == "_SOURCE":
                                first[dev.device] = min(first.get(dev.device, math.inf), _span_us(ns)[0])
                    if all(d in first for d in devices):
                        skews.append(first[devices[1]] - first[devices[0]])
                out["skew"] = statistics.median(skews) if skews else float("nan")
    return out


def busy_sender_probe(tasks: TwoTasks, busy_ops: int = 10, runs: int = 15) -> dict:
    """Latency of one small copy from task 0 to task 1 (end of its producer to start of its
    consumer, FULL_TRACE), with task 0 idle after the producer and with it then busy with a
    chain of `busy_ops` 512x512 matmuls; and how long that chain kept task 0 busy. Medians, us.

    The simulator starts a copy at its producer's end, whatever the sender does next."""
    import numpy as np
    import tensorflow as tf

    tf1 = tf.compat.v1
    d0, d1 = tasks.cluster.names
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    out = {}
    for chain in (0, busy_ops):
        g = tf.Graph()
        with g.as_default():
            x = tf1.placeholder(tf.float32, [512, 512], name="x")
            with tf.device(d0):
                a = tf.reduce_sum(x, name="a")
                y = x
                with tf.control_dependencies([a]):  # the chain runs after the producer
                    for i in range(chain):
                        y = tf.matmul(y, x, name=f"m{i}") * 0.001
                busy = tf.reduce_sum(y, name="busy")
            with tf.device(d1):
                b = tf.multiply(a, 2.0, name="b")
            with tf.device(d0):
                done = tf.add(b, busy, name="done")
        feed = {x: np.ones([512, 512], np.float32)}
        latency, kept = [], []
        with tf1.Session(tasks.target, graph=g, config=_session_config()) as sess:
            for _ in range(3):
                sess.run(done, feed)
            for _ in range(runs):
                metadata = tf1.RunMetadata()
                sess.run(done, feed, options=options, run_metadata=metadata)
                spans = {ns.node_name: _span_us(ns) for dev in metadata.step_stats.dev_stats
                         for ns in dev.node_stats}
                latency.append(spans["b"][0] - spans["a"][1])
                kept.append(spans[f"m{chain - 1}"][1] - spans["a"][1] if chain else 0.0)
        out["idle" if not chain else "busy"] = (float(np.median(latency)), float(np.median(kept)))
    return out


def save_run(directory: str, graph: TimedGraph, profile: Any, rows: Sequence[Measured], comm: Any,
             others: float) -> None:
    """Writes what re-simulating `rows` needs to `directory`: ``<graph>.pb`` (the GraphDef),
    ``<graph>.profile`` (its CostProfile) and ``<graph>.json`` (the link, and per placement its
    op -> device, simulated step and measured steps)."""
    import json

    from baechi_tf._files import atomic_write
    from baechi_tf.cost_model.profile import save_profile

    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, graph.name)
    with open(base + ".pb", "wb") as f:
        f.write(graph.graph_def.SerializeToString())
    save_profile(profile, base + ".profile")
    doc = {
        "graph": graph.name,
        "comm": [comm.slope_us_per_byte, comm.intercept_us, comm.copies_in_flight],
        "others_cpu_share": others,
        "placements": [{
            "method": r.method, "chosen": r.chosen, "sim_ms": r.sim_ms, "times_s": r.times_s,
            "op_to_device": r.report.op_to_device, "diagnosis": r.diagnosis,
        } for r in rows],
    }
    atomic_write(base + ".json", json.dumps(doc, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------- command line


def _machine_load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load unknown"
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


@dataclasses.dataclass(frozen=True)
class TimeOptions:
    """How `run` measures; the command line's flags, --quick resolved."""

    rounds: int = 7  # timing rounds, the placements in a new seeded order in each
    steps: int = 5  # steps of each placement per round
    warmup: int = 3  # untimed steps of each placement, and of the profile
    traced_steps: int = 10  # FULL_TRACE steps of the profile
    seed: int = 0  # seeds the order within rounds
    refine_seconds: float = 3.0  # auto's refinement budget
    link_exponent: int = 22  # the link is fitted to 2^0 .. 2^(k-1) float32 elements
    link_runs: int = 5  # traced copies per size and direction
    link: str = "one_way"  # the line placement uses: 'one_way' or 'round_trip' (`fit_link`)
    copies_in_flight: Optional[float] = None  # the link's K; None: as fitted (`fit_link`)
    inter_op_threads: int = 1  # each task's inter-op pool (which also serves its RPCs)
    diagnose: bool = False  # also `diagnose_placement` and the two probes
    save: Optional[str] = None  # folder for `save_run`, or None


def run(
    graphs: Sequence[TimedGraph],
    methods: Sequence[str],
    options: TimeOptions = TimeOptions(),
    *,
    out=sys.stdout,
    log: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
) -> tuple[list[Measured], dict, bool]:
    """The step-time half of the fidelity check: starts the two tasks, fits the link, and per
    graph profiles, places with each of `methods`, times and prints (`print_graph`); then the
    summary (`print_summary`). Returns (every row, per-graph figures, whether every target
    was met). The tasks are stopped on return, by an exception too."""
    cores = sorted(os.sched_getaffinity(0))[:NUM_DEVICES]
    if len(cores) < NUM_DEVICES:
        raise RuntimeError(f"this process may run on {len(cores)} core(s); the {NUM_DEVICES} "
                           "tasks need one each")
    started = time.perf_counter()
    tasks = start_two_tasks(cores, options.inter_op_threads)
    try:
        print(f"{NUM_DEVICES} worker tasks on loopback, task i on core {cores}[i], inter-op pool "
              f"{options.inter_op_threads}, intra-op pool 1; devices: each task's CPU:0; "
              f"{_machine_load()}", file=out, flush=True)
        fits, link_rows = fit_link(tasks, exponent=options.link_exponent, runs=options.link_runs)
        for kind in ("one_way", "round_trip"):
            fit, flight = fits[kind], fits["in_flight_" + kind]
            print(f"link fitted to {kind.replace('_', ' ')}s: {fit.comm.slope_us_per_byte:.4g} us/B "
                  f"x + {fit.comm.intercept_us:.1f} us (rms relative error "
                  f"{100 * fit.rms_relative_error:.0f}%), {fit.comm.copies_in_flight:.2f} copies in "
                  f"flight (copies sent together {flight.spacing_us:.1f} us apart, rms relative "
                  f"error {100 * flight.rms_relative_error:.0f}%)", file=out)
        small = [r for r in link_rows if r[0] <= 4096]
        print(f"copies up to 4 KiB, median: {statistics.median(r[1] for r in small):.0f} us "
              f"task 0 -> 1, {statistics.median(r[2] for r in small):.0f} us task 1 -> 0, "
              f"{statistics.median(r[3] for r in small):.0f} us half a round trip from task 1",
              file=out)
        comm = fits[options.link].comm
        if options.copies_in_flight is not None:
            comm = dataclasses.replace(comm, copies_in_flight=options.copies_in_flight)
        print(f"placing with the {options.link.replace('_', ' ')} line, {comm.copies_in_flight:.2f} "
              f"copies in flight{' (given)' if options.copies_in_flight is not None else ''}",
              file=out, flush=True)
        tasks = dataclasses.replace(tasks, cluster=dataclasses.replace(tasks.cluster, comm=comm))
        if options.diagnose:
            fixed = step_overhead_us(tasks)
            print(f"step without work (one scalar add): on task 0 {fixed['task 0']:.0f} us, on "
                  f"task 1 {fixed['task 1']:.0f} us, on both {fixed['both']:.0f} us; task 1 "
                  f"starts its part {fixed['skew']:.0f} us after task 0", file=out)
            probe = busy_sender_probe(tasks)
            print(f"copy of a scalar task 0 -> 1: {probe['idle'][0]:.0f} us when task 0 idles "
                  f"after its producer; {probe['busy'][0]:.0f} us when task 0 then runs "
                  f"{probe['busy'][1]:.0f} us of other ops", file=out, flush=True)
        all_rows: list[Measured] = []
        per_graph: dict[str, dict] = {}
        for graph in graphs:
            t0 = time.perf_counter()
            profile = profile_on_one_task(graph, tasks, warmup=options.warmup,
                                          traced=options.traced_steps)
            log(f"{graph.name}: {len(graph.graph_def.node)} ops, profiled in "
                f"{time.perf_counter() - t0:.1f} s")
            rows, others = measure_graph(
                graph, tasks, methods, rounds=options.rounds, steps=options.steps,
                warmup=options.warmup, seed=options.seed, refine_seconds=options.refine_seconds,
                profile=profile, diagnose=options.diagnose, log=log)
            print(f"\n{graph.name}: {len(graph.graph_def.node)} ops; {options.rounds} rounds of "
                  f"{options.steps} steps per placement; other processes took {100 * others:.0f}% "
                  f"of the cores meanwhile; {_machine_load()}", file=out)
            per_graph[graph.name] = print_graph(rows, out)
            if options.save:
                save_run(options.save, graph, profile, rows, comm, others)
            if options.diagnose:
                print_diagnosis(rows, out)
            all_rows += rows
        print(file=out)
        met = print_summary(all_rows, per_graph, out)
        print(f"({time.perf_counter() - started:.0f} s in all)", file=out, flush=True)
    finally:
        tasks.workers.stop()
    return all_rows, per_graph, met


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated graphs among %(default)s")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated placers and fixed layouts (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller graphs, a shorter link fit and fewer rounds: a check that "
                        "it all runs, not figures")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timing rounds (default: 7; 2 with --quick)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps of each placement per round (default: 5; 2 with --quick)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps of each placement (default: %(default)s)")
    parser.add_argument("--traced_steps", type=int, default=None,
                        help="FULL_TRACE steps of the profile (default: 10; 3 with --quick)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the order of the placements within rounds (default: %(default)s)")
    parser.add_argument("--refine_seconds", type=float, default=3.0,
                        help="auto's refinement budget (default: %(default)s)")
    parser.add_argument("--link_exponent", type=int, default=None,
                        help="the link is fitted to transfers of 2^0 .. 2^(k-1) float32 elements "
                        "(default: 22; 12 with --quick)")
    parser.add_argument("--link", choices=("one_way", "round_trip"), default="one_way",
                        help="the line placement uses: fitted to single copies both ways, or to "
                        "half round trips started on task 1 (default: %(default)s)")
    parser.add_argument("--copies_in_flight", default=None, metavar="K|unlimited|fit",
                        type=lambda text: None if text == "fit" else flags.copies_in_flight(text),
                        help="the link's copies in flight placement uses: a number >= 1, "
                        "'unlimited', or 'fit' to use the K fitted to copies sent together "
                        "(default: fit)")
    parser.add_argument("--inter_op_threads", type=int, default=1,
                        help="each task's inter-op pool, which also serves its gRPC requests "
                        "(default: %(default)s)")
    parser.add_argument("--save", default=None, metavar="DIR",
                        help="write each graph, its profile and the measured steps of its "
                        "placements to DIR, to simulate them again under other models")
    parser.add_argument("--diagnose", action="store_true",
                        help="also trace steps of each placement and print where their time "
                        "goes, and time two probes: a step's fixed cost and a copy from a busy task")
    args = parser.parse_args(argv)
    models = flags.chosen(parser, args.models, "--models", MODELS, "model")
    methods = flags.chosen(parser, args.methods, "--methods", METHODS, "method")
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 7)
    steps = args.steps if args.steps is not None else (2 if args.quick else 5)
    traced = args.traced_steps if args.traced_steps is not None else (3 if args.quick else 10)
    exponent = args.link_exponent if args.link_exponent is not None else (12 if args.quick else 22)
    if min(rounds, steps, traced) < 1 or args.warmup < 0 or args.inter_op_threads < 1:
        parser.error("--rounds, --steps, --traced_steps and --inter_op_threads must be at least 1, "
                     "--warmup at least 0")
    if not 2 <= exponent <= 28:
        parser.error(f"--link_exponent {exponent}: give 2 to 28")
    if not 0 <= args.refine_seconds < math.inf:
        parser.error(f"--refine_seconds {args.refine_seconds}: give a finite number >= 0")
    if len(os.sched_getaffinity(0)) < NUM_DEVICES:
        parser.error(f"this process may run on {len(os.sched_getaffinity(0))} core(s); the "
                     f"{NUM_DEVICES} tasks need one each")

    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    options = TimeOptions(
        rounds=rounds, steps=steps, warmup=args.warmup, traced_steps=traced, seed=args.seed,
        refine_seconds=args.refine_seconds, link_exponent=exponent, link=args.link,
        copies_in_flight=args.copies_in_flight,
        link_runs=3 if args.quick else 5, inter_op_threads=args.inter_op_threads,
        diagnose=args.diagnose, save=args.save)
    _, _, met = run(time_graphs(models, args.quick), methods, options)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
