"""Tight memory: does every method place a graph whenever some placement fits?

Each case is a seeded random DAG (tests/graphs.py's `random_dag`: TF colocation groups, a few pins,
weights on some ops) whose devices get exactly the peak memory of a random placement of its
groups (the planted placement, pins kept), simulated with unlimited memory: that placement fits,
so a method that reports the graph infeasible is wrong. For each size range and method the table
prints how many graphs were placed, how many of those only by the fit search
(`baechi_tf.placer.fit`: the method and the memory-first packing had both run out of memory),
how many failed, the seconds per graph, and the median simulated step over the planted
placement's.

    .venv/bin/python bench/tight_memory.py [--sizes 20-80,200-800] [--graphs 40] [--methods auto,m_etf]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from baechi_tf.cluster import Cluster, CommCost, Device  # noqa: E402
from baechi_tf.errors import InfeasiblePlacementError, InvalidGraphError  # noqa: E402
from baechi_tf.placer import colocation_groups  # noqa: E402
from baechi_tf.placer.pipeline import PlacementOptions, place  # noqa: E402
from baechi_tf.placer.schedule import Placement  # noqa: E402
from baechi_tf.placer.simulator import simulate  # noqa: E402
from graphs import random_dag  # noqa: E402
import flags  # noqa: E402

COMM = CommCost(0.0001754, 134)


def _cluster(num_devices: int, memory_bytes: int) -> Cluster:
    return Cluster(tuple(Device(f"/device:GPU:{i}", memory_bytes) for i in range(num_devices)), COMM)


def planted_case(seed: int, low: int, high: int):
    """(graph, cluster, planted makespan us), or None when the drawn pins contradict a group."""
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(2, 5))
    n = int(rng.integers(low, high + 1))
    # As dense as tests/test_fit.py's graphs up to 60 ops, then some 9 inputs an op on average.
    edge_prob = float(rng.uniform(0.05, 0.3)) * min(1.0, 60.0 / n)
    graph = random_dag(seed, n, edge_prob=edge_prob, max_bytes=8 << 20, group_prob=0.2,
                       pin_prob=0.05, num_devices=nd, persistent_prob=0.2)
    try:
        groups = colocation_groups(graph)
    except InvalidGraphError:
        return None
    planted = rng.integers(0, nd, groups.num_groups)
    for op, name in enumerate(graph.pinned_device):
        if name is not None:
            planted[groups.group_of[op]] = int(name.rsplit(":", 1)[1])
    placement = Placement(planted[groups.group_of].astype(np.int32), "planted")
    capacity = max(simulate(graph, _cluster(nd, 1 << 50), placement).peak_memory_bytes)
    cluster = _cluster(nd, capacity)
    return graph, cluster, simulate(graph, cluster, placement).makespan_us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20-80,200-800",
                        help="comma-separated op-count ranges LOW-HIGH (default: %(default)s)")
    parser.add_argument("--graphs", type=int, default=40, help="graphs drawn per range (default: %(default)s)")
    parser.add_argument("--methods", default="auto,m_etf,m_sct,m_topo,heft",
                        help="comma-separated methods (default: %(default)s)")
    args = parser.parse_args()
    logging.getLogger("baechi_tf").setLevel(logging.ERROR)  # each fallback warns; the table counts them
    methods = flags.methods(parser, args.methods)
    try:
        ranges = [tuple(int(x) for x in r.split("-")) for r in args.sizes.split(",")]
        if any(len(r) != 2 or not 1 <= r[0] <= r[1] for r in ranges):
            raise ValueError
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: give ranges such as 20-80,200-800")
    print(f"{'ops':>10}{'method':>8}{'graphs':>8}{'placed':>8}{'by fit':>8}{'failed':>8}"
          f"{'s/graph':>9}{'step/planted':>14}")
    for low, high in ranges:
        cases = [c for c in (planted_case(seed, low, high) for seed in range(args.graphs)) if c is not None]
        for method in methods:
            placed = fit = failed = 0
            ratios = []
            t0 = time.perf_counter()
            for graph, cluster, planted_us in cases:
                try:
                    result = place(graph, cluster, PlacementOptions(placement_method=method))
                except InfeasiblePlacementError:
                    failed += 1
                    continue
                placed += 1
                fit += result.placement.method.endswith(("+fit", "(fit)"))
                ratios.append(result.makespan_us / planted_us)
            took = (time.perf_counter() - t0) / max(len(cases), 1)
            ratio = f"{statistics.median(ratios):.3f}" if ratios else "-"
            print(f"{f'{low}-{high}':>10}{method:>8}{len(cases):>8}{placed:>8}{fit:>8}{failed:>8}"
                  f"{took:>9.2f}{ratio:>14}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
