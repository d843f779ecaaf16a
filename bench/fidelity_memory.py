"""Simulated against measured peak memory per device, for real graphs placed on 4 CPU stand-ins.

For each graph of bench/fidelity_graphs.py (GNMT v2, Inception-v3, Transformer, ResNet50,
MobileNetV2, an unrolled LSTM): profiles the unplaced training step as BaechiSession does
(`profile_fetch`, Grappler off, 1 warm-up and 3 traced steps), places it with each method on 4
stand-ins of 8 GiB (``ConfigProto(device_count={"CPU": 5})``: the host and four stand-ins), and
with the methods of ``--tight_methods`` again under a tight limit: ``--tight`` (1.5) times the
graph's simulated one-device peak, divided among the 4 devices, raised to 4/3 and then 2 times
that when the method finds no placement that fits (the limit column says which). Each placement
is run in a session of its own (Grappler off, as BaechiSession runs it; on with ``--grappler``):
initialized, ``--warmup_steps`` untraced steps, then ``--traced_steps`` steps with
``FULL_TRACE``, in each of ``--sessions`` sessions (1). A device's measured peak is
the largest over the traced steps of the memory rebuilt from the step's allocation records plus
the variables and constants it holds (`baechi_tf.cost_model.measured_memory`); the simulated
peak is the placement report's (`PlacementResult.reordered_peak_bytes`): with ``--shared_memory``,
the highest over steps of TF's executor emulated on the process's pool of threads, which all the
stand-ins take turns on (`baechi_tf.placer.executor_order.expected_peaks`); without it, the
schedule's memory held as long as TF may hold it running each device's ops up to its window of
places (`memory_timeline.order_windows`) out of the simulated order.

It prints one line per placement and device (the host too when the placement put ops there):
simulated and measured MiB, and their ratio (simulated / measured; the target is every device in
[1.0, 1.25]). Then the summary: devices where simulated >= measured, where simulated <= 1.25 x
measured, both, and the worst under- and over-prediction; the under-predicted devices by cause
(`under_causes`); and, for placements that ran more than once (two methods or limits gave the
same one, each run in a session of its own), how far apart their devices' measured peaks were
(`repeat_spread`); how far apart each device's peaks in the traced steps were (`step_spread`),
and on how many devices the simulated peak is in [1.0, 1.25] of some traced step's peak, not
only of the highest (`in_target_of_some_step`). Then the same figures for the simulated order alone (the schedule's
own peak, `Schedule.peak_memory_bytes`), and for the same
schedules with their blocks of memory (`baechi_tf.placer.memory_timeline.memory_blocks`) counted
otherwise, cumulatively, by what the traced step shows (`VARIANTS`): without the ops the step
never ran; with an output that is a view of another buffer (a variable's value, an Identity, an
op done in place) held as part of that buffer; with a tensor read on another stand-in held by its
sender (stand-ins pass buffers, a GPU copies them), each held as out of order as the simulated
peak; and those rules replayed at each op's measured start and end, in the measured order, which
leaves out the simulated timing. ``--explain`` adds, per placement, what the
simulator holds at its peak by kind and what the device held at its measured peak by type of
node. ``--json`` writes every row for plots and for bench/fidelity.py; ``--save DIR`` keeps the
graphs, profiles, placements and measured peaks, so that bench/fidelity_memory_resim.py can
simulate the same placements again under another model against the same measurements, and the
traced steps of each placement whose measured peak the byte rules miss at the measured times, or
the simulated peak misses (`_keep_steps`; `save_steps`, read with `load_steps`).

    TF_USE_LEGACY_KERAS=1 .venv/bin/python bench/fidelity_memory.py [--models rnn,transformer]
        [--methods m_etf,auto] [--quick] [--explain] [--grappler] [--shared_memory] [--json out.json]

Needs tf_keras for ResNet50 and MobileNetV2 (``pip install --no-deps tf-keras==2.21.0``). The
whole set takes some 15 minutes on 2 cores; ``--quick`` (2 graphs, 2 methods) about one.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import statistics
import sys
import textwrap
import time
import types
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import fidelity_graphs  # noqa: E402  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
import flags  # noqa: E402


from baechi_tf._startup import import_tensorflow_quietly  # noqa: E402

__all__ = [
    "Row", "in_target_of_some_step", "load_steps", "measure_graph", "repeat_spread", "run_session_config",
    "save_run", "save_steps", "step_spread", "summary", "under_causes",
]

NUM_DEVICES = 4
METHODS = ("single", "m_topo", "m_etf", "m_sct", "heft", "expert", "auto")
TIGHT_METHODS = ("m_topo", "m_etf", "m_sct", "auto")
QUICK_MODELS, QUICK_METHODS = ("rnn", "transformer"), ("m_etf", "auto")
TIGHT_STEPS = (1.0, 4 / 3, 2.0)  # a tight limit is raised by these factors until the method places
MiB = 1 << 20
LOW, HIGH = 1.0, 1.25  # the target: simulated / measured within [LOW, HIGH] on every device


@dataclasses.dataclass(frozen=True)
class Row:
    """One device of one placement."""

    model: str
    method: str  # as asked
    chosen: str  # the placement's method as the report names it
    limit: str  # 'loose' (8 GiB), or the tight limit as times the one-device peak / devices
    capacity_bytes: int
    device: str  # 'device:CPU:1'
    ops: int  # ops placed there
    simulated_bytes: int
    measured_bytes: int
    measured_persistent_bytes: int  # variables and constants
    measured_step_bytes: int  # the records' peak
    replaced_bytes: int  # records left at the step's end (variables' new buffers)
    # The same schedule's peak with some blocks of memory counted otherwise (`_variants`), the
    # largest over the traced steps (None when the placement ran with Grappler, whose nodes
    # are not the graph's):
    sim_ran_bytes: Optional[int]  # without the blocks of ops the step never ran
    sim_alias_bytes: Optional[int]  # and an output that is a view of another buffer counted with that buffer
    sim_standin_bytes: Optional[int]  # and a copy received from another stand-in counted on the sender
    replay_bytes: Optional[int]  # those rules with each op at its measured start and end
    # The placement's fingerprint (every op's device); rows of runs that share it ran the same
    # placement in sessions of their own (`repeat_spread`). None in files written before it.
    placement: Optional[str] = None
    # Of the outputs of this device's ops that reuse another stand-in's buffer (`reuse_check`),
    # over the traced steps: [runs, runs in which TF reused the buffer] of those the model counts
    # once (`buffers.always_reused_tensors`) and of those it counts both ways. None in files
    # written before it, and with Grappler.
    reused_once: Optional[list[int]] = None
    reused_both_ways: Optional[list[int]] = None
    # The placement's peak simulated with no op held back for memory, as TF runs it
    # (`PlacementResult.unheld_peak_bytes`; the simulated peak where no op can have waited).
    # None in files written before it.
    sim_unheld_bytes: Optional[int] = None
    # Each traced step's peak, in the order the steps ran (`measured_bytes` is the highest; 0 for a
    # step that ran nothing there): how far TF's order moved this device's peak from step to
    # step. None in files written before it.
    measured_peaks: Optional[list[int]] = None
    # The schedule's own peak, each op at its simulated place in the order
    # (`Schedule.peak_memory_bytes`; `simulated_bytes` lets ops move their device's window). None
    # in files written before it, where `simulated_bytes` is this.
    sim_schedule_bytes: Optional[int] = None

    @property
    def ratio(self) -> float:
        return _ratio(self.simulated_bytes, self.measured_bytes)


def _ratio(simulated: int, measured: int) -> float:
    """simulated / measured; 1 when both are 0 (a device of a few ops that hold nothing), inf
    when only the measured peak is."""
    if measured:
        return simulated / measured
    return 1.0 if simulated == 0 else float("inf")


def machine_line() -> str:
    """The CPU this run measures on and whether TensorFlow's oneDNN kernels are on: both set how
    much scratch TF's kernels take (a convolution's gradient 23 to 27 MiB without oneDNN, on an
    AVX2 CPU; docs/fidelity.md, "Scratch is held while its op runs"), so peaks of runs on other
    machines compare only where these agree. TensorFlow must be imported."""
    model, flags = "an unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "an unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    try:
        from tensorflow.python.util import _pywrap_util_port

        onednn = "on" if _pywrap_util_port.IsMklEnabled() else "off"
    except (ImportError, AttributeError):
        onednn = "unknown"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"machine: {model}, {cpus} CPUs for this process, {vector}; TensorFlow's oneDNN {onednn}"


def _local(name: str) -> str:
    return name.split("/")[-1]


def run_session_config(setup, grappler: bool, inter_op_threads: int):
    """The ConfigProto the placements run with: `session_config` of `setup`, with an inter-op pool
    of `inter_op_threads` threads of the session's own (``use_per_session_threads``), or TF's
    process-wide pool for 0. TF sizes that pool once per process, by the first session made (here
    the profiling one), and ignores the count of every session after it: a count given there
    would leave the placements running as many ops at once as the machine has cores."""
    from baechi_tf.rewriter.devices import session_config

    config = session_config(setup, grappler=grappler)
    if inter_op_threads > 0:
        config.inter_op_parallelism_threads = inter_op_threads
        config.use_per_session_threads = True
    return config


def _profile(case, config, traced_steps: int):
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profile_fetch

    run = fidelity_graphs.runnable(case)
    with tf.compat.v1.Session(graph=run.graph, config=config) as sess:
        sess.run(run.init)
        return profile_fetch(sess, run.target, run.feeds, warmup_steps=1, traced_steps=traced_steps,
                             graph_def=case.graph_def)


def _run(case, placed_def, config, warmup: int, traced: int, target: str = ""):
    """(the graph that ran as a GraphDef, step stats of each traced step) of `placed_def`, in a
    session of `config` on `target` (this process by default)."""
    import tensorflow as tf

    run = fidelity_graphs.runnable(case, placed_def)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    stats = []
    with tf.compat.v1.Session(target, graph=run.graph, config=config) as sess:
        sess.run(run.init)
        for _ in range(warmup):
            sess.run(run.target, feed_dict=run.feeds)
        for _ in range(traced):
            metadata = tf.compat.v1.RunMetadata()
            sess.run(run.target, feed_dict=run.feeds, options=options, run_metadata=metadata)
            stats.append(metadata.step_stats)
    return run.graph.as_graph_def(), stats


_NOTHING = types.SimpleNamespace(peak_bytes=0, persistent_bytes=0, step_peak_bytes=0, replaced_bytes=0)


def _measured(graph_def, stats, key: Optional[Callable[[str], str]] = None,
              fed: Optional[Mapping[str, int]] = None) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """Per device, named by `key` (default `_local`: 'device:CPU:1'): the `MeasuredDevice` of the
    traced step with the highest peak, and each traced step's peak in turn (0 for a step that ran
    nothing there). `fed`: bytes of each value fed to the step (`measured_memory`), for worker
    tasks, where the records miss them."""
    from baechi_tf.cost_model.measured_memory import measured_memory

    key = _local if key is None else key
    best: dict[str, Any] = {}
    per_step = [{key(name): m for name, m in measured_memory(step, graph_def, fed).items()} for step in stats]
    for found in per_step:
        for name, m in found.items():
            if name not in best or m.peak_bytes > best[name].peak_bytes:
                best[name] = m
    peaks = {name: [found[name].peak_bytes if name in found else 0 for found in per_step] for name in best}
    return best, peaks


def measure_graph(
    name: str,
    methods: Sequence[str],
    tight_methods: Sequence[str],
    *,
    tight: float = 1.5,
    warmup_steps: int = 2,
    traced_steps: int = 2,
    explain: bool = False,
    grappler: bool = False,
    shared_memory: bool = False,
    inter_op_threads: int = 0,
    sessions: int = 1,
    save: Optional[str] = None,
    out=sys.stdout,
) -> list[Row]:
    """Builds, profiles, places (each method, loose and tight) and runs graph `name`; one `Row`
    per device of each placement that ran. Placements refused as infeasible are printed, not
    returned. With `shared_memory`, the stand-ins are modelled as devices of one memory
    (`Device.shared_memory`: a reader holds no copy), else as GPUs that copy. With `grappler`,
    the placements run with Grappler on (the profile is still taken without), and the rows have
    no breakdown (`VARIANTS` fields None). With `save`, a folder, it keeps what re-simulating the
    rows needs there (`save_run`)."""
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.devices import LOCAL_TASK, session_config, standin_cluster
    from baechi_tf.rewriter.graph_pass import place_graph_def

    case = fidelity_graphs.build(name)
    loose = standin_cluster(NUM_DEVICES, prefix=LOCAL_TASK, shared_memory=shared_memory)
    config = session_config(loose, grappler=False)  # the profile as the graph is written
    run_config = run_session_config(loose, grappler, inter_op_threads)
    t0 = time.perf_counter()
    profile = _profile(case, config, traced_steps=3)
    print(f"# {name}: {len(case.graph_def.node)} ops, profiled {len(profile.ops)} "
          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    def place(method: str, setup):
        expert = case.expert(setup.cluster.names) if case.expert and method in ("expert", "auto") else None
        return place_graph_def(case.graph_def, profile, setup.cluster,
                               PlacementOptions(placement_method=method, expert=expert),
                               host_device=setup.host, device_aliases=setup.aliases)

    _, single = place("single", loose)
    one_device = max(single.result.schedule.peak_memory_bytes)
    limits = {"loose": [("loose", loose)], "tight": [
        (f"{tight * f:.1f}x", standin_cluster(NUM_DEVICES, int(tight * f * one_device / NUM_DEVICES), prefix=LOCAL_TASK,
                                              shared_memory=shared_memory))
        for f in TIGHT_STEPS
    ]}
    runs = [(m, "loose") for m in methods if m != "expert" or case.expert]
    runs += [(m, "tight") for m in tight_methods]
    rows: list[Row] = []
    saved: list[dict] = []  # per placement that ran, what `save_run` keeps
    for method, kind in runs:
        t1 = time.perf_counter()
        placed_def, report, limit, refusal = first_fit(method, limits[kind], place)
        if placed_def is None:
            print(f"{name:<12} {method:<7} {limit:<5} refused: {refusal}", file=out, flush=True)
            continue
        t2 = time.perf_counter()
        stats = []
        for _ in range(sessions):  # TF's order of the step's ops, so the peak, moves between sessions
            ran_def, traced = _run(case, placed_def, run_config, warmup_steps, traced_steps)
            stats += traced
        measured, step_peaks = _measured(ran_def, stats)
        result = report.result
        device_of = result.placement.device_of
        fingerprint = placement_fingerprint(device_of)
        if grappler:  # the traced nodes are Grappler's, not the graph's: no breakdown
            variants, replay = [[None] * result.cluster.num_devices] * 3, [None] * result.cluster.num_devices
        else:
            # Per device the largest over the traced steps, as the measured peak is: whether an op
            # works in place of its input depends on the order of the step.
            per_step = [_variants(result, step, None) + _variants(_replayed(result, step), step, 0)[-1:]
                        for step in stats]
            variants = [[max(p) for p in zip(*(v[k] for v in per_step))] for k in range(4)]
            replay = variants.pop()
            reuse, missed = reuse_check(result, stats)
            if missed:
                print(f"#   {method} {limit}: outputs counted once as another stand-in's buffer that a "
                      f"traced run put elsewhere: {', '.join(sorted(set(missed)))}", file=sys.stderr, flush=True)
            if save and any(_keep_steps(replay[d], int(result.reordered_peak_bytes[d]),
                                        measured.get(_local(dev.name), _NOTHING).peak_bytes)
                            for d, dev in enumerate(result.cluster.devices)):
                save_steps(save, case.name, method, limit, ran_def, stats)
        for d, dev in enumerate(result.cluster.devices):
            ops = int((device_of == d).sum())
            key = _local(dev.name)
            m = measured.get(key, _NOTHING)
            if ops == 0 and (key == "device:CPU:0" or m is _NOTHING):
                continue  # a device with no op that never ran one: nothing to compare
            rows.append(Row(
                model=name, method=method, chosen=result.placement.method, limit=limit,
                capacity_bytes=dev.memory_bytes if key != "device:CPU:0" else 0, device=key, ops=ops,
                simulated_bytes=int(result.reordered_peak_bytes[d]), measured_bytes=m.peak_bytes,
                measured_persistent_bytes=m.persistent_bytes, measured_step_bytes=m.step_peak_bytes,
                replaced_bytes=m.replaced_bytes, sim_ran_bytes=variants[0][d],
                sim_alias_bytes=variants[1][d], sim_standin_bytes=variants[2][d], replay_bytes=replay[d],
                placement=fingerprint, reused_once=None if grappler else reuse[d][0],
                reused_both_ways=None if grappler else reuse[d][1],
                sim_unheld_bytes=int((result.unheld_peak_bytes or result.schedule.peak_memory_bytes)[d]),
                measured_peaks=step_peaks.get(key, [0] * len(stats)),
                sim_schedule_bytes=int(result.schedule.peak_memory_bytes[d]),
            ))
            print(_line(rows[-1]), file=out, flush=True)
        saved.append({"method": method, "limit": limit, "placement": fingerprint,
                      "op_to_device": report.op_to_device})
        print(f"#   {method} {limit}: placed in {t2 - t1:.1f} s, ran in {time.perf_counter() - t2:.1f} s",
              file=sys.stderr, flush=True)
        if explain:
            _explain(result, ran_def, stats, measured, out)
    if save:
        save_run(save, case.name, case.graph_def, profile, shared_memory, saved, rows)
    return rows


def placement_fingerprint(device_of: np.ndarray) -> str:
    """16 hex digits naming a placement by every op's device (`Row.placement`): rows that share
    it ran the same placement."""
    return hashlib.sha1(np.ascontiguousarray(device_of, dtype=np.int32).tobytes()).hexdigest()[:16]


def first_fit(method: str, limits: Sequence[tuple[str, Any]], place: Any) -> tuple[Any, Any, str, Any]:
    """(placed GraphDef, report, limit, refusal) of `method` placed by ``place(method, setup)``
    under the first of `limits` ((limit label, setup) pairs, tightest first) it fits: a refusal
    for memory (`InfeasiblePlacementError`) tries the next, another `BaechiError` ends the search
    as a failure, said as such. Placed GraphDef and report are None when no limit placed it, the
    refusal then the last one (the limit the last tried); else the refusal is None."""
    from baechi_tf.errors import BaechiError, InfeasiblePlacementError

    refusal: Any = None
    for limit, setup in limits:
        try:
            placed_def, report = place(method, setup)
            return placed_def, report, limit, None
        except InfeasiblePlacementError as e:
            refusal = e
        except BaechiError as e:  # not a refusal: a failure, said as such
            return None, None, limit, f"failed: {type(e).__name__}: {e}"
    return None, None, limit, refusal


def save_run(directory: str, name: str, graph_def: Any, profile: Any, shared_memory: bool,
             placements: Sequence[Mapping[str, Any]], rows: Sequence[Row], tasks: int = 0,
             fed: Optional[Mapping[str, int]] = None) -> None:
    """Writes what re-simulating `rows` needs to `directory` (made if missing): ``<name>.pb``
    (the unplaced GraphDef), ``<name>.profile`` (its CostProfile) and ``<name>.json`` (whether
    the stand-ins were of shared memory, or, `tasks` > 0, that the devices were that many worker
    tasks of bench/fidelity_memory_tasks.py, and `fed`, the bytes of each value fed to a step,
    which measuring a task's memory from its kept steps needs; per placement its method, limit,
    fingerprint and op -> device; and every row, measured peaks included). Each file is written
    whole or not at all (`atomic_write`); bench/fidelity_memory_resim.py and
    bench/fidelity_memory_steps.py read them."""
    from baechi_tf._files import atomic_write
    from baechi_tf.cost_model.profile import save_profile

    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, name)
    atomic_write(base + ".pb", graph_def.SerializeToString())
    save_profile(profile, base + ".profile")
    doc = {"graph": name, "shared_memory": shared_memory, "placements": list(placements),
           "rows": [dataclasses.asdict(r) for r in rows]}
    if tasks:
        doc["tasks"] = tasks
        doc["fed"] = dict(fed or {})
    atomic_write(base + ".json", json.dumps(doc, sort_keys=True) + "\n")


SHORT = 0.99
"""`--save` keeps the traced steps of a placement where the byte rules at the measured times
(`replay_bytes`) give some device less than this share of its measured peak (`save_steps`)."""


def _keep_steps(replay: Optional[int], simulated: int, measured: int) -> bool:
    """Whether `--save` keeps a placement's traced steps for this device of it: the byte rules at
    the measured times fall short of `SHORT` of its measured peak, or its simulated peak lies
    outside the target [`LOW`, `HIGH`] of it (bench/fidelity_memory_steps.py --peaks sets the two
    peaks' contents side by side)."""
    if not measured:
        return False
    short = replay is not None and replay < SHORT * measured
    return short or not LOW * measured <= simulated <= HIGH * measured


def save_steps(directory: str, name: str, method: str, limit: str, ran_def: Any, stats: Sequence[Any]) -> str:
    """Writes the graph that ran and its traced steps' StepStats to ``<name>.<method>.<limit>.steps``
    in `directory` (made if missing), whole or not at all, and returns its path: a placement whose
    measured peak the byte rules miss even at the measured times, or the simulated peak misses
    (`_keep_steps`), kept to be examined without running it again (TF's order, which decides such
    bytes, moves from session to session).
    Read with `load_steps`."""
    from baechi_tf._files import atomic_write

    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.{method}.{limit}.steps")
    parts = [ran_def.SerializeToString()] + [step.SerializeToString() for step in stats]
    atomic_write(path, b"".join(len(b).to_bytes(8, "little") + b for b in parts))
    return path


def load_steps(path: str) -> tuple[Any, list[Any]]:
    """(GraphDef that ran, [StepStats of each traced step]) of a `save_steps` file."""
    import tensorflow as tf
    from tensorflow.core.framework.step_stats_pb2 import StepStats

    with open(path, "rb") as f:
        data = f.read()
    parts, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 8], "little")
        parts.append(data[at + 8:at + 8 + size])
        at += 8 + size
    graph_def = tf.compat.v1.GraphDef.FromString(parts[0])
    return graph_def, [StepStats.FromString(b) for b in parts[1:]]


