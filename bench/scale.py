"""Scale: `baechi place-json` on a 100k-op graph and `baechi place` on a 100k-node GraphDef.

Each command runs as a subprocess; the table gives its wall time, its peak RSS (from the OS) and
whether it finished. The GraphDef is a layered graph of real TF ops (AddV2 / Identity over
placeholders) built with tf.compat.v1; its profile carries synthetic costs (the point is scale,
not cost accuracy), made with the profile module so that its fingerprint matches.

    .venv/bin/python bench/scale.py [--ops 100000] [--methods m_etf,auto]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flags  # noqa: E402


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, peak RSS MiB of this child alone, exit status, last stderr line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # reaps the child and gives its own rusage
    wall = time.perf_counter() - t0
    last = (err.strip().splitlines() or [""])[-1]
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), last


def make_json(path: str, n: int) -> None:
    from baechi_tf.cluster import Cluster
    from baechi_tf.json_io import graph_to_json
    from layered import layered_graph

    graph = layered_graph(n, seed=n)
    with open(path, "w") as f:
        json.dump(graph_to_json(graph, Cluster.homogeneous(4, 16 << 30)), f)


def make_graph_def(graph_path: str, profile_path: str, n: int) -> None:
    import numpy as np
    import tensorflow as tf

    from baechi_tf.cost_model.profile import CostProfile, OpCost, graph_fingerprint, graph_nodes, save_profile

    tf.compat.v1.disable_eager_execution()
    rng = np.random.default_rng(n)
    g = tf.Graph()
    with g.as_default():
        width = max(2, int(np.sqrt(n) / 2))
        layer = [tf.compat.v1.placeholder(tf.float32, [256], name=f"in{i}") for i in range(width)]
        count = width
        while count < n:
            nxt = []
            for i in range(width):
                a, b = rng.choice(len(layer), 2)
                nxt.append(tf.add(layer[a], layer[b]) if a != b else tf.identity(layer[a]))
                count += 1
            layer = nxt
    graph_def = g.as_graph_def()
    with open(graph_path, "wb") as f:
        f.write(graph_def.SerializeToString())
    ops = {
        node.name: OpCost(node.name, node.op, float(rng.uniform(5, 500)), (1024,), 0, 0, "", 1)
        for node in graph_def.node
    }
    save_profile(
        CostProfile(ops, graph_fingerprint(graph_def), graph_nodes(graph_def), tf.__version__, 1, 0.0),
        profile_path,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=100_000, help="ops of each graph (default: %(default)s)")
    parser.add_argument("--methods", default="m_topo,m_etf,auto",
                        help="comma-separated placement methods (default: %(default)s)")
    parser.add_argument("--skip_graph_def", action="store_true",
                        help="only place-json: neither build the GraphDef nor run baechi place")
    args = parser.parse_args()
    if args.ops < 1:
        parser.error(f"--ops={args.ops}: give at least 1")
    methods = flags.methods(parser, args.methods)
    py = os.path.join(ROOT, ".venv", "bin", "python")
    py = py if os.path.exists(py) else sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "g.json")
        t0 = time.perf_counter()
        make_json(src, args.ops)
        print(f"{args.ops}-op JSON graph written in {time.perf_counter() - t0:.1f} s "
              f"({os.path.getsize(src) / 2**20:.0f} MiB)")
        print(f"{'command':<36}{'wall s':>8}{'peak RSS MiB':>14}  result")
        for m in methods:
            cmd = [py, "-m", "baechi_tf", "place-json", src, "--placement_method", m,
                   "--out", os.path.join(tmp, f"{m}.json")]
            wall, rss, status, last = timed(cmd)
            print(f"{'place-json ' + m:<36}{wall:>8.1f}{rss:>14.0f}  {'ok' if status == 0 else 'exit %d: %s' % (status, last)}", flush=True)
        if args.skip_graph_def:
            return
        gpath, ppath = os.path.join(tmp, "g.pb"), os.path.join(tmp, "p.pb")
        t0 = time.perf_counter()
        make_graph_def(gpath, ppath, args.ops)
        print(f"{args.ops}-node GraphDef and profile written in {time.perf_counter() - t0:.1f} s")
        for m in methods:
            cmd = [py, "-m", "baechi_tf", "place", "--graph", gpath, "--cost_path", ppath,
                   "--num_devices", "4", "--placement_method", m, "--out", os.path.join(tmp, f"{m}.pb")]
            wall, rss, status, last = timed(cmd)
            print(f"{'place (GraphDef) ' + m:<36}{wall:>8.1f}{rss:>14.0f}  {'ok' if status == 0 else 'exit %d: %s' % (status, last)}", flush=True)


if __name__ == "__main__":
    main()
