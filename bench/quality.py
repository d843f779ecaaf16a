"""Placement quality: simulated makespan / lower bound of every method on a fixed graph set.

For each graph (bench/quality_graphs.py; profiles of real models are added from
bench/profiles/*.json when present) every method places it; the table prints makespan divided by
the lower bound (`bounds.lower_bound_us`: max(critical path, total compute / devices), summed
phase by phase where cut ops split the graph, or a longest path that pays for the copies no
placement that keeps TF colocation groups together avoids, or the energetic bounds of the graph
and of its phases, or the lesser of one device per connected part and the cheapest split,
whichever is more), the single-device makespan over the same bound
("-" when the graph does not fit one device, as under a method that does not apply to a graph),
and checks that auto is no worse than the best single method and than one device when the graph
fits there.

    .venv/bin/python bench/quality.py [--refine_seconds 3]
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from baechi_tf.errors import BaechiError, ConfigError  # noqa: E402
from baechi_tf.json_io import load_graph_json  # noqa: E402
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions, place  # noqa: E402
from baechi_tf.placer.bounds import critical_path_us  # noqa: E402
from quality_graphs import cases  # noqa: E402
import flags  # noqa: E402


def plain_bound(graph, cluster) -> float:
    """The bound before phases were counted, printed beside it so that figures stay comparable."""
    return max(critical_path_us(graph), float(graph.compute_us.sum()) / cluster.num_devices)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refine_seconds", type=float, default=3.0,
                        help="auto's refinement (default: %(default)s)")
    args = parser.parse_args()
    flags.refine_seconds(parser, args.refine_seconds)
    methods = [m for m in ("m_topo", "m_etf", "m_sct", "heft", "layers") if m in PLACEMENT_METHODS] + ["auto"]
    all_cases = cases()
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "profiles", "*.json"))):
        graph, cluster = load_graph_json(path)
        all_cases.append((os.path.basename(path)[:-5], graph, cluster))
    header = f"{'graph':<22}{'ops':>6}" + "".join(f"{m:>9}" for m in methods) + f"{'1 device':>10}{'auto s':>8}  winner"
    print(header)
    print("-" * len(header))
    ratios: dict[str, list[float]] = {m: [] for m in methods}
    plain_ratios: dict[str, list[float]] = {m: [] for m in methods}  # over the plain bound
    failures = []
    for name, graph, cluster in all_cases:
        row = f"{name:<22}{graph.num_ops:>6}"
        made: dict[str, float] = {}
        single = bound = None
        auto_s = 0.0
        winner = ""
        for m in methods:
            options = PlacementOptions(placement_method=m, refine_seconds=args.refine_seconds)
            t0 = time.perf_counter()
            try:
                r = place(graph, cluster, options)
            except ConfigError:  # the method does not apply (layers: no numbered scopes)
                row += f"{'-':>9}"
                continue
            except BaechiError as e:
                row += f"{'fail':>9}"
                print(f"  ({name}, {m}: {e})", file=sys.stderr)
                continue
            if m == "auto":
                auto_s = time.perf_counter() - t0
                winner = r.placement.method
            bound, single = r.lower_bound_us, r.single_device_makespan_us
            made[m] = r.makespan_us
            ratios[m].append(r.makespan_us / bound)
            plain_ratios[m].append(r.makespan_us / plain_bound(graph, cluster))
            row += f"{r.makespan_us / bound:>9.3f}"
        row += f"{(single / bound) if single else float('nan'):>10.3f}" if single else f"{'-':>10}"
        row += f"{auto_s:>8.1f}  {winner}"
        print(row, flush=True)
        if "auto" in made:
            best_single = min(v for k, v in made.items() if k != "auto")
            if made["auto"] > best_single + 1e-6:
                failures.append(f"{name}: auto {made['auto']:.1f} > best method {best_single:.1f}")
            if single is not None and made["auto"] > single + 1e-6:
                failures.append(f"{name}: auto {made['auto']:.1f} > one device {single:.1f}")
    print()
    med = {m: statistics.median(v) for m, v in ratios.items() if v}
    print("median makespan / lower bound: " + ", ".join(
        f"{m} {v:.3f}" + (f" (of {len(ratios[m])} graphs)" if len(ratios[m]) < len(all_cases) else "")
        for m, v in med.items()))
    if "m_etf" in med and "auto" in med:
        print(f"auto vs m_etf: {100 * (1 - med['auto'] / med['m_etf']):.1f}% lower median ratio")
    plain = {m: statistics.median(v) for m, v in plain_ratios.items() if v}
    if "m_etf" in plain and "auto" in plain:
        print(
            "over the plain bound max(critical path, compute / devices), without phases: median "
            f"m_etf {plain['m_etf']:.3f}, auto {plain['auto']:.3f} "
            f"({100 * (1 - plain['auto'] / plain['m_etf']):.1f}% lower)"
        )
    for f in failures:
        print("CHECK FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