HEADER = (f"{'model':<12} {'method':<7} {'limit':<5} {'chosen':<14} {'device':<12} {'ops':>5} "
          f"{'sim MiB':>8} {'meas MiB':>8} {'sim/meas':>8}  {'persist':>7} {'step':>6}  "
          f"{'ran':>5} {'views':>5} {'copy':>5} {'replay':>6}")
LEGEND = ("persist, step: the measured peak's variables and constants, and its allocation records' "
          "peak (MiB); ran, views, copy, replay: simulated / measured for `VARIANTS` in turn")


def _line(r: Row) -> str:
    mark = "" if LOW <= r.ratio <= HIGH else ("  under" if r.ratio < LOW else "  over")

    def x(field: str, width: int) -> str:
        value = getattr(r, field)
        if value is None:
            return f"{'-':>{width}}"
        return f"{value / r.measured_bytes:>{width}.2f}" if r.measured_bytes else f"{'inf':>{width}}"

    return (f"{r.model:<12} {r.method:<7} {r.limit:<5} {r.chosen[:14]:<14} {r.device:<12} {r.ops:>5} "
            f"{r.simulated_bytes / MiB:>8.2f} {r.measured_bytes / MiB:>8.2f} {r.ratio:>8.2f}  "
            f"{r.measured_persistent_bytes / MiB:>7.2f} {r.measured_step_bytes / MiB:>6.2f}  "
            f"{x('sim_ran_bytes', 5)} {x('sim_alias_bytes', 5)} {x('sim_standin_bytes', 5)} "
            f"{x('replay_bytes', 6)}{mark}")


