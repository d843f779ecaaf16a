"""Placement with embeddings pinned to the host: every method on the profiled models.

Large embeddings usually live on the host CPU (`tf.device("/cpu:0")`), outside the devices the
placer fills. Here every op of bench/profiles/*.json whose name holds ``--pattern`` (default
"embedding": the tables, their lookups and their optimizer updates) is pinned to the host, and
each method places the rest on the profile's devices (`graph_pass.place_with_host`). Printed per
graph and method: the simulated step (host ops on the host, their outputs copied from it), the
placement's label, and the wall time; then auto against the best other method and one device.

    .venv/bin/python bench/host_pins.py [--refine_seconds 3] [--methods auto,m_etf,single]
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from baechi_tf.cluster import Device  # noqa: E402
from baechi_tf.errors import BaechiError  # noqa: E402
from baechi_tf.json_io import load_graph_json  # noqa: E402
from baechi_tf.placer.pipeline import PlacementOptions  # noqa: E402
from baechi_tf.rewriter.graph_pass import place_with_host  # noqa: E402
import flags  # noqa: E402

HOST = "/job:localhost/replica:0/task:0/device:CPU:0"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refine_seconds", type=float, default=3.0,
                        help="auto's refinement (default: %(default)s)")
    parser.add_argument("--methods", default="auto,m_topo,m_etf,m_sct,heft,single",
                        help="comma-separated placement methods (default: %(default)s)")
    parser.add_argument("--pattern", default="embedding", help="ops whose name holds this go to the host")
    args = parser.parse_args()
    methods = flags.methods(parser, args.methods)
    flags.refine_seconds(parser, args.refine_seconds)
    paths = sorted(glob.glob(os.path.join(ROOT, "bench", "profiles", "*.json")))
    if not paths:
        print("no profiles in bench/profiles; make them with bench/make_profiles.py", file=sys.stderr)
        return 2
    worse = 0
    for path in paths:
        graph, cluster = load_graph_json(path)
        if cluster.find(HOST) is not None:
            print(f"{path}: {HOST} is one of its devices, not a host outside them", file=sys.stderr)
            return 2
        pins = tuple(HOST if args.pattern in n else d for n, d in zip(graph.names, graph.pinned_device))
        graph = dataclasses.replace(graph, pinned_device=pins)
        host = Device(HOST, 64 << 30, "CPU")
        name = os.path.basename(path)[:-5]
        if HOST not in pins:
            print(f"{name}: no op name holds {args.pattern!r}; skipped")
            continue
        print(f"{name}: {graph.num_ops} ops, {sum(p == HOST for p in pins)} on the host, "
              f"{cluster.num_devices} devices")
        spans: dict[str, float] = {}
        single = None
        for m in methods:
            t0 = time.perf_counter()
            try:
                r = place_with_host(graph, cluster, host, PlacementOptions(m, refine_seconds=args.refine_seconds))
            except BaechiError as e:
                print(f"  {m:<8} fails: {e}")
                continue
            spans[m] = r.makespan_us
            single = r.single_device_makespan_us if single is None else single
            print(f"  {m:<8} {r.makespan_us:>12,.1f} us  {r.placement.method:<24} {time.perf_counter() - t0:6.1f} s")
        others = {m: s for m, s in spans.items() if m != "auto"}
        if "auto" in spans and others:
            best = min(others, key=others.get)
            print(f"  auto / best other ({best}): {spans['auto'] / others[best]:.3f}"
                  + (f"; auto / one device: {spans['auto'] / single:.3f}" if single else ""))
            worse += spans["auto"] > others[best] + 1e-6
    if worse:
        print(f"auto is slower than another method on {worse} graph(s)")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
