"""Which LP back end m-SCT should use: seconds of m-SCT's LP under each ``--lp_solver``.

For the training steps that bench/keras_graphs.py writes to bench/out/keras/ (those present:
DenseNet121, ResNet50, MobileNetV2, GNMT v2) it places the graph with ``m_sct`` on 4 CPU
stand-ins of 8 GiB, as ``baechi place`` does (`place_graph_def`: import, group, place, check),
once per back end, and prints the placement's seconds, the back ends that solved its LPs and the
simulated makespan. For bench/layered.py's seeded graphs (no op cuts their LP: the hard case for
simplex) it solves m-SCT's LP alone (`solve_sct_relaxation`) on 4 devices. Back ends:

* ``auto``: what m-SCT uses without MOSEK (`baechi_tf.sct.solvers.back_ends`): cvxopt first for
  an LP of more than 5000 arcs with sparse normal equations, else HiGHS;
* ``highs``: HiGHS alone: dual simplex, then its interior point when simplex does not finish an
  LP of more than 5000 arcs within its pivot budget;
* ``cvxopt``: cvxopt's interior point alone.

    .venv/bin/python bench/keras_graphs.py --models mobilenetv2,resnet50   # once
    .venv/bin/python bench/lp_backends.py [--solvers auto,highs,cvxopt] [--layered 5000,10000]

cvxopt took minutes on MobileNetV2's LP here and grew past 17 GB on DenseNet121's: ``--solvers
auto,highs`` leaves it out, and ``--models mobilenetv2,resnet50`` keeps to the graphs it finishes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from baechi_tf._startup import import_tensorflow_quietly  # noqa: E402
import flags  # noqa: E402

KERAS_DIR = os.path.join(ROOT, "bench", "out", "keras")
MODELS = ("densenet121", "resnet50", "mobilenetv2", "gnmt_v2")
SOLVERS = ("auto", "highs", "cvxopt")
NUM_DEVICES = 4


def place_model(keras_dir: str, model: str, solver: str) -> tuple[float, str, float]:
    """(seconds, back ends that solved, simulated makespan in ms) of m-SCT on one saved graph."""
    from baechi_tf.cost_model.profile import load_profile
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.cli_place import read_graph_bytes, read_graph_file
    from baechi_tf.rewriter.devices import LOCAL_TASK, standin_cluster
    from baechi_tf.rewriter.graph_pass import place_graph_def

    path = os.path.join(keras_dir, f"{model}.pb")
    graph_def = read_graph_file(path, read_graph_bytes(path))[0]
    profile = load_profile(os.path.join(keras_dir, f"{model}.profile"))
    setup = standin_cluster(NUM_DEVICES, prefix=LOCAL_TASK)
    solved_by, logger = _SolvedBy(), logging.getLogger("baechi_tf.sct.relaxation")
    level = logger.level
    logger.addHandler(solved_by)
    logger.setLevel(logging.INFO)
    try:
        t0 = time.perf_counter()
        _, report = place_graph_def(graph_def, profile, setup.cluster,
                                    PlacementOptions(placement_method="m_sct", lp_solver=solver),
                                    host_device=setup.host, device_aliases=setup.aliases)
        seconds = time.perf_counter() - t0
    finally:
        logger.removeHandler(solved_by)
        logger.setLevel(level)
    return seconds, solved_by.text, report.result.schedule.makespan_us / 1e3


class _SolvedBy(logging.Handler):
    """Keeps the back ends of the relaxation's summary line ("... in N LPs by highs, ...")."""

    def __init__(self) -> None:
        super().__init__(level=0)
        self.text = "?"

    def emit(self, record) -> None:
        message = record.getMessage()
        if " LPs by " in message:
            self.text = message.split(" LPs by ")[1].split(",")[0]


def solve_layered(size: int, solver: str) -> tuple[float, str, float]:
    """(seconds, back ends, LP optimum in ms) of m-SCT's LP alone on a seeded layered graph."""
    from layered import layered_graph

    from baechi_tf.cluster import Cluster
    from baechi_tf.sct.relaxation import solve_sct_relaxation

    graph = layered_graph(size, seed=size)
    graph.topo_order  # derived arrays: part of the graph, not of the LP
    t0 = time.perf_counter()
    r = solve_sct_relaxation(graph, Cluster.homogeneous(NUM_DEVICES, 16 << 30), solver=solver)
    return time.perf_counter() - t0, r.solver, r.w_us / 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    flags.add_saved_model_flags(parser, MODELS, KERAS_DIR)
    parser.add_argument("--solvers", default=",".join(SOLVERS), help="back ends (default: %(default)s)")
    parser.add_argument("--layered", default="5000,10000",
                        help="op counts of layered graphs whose LP to solve ('' for none; default: %(default)s)")
    args = parser.parse_args(argv)
    solvers = flags.chosen(parser, args.solvers, "--solvers", SOLVERS, "LP back end")
    models = flags.chosen(parser, args.models, "--models", MODELS, "model") if args.models else []
    sizes = flags.sizes(parser, args.layered, "--layered") if args.layered else []
    models = flags.saved_models(models, args.keras_dir)

    import_tensorflow_quietly()
    import cvxopt.solvers  # noqa: F401  imported before any clock starts
    import scipy.optimize  # noqa: F401

    print(f"{'graph':<16}{'what':<22}{'solver':<8}{'seconds':>10}  {'solved by':<14}{'ms':>10}", flush=True)
    for model in models:
        for solver in solvers:
            seconds, by, ms = place_model(args.keras_dir, model, solver)
            print(f"{model:<16}{'m_sct placement':<22}{solver:<8}{seconds:>10.2f}  {by:<14}{ms:>10.2f}"
                  "  (simulated makespan)", flush=True)
    for size in sizes:
        for solver in solvers:
            seconds, by, ms = solve_layered(size, solver)
            print(f"{'layered ' + str(size):<16}{'m-SCT LP alone':<22}{solver:<8}{seconds:>10.2f}  {by:<14}{ms:>10.2f}"
                  "  (LP optimum)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