def summary(rows: Sequence[Row], field: str = "simulated_bytes") -> list[str]:
    """The summary figures of `rows` as lines of text, for the simulated peak of `field`."""
    from baechi_tf.placer.scheduler_state import byte_formatter

    if not rows:
        return ["no placement ran"]
    n = len(rows)
    placements = len({(r.model, r.method, r.limit) for r in rows})
    ratios = [(_ratio(getattr(r, field), r.measured_bytes), r) for r in rows]
    at_least = sum(x >= LOW for x, _ in ratios)
    at_most = sum(x <= HIGH for x, _ in ratios)
    both = sum(LOW <= x <= HIGH for x, _ in ratios)
    under = min(ratios, key=lambda xr: xr[0])
    over = max(ratios, key=lambda xr: xr[0])
    held = [xr for xr in ratios if xr[1].measured_bytes >= MiB]

    def where(xr) -> str:  # in units that show a few bytes as bytes, never two sizes alike
        x, r = xr
        simulated = getattr(r, field)
        shown = byte_formatter(simulated, r.measured_bytes)
        return (f"{x:.3f} ({r.model} {r.method} {r.limit} {r.device}: simulated "
                f"{shown(simulated)}, measured {shown(r.measured_bytes)})")

    return [
        f"{placements} placements, {n} devices; simulated / measured peak: median "
        f"{statistics.median(x for x, _ in ratios):.2f}",
        f"simulated >= measured:            {at_least}/{n} devices ({100 * at_least / n:.0f}%)",
        f"simulated <= 1.25 x measured:     {at_most}/{n} devices ({100 * at_most / n:.0f}%)",
        f"both (the target, [1.0, 1.25]):   {both}/{n} devices ({100 * both / n:.0f}%)",
        f"worst under-prediction: {where(under)}",
        f"worst over-prediction:  {where(over)}",
    ] + ([f"worst over-prediction where at least 1 MiB was measured: {where(max(held, key=lambda xr: xr[0]))}"]
         if held and len(held) < n else [])


