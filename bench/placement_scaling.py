"""Placement time, peak memory and quality of each placer on seeded layered graphs, or on
shapes whose copies queue on the channels (`bench/layered.py`): fan-outs (`--shape fan_out`:
thousands of small ops ready at once), updates colocated with one variable (`updates`, and
`chained_updates`, each after the one before) and gathers colocated with one embedding
(`gathers`), each fed from or feeding other devices.

Each (size, method) runs in a fresh process so that its peak RSS is its own. Prints a table:
seconds to group, to place and to simulate, peak RSS of the process, and the simulated makespan
over the lower bound (bounds.lower_bound_us). Four devices of 16 GiB (`--devices`).

    .venv/bin/python bench/placement_scaling.py [--sizes 1000,10000,100000] [--methods m_topo,m_etf]
    .venv/bin/python bench/placement_scaling.py --shape fan_out --sizes 1200,2400,4800 --methods m_etf,auto
    .venv/bin/python bench/placement_scaling.py --shape updates --sizes 2000,4000,8000 --methods m_etf,auto
    .venv/bin/python bench/placement_scaling.py --sizes 200 --methods auto --devices 200   # many devices
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flags  # noqa: E402


def one(size: int, method: str, shape: str, devices: int) -> dict:
    from baechi_tf.cluster import Cluster
    from baechi_tf.placer.grouping import make_groups
    from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions
    from baechi_tf.placer.bounds import lower_bound_us
    from baechi_tf.placer.simulator import simulate
    from layered import SHAPES

    graph = SHAPES[shape](size)
    graph.validate()
    cluster = Cluster.homogeneous(devices, 16 << 30)
    options = PlacementOptions(placement_method=method)
    t0 = time.perf_counter()
    groups = make_groups(graph, "tf")
    t1 = time.perf_counter()
    placement = PLACEMENT_METHODS[method](graph, cluster, groups, options)
    t2 = time.perf_counter()
    schedule = simulate(graph, cluster, placement)
    t3 = time.perf_counter()
    return {
        "ops": graph.num_ops,
        "edges": graph.num_edges,
        "group_s": t1 - t0,
        "place_s": t2 - t1,
        "simulate_s": t3 - t2,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "ratio": schedule.makespan_us / lower_bound_us(graph, cluster),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000",
                        help="comma-separated op counts of the graphs (default: %(default)s)")
    parser.add_argument("--methods", default="m_topo,m_etf",
                        help="comma-separated placement methods (default: %(default)s)")
    parser.add_argument("--shape", choices=("layered", "fan_out", "updates", "chained_updates", "gathers"), default="layered",
                        help="the graphs' shape, as above (bench/layered.py; default: %(default)s)")
    parser.add_argument("--devices", type=int, default=4, help="number of devices (default: %(default)s)")
    parser.add_argument("--one", nargs=2, metavar=("SIZE", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.devices < 1:
        parser.error(f"--devices={args.devices}: give at least one device")
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1], args.shape, args.devices)))
        return
    sizes, methods = flags.sizes(parser, args.sizes), flags.methods(parser, args.methods)
    header = f"{'ops':>7} {'edges':>7} {'method':>7} {'group s':>8} {'place s':>8} {'sim s':>7} {'RSS MiB':>8} {'makespan/LB':>11}"
    print(header)
    print("-" * len(header))
    for size in sizes:
        for method in methods:
            proc = subprocess.run(
                [sys.executable, __file__, "--one", str(size), method, "--shape", args.shape, "--devices", str(args.devices)],
                capture_output=True, text=True,
            )
            if proc.returncode:
                print(f"{size:>7} {'':>7} {method:>7}  failed: {proc.stderr.strip().splitlines()[-1]}")
                continue
            r = json.loads(proc.stdout)
            print(
                f"{r['ops']:>7} {r['edges']:>7} {method:>7} {r['group_s']:>8.3f} {r['place_s']:>8.3f} "
                f"{r['simulate_s']:>7.3f} {r['rss_mib']:>8.0f} {r['ratio']:>11.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
