"""What other work on the machine does to a profile, and to the placements made of it.

For each graph (bench/fidelity_graphs.py), profiles its training step three times in this process
(`profile_fetch`, Grappler off as bench/fidelity_memory.py profiles): on the machine as it is
("idle"), with as many busy processes of another program as the machine has CPUs ("busy"), and
as it is again ("idle again": how far two idle profiles lie apart, the yardstick). Prints, per
profile, the load its `CostProfile.machine_load` recorded and the traced time per step; per
profile against the first, the ratio of each op's time (ops of at least `MIN_OP_US` in the
first), median and 10th / 90th percentiles; then, per method, the simulated step of the placement
made from each profile, all judged by the first profile's costs on 4 GPUs of 8 GiB with the
default link, so that a placement made from a distorted profile shows as a slower step.

    .venv/bin/python bench/profile_under_load.py [--graphs rnn,transformer] [--methods ...] [--spinners N]

Some 15 s per graph (ResNet50 a minute); run it with the machine otherwise idle, or the "idle"
profiles are not. A profile of a small graph spans a few tenths of a second, so its load is a
coarse figure (`machine_load.MIN_SPAN_S`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fidelity_graphs  # noqa: E402  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
import flags  # noqa: E402

MIN_OP_US = 20.0
TRACED_STEPS = 5
METHODS = ("single", "m_topo", "m_etf", "m_sct", "auto")


def _spin(count: int, marker: str) -> None:
    """`count` busy processes of another program: a shell that exits leaves them to init, so that
    the profiling process does not count them as its own (`machine_load`)."""
    spin = f"import time; t = time.time()\nwhile time.time() - t < 600: pass  # {marker}"
    for _ in range(count):
        subprocess.run(["sh", "-c", f'{sys.executable} -c "{spin}" >/dev/null 2>&1 &'], check=True)
    time.sleep(0.5)


def _profile(case, spinners: int):
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profile_fetch, profiling_config

    config = profiling_config()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    run = fidelity_graphs.runnable(case)
    marker = f"baechi_bench_load_{uuid.uuid4().hex}"
    try:
        if spinners:
            _spin(spinners, marker)
        with tf.compat.v1.Session(graph=run.graph, config=config) as sess:
            sess.run(run.init)
            return profile_fetch(sess, run.target, run.feeds, warmup_steps=2, traced_steps=TRACED_STEPS,
                                 graph_def=case.graph_def)
    finally:
        if spinners:
            subprocess.run(["pkill", "-f", marker])


def _ratios(base, other) -> str:
    import numpy as np

    ratios = [other.ops[n].compute_us / c.compute_us for n, c in base.ops.items()
              if c.compute_us >= MIN_OP_US and n in other.ops]
    if not ratios:
        return f"no op of at least {MIN_OP_US:.0f} us"
    p10, p50, p90 = np.percentile(ratios, [10, 50, 90])
    return f"op time / idle's, {len(ratios)} ops of >= {MIN_OP_US:.0f} us: median {p50:.2f} (p10 {p10:.2f}, p90 {p90:.2f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="rnn,transformer",
                        help=f"comma-separated, of {', '.join(fidelity_graphs.FIDELITY_GRAPHS)} (default: %(default)s)")
    parser.add_argument("--methods", default=",".join(METHODS), help="placers, comma-separated (default: %(default)s)")
    parser.add_argument("--spinners", type=flags.at_least(1), default=None,
                        help="busy processes while the busy profile is taken (default: the machine's CPUs)")
    args = parser.parse_args(argv)
    graphs = flags.chosen(parser, args.graphs, "--graphs", list(fidelity_graphs.FIDELITY_GRAPHS), "graph")
    methods = flags.methods(parser, args.methods)
    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import logging

    logging.getLogger("baechi_tf").setLevel(logging.ERROR)
    from baechi_tf.cluster import Cluster
    from baechi_tf.cost_model.machine_load import cpu_counters
    from baechi_tf.placer.pipeline import PlacementOptions, place
    from baechi_tf.placer.schedule import Placement
    from baechi_tf.placer.simulator import simulate
    from baechi_tf.rewriter.importer import import_graph_def

    if not os.path.exists("/proc/stat"):
        parser.error("the machine's load is read from Linux's /proc/stat, which this machine lacks")
    spinners = args.spinners if args.spinners is not None else cpu_counters(open("/proc/stat").read())[2]
    cluster = Cluster.homogeneous(4, 8 << 30)
    print(f"{spinners} busy processes for the busy profile; placements on 4 GPUs of 8 GiB, default link; "
          f"each judged by the first idle profile's costs")
    for name in graphs:
        case = fidelity_graphs.build(name)
        profiles = [("idle", _profile(case, 0)), ("busy", _profile(case, spinners)),
                    ("idle again", _profile(case, 0))]
        print(f"\n{name}: {len(case.graph_def.node)} ops")
        base = profiles[0][1]
        for label, p in profiles:
            load = p.machine_load
            print(f"  {label:10s} {load.describe() if load else 'load not measured'}; traced "
                  f"{p.traced_compute_us / 1e3:.2f} ms per step"
                  + ("" if p is base else f"; {_ratios(base, p)}"))
        graphs_of = {label: import_graph_def(case.graph_def, p, cluster).graph for label, p in profiles}
        judge = graphs_of["idle"]
        print(f"  {'method':8s} " + " ".join(f"{label + ' (ms)':>16s}" for label, _ in profiles))
        for method in methods:
            cells = []
            for label, _ in profiles:
                graph = graphs_of[label]
                assert graph.names == judge.names, "profiles of one graph give one op order"
                try:
                    result = place(graph, cluster, PlacementOptions(placement_method=method))
                    step = simulate(judge, cluster, Placement(result.placement.device_of, method)).makespan_us
                    chosen = f" {result.placement.method}" if method == "auto" else ""
                    cells.append(f"{step / 1e3:.2f}{chosen}")
                except Exception as e:  # a method that cannot place this graph: say so, go on
                    cells.append(type(e).__name__)
            print(f"  {method:8s} " + " ".join(f"{c:>16s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