VARIANTS = (
    ("sim_ran_bytes", "the same schedules without the memory of ops the step never ran"),
    ("sim_alias_bytes", "and an output that is a view of another buffer (a variable's, an input's) "
     "in this run's trace, beyond those the profile marks, held as part of that buffer"),
    ("sim_standin_bytes", "and a tensor read on another stand-in held by its sender until that "
     "reader is done, not copied, also where the reader writes in place of it (the model's rule "
     "where the cluster's devices share memory gives such an output a buffer of its own too)"),
    ("replay_bytes", "those rules with each op at the start and end it had in the traced step (the "
     "memory model without the simulated timing)"),
)


def plot(rows: Sequence[Row], path: str, title: str = "") -> None:
    """Writes an SVG (or any format matplotlib knows from `path`'s suffix) of `rows`, one point
    per device of a placement, a colour per graph: simulated against measured peak (log axes,
    the target band between measured = simulated and 1.25 x measured shaded), and beside it
    simulated / measured against measured, where points near the band can be told apart.
    Devices that measured no bytes have no ratio and are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.measured_bytes > 0]
    if not rows:
        raise ValueError("no device measured any bytes: nothing to plot")
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text: searchable, smaller
        _draw(plt, rows, path, title)


def _draw(plt, rows: Sequence[Row], path: str, title: str) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
    for model in sorted({r.model for r in rows}):
        own = [r for r in rows if r.model == model]
        measured = [r.measured_bytes / MiB for r in own]
        left.scatter(measured, [r.simulated_bytes / MiB for r in own], label=model, s=14)
        right.scatter(measured, [r.ratio for r in own], label=model, s=14)
    values = [v for r in rows for v in (r.simulated_bytes / MiB, r.measured_bytes / MiB) if v > 0]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    left.fill_between([lo, hi], [LOW * lo, LOW * hi], [HIGH * lo, HIGH * hi], color="green", alpha=0.15,
                      linewidth=0, label=f"target: [{LOW}, {HIGH}] x measured")
    left.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
    left.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured peak (MiB)",
             ylabel="simulated peak (MiB)")
    ratios = [r.ratio for r in rows]
    right.axhspan(LOW, HIGH, color="green", alpha=0.15, linewidth=0)
    right.axhline(LOW, color="grey", linewidth=0.8)
    right.set(xscale="log", xlim=(lo, hi), ylim=(min(0.9, min(ratios) - 0.05), max(1.35, max(ratios) + 0.05)),
              xlabel="measured peak (MiB)", ylabel="simulated / measured")
    both = sum(LOW <= x <= HIGH for x in ratios)
    right.set_title(f"{both} of {len(rows)} devices in the target", fontsize=9)
    left.legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(textwrap.fill(title, 120), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None} if path.endswith(".svg") else None)
    plt.close(fig)


def _replayed(result, step_stats):
    """`result` whose schedule has each op at its start and end in the traced step (relative to
    the step's first node; ops that did not run at 0), committed in the order they started, with
    no transfer (stand-ins pass buffers)."""
    times: dict[str, tuple[float, float]] = {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name not in times:
                times[ns.node_name] = (float(ns.all_start_micros), float(ns.all_start_micros + ns.all_end_rel_micros))
    t0 = min((t for t, _ in times.values()), default=0.0)
    pairs = [times.get(n, (t0, t0)) for n in result.graph.names]
    start = np.array([a - t0 for a, _ in pairs])
    end = np.array([b - t0 for _, b in pairs])
    order = np.lexsort((end, start)).astype(np.int32)
    schedule = dataclasses.replace(result.schedule, start_us=start, end_us=end, order=order, transfers=())
    return dataclasses.replace(result, schedule=schedule)


def reuse_check(result, step_stats) -> tuple[list[tuple[list[int], list[int]]], list[str]]:
    """(per device of `result`, ([runs, reused], [runs, reused]) of the outputs of its ops that
    reuse (`OpGraph.output_alias`) a buffer of another device it shares memory with: first those
    the model counts once as that buffer (`buffers.always_reused_tensors`), then those it counts
    both ways, over the traced steps; the ops of the outputs counted once that a run did not
    reuse the buffer for, as 'op:slot'). A run reused the buffer when the output's traced address
    is the address of the input it names (a view or a write in place; TF records a buffer's base
    address, also for a part of it); a run with no address recorded is not counted."""
    from baechi_tf.placer.buffers import always_reused_tensors, buffer_tables

    graph = result.graph
    device_of = result.placement.device_of.tolist()
    shares = result.cluster.shares_memory()
    _, alias, _ = buffer_tables(graph)
    once = always_reused_tensors(graph, alias)
    src, slot = graph.tensor_src.tolist(), graph.tensor_src_output.tolist()
    out = [([0, 0], [0, 0]) for _ in range(result.cluster.num_devices)]
    missed: list[str] = []
    pairs = []
    for t in np.flatnonzero(alias >= 0).tolist():
        s = int(alias[t])
        d, home = device_of[src[t]], device_of[src[s]]
        if d != home and shares[home][d]:
            pairs.append((t, s, d))
    for step in step_stats:
        traced = _traced_outputs(step)
        for t, s, d in pairs:
            mine = traced.get(graph.names[src[t]], ({}, 0))[0].get(slot[t], 0)
            theirs = traced.get(graph.names[src[s]], ({}, 0))[0].get(slot[s], 0)
            if mine and theirs:
                tally = out[d][0 if once[t] else 1]
                tally[0] += 1
                tally[1] += mine == theirs
                if once[t] and mine != theirs:
                    missed.append(f"{graph.names[src[t]]}:{slot[t]}")
    return out, missed


def _traced_outputs(step_stats) -> dict[str, tuple[dict[int, int], int]]:
    """Node -> ({output slot: buffer address}, bytes its allocation records allocated)."""
    out = {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            ptrs = {o.slot: int(o.tensor_description.allocation_description.ptr) for o in ns.output}
            allocated = sum(r.alloc_bytes for m in ns.memory for r in m.allocation_records if r.alloc_bytes > 0)
            out[ns.node_name] = (ptrs, int(allocated))
    return out


def _variants(result, step_stats, window: Optional[int]) -> list[list[int]]:
    """Per variant of `VARIANTS`, per device of `result.cluster`, the peak of `_variant_blocks`,
    each op up to `window` places out of its schedule's order (`reordered_blocks`, with the
    cluster's `thread_pools`; None: their `order_windows`)."""
    from baechi_tf.placer.memory_timeline import blocks_timeline, reordered_blocks, thread_pools

    graph, schedule, pools = result.graph, result.schedule, thread_pools(result.cluster)
    return [[t.peak_bytes for t in blocks_timeline(reordered_blocks(graph, schedule, b, window, pools),
                                                   result.cluster.num_devices)]
            for b in _variant_blocks(result, step_stats)]


def _variant_blocks(result, step_stats) -> list:
    """Per variant of `VARIANTS`, the blocks of memory of `result.schedule` (`memory_blocks`)
    counted otherwise, by what the traced step shows:

    1. the blocks of ops that did not run in the step are left out (a constant TF replicated
       onto the devices that read it ran as its replicas), but a variable's persistent block:
       its buffer is held whether or not the step runs its op;
    2. an output the model still gives a buffer of its own (the profile did not mark it:
       `OpGraph.output_alias`) whose buffer is one of its op's inputs' (the same address in the trace:
       Identity, Reshape, an element-wise op done in place) is no block of its own: the input's
       block on that device is held until the output's would have been freed; an output whose
       buffer the op did not allocate and no input has (a variable's value, a constant's) is
       left out, the buffer being persistent memory;
    3. a received copy is left out and the sender's block (the buffer it is a view of, for an
       output that reuses one) held until the copy's would have been freed (CPU stand-ins pass
       the buffer; a GPU would copy it), but for a constant's value (`buffers.constant_tensors`):
       a replica held from the start of the step where the trace shows TF made one (it replicates
       small constants onto each CPU device that reads them), else nothing: nothing to do where
       the model already says so (`Device.shared_memory`, on for `standin_cluster`'s devices).
    """
    from baechi_tf.placer.buffers import HELD_VIEW, buffer_tables, constant_tensors
    from baechi_tf.placer.memory_timeline import KEPT, MemoryBlocks, memory_blocks
    from baechi_tf.graph import VARIABLE_OP_TYPES

    graph, schedule = result.graph, result.schedule
    traced = _traced_outputs(step_stats)
    replicated = {n.split("/replicate/")[0] for n in traced if "/replicate/" in n}  # TF's '<op>/replicate/_3'
    never = np.array([n not in traced and n not in replicated for n in graph.names])  # a replica runs for it
    inputs: dict[int, list[tuple[int, int]]] = {}
    for s, d, o in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_src_output.tolist()):
        if o >= 0:
            inputs.setdefault(d, []).append((s, o))
    alias: dict[tuple[int, int], Optional[tuple[int, int]]] = {}  # None: a persistent buffer
    for op, name in enumerate(graph.names):
        if name not in traced:
            continue
        ptrs, allocated = traced[name]
        for slot, ptr in ptrs.items():
            if not ptr:
                continue
            source = next((t for t in inputs.get(op, ()) if traced.get(graph.names[t[0]], ({}, 0))[0].get(t[1]) == ptr), None)
            if source is not None:
                alias[(op, slot)] = source
            elif allocated == 0:
                alias[(op, slot)] = None
    b = memory_blocks(graph, schedule, result.cluster)
    free, free_rank = b.free_us.copy(), b.free_rank.copy()
    alloc, alloc_rank = b.alloc_us.copy(), b.alloc_rank.copy()
    # A variable holds its buffer whether or not the step runs its op (`measured_memory` counts it
    # on the op's device either way): its persistent block stays.
    variable = np.array([t in VARIABLE_OP_TYPES for t in graph.op_types or [""] * graph.num_ops], dtype=bool)
    keep = ~never[b.op] | (variable[b.op] & (np.asarray(b.kind) == "persistent"))
    variants = []
    home = {(int(o), int(s), int(d)): i for i, (k, o, s, d) in enumerate(zip(b.kind, b.op, b.slot, b.device))
            if k in ("output", "received")}
    root: dict[int, int] = {}

    def extend(j: int, i: int) -> None:
        if free[i] > free[j]:
            free[j], free_rank[j] = free[i], free_rank[i]

    def kept() -> MemoryBlocks:
        return MemoryBlocks(b.device[keep], b.nbytes[keep], alloc[keep], free[keep], alloc_rank[keep],
                            free_rank[keep], tuple(k for k, x in zip(b.kind, keep) if x), b.op[keep], b.slot[keep],
                            alternative=None if b.alternative is None else b.alternative[keep])

    variants.append(kept())
    persistent: set[int] = set()  # blocks left out as views of persistent buffers
    for i in np.argsort(b.alloc_us, kind="stable").tolist():
        if not keep[i] or b.kind[i] != "output":
            continue
        key = (int(b.op[i]), int(b.slot[i]))
        if key not in alias:
            continue
        if alias[key] is None:
            keep[i] = False
            persistent.add(i)
            continue
        j = home.get((*alias[key], int(b.device[i])))
        if j is None:
            continue
        j = root.get(j, j)
        if j in persistent:
            keep[i] = False
            persistent.add(i)
        elif keep[j]:
            extend(j, i)
            keep[i] = False
            root[i] = j
    variants.append(kept())
    _, table_alias, _ = buffer_tables(graph)
    constant = constant_tensors(graph, table_alias).tolist()
    tensor_of = {(s, o): t for t, (s, o) in enumerate(zip(graph.tensor_src.tolist(), graph.tensor_src_output.tolist()))
                 if o >= 0}
    for i in range(len(b.kind)):
        if b.kind[i] == "received" and constant[int(tensor_of[(int(b.op[i]), int(b.slot[i]))])]:
            # A constant's value read on another stand-in: a replica, held from the start of the
            # step, where TF replicated it (the constant itself then need not run); else the
            # constant's own buffer, passed.
            keep[i] = graph.names[int(b.op[i])] in replicated
            alloc[i], alloc_rank[i], free[i], free_rank[i] = 0.0, -1, KEPT, -1
            continue
        if keep[i] and b.kind[i] == "received":
            # The sender's buffer: the output's own, or, for an output that reuses a buffer
            # (`buffer_tables`), the buffer it reuses on the sender's device.
            op, slot = int(b.op[i]), int(b.slot[i])
            sender = int(result.placement.device_of[op])
            t = tensor_of[(op, slot)]
            while (j := home.get((op, slot, sender))) is None and table_alias[t] >= 0:
                t = int(table_alias[t])
                op, slot = int(graph.tensor_src[t]), int(graph.tensor_src_output[t])
            if j is None and table_alias[t] == HELD_VIEW:
                keep[i] = False
                continue
            if j is None:
                continue
            j = root.get(j, j)
            if j in persistent:
                keep[i] = False
            elif keep[j]:
                extend(j, i)
                keep[i] = False
    variants.append(kept())
    return variants


