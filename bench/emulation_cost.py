"""What the peak of TF's executor emulated on a shared pool of threads costs, beside the window's
peak on the simulated order: per graph, the median seconds of `memory_timeline.reordered_peaks`
(the window; what a device with a pool of its own expects) and of `executor_order.expected_peaks`
(on CPU stand-ins of shared memory: `EMULATED_STEPS` + 1 emulated steps, each a pass over the
schedule's memory), and their ratio, on 4 stand-ins of shared memory that the graph's m-ETF
placement fills (no memory limit in effect).

The graphs are those bench/keras_graphs.py writes to bench/out/keras/ (GraphDef and profile);
a graph whose files are missing is named and skipped.

    .venv/bin/python bench/keras_graphs.py            # once: writes bench/out/keras/
    .venv/bin/python bench/emulation_cost.py [--graphs densenet121,gnmt_v2] [--repeats 5]

Nothing here is a test: the figures depend on the machine (and on what else runs on it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)

import flags  # noqa: E402
from placement_speed import median_seconds as seconds  # noqa: E402

KERAS_DIR = os.path.join(os.path.dirname(BENCH), "bench", "out", "keras")
GRAPHS = ("densenet121", "resnet50", "gnmt_v2")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default=",".join(GRAPHS),
                        help=f"comma-separated names of bench/keras_graphs.py's graphs (default: {','.join(GRAPHS)})")
    parser.add_argument("--repeats", type=flags.at_least(1), default=5, help="timed calls per figure (default 5)")
    parser.add_argument("--keras_dir", default=KERAS_DIR,
                        help="folder of the files bench/keras_graphs.py writes (default: bench/out/keras)")
    args = parser.parse_args(argv)
    from keras_graphs import MODELS

    names = flags.chosen(parser, args.graphs, "--graphs", MODELS, "graph")

    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import logging

    import tensorflow as tf

    logging.getLogger("baechi_tf").setLevel(logging.ERROR)
    from baechi_tf.cost_model.profile import load_profile
    from baechi_tf.placer.executor_order import EMULATED_STEPS, EMULATED_WINDOW, JITTER, expected_peaks
    from baechi_tf.placer.memory_timeline import reordered_peaks
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.devices import LOCAL_TASK, standin_cluster
    from baechi_tf.rewriter.graph_pass import place_graph_def

    print(f"{EMULATED_STEPS} + 1 emulated steps, window {EMULATED_WINDOW}, jitter {JITTER}; median of {args.repeats}")
    print(f"{'graph':<12} {'ops':>7} {'window (s)':>11} {'emulated (s)':>13} {'ratio':>6}")
    for name in names:
        base = os.path.join(args.keras_dir, name)
        if not (os.path.exists(base + ".pb") and os.path.exists(base + ".profile")):
            print(f"{name:<12} not built: run bench/keras_graphs.py")
            continue
        with open(base + ".pb", "rb") as f:
            graph_def = tf.compat.v1.GraphDef.FromString(f.read())
        setup = standin_cluster(4, 64 << 30, prefix=LOCAL_TASK, shared_memory=True)
        _, report = place_graph_def(graph_def, load_profile(base + ".profile"), setup.cluster,
                                    PlacementOptions(placement_method="m_etf"), host_device=setup.host,
                                    device_aliases=setup.aliases)
        graph, cluster, schedule = report.result.graph, report.result.cluster, report.result.schedule
        expected_peaks(graph, cluster, schedule)  # once untimed: the graph's cached tables
        window = seconds(lambda: reordered_peaks(graph, cluster, schedule), args.repeats)
        emulated = seconds(lambda: expected_peaks(graph, cluster, schedule), args.repeats)
        print(f"{name:<12} {graph.num_ops:>7} {window:>11.3f} {emulated:>13.3f} {emulated / window:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
