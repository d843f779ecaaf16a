"""auto's placement time with its candidates placed in this process and side by side in worker
processes (`--placement_jobs`), measured one after the other on each graph, and whether the two
placements are the same (they must be).

Graphs: the model profiles of bench/profiles/*.json, seeded layered graphs (bench/layered.py) of
`--layered` sizes, and any op-graph JSON files given (the schema of `baechi place-json`).

    .venv/bin/python bench/auto_jobs.py [--jobs 2] [--repeats 2] [--refine_seconds 3] [GRAPH.json ...]

Each line: ops, the median wall time of `place` in one process and with workers, their ratio,
and the simulated makespan. Other work on the machine shows in the times: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from baechi_tf.cluster import Cluster  # noqa: E402
from baechi_tf.json_io import load_graph_json  # noqa: E402
from baechi_tf.placer.pipeline import PlacementOptions, place  # noqa: E402
from baechi_tf.placer.auto.workers import usable_cores  # noqa: E402
from baechi_tf.errors import BaechiError  # noqa: E402
from layered import layered_graph  # noqa: E402
import flags  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graphs", nargs="*", metavar="GRAPH.json", help="more op graphs to place")
    parser.add_argument("--jobs", type=int, default=usable_cores(), help="workers (default: the usable cores)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each kind per graph (default: 2)")
    parser.add_argument("--refine_seconds", type=float, default=3.0,
                        help="auto's refinement (default: %(default)s)")
    parser.add_argument("--layered", default="10000,25000", help="sizes of layered graphs (default: 10000,25000)")
    args = parser.parse_args()
    if args.jobs < 2:
        parser.error(f"--jobs={args.jobs}: side by side needs 2 or more workers")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: give at least 1")
    flags.refine_seconds(parser, args.refine_seconds)
    layered = flags.sizes(parser, args.layered, "--layered") if args.layered.strip() else []
    cases = []
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "profiles", "*.json"))) + args.graphs:
        try:
            graph, cluster = load_graph_json(path)
        except BaechiError as e:
            parser.error(str(e))
        cases.append((os.path.basename(path)[:-5], graph, cluster))
    for size in layered:
        cases.append((f"layered-{size}", layered_graph(size, seed=1), Cluster.homogeneous(4, 16 << 30)))
    print(f"{args.jobs} workers, {usable_cores()} usable cores, refine_seconds {args.refine_seconds:g}")
    header = f"{'graph':<20}{'ops':>7}{'one process s':>15}{'workers s':>11}{'ratio':>7}  {'winner':<16}{'makespan us':>14}  same"
    print(header)
    print("-" * len(header))
    all_same = True
    for name, graph, cluster in cases:
        seconds: dict[int, list[float]] = {1: [], args.jobs: []}
        results = {}
        for _ in range(args.repeats):
            for jobs in (1, args.jobs):  # one after the other, so that load changes hit both
                options = PlacementOptions(refine_seconds=args.refine_seconds, placement_jobs=jobs)
                t0 = time.perf_counter()
                result = place(graph, cluster, options)
                seconds[jobs].append(time.perf_counter() - t0)
                results.setdefault(jobs, []).append(result)
        first = results[1][0]
        same = all(
            r.placement.method == first.placement.method
            and (r.placement.device_of == first.placement.device_of).all()
            and r.makespan_us == first.makespan_us
            for rs in results.values()
            for r in rs
        )
        all_same &= same
        here, apart = statistics.median(seconds[1]), statistics.median(seconds[args.jobs])
        print(
            f"{name:<20}{graph.num_ops:>7}{here:>15.2f}{apart:>11.2f}{apart / here:>7.2f}  "
            f"{first.placement.method:<16}{first.makespan_us:>14,.1f}  {'yes' if same else 'NO'}",
            flush=True,
        )
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