def _explain(result, ran_def, stats, measured, out) -> None:
    """Per device: the simulated peak by kind of block, the measured one by kind of node, and
    the bytes the simulator gives ops that never ran in the step."""
    from baechi_tf.placer.memory_timeline import memory_blocks, memory_timeline

    graph, schedule = result.graph, result.schedule
    ran = {ns.node_name for step in stats for dev in step.dev_stats for ns in dev.node_stats}
    never = np.array([n not in ran for n in graph.names])
    blocks = memory_blocks(graph, schedule, result.cluster)
    timelines = memory_timeline(graph, result.cluster, schedule)
    types = {n.name: n.op for n in ran_def.node}
    for d, dev in enumerate(result.cluster.devices):
        m = measured.get(_local(dev.name))
        tl = timelines[d]
        if m is None or not tl.bytes.size:
            continue
        t_peak = float(tl.times_us[int(np.argmax(tl.bytes))])
        live = (blocks.device == d) & (blocks.alloc_us <= t_peak) & (blocks.free_us > t_peak)
        if blocks.alternative is not None:
            live &= ~blocks.alternative  # not in the simulated order (`memory_timeline`)
        by_kind: dict[str, int] = {}
        for i in np.flatnonzero(live).tolist():
            key = blocks.kind[i] + ("(never run)" if never[blocks.op[i]] else "")
            by_kind[key] = by_kind.get(key, 0) + int(blocks.nbytes[i])
        meas_kind: dict[str, int] = {"variables": m.variable_bytes,
                                     "other persistent": m.persistent_bytes - m.variable_bytes}
        for node, b in m.live_at_peak.items():
            meas_kind[types.get(node, "(runtime)")] = meas_kind.get(types.get(node, "(runtime)"), 0) + b
        top = sorted(meas_kind.items(), key=lambda kv: -kv[1])[:6]
        sim = ", ".join(f"{k} {v / MiB:.2f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))
        print(f"    {_local(dev.name)}: simulated at its peak (MiB): {sim}", file=out)
        print(f"    {' ' * len(_local(dev.name))}  measured at its peak (MiB): "
              + ", ".join(f"{k} {v / MiB:.2f}" for k, v in top), file=out)


def under_causes(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """The devices simulated below their measured peak, by what the variants (`VARIANTS`) say
    the model misses there: 'handover' when the stand-in rule alone covers the peak (a tensor
    another stand-in read stayed its sender's buffer: CPU stand-ins pass buffers, a GPU copies),
    'order' when, failing that, the rules at each op's measured start and end do (the simulated
    order and overlap of ops, not the bytes), else 'bytes' (what the rules count)."""
    out: dict[str, list[Row]] = {"handover": [], "order": [], "bytes": []}
    for r in rows:
        if r.ratio >= LOW or r.sim_standin_bytes is None:
            continue
        key = ("handover" if r.sim_standin_bytes >= r.measured_bytes else
               "order" if r.replay_bytes >= r.measured_bytes else "bytes")
        out[key].append(r)
    return out


def repeat_spread(rows: Sequence[Row]) -> list[tuple[float, list[Row]]]:
    """For each device of a placement that ran more than once (methods or limits that gave the
    same placement, each run in a session of its own): (largest / smallest measured peak, its
    rows), the widest first. TF's order of a step's ops is not fixed, so neither is a device's
    measured peak; no one figure the simulator gives can fall in [1, 1.25] of runs further
    apart than 1.25."""
    runs: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        if r.placement is not None and r.measured_bytes > 0:
            runs.setdefault((r.model, r.placement, r.device), []).append(r)
    out = [(max(r.measured_bytes for r in found) / min(r.measured_bytes for r in found), found)
           for found in runs.values() if len(found) > 1]
    return sorted(out, key=lambda item: -item[0])


def step_spread(rows: Sequence[Row]) -> list[tuple[float, Row]]:
    """(highest / lowest traced step's peak, row) for each row that has the steps' peaks
    (`Row.measured_peaks`), the widest first; inf where some step ran nothing on a device that
    another step used, 1 where no step held anything. One session's steps run the same graph, yet
    TF's order of their ops, so each device's peak, moves between them; where the steps lie
    further apart than 1.25, no one simulated figure is within [1, 1.25] of each."""
    out = []
    for r in rows:
        if r.measured_peaks:
            low, high = min(r.measured_peaks), max(r.measured_peaks)
            out.append((high / low if low else (1.0 if high == 0 else float("inf")), r))
    return sorted(out, key=lambda item: -item[0])


def in_target_of_some_step(rows: Sequence[Row], field: str = "simulated_bytes") -> tuple[int, int]:
    """(rows whose simulated peak of `field` is in [1, 1.25] of at least one traced step's peak,
    rows that have the steps' peaks): the devices where the simulated order's peak is one that TF
    reached in some step, not only in its highest."""
    have = [r for r in rows if r.measured_peaks]
    hit = sum(any(LOW <= _ratio(getattr(r, field), p) <= HIGH for p in r.measured_peaks) for r in have)
    return hit, len(have)


def reuse_summary(rows: Sequence[Row]) -> str:
    """One line: how often TF reused another stand-in's buffer for the outputs the model counts
    once, and for those it counts both ways (`Row.reused_once`, `Row.reused_both_ways`); '' when
    no row has the figures."""
    once, both = [0, 0], [0, 0]
    for r in rows:
        for total, part in ((once, r.reused_once), (both, r.reused_both_ways)):
            if part is not None:
                total[0] += part[0]
                total[1] += part[1]
    if not (once[0] or both[0]):
        return ""
    return (f"outputs reusing another stand-in's buffer, traced runs: counted once {once[0]}, TF "
            f"reused the buffer in {once[1]}; counted both ways {both[0]}, reused in {both[1]}")


def _print_summary(rows: Sequence[Row], grappler: bool) -> None:
    print()
    print("\n".join(summary(rows)))
    from baechi_tf.placer.scheduler_state import format_bytes

    causes = under_causes(rows)
    if any(causes.values()):
        print("under-predicted devices, by what covers them: "
              + ", ".join(f"{k} {len(v)}" for k, v in causes.items()))
        for key, found in causes.items():
            for r in sorted(found, key=lambda r: r.ratio):
                print(f"  {key:<8} {r.model} {r.method} {r.limit} {r.device}: {r.ratio:.3f}, "
                      f"{format_bytes(r.measured_bytes - r.simulated_bytes)} short")
    spread = repeat_spread(rows)
    if spread:
        print(f"devices of placements run more than once: {len(spread)}; their measured peaks apart by "
              f"more than 1%: {sum(x > 1.01 for x, _ in spread)}, more than 5%: "
              f"{sum(x > 1.05 for x, _ in spread)}, most {spread[0][0]:.3f}")
        for x, found in spread[:5]:
            print(f"  {x:.3f} {found[0].model} {found[0].device}: " + ", ".join(
                f"{r.method} {r.limit} {format_bytes(r.measured_bytes)}" for r in found))
    steps = step_spread(rows)
    if steps:
        x, r = steps[0]
        print(f"devices whose traced steps' peaks lie apart by more than 1%: {sum(x > 1.01 for x, _ in steps)}, "
              f"more than 5%: {sum(x > 1.05 for x, _ in steps)}, more than 25% (no one figure within [1.0, "
              f"1.25] of each step): {sum(x > HIGH for x, _ in steps)}, of {len(steps)}; widest {x:.3f} "
              f"({r.model} {r.method} {r.limit} {r.device}: "
              + ", ".join(format_bytes(p) for p in r.measured_peaks) + ")")
        hit, have = in_target_of_some_step(rows)
        print(f"simulated peak in [1.0, 1.25] of at least one traced step's peak (the target asks it of "
              f"the highest): {hit}/{have} devices")
    reuse = reuse_summary(rows)
    if reuse:
        print(reuse)
    if all(r.sim_schedule_bytes is not None for r in rows):
        print("\nthe simulated order alone (each op at its simulated place; the peak above is TF's executor "
              "emulated on a shared pool, else each op moved up to its device's window of places, "
              "`order_windows`):")
        print("\n".join("  " + line for line in summary(rows, "sim_schedule_bytes")[1:]))
    if all(r.sim_unheld_bytes is not None for r in rows):
        print("\nthe same placements simulated with no op held back for memory (TF runs an op as soon as "
              "its inputs are there):")
        print("\n".join("  " + line for line in summary(rows, "sim_unheld_bytes")[1:]))
    for field, what in VARIANTS if not grappler else ():
        print(f"\n{what}:")
        print("\n".join("  " + line for line in summary(rows, field)[1:]))


def add_arguments(parser: argparse.ArgumentParser, devices: str, sessions: int) -> None:
    """The options this bench shares with bench/fidelity_memory_tasks.py: which graphs and methods,
    the tight limit (over `devices`, as the help says), the steps and sessions (`sessions` by
    default), and where the rows go."""
    models = list(fidelity_graphs.FIDELITY_GRAPHS)
    parser.add_argument("--models", default=",".join(models), help="comma-separated, of %(default)s")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="placed at 8 GiB per device (default: %(default)s; 'expert' where the "
                        "model has a layout)")
    parser.add_argument("--tight_methods", default=",".join(TIGHT_METHODS),
                        help="placed again under the tight limit (default: %(default)s; '' for none)")
    parser.add_argument("--tight", type=float, default=1.5,
                        help=f"the tight limit per device, times the one-device simulated peak over "
                        f"{devices} (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"only {','.join(QUICK_MODELS)} with {','.join(QUICK_METHODS)}, tight "
                        "with m_etf (overrides --models, --methods, --tight_methods)")
    parser.add_argument("--warmup_steps", type=flags.at_least(0), default=2,
                        help="untraced steps per placement (default: %(default)s)")
    parser.add_argument("--traced_steps", type=flags.at_least(1), default=2,
                        help="traced steps per placement; a device's measured peak is their largest "
                        "(default: %(default)s)")
    parser.add_argument("--sessions", type=flags.at_least(1), default=sessions,
                        help="sessions each placement runs in, each with its warm-up and traced "
                        "steps; a device's measured peak is the largest over all their traced steps "
                        "(default: %(default)s)")
    parser.add_argument("--json", type=flags.output_file, help="write every row to this file")
    parser.add_argument("--summary_of", metavar="FILE",
                        help="print the summary figures of the rows a --json run wrote, and run nothing")
    parser.add_argument("--plot", metavar="FILE.svg", type=flags.output_file,
                        help="also draw simulated against measured peak, one point per device of a "
                        "placement, into FILE (with --summary_of: of that file's rows)")
    parser.add_argument("--title", default="", help="the plot's title")


def chosen_runs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """(graphs, methods, tight methods) that `add_arguments`' options ask for; argparse's one-line
    error for a name it does not know or a tight limit not above 0."""
    if not args.tight > 0:
        parser.error(f"--tight={args.tight}: give a number above 0")
    if args.quick:
        return list(QUICK_MODELS), list(QUICK_METHODS), ["m_etf"]
    names = flags.chosen(parser, args.models, "--models", list(fidelity_graphs.FIDELITY_GRAPHS), "model")
    methods = flags.methods(parser, args.methods)
    tight_methods = flags.methods(parser, args.tight_methods, "--tight_methods") if args.tight_methods else []
    return names, methods, tight_methods


def read_rows(path: str) -> list[Row]:
    """The rows a ``--json`` run wrote to `path`."""
    with open(path) as f:
        return [Row(**{k: v for k, v in r.items() if k != "ratio"}) for r in json.load(f)]


def write_rows(rows: Sequence[Row], path: str) -> None:
    """Every row to `path` as JSON, with its ratio, for ``--summary_of`` and bench/fidelity.py."""
    with open(path, "w") as f:
        json.dump([dataclasses.asdict(r) | {"ratio": r.ratio} for r in rows], f, indent=1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, "the devices", sessions=1)
    parser.add_argument("--explain", action="store_true", help="break each device's two peaks down")
    parser.add_argument("--grappler", action="store_true",
                        help="run the placements with Grappler on (profiled without, as BaechiSession "
                        "does); no breakdown then")
    parser.add_argument("--shared_memory", action="store_true",
                        help="model the stand-ins as devices of one memory (a reader holds no copy, "
                        "`Device.shared_memory`) instead of GPUs that copy")
    parser.add_argument("--inter_op_threads", type=int, default=0,
                        help="threads of the placed sessions' inter-op pool (one of each session's "
                        "own), shared by the stand-ins; 1 runs one op at a time, as a GPU's one stream "
                        "does (default: %(default)s, TF's own process-wide pool: one per core)")
    parser.add_argument("--save", metavar="DIR",
                        help="keep each graph, its profile, its placements and their measured peaks "
                        "in DIR, for bench/fidelity_memory_resim.py to simulate again under another "
                        "model; and the traced steps of each placement where some device's measured "
                        "peak is missed by the byte rules at the measured times, or whose simulated "
                        "peak lies outside [1.0, 1.25] times the measured one (NAME.METHOD.LIMIT.steps, "
                        "load_steps)")
    args = parser.parse_args(argv)
    names, methods, tight_methods = chosen_runs(parser, args)
    if args.inter_op_threads < 0:
        parser.error(f"--inter_op_threads={args.inter_op_threads}: give 0 (TF's default) or more")

    if args.summary_of:
        rows = read_rows(args.summary_of)
        _print_summary(rows, grappler=rows[0].sim_ran_bytes is None if rows else False)
        _plot_if_asked(rows, args)
        return 0
    import_tensorflow_quietly()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    logging.getLogger("baechi_tf").setLevel(logging.ERROR)
    print(f"{NUM_DEVICES} CPU stand-ins ({'of shared memory, ' if args.shared_memory else ''}8 GiB; tight: {args.tight} x one-device simulated peak / "
          f"{NUM_DEVICES}); measured = variables + constants + peak of the allocation records; "
          f"the largest of {args.traced_steps} traced steps"
          f"{f' in each of {args.sessions} sessions' if args.sessions > 1 else ''}")
    print(machine_line())
    print(LEGEND)
    print(HEADER)
    print("-" * len(HEADER))
    rows: list[Row] = []
    for name in names:
        rows += measure_graph(name, methods, tight_methods, tight=args.tight, warmup_steps=args.warmup_steps,
                              traced_steps=args.traced_steps, explain=args.explain and not args.grappler,
                              grappler=args.grappler, shared_memory=args.shared_memory,
                              inter_op_threads=args.inter_op_threads, sessions=args.sessions,
                              save=args.save)
    _print_summary(rows, args.grappler)
    if args.json:
        write_rows(rows, args.json)
    _plot_if_asked(rows, args)
    return 0


def _plot_if_asked(rows: Sequence[Row], args: argparse.Namespace) -> None:
    if args.plot:
        plot(rows, args.plot, args.title)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
