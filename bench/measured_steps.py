"""Measured step times of placed graphs, side by side with one device.

The simulator says how much faster a placement should run; this bench runs it. For each model
(the small training graphs of bench/make_profiles.py: GNMT v2, Inception-v3, Transformer) it
profiles the graph under its expert layout, places it with each method (`single`, everything on
one device, is the baseline), opens one session per placement on the same devices, warms each up,
then times `--rounds` rounds of `--steps` steps each, the placements taken in a new seeded order
every round, so that a slow spell of this shared machine falls on all of them alike. It prints,
per model and method, the median measured step, its ratio to `single`'s, and the simulated step
and ratio, so that the two can be compared.

The devices are the virtual CPU devices that stand in for GPUs when the machine has none
(`ConfigProto(device_count={"CPU": 5})`: the host and four stand-ins). They share the machine's
cores and memory: a placement cannot run faster here for running on several of them, and a copy
between them is a memory copy, so the measured ratios show the cost of the placement's copies and
TF's cross-device machinery, not the gain of several GPUs.

    .venv/bin/python bench/measured_steps.py [--models gnmt_v2,transformer] [--methods single,auto]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from baechi_tf._startup import import_tensorflow_quietly  # noqa: E402

import_tensorflow_quietly()
import tensorflow as tf  # noqa: E402

from baechi_tf.cost_model.profiler import profile_fetch  # noqa: E402
from baechi_tf.placer.pipeline import PlacementOptions  # noqa: E402
from baechi_tf.rewriter.apply import apply_placement  # noqa: E402
from baechi_tf.rewriter.devices import session_config, standin_cluster  # noqa: E402
from baechi_tf.rewriter.graph_pass import place_graph_def  # noqa: E402
from make_profiles import MODELS, NUM_DEVICES, model_names  # noqa: E402
from train import TrainConfig, build_graph, import_placed  # noqa: E402
import flags  # noqa: E402

METHODS = ("single", "expert", "m_etf", "auto")


def measure(name: str, methods: list[str], rounds: int, steps: int, seed: int) -> list[dict]:
    """One row per method: simulated and measured step of model `name`."""
    hparams, optimizer = MODELS[name]
    setup = standin_cluster(NUM_DEVICES, prefix="/job:localhost/replica:0/task:0")
    config = session_config(setup, grappler=False)  # the graph as written, as it was profiled
    built = build_graph(TrainConfig(name, hparams, optimizer=optimizer, colocate_grads_with_ops=True))
    expert = built.spec.expert_placement(setup.cluster.names, built.graph_def)
    run = import_placed(built, apply_placement(built.graph_def, expert))
    with tf.compat.v1.Session(graph=run.graph, config=config) as sess:
        sess.run(run.init)
        profile = profile_fetch(sess, run.target, run.feeds, warmup_steps=2, traced_steps=5,
                                graph_def=built.graph_def)

    rows, sessions = {}, {}
    try:
        for method in methods:
            options = PlacementOptions(placement_method=method,
                                       expert=expert if method in ("expert", "auto") else None)
            t0 = time.perf_counter()
            placed_def, report = place_graph_def(
                built.graph_def, profile, setup.cluster, options,
                host_device=setup.host, device_aliases=setup.aliases)
            placed = import_placed(built, placed_def)
            sess = tf.compat.v1.Session(graph=placed.graph, config=config)
            sessions[method] = (sess, placed)
            sess.run(placed.init)
            for _ in range(3):  # warm-up: the first steps build kernels and allocate
                sess.run(placed.target, feed_dict=placed.feeds)
            rows[method] = {
                "method": method,
                "chosen": report.result.placement.method,
                "devices": len(report.devices_used),
                "place_s": time.perf_counter() - t0,
                "sim_ms": report.makespan_us / 1e3,
                "times": [],
            }
            devices = rows[method]["devices"]
            print(f"  {name} {method}: placed on {devices} device{'s' * (devices != 1)}",
                  file=sys.stderr, flush=True)
        order = random.Random(seed)
        for r in range(rounds):
            turn = list(methods)
            order.shuffle(turn)
            for method in turn:
                sess, placed = sessions[method]
                for _ in range(steps):
                    t0 = time.perf_counter()
                    sess.run(placed.target, feed_dict=placed.feeds)
                    rows[method]["times"].append(time.perf_counter() - t0)
            print(f"  {name}: round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    finally:
        for sess, _ in sessions.values():
            sess.close()
    return [rows[m] for m in methods]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated; 'single' is always run, as the baseline "
                        "(default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10,
                        help="steps of each placement per round (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="of the order within rounds")
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    names = model_names(parser, args.models)
    methods = ["single"] + [m for m in flags.methods(parser, args.methods) if m != "single"]
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")

    header = (f"{'model':<13} {'method':<7} {'chosen':<11} {'devs':>4} {'place s':>7} "
              f"{'sim ms':>8} {'sim x':>6} {'measured ms':>11} {'meas x':>6}")
    print(f"{NUM_DEVICES} virtual CPU devices sharing {os.cpu_count()} cores; "
          f"{args.rounds} rounds of {args.steps} steps per placement; median step; "
          "x = single's step over the method's (above 1: faster than one device)")
    print(header)
    print("-" * len(header))
    for name in names:
        rows = measure(name, methods, args.rounds, args.steps, args.seed)
        base_sim = rows[0]["sim_ms"]
        base_meas = statistics.median(rows[0]["times"]) * 1e3
        for row in rows:
            meas = statistics.median(row["times"]) * 1e3
            print(f"{name:<13} {row['method']:<7} {row['chosen']:<11} {row['devices']:>4} "
                  f"{row['place_s']:>7.1f} {row['sim_ms']:>8.2f} {base_sim / row['sim_ms']:>6.2f} "
                  f"{meas:>11.2f} {base_meas / meas:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
