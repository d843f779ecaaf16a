"""What leaving out the control edges that other paths imply does to placement: side by side.

For the training steps that bench/keras_graphs.py writes to bench/out/keras/ (those present of
DenseNet121, ResNet50, MobileNetV2, NASNetMobile, GNMT v2), it imports the graph twice on 4 CPU
stand-ins of 8 GiB (`import_graph_def`): as baechi_tf does, without the implied control edges
(`baechi_tf.control_edges`), and with every control edge kept (``keep_implied_control_edges``),
as before. It prints the graph's ops, edges and control edges, how many were implied and the
seconds their search took; then, per method, the seconds of the placement (`placer.pipeline.place`:
group, place, check, one-device baseline) of each graph, their ratio (kept / left out: above 1
is faster without them), and each placement's simulated step time in ms.

    .venv/bin/python bench/keras_graphs.py --models nasnetmobile,resnet50   # once
    .venv/bin/python bench/control_edges.py [--models nasnetmobile] [--methods m_etf,m_sct,auto]

One run per cell, on a shared machine: read ratios far from 1, not small ones. m-SCT on
NASNetMobile with every control edge kept takes minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from baechi_tf._startup import import_tensorflow_quietly  # noqa: E402
import flags  # noqa: E402

KERAS_DIR = os.path.join(ROOT, "bench", "out", "keras")
MODELS = ("densenet121", "resnet50", "mobilenetv2", "nasnetmobile", "gnmt_v2")
METHODS = ("m_topo", "m_etf", "m_sct", "auto")
NUM_DEVICES = 4


def imported(keras_dir: str, model: str):
    """(every control edge kept, the implied ones left out, cluster, seconds of each import) of
    one saved graph, its files read once."""
    from baechi_tf.cost_model.profile import load_profile
    from baechi_tf.rewriter.cli_place import read_graph_bytes, read_graph_file
    from baechi_tf.rewriter.devices import LOCAL_TASK, standin_cluster
    from baechi_tf.rewriter.importer import import_graph_def

    path = os.path.join(keras_dir, f"{model}.pb")
    graph_def = read_graph_file(path, read_graph_bytes(path))[0]
    profile = load_profile(os.path.join(keras_dir, f"{model}.profile"))
    cluster = standin_cluster(NUM_DEVICES, prefix=LOCAL_TASK).cluster
    graphs, seconds = [], []
    for keep in (True, False):
        t0 = time.perf_counter()
        graphs.append(import_graph_def(graph_def, profile, cluster, keep_implied_control_edges=keep).graph)
        seconds.append(time.perf_counter() - t0)
    return graphs[0], graphs[1], cluster, seconds


def place_seconds(graph, cluster, method: str) -> tuple[float, float]:
    """(seconds, simulated step time in ms) of the whole pipeline with `method`."""
    from baechi_tf.placer.pipeline import PlacementOptions, place

    t0 = time.perf_counter()
    result = place(graph, cluster, PlacementOptions(placement_method=method))
    return time.perf_counter() - t0, result.makespan_us / 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    flags.add_saved_model_flags(parser, MODELS, KERAS_DIR)
    parser.add_argument("--methods", default=",".join(METHODS), help="placers (default: %(default)s)")
    args = parser.parse_args(argv)
    models = flags.chosen(parser, args.models, "--models", MODELS, "model")
    methods = flags.chosen(parser, args.methods, "--methods", METHODS, "method")
    models = flags.saved_models(models, args.keras_dir)

    import_tensorflow_quietly()
    from baechi_tf.control_edges import implied_control_edges

    print(f"{'model':<13} {'ops':>6} {'edges':>8} {'control':>8} {'implied':>8} {'search s':>8}  "
          f"import s (kept / left out)")
    graphs = {}
    for model in models:
        kept, reduced, cluster, (kept_s, reduced_s) = imported(args.keras_dir, model)
        t0 = time.perf_counter()
        implied = int(implied_control_edges(kept).sum())
        search_s = time.perf_counter() - t0
        assert kept.num_edges - reduced.num_edges == implied
        print(f"{model:<13} {kept.num_ops:>6} {kept.num_edges:>8} {int(kept.is_control.sum()):>8} "
              f"{implied:>8} {search_s:>8.2f}  {kept_s:.1f} / {reduced_s:.1f}", flush=True)
        graphs[model] = (kept, reduced, cluster)
    print()
    print(f"{'model':<13} {'method':<7} {'kept s':>8} {'left out s':>10} {'ratio':>6}  "
          f"simulated ms (kept / left out)")
    for model, (kept, reduced, cluster) in graphs.items():
        for method in methods:
            a_s, a_ms = place_seconds(kept, cluster, method)
            b_s, b_ms = place_seconds(reduced, cluster, method)
            print(f"{model:<13} {method:<7} {a_s:>8.2f} {b_s:>10.2f} {a_s / b_s:>6.2f}  "
                  f"{a_ms:.1f} / {b_ms:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
